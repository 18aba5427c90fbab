"""Optional dependencies: loading and slicing import none of them, work without them, and each feature that needs
one names the extra to install. The packaging metadata (extras, license) says the same."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import run_at_once

from hf_snapvit.errors import MissingExtraError, SnapViTError
from hf_snapvit.utils.extras import EXTRAS, install_hint, require_extra

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("matplotlib", "evaluate", "datasets")

# Writes a tiny elastic checkpoint into sys.argv[1] (in a process that may have optional modules blocked).
_SAVE = """
import torch, transformers, hf_snapvit
torch.manual_seed(0)
config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                                image_size=32, patch_size=8, num_labels=3)
model = transformers.ViTForImageClassification(config).eval()
hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), sys.argv[1], model_card=False)
"""


# Loads the checkpoint in sys.argv[1] in a fresh process and says which optional modules that imported.
_LOAD = """
import sys
import torch, hf_snapvit
model = hf_snapvit.ElasticViTModel.from_pretrained(sys.argv[1], sparsity=0.3)
model(pixel_values=torch.randn(1, 3, 32, 32))
print(model.config.elastic_layout["num_heads"])
print(sorted(name for name in ("matplotlib", "evaluate", "datasets") if name in sys.modules))
"""

# With the optional modules blocked: saves (_SAVE), loads, slices and ranks, then asks for a metric.
_BLOCKED = 'import sys\nfor name in ("matplotlib", "evaluate", "datasets"):\n    sys.modules[name] = None\n' + _SAVE + """
import numpy as np
from PIL import Image
model = hf_snapvit.ElasticViTModel.from_pretrained(sys.argv[1], sparsity=0.3)
print(model.config.elastic_layout["sparsity"] > 0.2)
rng = np.random.default_rng(0)
photos = [Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)) for _ in range(4)]
processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
dense = transformers.ViTForImageClassification.from_pretrained(sys.argv[1])
ranking = hf_snapvit.rank(dense, method="snip", data=photos, processor=processor, preset="fast")
print(ranking.provenance["calibration_data"]["num_gradient"])
from hf_snapvit.evaluation.evaluate_metrics import load_metric
try:
    load_metric("top1_accuracy")
except ImportError as error:
    print("ERROR:", error)
"""


@pytest.fixture(scope="module")
def elastic_dir(tmp_path_factory) -> Path:
    """The checkpoint _SAVE writes, written here: only its loading needs a fresh process."""
    folder = tmp_path_factory.mktemp("extras") / "elastic"
    with torch.random.fork_rng():  # _SAVE seeds torch: the session's random state stays as it was
        exec(_SAVE, {"sys": types.SimpleNamespace(argv=["-c", str(folder)])})  # noqa: S102 (this file's own code)
    return folder


@pytest.fixture(scope="module")
def children(elastic_dir, tmp_path_factory) -> dict[str, list[str]]:
    """The stdout lines of _LOAD (on ``elastic_dir``) and of _BLOCKED, fresh processes started at once."""
    scripts = {"load": (_LOAD, elastic_dir), "blocked": (_BLOCKED, tmp_path_factory.mktemp("blocked") / "e")}
    done = run_at_once([[sys.executable, "-c", script, str(folder)] for script, folder in scripts.values()])
    return {name: result.stdout.strip().splitlines() for name, result in zip(scripts, done)}


@pytest.mark.slow
def test_import_and_loading_import_no_optional_dependency(children):
    heads, imported = children["load"][-2:]
    assert imported == "[]"
    assert sum(eval(heads)) < 8  # really sliced: fewer than 2 x 4 heads


@pytest.mark.slow
def test_loading_slicing_and_ranking_work_with_the_optional_dependencies_blocked(children):
    lines = children["blocked"]
    assert lines[-3:-1] == ["True", "4"]
    assert lines[-1].startswith("ERROR: load_metric('top1_accuracy') needs evaluate")
    assert 'pip install "hf-snapvit[eval]"' in lines[-1]


def test_require_extra_names_the_extra_and_is_an_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "evaluate", None)
    with pytest.raises(MissingExtraError, match=r'the metric needs evaluate.*pip install "hf-snapvit\[eval\]"') \
            as caught:
        require_extra("evaluate", "the metric")
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, SnapViTError)
    assert caught.value.name == "evaluate"
    assert install_hint("matplotlib") == 'pip install "hf-snapvit[plots]"'
    with pytest.raises(KeyError, match="not an optional dependency"):
        require_extra("numpy", "x")


def test_sweep_with_plots_fails_before_evaluating_without_matplotlib(monkeypatch, tmp_path):
    from hf_snapvit.evaluation import run_sweep

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"plots=False.*hf-snapvit\[plots\]"):
        run_sweep(object(), {"magnitude": object()}, [0.3], eval_data=[], output_dir=tmp_path / "sweep")
    assert not (tmp_path / "sweep").exists()


def test_packaging_metadata_declares_the_extras_and_the_license():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "matplotlib" not in core and "evaluate" not in core and "datasets" in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("matplotlib") for d in extras["plots"])
    assert any(d.startswith("evaluate") for d in extras["eval"])
    assert any(d.startswith("timm") for d in extras["timm"])
    # timm requires a torchvision, which pins its own torch: [all] leaves it out so that it never replaces the
    # user's torch (benchmarks/extras_keep_torch.py); CI's pip install -e ".[test]" still gets every optional feature.
    assert extras["all"] == ["hf-snapvit[plots,eval]"]
    assert "hf-snapvit[all,timm]" in extras["test"]
    assert set(EXTRAS.values()) == {"plots", "eval"}
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
