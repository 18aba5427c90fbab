"""``rotate_fitness_sparsities``: each xNES generation scores its candidates at one fitness sparsity, in turn,
checked against an xNES run fed one-sparsity fitnesses by hand, and against a search killed part-way and resumed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.data.calibration import split_calibration
from hf_snapvit.cards.sections import _settings_line
from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness
from hf_snapvit.pruning.methods.snapvit import pruner as snapvit_module
from hf_snapvit.pruning.xnes import XNES
from helpers import CASES, PROCESSOR, fit, forward_precision, images, interrupted_in_generation

CASE = {c.name: c for c in CASES}
ROTATING = dict(fitness_sparsities=(0.2, 0.5), rotate_fitness_sparsities=True)


def test_one_sparsity_alone_is_that_sparsitys_part_of_the_fitness():
    model = CASE["dinov2"].build()
    fitness = EmbeddingFitness(model, torch.randn(6, 3, 32, 32), sparsities=(0.1, 0.3, 0.5), pca_components=4)
    ranking = hs.rank(model, method="random", seed=3)
    every = fitness.similarities(ranking)
    for j, sparsity in enumerate((0.1, 0.3, 0.5)):
        assert fitness.similarities(ranking, j).tolist() == pytest.approx([every[j].item()], abs=1e-6)
        assert fitness.loss(ranking, j) == pytest.approx(1 - fitness.similarity(ranking, sparsity), abs=1e-6)
    losses = fitness.batch_loss(lambda c: hs.rank(model, method="random", seed=int(c[0])), np.array([[3.0], [4.0]]),
                                sparsity_index=2)
    assert losses[0] == pytest.approx(1 - every[2].item(), abs=1e-6) and losses[0] != losses[1]


def test_each_generation_is_scored_at_the_next_sparsity_in_turn():
    model = CASE["vit"].build()
    pruner, ranking = fit(model, seed=1, max_generations=3, **ROTATING)
    assert ranking.provenance["settings"]["rotate_fitness_sparsities"] is True
    assert ranking.provenance["preset"] is None
    # An xNES run fed the 20 % fitness, then the 50 % one, then the 20 % one again reaches every recorded mean.
    split = split_calibration(images(12), 3, 6, seed=1)
    pixels = PROCESSOR(images=split.fitness, return_tensors="pt")["pixel_values"]
    alone = {s: EmbeddingFitness(model, pixels, sparsities=(s,), pca_components=8,
                                 precision=forward_precision(ranking)) for s in (0.2, 0.5)}
    search = XNES(pruner.initial_factors_, sigma=0.5, seed=1)
    for record, sparsity in zip(pruner.history_, (0.2, 0.5, 0.2), strict=True):
        candidates = search.ask()
        losses = alone[sparsity].batch_loss(pruner.ranking_from_factors, candidates)
        assert record["mean_fitness"] == pytest.approx(float(np.mean(losses)), abs=1e-6)
        search.tell(candidates, losses)
        assert np.allclose(search.mean, record["mean_factors"], rtol=0, atol=1e-9)
    # Not the search at either sparsity alone; the result's recorded loss is over both sparsities.
    for sparsity in (0.2, 0.5):
        other, _ = fit(model, seed=1, max_generations=3, fitness_sparsities=(sparsity,))
        assert not np.allclose(other.history_[-1]["mean_factors"], pruner.history_[-1]["mean_factors"])
    both = EmbeddingFitness(model, pixels, sparsities=(0.2, 0.5), pca_components=8,
                            precision=forward_precision(ranking))
    assert both.loss(ranking) == pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
    assert "fitness at 20 / 50 % sparsity, one per generation in turn" in _settings_line(ranking.provenance["settings"])


def test_a_resumed_rotating_search_goes_on_at_the_sparsity_it_was_due(tmp_path, monkeypatch):
    model = CASE["vit"].build()
    _, full = fit(model, seed=2, max_generations=3, fitness_sparsities=(0.1, 0.3, 0.5), rotate_fitness_sparsities=True)
    settings = dict(seed=2, max_generations=3, fitness_sparsities=(0.1, 0.3, 0.5), rotate_fitness_sparsities=True,
                    checkpoint_every=1, output_dir=str(tmp_path))
    with monkeypatch.context() as patch:
        patch.setattr(snapvit_module.EmbeddingFitness, "batch_loss", interrupted_in_generation(3))
        with pytest.raises(KeyboardInterrupt):
            fit(model, **settings)
    pruner, resumed = fit(model, **settings)
    assert pruner.resumed_from_ == 2
    assert np.array_equal(resumed.head_scores, full.head_scores)
    assert np.array_equal(resumed.neuron_scores, full.neuron_scores)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"rotate_fitness_sparsities": 1}, r"rotate_fitness_sparsities=1\): give True or False"),
    ({"split_fitness_images": True}, r"split_fitness_images=True\): both cut .* choose one"),
    ({"solution": "best"}, r"solution='best'\): the best candidate would compare .* use solution='mean'"),
    ({"early_stopping_patience": 2}, r"early_stopping_patience=2\): a stall .* use early_stopping_patience=None"),
])
def test_rotation_refuses_what_would_compare_losses_at_different_sparsities(overrides, message):
    with pytest.raises(hs.SnapViTError, match=message):
        hs.SnapViTConfig(**{"rotate_fitness_sparsities": True, **overrides})
