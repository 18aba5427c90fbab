"""examples/anytime_serving.py end to end on a tiny random ViT: the simulated stream's records agree with each
other and with the latency table the example measured, a given checkpoint is served against a fixed size and left as
it was, and bad options exit with a message.

Nothing here compares a time with a threshold: timings only feed the code paths, and every assertion holds for any
measured latencies."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

import hf_snapvit
from hf_snapvit.loading.latency_table import LatencyTable

ROOT = Path(__file__).resolve().parents[2]


def load_example():
    """examples/anytime_serving.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("anytime_serving", ROOT / "examples" / "anytime_serving.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["anytime_serving"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load_example()


def check_run(run: dict, deadline_ms: float, max_sparsity: float, num_batches: int) -> None:
    """Counts and per-batch records of one simulated run agree with each other."""
    summary, batches = run["summary"], run["batches"]
    assert summary["batches"] == len(batches) == num_batches
    assert 0 <= summary["misses"] <= summary["batches"]
    assert summary["misses"] == sum(b["missed"] for b in batches)
    assert summary["miss_rate"] == pytest.approx(summary["misses"] / summary["batches"])
    assert 0 <= summary["fallbacks"] <= summary["batches"]
    assert summary["fallbacks"] == sum(b["fallback"] for b in batches)
    assert summary["images"] == num_batches * 4 and summary["throughput_images_per_s"] > 0
    assert summary["mean_sparsity"] == pytest.approx(sum(b["sparsity"] for b in batches) / num_batches)
    assert summary["p50_latency_ms"] <= summary["p95_latency_ms"]
    assert sum(p["batches"] for p in summary["phases"].values()) == num_batches
    assert sum(p["misses"] for p in summary["phases"].values()) == summary["misses"]
    free_at = 0.0
    for b in batches:
        assert 0.0 <= b["sparsity"] <= max_sparsity + 1e-9
        assert b["queued_ms"] == pytest.approx(max(free_at - b["arrival_ms"], 0.0), abs=1e-9)
        assert b["latency_ms"] == pytest.approx(b["queued_ms"] + b["service_ms"])
        assert b["missed"] == (b["latency_ms"] > deadline_ms)
        free_at = b["finish_ms"]


def test_anytime_example_runs_end_to_end_on_a_tiny_vit(example, tmp_path, capsys):
    output = tmp_path / "serving.json"
    results = example.main(["--tiny", "--num-batches", "10", "--batch-size", "4", "--repeats", "2", "--warmup", "1",
                            "--deadline-fraction", "0.8", "--output", str(output)])
    printed = capsys.readouterr().out
    table = LatencyTable.from_dict(results["table"])
    assert table.batch_size == 4 and table.sparsities[0] == 0.0
    assert results["dense_latency_ms"] == pytest.approx(table.latency_at(0.0))
    assert results["deadline_ms"] == pytest.approx(0.8 * table.latency_at(0.0))
    top = results["max_sparsity"]
    runs = results["runs"]
    for run in runs.values():
        check_run(run, results["deadline_ms"], top, 10)
    assert [b["arrival_ms"] for b in runs["switchable"]["batches"]] == [b["arrival_ms"] for b in
                                                                       runs["fixed"]["batches"]]  # the same stream
    assert {b["sparsity"] for b in runs["fixed"]["batches"]} == {0.0} and runs["fixed"]["summary"]["fallbacks"] == 0
    # The deadline is 0.8 x the table's dense latency l0, so every batch asks set_budget for at most 0.8 l0. The
    # table's curve is non-increasing, so the sparsity it returns is at least 0.2 x its second grid point (or the
    # smallest size: a fallback), far more than the one-unit rounding of the budget: no batch runs dense.
    assert all(b["sparsity"] > 0 for b in runs["switchable"]["batches"])
    assert runs["switchable"]["summary"]["mean_sparsity"] > 0
    for b in runs["switchable"]["batches"]:
        assert b["fallback"] == (b["predicted_ms"] is None)
        assert b["fallback"] or b["predicted_ms"] == pytest.approx(table.latency_at(b["sparsity"]))
    assert json.loads(output.read_text()) == json.loads(json.dumps(results))
    assert "switchable (set_budget per batch)" in printed and "fixed (sparsity 0.00)" in printed
    assert "burst" in printed


def test_anytime_example_serves_a_given_checkpoint_against_a_fixed_size(example, elastic_dir, capsys):
    before = sorted(p.name for p in elastic_dir.iterdir())
    results = example.main(["--checkpoint", str(elastic_dir), "--fixed-sparsity", "0.3", "--num-batches", "6",
                            "--batch-size", "4", "--repeats", "1", "--warmup", "0", "--deadline-ms", "5",
                            "--headroom", "0.5", "--seed", "3"])
    capsys.readouterr()
    fixed = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, switchable=True).set_budget(sparsity=0.3)
    assert {b["sparsity"] for b in results["runs"]["fixed"]["batches"]} == {fixed.sparsity}
    for run in results["runs"].values():
        check_run(run, 5.0, results["max_sparsity"], 6)
    assert results["deadline_ms"] == 5.0 and results["checkpoint"] == "vit-elastic"
    assert sorted(p.name for p in elastic_dir.iterdir()) == before  # the table stays on the model, not the folder


@pytest.mark.parametrize("argv, needle", [
    (["--deadline-ms", "-1"], "--deadline-ms"),
    (["--num-batches", "0"], "--num-batches"),
    (["--deadline-ms", "5", "--deadline-fraction", "0.5"], "not allowed with"),
    (["--fixed-sparsity", "0.99"], "--fixed-sparsity"),
])
def test_anytime_example_bad_options_exit_with_a_message(example, argv, needle, capsys):
    with pytest.raises(SystemExit) as exit:
        example.main(["--tiny", "--num-batches", "3", *argv])
    message = capsys.readouterr().err + (exit.value.code if isinstance(exit.value.code, str) else "")
    assert needle in message and exit.value.code != 0
