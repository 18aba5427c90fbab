"""Multi-process ranking through accelerate: 2 CPU processes (gloo) rank exactly as 1 process does.

The scenarios are tests/launched.py's ``rankings``: the session's launch of 2 processes runs every one and writes each
process's rankings, and its one-process reference run does the same; the tests compare.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.utils import distributed
from hf_snapvit.data import calibration
from hf_snapvit.pruning.methods.snapvit import fitness
from hf_snapvit.data.calibration import sample_images
from hf_snapvit.data.views import MultiCropConfig
from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores

from helpers import CASES, PROCESSOR, images
from launched import labelled_table, scenarios

CASE = {c.name: c for c in CASES}


def _load(out: Path, name: str, rank: int) -> tuple[dict, dict]:
    with np.load(out / f"{name}.rank{rank}.npz") as arrays:
        return dict(arrays), json.loads((out / f"{name}.rank{rank}.json").read_text())


@pytest.mark.slow  # reads the session's launch of two accelerate processes
@pytest.mark.launched("rankings")
@pytest.mark.parametrize("name", list(scenarios()))
def test_two_processes_rank_like_one(launched, name):
    reference, ref_info = _load(launched.one, name, 0)
    for rank in (0, 1):
        got, info = _load(launched.two, name, rank)
        assert info["num_processes"] == 2 and info["backend"] == "gloo"
        np.testing.assert_array_equal(got["keep_heads"], reference["keep_heads"])
        np.testing.assert_array_equal(got["keep_neurons"], reference["keep_neurons"])
        np.testing.assert_allclose(got["heads"], reference["heads"], rtol=1e-9, atol=0)
        np.testing.assert_allclose(got["neurons"], reference["neurons"], rtol=1e-9, atol=0)
        assert info["search"] == ref_info["search"]  # same fitness values, so the same xNES path and best loss
        assert info["calibration"] == ref_info["calibration"]
    assert ref_info["num_processes"] == 1
    # Every process holds the same ranking, bit for bit.
    zero, one = _load(launched.two, name, 0)[0], _load(launched.two, name, 1)[0]
    assert all(np.array_equal(zero[k], one[k]) for k in zero)


@pytest.mark.slow  # reads the session's launch of two accelerate processes
@pytest.mark.launched("rankings")
@pytest.mark.parametrize("name", ["snapvit-obd", "snapvit-accumulated-stream", "snip", "taylor-ce-stream"])
def test_the_work_is_split_between_the_processes(launched, name):
    _, reference = _load(launched.one, name, 0)
    shares = [_load(launched.two, name, rank)[1] for rank in (0, 1)]
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


def test_mixed_precision_comes_from_the_accelerate_configuration(no_accelerator):
    monkeypatch = no_accelerator  # as in a fresh launched process: no Accelerator yet
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

