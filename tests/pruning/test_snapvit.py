"""SnapViTPruner on tiny models: wiring, determinism, fitness consistency, calibration sources and bad input."""

from __future__ import annotations

import copy
import dataclasses

import datasets
import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.data.calibration import split_calibration
from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness
from hf_snapvit.pruning.xnes import XNES
from helpers import CASES, PROCESSOR, TINY_SEARCH, fit, forward_precision, images

CASE = {c.name: c for c in CASES}


@pytest.mark.parametrize("name", ["vit", "dinov2-swiglu", "clip-vision", "deit-cls-teacher"])
def test_fit_returns_a_usable_ranking(name, tmp_path):
    model = CASE[name].build()
    pruner, ranking = fit(model)
    assert ranking.provenance["method"] == "snapvit"
    assert ranking.provenance["calibration_data"]["num_fitness"] == 6
    assert ranking.provenance["settings"]["max_generations"] == 2
    assert len(pruner.history_) == 2 and {"gradients", "search"} <= set(pruner.timings_)
    stored = hs.save_elastic(model, ranking, tmp_path / "e")
    loaded = hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.5 * stored.max_sparsity)
    assert sum(layer_widths(loaded)[1]) < ranking.shape.num_layers * ranking.shape.intermediate_size


def test_same_seed_same_ranking_bit_for_bit():
    model = CASE["vit"].build()
    _, a = fit(model, seed=3)
    _, b = fit(model, seed=3)
    _, c = fit(model, seed=4)
    assert np.array_equal(a.head_scores, b.head_scores) and np.array_equal(a.neuron_scores, b.neuron_scores)
    assert not np.array_equal(a.neuron_scores, c.neuron_scores)


def test_the_returned_rankings_fitness_loss_is_recorded_for_either_solution():
    model = CASE["vit"].build()
    split = split_calibration(images(12), 3, 6, seed=1)
    for solution in ("best", "mean"):
        pruner, ranking = fit(model, seed=1, solution=solution)
        fitness = EmbeddingFitness(model, PROCESSOR(images=split.fitness, return_tensors="pt")["pixel_values"],
                                   sparsities=(0.1, 0.3), pca_components=8, precision=forward_precision(ranking))
        search = ranking.provenance["search"]
        assert fitness.loss(ranking) == pytest.approx(search["loss"], abs=1e-6)
        assert search["best_loss"] == min(h["best_fitness"] for h in pruner.history_)
        if solution == "best":
            assert search["loss"] == search["best_loss"]
        else:  # the mean is not one of the candidates: its own loss is evaluated, not the best's copied
            assert search["loss"] != search["best_loss"]
    _, none = fit(model, seed=1, max_generations=0)
    assert none.provenance["search"]["loss"] is None and none.provenance["search"]["evaluations"] == 0


def test_each_generations_best_factors_rebuild_its_ranking():
    model = CASE["vit"].build()
    pruner, ranking = fit(model, seed=1, max_generations=3, solution="best")
    last = pruner.ranking_from_factors(pruner.history_[-1]["best_factors"])
    assert np.array_equal(last.head_scores, ranking.head_scores)
    assert np.array_equal(last.neuron_scores, ranking.neuron_scores)
    split = split_calibration(images(12), 3, 6, seed=1)
    fitness = EmbeddingFitness(model, PROCESSOR(images=split.fitness, return_tensors="pt")["pixel_values"],
                               sparsities=(0.1, 0.3), pca_components=8, precision=forward_precision(ranking))
    for record in pruner.history_:  # the best-so-far factors reproduce the best-so-far loss at every generation
        assert fitness.loss(pruner.ranking_from_factors(record["best_factors"])) == pytest.approx(
            record["best_fitness"], abs=1e-6)
    assert pruner.ranking_from_factors(pruner.initial_factors_, mode="paired").mode == "paired"


def test_the_mean_solution_is_the_search_distributions_mean_after_its_last_update():
    model = CASE["vit"].build()
    best_pruner, best = fit(model, seed=1, max_generations=3, solution="best")
    pruner, mean = fit(model, seed=1, max_generations=3)  # the default
    # The solution only picks from the search: the search and its history are the same.
    assert pruner.history_ == best_pruner.history_
    last = pruner.ranking_from_factors(pruner.history_[-1]["mean_factors"])
    assert np.array_equal(mean.head_scores, last.head_scores) and np.array_equal(mean.neuron_scores, last.neuron_scores)
    assert not np.array_equal(mean.neuron_scores, best.neuron_scores)
    assert mean.provenance["settings"]["solution"] == "mean" and best.provenance["settings"]["solution"] == "best"
    # Each recorded mean is the one an xNES run fed the same fitness reaches after that generation's update.
    split = split_calibration(images(12), 3, 6, seed=1)
    fitness = EmbeddingFitness(model, PROCESSOR(images=split.fitness, return_tensors="pt")["pixel_values"],
                               sparsities=(0.1, 0.3), pca_components=8, precision=forward_precision(mean))
    search = XNES(pruner.initial_factors_, sigma=0.5, seed=1)
    for record in pruner.history_:
        candidates = search.ask()
        search.tell(candidates, fitness.batch_loss(pruner.ranking_from_factors, candidates))
        assert np.allclose(search.mean, record["mean_factors"], rtol=0, atol=1e-9)
        assert not np.allclose(search.mean, pruner.initial_factors_)
    # Without a search both solutions are the starting factors.
    _, none = fit(model, seed=1, max_generations=0, solution="mean")
    start = pruner.ranking_from_factors(pruner.initial_factors_)
    assert np.array_equal(none.neuron_scores, start.neuron_scores)
    with pytest.raises(hs.SnapViTError, match=r"solution='median'\): solution must be one of 'best', 'mean'"):
        hs.SnapViTConfig(solution="median")


def test_a_shorter_budget_equals_the_longer_runs_history():
    """benchmarks/defaults_vit_tiny.py reads the rankings of small budgets off one long run's history."""
    model = CASE["vit"].build()
    long, _ = fit(model, seed=2, max_generations=3)
    _, short = fit(model, seed=2, max_generations=1)
    from_history = long.ranking_from_factors(long.history_[0]["mean_factors"])
    assert np.array_equal(from_history.head_scores, short.head_scores)
    assert np.array_equal(from_history.neuron_scores, short.neuron_scores)


def test_early_stopping_ends_the_search_on_its_patience_and_keeps_its_prefix():
    """A threshold no gain can pass stops the search after 1 + patience generations; what ran is the start of the
    full search, so the ranking equals a run with that budget."""
    model = CASE["vit"].build()
    pruner, stopped = fit(model, seed=2, max_generations=6, early_stopping_patience=2, early_stopping_threshold=1e9)
    assert len(pruner.history_) == 3
    assert stopped.provenance["search"] | {"best_loss": None, "loss": None} == {
        "best_loss": None, "loss": None, "evaluations": 3 * pruner.history_[0]["evaluations"], "generations": 3,
        "stopped_early": True}
    assert stopped.provenance["settings"]["early_stopping_patience"] == 2
    _, budget = fit(model, seed=2, max_generations=3)
    assert budget.provenance["search"]["stopped_early"] is False
    assert budget.provenance["search"]["loss"] == stopped.provenance["search"]["loss"]
    assert np.array_equal(stopped.head_scores, budget.head_scores)
    assert np.array_equal(stopped.neuron_scores, budget.neuron_scores)
    # threshold 0, patience 1: the first generation whose best loss is not lower than the one before is the last
    full, _ = fit(model, seed=2, max_generations=6)
    losses = [h["best_fitness"] for h in full.history_]
    last = next((g + 1 for g in range(1, 6) if not losses[g] < losses[g - 1]), 6)
    pruner, _ = fit(model, seed=2, max_generations=6, early_stopping_patience=1)
    assert [h["best_fitness"] for h in pruner.history_] == losses[:last]


def test_zero_generations_means_the_starting_factors():
    model = CASE["vit"].build()
    pruner, ranking = fit(model, seed=1, max_generations=0)
    assert pruner.history_ == [] and ranking.provenance["search"]["evaluations"] == 0
    start = pruner.ranking_from_factors(pruner.initial_factors_)
    assert np.array_equal(start.neuron_scores, ranking.neuron_scores)
    # the starting factors decrease from the first block to the last
    last_block = model.config.num_hidden_layers - 1
    assert pruner.initial_factors_[0] == pytest.approx(1.2)
    assert pruner.initial_factors_[last_block] == pytest.approx(0.8)


def test_ranking_from_factors_needs_a_fit_and_the_right_shape():
    pruner = hs.SnapViTPruner(hs.SnapViTConfig(**TINY_SEARCH))
    with pytest.raises(hs.SnapViTError, match="call fit"):
        pruner.ranking_from_factors(np.ones(3))
    pruner, _ = fit(CASE["vit"].build(), max_generations=1)
    with pytest.raises(hs.SnapViTError, match=r"factors have shape \(3,\)"):
        pruner.ranking_from_factors(np.ones(3))


def test_masked_fitness_embeddings_equal_the_sliced_model():
    model = CASE["dinov2"].build()
    pixels = torch.randn(4, 3, 32, 32)
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4)
    ranking = hs.rank(model, method="random", seed=2)
    keep = ranking.keep_indices(ranking.keep_counts(0.3))
    sliced = slice_model_(copy.deepcopy(model), keep)
    with torch.no_grad():
        expected = image_embedding(sliced, {"pixel_values": pixels})
    torch.testing.assert_close(fitness.embed(keep), expected, atol=1e-5, rtol=1e-4)
    # The unmasked path is the teacher itself, so its similarity is 1.
    assert fitness.similarity(hs.rank(model), 0.0) == pytest.approx(1.0, abs=1e-5)


def test_calibration_sources():
    model = CASE["vit"].build()
    pictures = images(12)
    table = datasets.Dataset.from_dict({"img": pictures, "label": list(range(12))}).cast_column("img", datasets.Image())
    _, from_dataset = fit(model, table)
    _, from_stream = fit(model, table.to_iterable_dataset())
    _, from_tensor = fit(model, torch.randn(12, 3, 32, 32))
    for ranking in (from_dataset, from_stream, from_tensor):
        assert ranking.keep_counts(0.2).num_params > 0
    assert from_dataset.provenance["calibration_data"]["source"] == "Dataset"


def test_split_is_disjoint_and_seeded():
    pictures = images(20)
    split = split_calibration(pictures, 8, 12, seed=5)
    ids = lambda xs: {x.tobytes() for x in xs}  # noqa: E731
    assert not ids(split.gradient) & ids(split.fitness)
    again = split_calibration(pictures, 8, 12, seed=5)
    assert [x.tobytes() for x in again.gradient] == [x.tobytes() for x in split.gradient]
    with pytest.warns(UserWarning, match="fewer than the 8 gradient \\+ 30 fitness"):
        split_calibration(pictures, 8, 30, seed=5)


def test_bad_calibration_data():
    model = CASE["vit"].build()
    with pytest.raises(hs.SnapViTError, match="empty"):
        fit(model, [])
    no_images = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
    with pytest.raises(hs.SnapViTError, match=r"image column among the dataset's columns \['text', 'label'\]"):
        fit(model, no_images)
    with pytest.raises(hs.SnapViTError, match="needs calibration images"):
        hs.rank(model, method="snapvit")


def test_presets_and_config_validation():
    paper = hs.SnapViTConfig.preset("paper")
    assert paper.max_evaluations == 50 and paper.mode == "paired" and paper.scores.definition == "accumulated"
    assert paper.scores.crops.num_global == 2 and paper.scores.crops.num_local == 10 and paper.pca_components == 192
    assert paper.sigma == 1.0 and paper.max_generations is None and paper.unit_order == "scores"
    assert paper.solution == "best"
    fast = hs.SnapViTConfig.preset("fast", seed=9)
    assert fast.seed == 9 and fast.max_generations == 3
    # the measured choices (benchmarks/defaults_vit_tiny.py) are the defaults, and fast shares them
    default = hs.SnapViTConfig.preset("default")
    assert default == hs.SnapViTConfig() and default.num_gradient_images == 1000
    for config in (default, fast):
        assert (config.scores.definition, config.mode, config.max_generations, config.max_evaluations,
                config.sigma, config.unit_order, config.solution) == ("obd", "global", 3, None, 0.5, "output", "mean")
    # measured per preset (docs/defaults.md): fast scores its candidates at 30 % only, a third of the forwards
    assert fast.fitness_sparsities == (0.3,) and default.fitness_sparsities == (0.1, 0.3, 0.5, 0.6)
    assert paper.fitness_sparsities == (0.1, 0.3, 0.5, 0.6)
    with pytest.raises(hs.SnapViTError, match="Unknown preset 'turbo'"):
        hs.SnapViTConfig.preset("turbo")
    with pytest.raises(hs.SnapViTError, match="search budget"):
        hs.SnapViTConfig(max_generations=None, max_evaluations=None)
    for patience in (0, 1.5, True):
        with pytest.raises(hs.SnapViTError, match=f"early_stopping_patience={patience!r}"):
            hs.SnapViTConfig(early_stopping_patience=patience)
    for threshold in (-0.01, float("nan"), "0.1"):
        with pytest.raises(hs.SnapViTError, match=r"early_stopping_threshold=.*a finite number >= 0, e.g. 0.003"):
            hs.SnapViTConfig(early_stopping_threshold=threshold)
    assert hs.SnapViTConfig.preset("default", early_stopping_patience=2).preset_name() is None


def test_rank_entry_point_runs_snapvit():
    model = CASE["vit"].build()
    with pytest.warns(UserWarning, match="overlap"):  # 12 images for the fast preset's 128 + 128
        ranking = hs.rank(model, method="snapvit", data=torch.randn(12, 3, 32, 32), preset="fast", mode="paired",
                          show_progress=False)
    assert ranking.mode == "paired" and ranking.provenance["method"] == "snapvit"
    assert "snapvit" in hs.available_methods()
    # the search batch that ran is recorded: the CPU default, as the preset leaves it to the device
    assert ranking.provenance["settings"]["fitness_batch_size"] == 64 and ranking.provenance["preset"] == "fast"


def test_rank_sets_the_search_length_beside_the_preset_and_refuses_it_elsewhere():
    model = CASE["vit"].build()
    data = torch.randn(12, 3, 32, 32)
    with pytest.warns(UserWarning, match="overlap"):
        ranking = hs.rank(model, method="snapvit", data=data, preset="fast", seed=3, max_generations=0,
                          show_progress=False)
    settings = ranking.provenance["settings"]
    fast = hs.SnapViTConfig.preset("fast")
    assert settings["max_generations"] == 0 and ranking.provenance["search"]["evaluations"] == 0
    assert settings["num_fitness_images"] == fast.num_fitness_images and ranking.provenance["seed"] == 3
    with pytest.raises(hs.SnapViTError, match=r"max_generations=-1\): max_generations must be an integer >= 0"):
        hs.rank(model, method="snapvit", data=data, preset="fast", max_generations=-1)
    with pytest.raises(hs.SnapViTError, match=r"method='magnitude' has no setting 'max_generations'"):
        hs.rank(model, method="magnitude", max_generations=2)
    # Issue 66: settings given beside a full config replace its fields (a preset beside it is refused).
    from hf_snapvit.pruning.methods import ranking_method

    assert ranking_method("snapvit").config(fast, max_generations=1) == dataclasses.replace(fast, max_generations=1)
    with pytest.raises(hs.SnapViTError, match=r"Give either config=SnapViTConfig.*preset='paper'"):
        hs.rank(model, method="snapvit", data=data, config=fast, preset="paper")


def test_search_batch_defaults_to_the_device_and_a_given_one_wins():
    pruner = hs.SnapViTPruner(hs.SnapViTConfig.preset("paper"))
    assert pruner.fitness_batch_size(torch.device("cpu")) == 64
    assert pruner.fitness_batch_size(torch.device("cuda")) == 256  # only the device type is read
    given = hs.SnapViTPruner(hs.SnapViTConfig.preset("paper", fitness_batch_size=32))
    assert given.fitness_batch_size(torch.device("cuda")) == 32 and given.config.preset_name() == "paper"
    with pytest.raises(hs.SnapViTError, match="fitness_batch_size"):
        hs.SnapViTConfig(fitness_batch_size=0)


def test_cka_matrix_properties_and_search_init():
    from hf_snapvit.pruning.methods.snapvit.cka import cka_covariance, linear_cka_matrix, unit_activations

    model = CASE["vit"].build()
    pixels = torch.randn(16, 3, 32, 32)
    groups = unit_activations(model, pixels)
    assert len(groups) == 2 + 2 * 4 and groups[0].shape == (16, 37) and groups[2].shape == (16, 8)
    matrix = linear_cka_matrix(groups)
    assert np.allclose(np.diag(matrix), 1) and np.allclose(matrix, matrix.T)
    assert np.all(matrix >= -1e-12) and np.all(matrix <= 1 + 1e-12)
    assert np.linalg.eigvalsh(matrix).min() > -1e-8  # a Gram matrix of normalised HSIC embeddings
    x = torch.randn(16, 5)
    assert linear_cka_matrix([x, 3 * x @ torch.linalg.qr(torch.randn(5, 5))[0]])[0, 1] == pytest.approx(1.0)
    assert np.linalg.eigvalsh(cka_covariance(model, pixels)).min() > 0
    _, ranking = fit(model, covariance="cka")
    assert ranking.provenance["settings"]["covariance"] == "cka"


def test_per_image_similarities_average_to_the_fitness_loss():
    model = CASE["vit"].build()
    fitness = EmbeddingFitness(model, torch.randn(5, 3, 32, 32), sparsities=(0.1, 0.3, 0.6), pca_components=4)
    ranking = hs.rank(model, method="random", seed=3)
    per_image = fitness.image_similarities(ranking)
    assert per_image.shape == (3, 5) and bool((per_image <= 1 + 1e-6).all())
    assert torch.allclose(per_image.mean(1), fitness.similarities(ranking), atol=1e-6)
    assert fitness.loss(ranking) == pytest.approx(1 - per_image.mean().item(), abs=1e-6)
    assert per_image.std(1).min() > 0  # images differ: what the noise measurement reads
