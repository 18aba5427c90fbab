"""The examples run offline against ../shared, as the README promises (quickstart.py, the README's 30-second example,
with the shared model and images in place of its Hub ids)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SHARED, SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION, requires_shared

ROOT = Path(__file__).resolve().parents[2]


def _example(script: str):
    """``examples/<script>`` imported as a module (the examples are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script[:-3], ROOT / "examples" / script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def _first_rows(parquet: tuple[str, ...], path, rows: int = 300):
    """The first ``rows`` rows of ``parquet`` as a file of their own: the examples read the whole train file (100,000
    images) into a dataset before they draw from it, which is most of their run time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    first = next(pq.ParquetFile(SHARED.joinpath(*parquet)).iter_batches(batch_size=rows))
    pq.write_table(pa.Table.from_batches([first]), path)
    return path


@pytest.mark.slow  # a fresh process on the shared ViT-Tiny
@requires_shared(SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION)
def test_load_any_size_example(tmp_path):
    train = _first_rows(SHARED_TRAIN, tmp_path / "train.parquet")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "load_any_size.py"), "--method", "magnitude",  # seconds, not minutes
         "--train-data", str(train),
         "--sparsities", "0.0", "0.3", "--num-images", "50", "--output", str(tmp_path / "elastic"),
         "--json", str(tmp_path / "figures.json")],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("sparsity")]
    assert len(lines) == 2
    assert "5.56 M params" in lines[0] and "2.511 GFLOPs" in lines[0]
    assert (tmp_path / "elastic" / "config.json").exists()
    assert (tmp_path / "elastic" / "preprocessor_config.json").exists()
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert [row["sparsity"] for row in figures["rows"]] == [0.0, 0.3] and figures["num_validation_images"] == 50
    assert figures["settings"]["method"] == "magnitude" and figures["seconds"]["rank"] <= figures["seconds"]["total"]
    assert figures["hardware"]["cpu_count"] >= 1

    # The README's 30-second example, in this process (no second interpreter start): its Hub ids replaced by the
    # shared checkpoint folder and a parquet file, the two local forms it takes.
    shown = _example("quickstart.py").main(["--model", str(SHARED.joinpath(*SHARED_MODEL)), "--data", str(train),
                                            "--method", "magnitude", "--output", str(tmp_path / "quick")])
    assert shown["model"] == "ViTModel" and (shown["tokens"], shown["width"]) == (197, 192)
    # 30 % of the parameters off: under 80 % of the dense ViT-Tiny's 2.511 GFLOPs; the heads of all 12 blocks listed
    assert len(shown["num_heads"]) == 12 and shown["gflops"] < 0.8 * 2.511
    assert (tmp_path / "quick" / "preprocessor_config.json").exists()


@pytest.mark.slow  # a fresh process on the shared ViT-Tiny
@requires_shared(SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION)
def test_prune_and_push_example(tmp_path):
    import hf_snapvit

    output = tmp_path / "vit-tiny-elastic"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "prune_and_push.py"), "--method", "magnitude", "--num-eval", "20",
         "--data", str(_first_rows(SHARED_TRAIN, tmp_path / "train.parquet")),
         "--output", str(output), "--sparsities", "0.1", "0.3", "0.5"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loads = [line for line in result.stdout.splitlines() if line.startswith("sparsity")]
    assert len(loads) == 3
    small = hf_snapvit.ElasticViTModel.from_pretrained(output, sparsity=0.3)
    assert f"{hf_snapvit.backbone_parameters(small) / 1e6:.2f} M backbone params" in loads[1]
    assert f"{hf_snapvit.estimate_gflops(small):.3f} GFLOPs" in loads[1]
    assert "top-1" in loads[1] and "on 20 validation images" in loads[1]
    assert (tmp_path / "vit-tiny-elastic-allocation.png").read_bytes()[:4] == b"\x89PNG"
    assert (output / "preprocessor_config.json").exists()


@pytest.mark.parametrize("script", ["load_any_size.py", "prune_and_push.py", "quickstart.py"])
def test_examples_that_rank_take_every_preset(script, monkeypatch):
    """Issue 64: each example that ranks takes --preset, with SnapViT's presets as the choices and fast the default."""
    from hf_snapvit.pruning.methods.snapvit import PRESETS

    example = _example(script)
    for preset in PRESETS:
        monkeypatch.setattr(sys, "argv", [script, "--method", "snapvit", "--preset", preset])
        assert example.parse_args().preset == preset
    monkeypatch.setattr(sys, "argv", [script])
    assert example.parse_args().preset == "fast"
    monkeypatch.setattr(sys, "argv", [script, "--preset", "quick"])
    with pytest.raises(SystemExit):
        example.parse_args()
