"""benchmarks/bench_gpu_latency.py runs as is on a CPU with a tiny model (the GPU run uses the same code): every
precision, mode, multiple and sparsity side by side with the dense model, the switchable model's rows, the plot."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from helpers import load_benchmark

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _run(tmp_path, *arguments: str) -> dict:
    script = load_benchmark("bench_gpu_latency")
    output = tmp_path / "latency.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--batch-sizes", "1", "2", "--repeats", "1",
                        "--warmup", "0", "--output", str(output), *arguments]) == 0
    report = json.loads(output.read_text())
    assert report["hardware"]["device"] == "cpu" and "torch" in json.dumps(report["hardware"])
    assert (tmp_path / "latency.png").exists() == HAS_MATPLOTLIB  # the plot is written beside the JSON
    return report


def _check_speedups(run: dict, row: dict) -> None:
    """Speedups are dense median / model median of the rotation the row was timed in, next to the GFLOP ratio."""
    dense = row.get("dense_latency", run["dense"]["latency"])
    assert set(row["speedup"]) == {"1", "2"} and row["theoretical_speedup"] > 1.0
    for batch, speedup in row["speedup"].items():
        assert speedup > 0 and abs(speedup - dense[batch]["median_ms"] / row["latency"][batch]["median_ms"]) < 1e-9
        assert abs(row["efficiency"][batch] - speedup / row["theoretical_speedup"]) < 1e-9


def test_the_width_benchmark_measures_every_precision_multiple_and_sparsity_side_by_side(tmp_path):
    report = _run(tmp_path, "--precisions", "fp32", "bf16", "--modes", "eager", "--multiples", "1", "64",
                  "--sparsities", "0.3", "0.6")
    runs = {(r["precision"], r["mode"], r["width_multiple"]): r for r in report["runs"]}
    assert set(runs) == {(p, "eager", m) for p in ("fp32", "bf16") for m in (1, 64)}
    for (precision, _, multiple), run in runs.items():
        # 0.6 is beyond the floors once widths are multiples of 64 (the floor rounds up to 64 of 256 neurons).
        kept = [0.3, 0.6] if multiple == 1 else [0.3]
        assert run["skipped_sparsities"] == ([] if multiple == 1 else [0.6])
        for model in ("sliced", "switchable"):
            rows = [r for r in run["rows"] if r["model"] == model]
            assert [r["requested_sparsity"] for r in rows] == kept
            for row in rows:
                assert all(n == 256 or n % multiple == 0 for n in row["neurons"])
                assert abs(row["sparsity"] - row["requested_sparsity"]) < 0.05
                _check_speedups(run, row)


@pytest.mark.slow
def test_compiled_runs_time_compiled_models_and_cuda_graphs_are_skipped_on_a_cpu(tmp_path):
    # 0.3 and 0.5 make 3 models x 2 batch sizes, plus 2 switchable sizes x 2: more graphs than dynamo keeps per
    # function, which would silently run the rest eagerly. The limit is lowered from its default (8) to 2 so that
    # fewer inductor compilations (seconds each on a CPU) exceed it; the benchmark adds its room to whatever it is.
    from hf_snapvit.benchmark.latency import recompile_limit_settings

    limit, _ = recompile_limit_settings()
    with torch._dynamo.config.patch(**{limit: 2}):
        report = _run(tmp_path, "--precisions", "fp32", "--modes", "eager", "compile", "compile-graphs",
                      "--multiples", "1", "--sparsities", "0.3", "0.5")
    runs = {r["mode"]: r for r in report["runs"]}
    assert set(runs) == {"eager", "compile", "compile-graphs"}
    assert "CUDA" in runs["compile-graphs"]["skipped"] and runs["compile-graphs"]["rows"] == []
    compiled = runs["compile"]
    assert "error" not in compiled, compiled.get("error")
    assert compiled["compile_options"] == {"backend": "inductor", "mode": "default"} and compiled["warmup"] >= 1
    assert compiled["graphs_compiled"] >= (3 + 2) * 2
    for run in (runs["eager"], compiled):
        for model in ("sliced", "switchable"):
            rows = [r for r in run["rows"] if r["model"] == model]
            assert [r["requested_sparsity"] for r in rows] == [0.3, 0.5], rows
            for row in rows:
                assert "error" not in row, row["error"]
                _check_speedups(run, row)


@pytest.mark.slow
def test_compiled_sliced_and_switchable_models_give_the_eager_outputs(tmp_path):
    script = load_benchmark("bench_gpu_latency")
    modes = load_benchmark("_latency_modes")
    from hf_snapvit.benchmark import sliced_copy

    import hf_snapvit

    model = script.build("tiny", 0)
    ranking = hf_snapvit.rank(model, method="magnitude", seed=0, show_progress=False)
    pixels = torch.randn(2, 3, 32, 32)
    sliced = sliced_copy(model, ranking, 0.5, width_multiple=1)
    with modes.elastic_checkpoint(model, ranking) as folder:
        switchable = modes.load_switchable(folder, torch.float32, "cpu")
    switchable.set_budget(sparsity=0.5, width_multiple=1)
    torch._dynamo.reset()
    with torch.inference_mode():
        for candidate in (sliced, switchable):
            expected = candidate(pixel_values=pixels).last_hidden_state
            # fullgraph: no graph break in the sliced model or behind the switchable model's gate.
            compiled = torch.compile(candidate, backend="inductor", fullgraph=True, dynamic=False)
            torch.testing.assert_close(compiled(pixel_values=pixels).last_hidden_state, expected, atol=1e-4, rtol=0)
    torch._dynamo.reset()


def test_modes_compile_the_same_way_and_cuda_graphs_need_cuda():
    modes = load_benchmark("_latency_modes")
    assert modes.compile_options("eager") is None
    assert modes.compile_options("compile") == {"backend": "inductor", "mode": "default"}
    assert modes.compile_options("compile", "max-autotune")["mode"] == "max-autotune"
    assert modes.compile_options("compile-graphs") == {"backend": "inductor", "mode": "reduce-overhead"}
    assert "CUDA graphs" in modes.skip_reason("compile-graphs", "cpu")
    assert modes.skip_reason("compile-graphs", "cuda:0") is None and modes.skip_reason("compile", "cpu") is None
    with pytest.raises(ValueError, match="bf16-compile"):
        modes.compile_options("bf16-compile")


def test_compiled_graph_room_keeps_more_graphs_and_fails_rather_than_running_eagerly():
    from hf_snapvit.benchmark.latency import compiled_graph_room

    double = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
    torch._dynamo.reset()
    with compiled_graph_room(12):
        for size in range(1, 13):  # 12 shapes: past dynamo's default 8 graphs per function
            assert torch.equal(double(torch.ones(size)), torch.full((size,), 2.0))
    torch._dynamo.reset()
    with compiled_graph_room(0), pytest.raises(Exception, match="recompile|cache"):
        for size in range(1, 40):
            double(torch.ones(size))
    torch._dynamo.reset()
