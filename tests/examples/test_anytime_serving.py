"""examples/anytime_serving.py end to end on a tiny random ViT, and ``hf-snapvit bench --latency-table``: the tables
it writes beside a checkpoint, what a switchable load of that checkpoint does with them, and bad input.

Nothing here compares a time with a threshold: timings only feed the code paths, and every assertion holds for any
measured latencies."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

import hf_snapvit
from hf_snapvit.cli import main as cli_main
from hf_snapvit.loading.latency_table import LATENCY_FILE, LatencyTable, device_name, read_latency_file

from helpers import PROCESSOR, tiny_vit_classifier

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


@pytest.fixture(scope="module")
def elastic_dir(tmp_path_factory) -> Path:
    """A tiny elastic checkpoint (magnitude ranking), shared read-only: tests that write copy it first."""
    folder = tmp_path_factory.mktemp("elastic") / "vit-elastic"
    model = tiny_vit_classifier()
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), folder, image_processor=PROCESSOR,
                            model_card=False)
    return folder


@pytest.fixture
def writable_dir(elastic_dir, tmp_path) -> Path:
    return Path(shutil.copytree(elastic_dir, tmp_path / "vit-elastic"))


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------ the anytime example
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


# ------------------------------------------------------------------------------------ bench --latency-table
def test_bench_latency_table_writes_tables_that_a_switchable_load_uses(writable_dir, capsys):
    code, out, err = cli(capsys, "bench", writable_dir, "--latency-table", "--batch-sizes", "1", "3", "--repeats",
                         "2", "--warmup", "0", "--json", "-q")
    assert code == 0, err
    result = json.loads(out)
    written = read_latency_file(writable_dir / LATENCY_FILE)
    assert sorted(t.batch_size for t in written) == [1, 3]
    assert {(t.device, t.dtype) for t in written} == {(device_name("cpu"), "float32")}
    assert [LatencyTable.from_dict(t) for t in result["tables"]] == written
    assert sorted(k[2] for k in result["measured"]) == [1, 3]
    assert result["latency_file"] == f"vit-elastic/{LATENCY_FILE}" and str(writable_dir.parent) not in out

    model = hf_snapvit.ElasticViTModel.from_pretrained(writable_dir, switchable=True)
    assert sorted(t.batch_size for t in model.elastic_latency_tables) == [1, 3]
    table = next(t for t in model.elastic_latency_tables if t.batch_size == 3)
    target = table.latency_at(table.sparsities[len(table.sparsities) // 2])  # within the table's range
    budget = model.set_budget(latency_ms=target, batch_size=3)
    assert budget.requested == {"latency_ms": target, "batch_size": 3}
    assert 0.0 <= budget.sparsity <= model.max_sparsity()
    assert budget.predicted_latency_ms == pytest.approx(table.latency_at(budget.sparsity))
    with pytest.raises(hf_snapvit.BudgetError, match="batch_size"):  # two batch sizes measured: say which
        model.set_budget(latency_ms=target)


def test_bench_latency_table_merges_by_key_and_renders_a_table(writable_dir, tmp_path, capsys):
    code, _, err = cli(capsys, "bench", writable_dir, "--latency-table", "--batch-sizes", "1", "--repeats", "1",
                       "--warmup", "0", "-q")
    assert code == 0, err
    output = tmp_path / "tables.json"
    code, out, err = cli(capsys, "bench", writable_dir, "--latency-table", "--batch-sizes", "1", "2", "--dtype",
                         "bfloat16", "--sparsities", "0.2", "0.4", "--repeats", "1", "--warmup", "0", "--output",
                         output, "-q")
    assert code == 0, err
    tables = read_latency_file(writable_dir / LATENCY_FILE)
    assert sorted((t.dtype, t.batch_size) for t in tables) == [("bfloat16", 1), ("bfloat16", 2), ("float32", 1)]
    assert read_latency_file(output) == tables  # --output is a valid elastic_latency.json with every table
    bf16 = [t for t in tables if t.dtype == "bfloat16"]
    assert all(t.sparsities[0] == 0.0 and len(t.sparsities) == 3 for t in bf16)  # dense is always measured
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("sparsity"))
    assert header.split() == ["sparsity", "GFLOPs", "batch", "1", "batch", "2"]
    rows = lines[lines.index(header) + 1:lines.index(header) + 4]
    assert [float(r.split()[0]) for r in rows] == pytest.approx(list(bf16[0].sparsities), abs=5e-4)
    assert "bfloat16" in out and "1 kept from before" in out and str(output) in out

    model = hf_snapvit.ElasticViTModel.from_pretrained(writable_dir, switchable=True, dtype=torch.bfloat16)
    table = next(t for t in bf16 if t.batch_size == 2)
    budget = model.set_budget(latency_ms=table.latency_at(table.sparsities[-1]), batch_size=2)
    assert math.isfinite(budget.predicted_latency_ms) and budget.requested["batch_size"] == 2


@pytest.mark.parametrize("argv, needles", [
    (["{elastic}", "--latency-table", "--dtype", "int8"], ["--dtype", "invalid choice", "bfloat16"]),
    (["{elastic}", "--dtype", "bfloat16"], ["--dtype", "only to --latency-table"]),
    (["{elastic}", "--latency-table", "--no-latency"], ["--no-latency"]),
    (["{elastic}", "--latency-table", "--device", "nope"], ["--device 'nope'"]),
    (["{elastic}", "--latency-table", "--warmup", "-1"], ["--warmup"]),
    (["{elastic}", "--latency-table", "--batch-sizes", "1", "--sparsities", "0.9"], ["out of range"]),
    (["my-org/vit-elastic", "--latency-table"], ["is no folder here", "looked up on the Hub"]),
    (["./no/such/folder", "--latency-table"], ["no such folder"]),
])
def test_bench_latency_table_bad_input_is_one_error_line(argv, needles, elastic_dir, capsys):
    code, out, err = cli(capsys, "bench", *[str(elastic_dir) if a == "{elastic}" else a for a in argv], "-q")
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and out == ""
    assert lines and lines[-1].startswith("error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[-1], lines[-1]
    assert not (elastic_dir / LATENCY_FILE).exists()
