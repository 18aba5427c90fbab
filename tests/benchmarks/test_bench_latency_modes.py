"""What the GPU latency scripts build on, on a CPU with a tiny model (``_harness.build``, the paths and the switchable
model of ``serving_paths.py``): compiled sliced and switchable models give the eager outputs, compiled paths warm up
before they are timed, compiled graphs get room."""

from __future__ import annotations

import pytest
import torch

from helpers import load_benchmark


@pytest.mark.slow
def test_compiled_sliced_and_switchable_models_give_the_eager_outputs(tmp_path):
    harness, serving = load_benchmark("_harness"), load_benchmark("serving_paths")
    from hf_snapvit.benchmark import sliced_copy

    import hf_snapvit

    model = harness.build("tiny", 0)
    ranking = hf_snapvit.rank(model, method="magnitude", seed=0, show_progress=False)
    pixels = torch.randn(2, 3, 32, 32)
    sliced = sliced_copy(model, ranking, 0.5, width_multiple=1)
    hf_snapvit.save_elastic(model, ranking, tmp_path, model_card=False)
    switchable = serving.load_switchable(tmp_path, torch.float32, "cpu")
    switchable.set_budget(sparsity=0.5, width_multiple=1)
    torch._dynamo.reset()
    with torch.inference_mode():
        for candidate in (sliced, switchable):
            expected = candidate(pixel_values=pixels).last_hidden_state
            # fullgraph: no graph break in the sliced model or behind the switchable model's gate.
            compiled = torch.compile(candidate, backend="inductor", fullgraph=True, dynamic=False)
            torch.testing.assert_close(compiled(pixel_values=pixels).last_hidden_state, expected, atol=1e-4, rtol=0)
    torch._dynamo.reset()


def test_compiled_paths_wait_to_compile_and_record_before_they_are_timed():
    serving = load_benchmark("serving_paths")
    assert serving.compile_waits(serving.PATHS["eager"], 0) == 0
    assert serving.compile_waits(serving.PATHS["compile"], 0) == 1  # the first call compiles
    assert serving.compile_waits(serving.PATHS["graphs"], 0) == 3  # CUDA graph trees record after a second run
    assert serving.compile_waits(serving.PATHS["graphs"], 5) == 5
    assert serving.PATHS["graphs"].cuda_only and not serving.PATHS["max-autotune"].cuda_only


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
