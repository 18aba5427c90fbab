"""Multi-process ranking through accelerate: 2 CPU processes (gloo) rank exactly as 1 process does.

The module is also the worker: ``accelerate launch ... tests/test_distributed.py OUT`` runs every scenario on each
process and writes each process's rankings to ``OUT``; the tests run the same scenarios in this process and compare.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit import distributed
from hf_snapvit.data import calibration
from hf_snapvit.pruning import scoring
from hf_snapvit.pruning.methods.snapvit import fitness
from hf_snapvit.data.calibration import sample_images
from hf_snapvit.data.views import MultiCropConfig
from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores

from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}
GRID = np.round(np.arange(0.05, 0.601, 0.05), 2)
# Odd sizes, so the processes get unequal shares of gradient steps and of each generation's 10 candidates.
TINY = dict(num_gradient_images=5, num_fitness_images=6, max_generations=2, max_evaluations=None,
            fitness_sparsities=(0.1, 0.3), pca_components=8)


def labelled_table(n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"image": images(n), "label": [i % 5 for i in range(n)]}).cast_column(
        "image", datasets.Image())


def scenarios() -> dict:
    """name -> () -> ElasticRanking; each builds its own model and data, identically on every process."""

    def snapvit(data, **overrides):
        def run():
            pruner = hs.SnapViTPruner(hs.SnapViTConfig(**{**TINY, **overrides}))
            return pruner.fit(CASE["vit"].build(), data(), processor=PROCESSOR, show_progress=False)
        return run

    return {
        # Per-image steps (the fast preset's OBD scores) from a list of PIL images.
        "snapvit-obd": snapvit(lambda: images(20), scores=ScoreConfig(
            definition="obd", crops=MultiCropConfig(num_local=2, local_size=16))),
        # Batches of 2 (3 steps for 5 images) from a stream with 2 shards: split_dataset_by_node's "auto" strategy
        # would assign shards here; the "examples" strategy keeps the one-process sample.
        "snapvit-accumulated-stream": snapvit(
            lambda: labelled_table(20).to_iterable_dataset(num_shards=2),
            scores=ScoreConfig(definition="accumulated", batch_size=2, crops=MultiCropConfig(num_local=2))),
        # Steps of 16 over 40 images (16, 16, 8): process 0 takes steps 0 and 2, process 1 step 1.
        "snip": lambda: hs.rank(CASE["vit"].build(), method="snip", data=labelled_table(40), processor=PROCESSOR,
                                preset="fast", show_progress=False),
        # Labels travel with each process's steps of a stream.
        "taylor-ce-stream": lambda: hs.rank(CASE["vit-cls"].build(), method="taylor-ce",
                                            data=labelled_table(40).to_iterable_dataset(num_shards=3),
                                            processor=PROCESSOR, preset="fast", show_progress=False),
        "magnitude": lambda: hs.rank(CASE["vit"].build(), method="magnitude"),
    }


class Counters:
    """Counts the gradient steps and candidate evaluations this process computes, to show the work is split."""

    def __init__(self) -> None:
        self.steps = self.evaluations = 0
        self._batch_loss, self._similarities = scoring._batch_loss, fitness.EmbeddingFitness.similarities

    def __enter__(self) -> "Counters":
        def batch_loss(*args, **kwargs):
            self.steps += 1
            return self._batch_loss(*args, **kwargs)

        def similarities(fit, ranking, *args):  # one candidate evaluation, whether one process or several ask for it
            self.evaluations += 1
            return self._similarities(fit, ranking, *args)

        scoring._batch_loss, fitness.EmbeddingFitness.similarities = batch_loss, similarities
        return self

    def __exit__(self, *exc) -> None:
        scoring._batch_loss, fitness.EmbeddingFitness.similarities = self._batch_loss, self._similarities


def run_scenarios(out: Path, rank: int) -> None:
    """Rank every scenario with 1 thread and write ``{name}.rank{rank}.npz`` and ``{name}.rank{rank}.json``."""
    torch.set_num_threads(1)  # the same float arithmetic in every process, and in the reference
    out.mkdir(parents=True, exist_ok=True)
    for name, run in scenarios().items():
        with Counters() as counts:
            ranking = run()
        keep = [ranking.keep_counts(min(s, ranking.max_sparsity)) for s in GRID]
        np.savez(out / f"{name}.rank{rank}.npz", heads=ranking.head_scores, neurons=ranking.neuron_scores,
                 keep_heads=np.array([k.heads for k in keep]), keep_neurons=np.array([k.neurons for k in keep]))
        state = distributed.process_state()
        (out / f"{name}.rank{rank}.json").write_text(json.dumps({
            "steps": counts.steps, "evaluations": counts.evaluations, "num_processes": state.num_processes,
            "backend": state.backend, "search": ranking.provenance.get("search"),
            "calibration": ranking.provenance.get("calibration_data"),
        }))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load(out: Path, name: str, rank: int) -> tuple[dict, dict]:
    with np.load(out / f"{name}.rank{rank}.npz") as arrays:
        return dict(arrays), json.loads((out / f"{name}.rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every scenario ranked by 2 launched processes and, as the reference, by this single process."""
    two = tmp_path_factory.mktemp("two")
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", PYTHONWARNINGS="ignore")
    # On a CPU-only machine "--multi_gpu" is what makes accelerate start N processes (torchrun); hf_snapvit then
    # joins them over gloo (distributed.process_state).
    command = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
               __file__, str(two)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    one = tmp_path_factory.mktemp("one")
    threads = torch.get_num_threads()
    try:
        run_scenarios(one, 0)
    finally:
        torch.set_num_threads(threads)
    return {"one": one, "two": two}


@pytest.mark.slow  # launches two accelerate processes
@pytest.mark.parametrize("name", list(scenarios()))
def test_two_processes_rank_like_one(runs, name):
    reference, ref_info = _load(runs["one"], name, 0)
    for rank in (0, 1):
        got, info = _load(runs["two"], name, rank)
        assert info["num_processes"] == 2 and info["backend"] == "gloo"
        np.testing.assert_array_equal(got["keep_heads"], reference["keep_heads"])
        np.testing.assert_array_equal(got["keep_neurons"], reference["keep_neurons"])
        np.testing.assert_allclose(got["heads"], reference["heads"], rtol=1e-9, atol=0)
        np.testing.assert_allclose(got["neurons"], reference["neurons"], rtol=1e-9, atol=0)
        assert info["search"] == ref_info["search"]  # same fitness values, so the same xNES path and best loss
        assert info["calibration"] == ref_info["calibration"]
    assert ref_info["num_processes"] == 1
    # Every process holds the same ranking, bit for bit.
    zero, one = _load(runs["two"], name, 0)[0], _load(runs["two"], name, 1)[0]
    assert all(np.array_equal(zero[k], one[k]) for k in zero)


@pytest.mark.slow  # launches two accelerate processes
@pytest.mark.parametrize("name", ["snapvit-obd", "snapvit-accumulated-stream", "snip", "taylor-ce-stream"])
def test_the_work_is_split_between_the_processes(runs, name):
    _, reference = _load(runs["one"], name, 0)
    shares = [_load(runs["two"], name, rank)[1] for rank in (0, 1)]
    for key in ("steps", "evaluations"):
        assert sum(share[key] for share in shares) == reference[key]
        if reference[key] > 1:
            assert all(0 < share[key] < reference[key] for share in shares), (key, shares)
    if name.startswith("snapvit"):
        # 2 generations of 4 + ⌊3 ln 10⌋ candidates, then the search's mean (the result) for its own loss
        assert reference["evaluations"] == 2 * 10 + 1


def test_one_process_draws_the_whole_sample():
    table = labelled_table(12)
    gradient, fitness_images, description, _ = calibration.draw_calibration(
        table.to_iterable_dataset(), 4, 5, seed=2)
    reference, _ = sample_images(table.to_iterable_dataset(), 9, seed=2)
    assert [x.tobytes() for x in gradient + fitness_images] == [x.tobytes() for x in reference]
    assert description["num_gradient"] == 4 and description["num_fitness"] == 5


def test_scores_of_disjoint_step_shares_add_up_to_the_whole():
    """Per-image squared gradients are additive: two processes' shares, each in any order, sum to the whole sample's
    scores, which needs an image's crops to depend on (seed, index) only, not on what was processed before it."""
    model = CASE["vit"].build()
    config = ScoreConfig(definition="fisher", batch_size=1, crops=MultiCropConfig(num_global=2, num_local=1))
    pictures = images(5)
    whole = gradient_scores(model, pictures, PROCESSOR, config, seed=4, show_progress=False)
    steps = [(i, pictures[i:i + 1], None) for i in range(5)]
    shares = (steps[1::2][::-1], steps[0::2])
    parts = [gradient_scores(model, calibration.GradientSteps(share, 5, 1), PROCESSOR, config, seed=4,
                             show_progress=False) for share in shares]
    for unit in (0, 1):
        np.testing.assert_allclose(parts[0][unit] + parts[1][unit], whole[unit], rtol=1e-12, atol=0)
        assert np.all(parts[0][unit] < whole[unit])
    other_seed = gradient_scores(model, pictures, PROCESSOR, config, seed=5, show_progress=False)
    assert not np.allclose(other_seed[1], whole[1], rtol=1e-6)
    with pytest.raises(hs.SnapViTError, match="drawn with 1 images per step"):
        gradient_scores(model, calibration.GradientSteps(steps, 5, 1), PROCESSOR,
                        ScoreConfig(definition="accumulated", batch_size=2), show_progress=False)


def test_mixed_precision_comes_from_the_accelerate_configuration(monkeypatch):
    from accelerate.state import AcceleratorState

    monkeypatch.setattr(AcceleratorState, "_shared_state", {})  # as in a fresh launched process: no Accelerator yet
    model = CASE["vit"].build()
    dtypes: list[torch.dtype] = []
    model.layers[0].mlp.fc1.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    pixels = torch.randn(3, 3, 32, 32)
    config = ScoreConfig(crops=MultiCropConfig(num_global=2, num_local=0))
    full = gradient_scores(model, pixels, None, config, show_progress=False)
    full_fit = fitness.EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4)
    assert set(dtypes) == {torch.float32}
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch --mixed_precision bf16` sets
    dtypes.clear()
    half = gradient_scores(model, pixels, None, config, show_progress=False)
    assert set(dtypes) == {torch.bfloat16}
    dtypes.clear()
    half_fit = fitness.EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4)
    assert set(dtypes) == {torch.bfloat16}
    assert half[1].dtype == np.float64 and not np.array_equal(half[1], full[1])
    # bf16 keeps the scores' order of magnitude and most of their ranking.
    assert np.corrcoef(np.log(half[1].ravel()), np.log(full[1].ravel()))[0, 1] > 0.9
    assert not torch.equal(half_fit.target, full_fit.target)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # gradient passes keep float32, forwards use float16
    dtypes.clear()
    gradient_scores(model, pixels, None, config, show_progress=False)
    assert set(dtypes) == {torch.float32}
    dtypes.clear()
    fitness.EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4)
    assert set(dtypes) == {torch.float16}


def test_single_process_helpers_are_identities():
    state = distributed.process_state()
    assert state.num_processes == 1
    assert distributed.local_share([1, 2, 3]) == [1, 2, 3]
    assert distributed.map_across_processes(lambda x: x * 2, [1, 2, 3]) == [2, 4, 6]
    tensors = [torch.ones(2, dtype=torch.float64)]
    assert distributed.reduce_sum(tensors)[0] is tensors[0]
    with pytest.raises(ValueError, match="boom"):
        distributed.raise_if_failed_anywhere(ValueError("boom"))


if __name__ == "__main__":
    run_scenarios(Path(sys.argv[1]), distributed.process_state().process_index)
    distributed.process_state().destroy_process_group()
