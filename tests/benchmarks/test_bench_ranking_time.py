"""benchmarks/bench_ranking_time.py runs as is on a CPU with a tiny model (the GPU run uses the same code)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import hf_snapvit

from helpers import load_benchmark


def _parquet(path: Path, count: int) -> Path:
    rng = np.random.default_rng(0)
    cells = []
    for _ in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(buffer, format="PNG")
        cells.append({"bytes": buffer.getvalue(), "path": None})
    pq.write_table(pa.table({"image": cells, "label": list(range(count))}), path)
    return path


@pytest.mark.slow
def test_the_ranking_benchmark_records_phases_and_the_forward_floor_for_each_preset_and_precision(tmp_path):
    script = load_benchmark("bench_ranking_time")
    output = tmp_path / "ranking_time.json"
    data = _parquet(tmp_path / "train.parquet", 12)
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--presets", "fast", "paper", "--images", "6",
                        "--generations", "1", "--floor-repeats", "1", "--data", str(data), "--fitness-batch-size", "4",
                        "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["hardware"]["device"] == "cpu" and report["data"] == str(data)
    runs = {(r["preset"], r["precision"]): r for r in report["runs"]}
    assert set(runs) == {("fast", "fp32"), ("fast", "bf16"), ("paper", "fp32"), ("paper", "bf16")}
    for (preset, precision), run in runs.items():
        assert run["shape"] == "tiny" and run["ran_in"] == precision and run["generations"] == 1
        assert run["fitness_batch_size"] == 4 and run["peak_memory_bytes"] is None  # measured on CUDA only
        phases = run["phases"]
        assert {"data", "gradients", "search", "search_forward"} <= set(phases)
        assert 0 < phases["search_forward"] <= phases["search"] <= run["wall_seconds"]
        assert run["search_forward_fraction"] == pytest.approx(phases["search_forward"] / phases["search"])
        # The teacher pass, then every evaluation at each of the preset's fitness sparsities (fast 1, paper 4).
        sparsities = len(hf_snapvit.SnapViTConfig.preset(preset).fitness_sparsities)
        assert sparsities == {"fast": 1, "paper": 4}[preset]
        assert run["search_images_forwarded"] == 6 * (1 + sparsities * run["evaluations"])
        assert run["search_forward_floor_seconds"] == pytest.approx(
            run["search_images_forwarded"] / run["dense_images_per_second"])


def test_the_ranking_benchmark_reads_only_the_images_it_needs_and_says_when_there_are_too_few(tmp_path):
    script = load_benchmark("bench_ranking_time")
    data = _parquet(tmp_path / "train.parquet", 5)
    assert len(script.load_images(str(data), 3, 0)) == 3
    with pytest.raises(SystemExit, match="holds 5 images; this run needs 8"):
        script.load_images(str(data), 8, 0)


def test_each_fitness_image_count_runs_side_by_side_with_the_images_it_needs(tmp_path):
    script = load_benchmark("bench_ranking_time")
    output = tmp_path / "ranking_time.json"
    data = _parquet(tmp_path / "train.parquet", 10)  # 4 gradient + the larger 6 fitness images
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--presets", "fast", "--precisions", "fp32",
                        "--images", "4", "--fitness-images", "6", "2", "--generations", "1", "--floor-repeats", "1",
                        "--data", str(data), "--fitness-batch-size", "4", "--output", str(output)]) == 0
    runs = json.loads(output.read_text())["runs"]
    assert [(r["num_gradient_images"], r["num_fitness_images"]) for r in runs] == [(4, 6), (4, 2)]
    assert [r["search_images_forwarded"] for r in runs] == [n * (1 + r["evaluations"])  # fast: 1 sparsity
                                                           for n, r in zip((6, 2), runs)]
    with pytest.raises(SystemExit, match="holds 10 images; this run needs 11"):
        script.main(["--device", "cpu", "--shapes", "tiny", "--presets", "fast", "--images", "4",
                     "--fitness-images", "7", "--data", str(data), "--output", str(output)])


def test_each_gradient_step_size_runs_side_by_side_and_is_recorded(tmp_path):
    script = load_benchmark("bench_ranking_time")
    output = tmp_path / "ranking_time.json"
    args = ["--device", "cpu", "--shapes", "tiny", "--presets", "fast", "--precisions", "fp32", "--images", "4",
            "--generations", "1", "--floor-repeats", "1", "--fitness-batch-size", "4", "--output", str(output)]
    assert script.main(args + ["--gradient-batch-sizes", "2", "4"]) == 0
    runs = json.loads(output.read_text())["runs"]
    assert [r["gradient_batch_size"] for r in runs] == [2, 4]
    assert all(r["phases"]["gradients"] > 0 for r in runs)
    assert script.main(args) == 0  # without the option: the preset's own step
    assert [r["gradient_batch_size"] for r in json.loads(output.read_text())["runs"]] == [
        hf_snapvit.SnapViTConfig.preset("fast").scores.batch_size]


def _side_by_side(tmp_path: Path, *option: str, preset: str = "fast", images: int = 6) -> tuple[object, list[dict]]:
    """``preset`` on tiny images, one generation, once per value of ``option``: the script and its runs."""
    script = load_benchmark("bench_ranking_time")
    output = tmp_path / "ranking_time.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--presets", preset, "--precisions", "fp32",
                        "--images", str(images), "--generations", "1", "--floor-repeats", "1",
                        "--fitness-batch-size", "4", *option, "--output", str(output)]) == 0
    return script, json.loads(output.read_text())["runs"]


def test_split_fitness_images_run_side_by_side_and_forward_each_image_once_per_evaluation(tmp_path):
    _, runs = _side_by_side(tmp_path, "--split-fitness-images", "0", "1", preset="paper", images=8)
    assert [r["split_fitness_images"] for r in runs] == [False, True]
    # paper: 4 sparsities on every image, or each on its own share (8 images: 2 each).
    assert [r["search_images_forwarded"] for r in runs] == [8 * (1 + 4 * runs[0]["evaluations"]),
                                                           8 * (1 + runs[1]["evaluations"])]


def test_token_fractions_run_side_by_side_and_are_recorded(tmp_path):
    script, runs = _side_by_side(tmp_path, "--fitness-token-fractions", "1", "0.5")
    assert [r["fitness_token_fraction"] for r in runs] == [1.0, 0.5]
    # the same images forwarded, on fewer tokens each
    assert runs[0]["search_images_forwarded"] == runs[1]["search_images_forwarded"]
    assert "(0.5 of the tokens)" in script.summary_line("tiny", runs[1])
    assert "of the tokens" not in script.summary_line("tiny", runs[0])
