"""``hf-snapvit bench --latency-table``: the tables it writes beside a checkpoint (merged by key, rendered as text),
what a switchable load of that checkpoint does with them, and bad input as one error line.

Nothing here compares a time with a threshold: timings only feed the code paths, and every assertion holds for any
measured latencies."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import hf_snapvit
from hf_snapvit.cli import main as cli_main
from hf_snapvit.loading.latency_table import LATENCY_FILE, LatencyTable, device_name, read_latency_file


@pytest.fixture
def writable_dir(elastic_dir, tmp_path) -> Path:
    """A copy of conftest's tiny elastic checkpoint (``vit-elastic``) that a test may write its tables into."""
    return Path(shutil.copytree(elastic_dir, tmp_path / "vit-elastic"))


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli_main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


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
