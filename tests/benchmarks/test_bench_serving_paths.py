"""benchmarks/serving_paths.py runs as is on a CPU with a tiny model (the GPU run uses the same code): each path's
dense and sliced models timed beside the eager dense anchor, the fastest dense path per batch, each size against it."""

from __future__ import annotations

import json

from helpers import load_benchmark


def test_every_path_is_timed_beside_the_eager_anchor_and_sizes_are_read_against_the_fastest_dense(tmp_path):
    script = load_benchmark("serving_paths")
    output = tmp_path / "serving.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--backend", "aot_eager", "--paths", "eager",
                        "compile-unpadded", "graphs-unpadded", "--path-batch-sizes", "compile-unpadded=2",
                        "--batch-sizes", "1", "2", "--sparsities", "0.5", "--repeats", "1", "--warmup", "1",
                        "--profile", "--switchable", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    runs = {(run["path"], run.get("model")): run for run in report["runs"]}
    assert "CUDA" in runs["graphs-unpadded", None]["skipped"]  # no CUDA graphs on a CPU, and it says so
    assert runs["compile-unpadded", None]["batch_sizes"] == [2] and runs["eager", None]["batch_sizes"] == [1, 2]
    assert runs["compile-unpadded", None]["settings"]["attention"] == "sdpa_unpadded"
    for name in ("eager", "compile-unpadded"):
        run = runs[name, None]
        dense, sliced = run["rows"]
        assert dense["model"] == "dense" and sliced["model"] == "sliced" and sliced["gflop_ratio"] > 1.5
        for batch, entry in dense["latency"].items():
            anchor = run["anchor_latency"][batch]["median_ms"]
            assert abs(dense["to_eager_dense"][batch] - anchor / entry["median_ms"]) < 1e-9
        assert run["profile"]["kinds"]["gemm"]["ms"] > 0  # the profiled forwards saw the matmuls
    # The summary: per batch, the fastest dense path of those that ran that batch, and each size against it.
    for batch, cell in report["summary"]["tiny"].items():
        candidates = {name: runs[name, None]["rows"][0]["latency"].get(batch) for name in
                      ("eager", "compile-unpadded")}
        times = {name: entry["median_ms"] for name, entry in candidates.items() if entry}
        assert cell["fastest_dense"]["ms"] == min(times.values()) and cell["fastest_dense"]["path"] in times
        (size,) = cell["sizes"]
        assert abs(size["speedup"] - cell["fastest_dense"]["ms"] / size["ms"]) < 1e-9
        assert abs(size["efficiency"] - size["speedup"] / size["gflop_ratio"]) < 1e-9
    switchable = runs["eager", "switchable"]["rows"]
    assert [row["requested_sparsity"] for row in switchable] == [0.5] and switchable[0]["theoretical_speedup"] > 1.5
