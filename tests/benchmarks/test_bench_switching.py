"""The switching benchmark runs end to end on a toy ViT and records what its criteria are computed from (timings
are the benchmark's business, never asserted here)."""

from __future__ import annotations

import json
import math

import hf_snapvit as hs
from helpers import load_benchmark


def test_the_benchmark_records_storage_memory_switch_times_and_latency(tmp_path):
    bench = load_benchmark("bench_switching")
    output = tmp_path / "switching.json"
    result = bench.main(["--config", "tiny", "--repeats", "2", "--switches", "20", "--table-repeats", "1",
                         "--batch-sizes", "2", "--output", str(output)])
    assert json.loads(output.read_text()) == json.loads(json.dumps(result))
    assert output.with_suffix(".png").stat().st_size > 0
    assert result["storage"]["pointers_and_bytes_unchanged"] is True
    assert result["criteria"]["one_copy_of_the_dense_weights"] is True
    assert result["switch"]["count"] == 20 and len(result["switch"]["cold_ms"]) == 6
    row = result["latency_at_0.5"]["2"]
    assert len(row["runs_ms"]["switchable"]) == len(row["runs_ms"]["sliced"]) == 2
    assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    table = hs.LatencyTable.from_dict(result["latency_table"])
    assert table.sparsities[0] == 0.0 and table.batch_size == 2
    assert set(result["criteria"]) == {"switch_median_under_1ms", "latency_within_1.1x_of_sliced",
                                       "storage_unchanged", "one_copy_of_the_dense_weights",
                                       "peak_memory_growth_below_smallest_weight"}
