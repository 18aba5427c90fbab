"""benchmarks/bench_gpu_latency.py runs as is on a CPU with a tiny model (the GPU run uses the same code)."""

from __future__ import annotations

import json

from helpers import load_benchmark


def test_the_width_benchmark_measures_every_precision_multiple_and_sparsity_side_by_side(tmp_path):
    script = load_benchmark("bench_gpu_latency")
    output = tmp_path / "latency.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--precisions", "fp32", "bf16", "--multiples", "1",
                        "64", "--sparsities", "0.3", "0.6", "--batch-sizes", "1", "2", "--repeats", "1",
                        "--warmup", "0", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["hardware"]["device"] == "cpu" and "torch" in json.dumps(report["hardware"])
    runs = {(r["precision"], r["width_multiple"]): r for r in report["runs"]}
    assert set(runs) == {("fp32", 1), ("fp32", 64), ("bf16", 1), ("bf16", 64)}
    for (precision, multiple), run in runs.items():
        # 0.6 is beyond the floors once widths are multiples of 64 (the floor rounds up to 64 of 256 neurons).
        assert [r["requested_sparsity"] for r in run["rows"]] == ([0.3, 0.6] if multiple == 1 else [0.3])
        assert run["skipped_sparsities"] == ([] if multiple == 1 else [0.6])
        for row in run["rows"]:
            assert all(n == 256 or n % multiple == 0 for n in row["neurons"])
            assert set(row["speedup"]) == {"1", "2"} and row["theoretical_speedup"] > 1.0
            for batch, speedup in row["speedup"].items():
                dense = run["dense"]["latency"][batch]["median_ms"]
                assert abs(speedup - dense / row["latency"][batch]["median_ms"]) < 1e-9
