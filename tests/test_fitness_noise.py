"""benchmarks/fitness_noise.py: its measurements of the fitness's noise and agreement give the known answers on
synthetic similarities (the shared-model run is the benchmark itself); benchmarks/fitness_by_sparsity.py on the shared
ViT-Tiny."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import SHARED, SHARED_MODEL, SHARED_TRAIN, load_benchmark, requires_shared

script = load_benchmark("fitness_noise")


def test_rank_correlation_of_equal_and_reversed_orders():
    a = np.array([0.3, 0.1, 0.7, 0.2])
    assert script.spearman(a, a * 5 + 1) == pytest.approx(1.0)
    assert script.spearman(a, -a) == pytest.approx(-1.0)


def test_split_halves_agree_when_candidates_differ_more_than_images_and_not_when_only_noise_differs():
    rng = np.random.default_rng(0)
    offsets = np.linspace(0.5, 0.9, 8)[:, None]
    clear = offsets + 0.01 * rng.standard_normal((8, 400))
    row = script.split_halves(clear, 50, 40, np.random.default_rng(1))
    assert row["spearman_median"] == pytest.approx(1.0) and row["regret_mean"] == 0.0 and row["images"] == 50
    noise = 0.7 + 0.1 * rng.standard_normal((8, 400))
    row = script.split_halves(noise, 50, 200, np.random.default_rng(1))
    assert abs(row["spearman_median"]) < 0.3 and row["regret_mean"] > 0.005  # about a fifth of a per-image SD


def test_paired_noise_is_zero_when_candidates_differ_by_the_same_amount_on_every_image():
    rng = np.random.default_rng(2)
    images = rng.uniform(0.2, 0.9, 300)
    per_image = np.stack([images, images - 0.01, images - 0.03])
    result = script.noise_and_spread(per_image)
    assert result["paired_difference_se_median"] == pytest.approx(0.0, abs=1e-12)
    assert result["loss_spread"] == pytest.approx(np.std([0, 0.01, 0.03], ddof=1))
    assert result["images"] == 300


def test_a_sparsity_that_repeats_another_agrees_with_it_and_leaving_it_out_changes_nothing():
    rng = np.random.default_rng(3)
    first = rng.uniform(0.3, 0.9, (6, 50))
    similarities = np.stack([first, first, rng.uniform(0.3, 0.9, (6, 50))], axis=1)  # [candidates, 3, images]
    result = script.sparsity_agreement(similarities, [0.1, 0.3, 0.5])
    assert result["between_sparsities"]["0.1-0.3"] == pytest.approx(1.0)
    assert set(result["full_vs_without"]) == {"0.1", "0.3", "0.5"}
    assert all(-1 <= value <= 1 for value in result["between_sparsities"].values())


def test_a_cheaper_fitness_that_keeps_the_order_agrees_fully_and_one_that_reverses_it_chooses_the_worst():
    rng = np.random.default_rng(4)
    full = (np.linspace(0.5, 0.9, 6)[:, None, None] + 0.01 * rng.standard_normal((6, 2, 200)))
    same_order = script.cheaper_agreement(full, 0.5 * full + 0.1, [50], 20, seed=0)
    assert same_order["spearman_same_images"] == pytest.approx(1.0)
    assert same_order["split_halves"][0]["regret_mean"] == 0.0
    reversed_order = script.cheaper_agreement(full, 1.4 - full, [50], 20, seed=0)
    assert reversed_order["spearman_same_images"] == pytest.approx(-1.0)
    worst = (1 - full.mean(1).mean(1)).max() - (1 - full.mean(1).mean(1)).min()
    assert reversed_order["split_halves"][0]["regret_mean"] == pytest.approx(worst, abs=0.01)
    # chooser=None is the full fitness's own split halves, on the same draws
    own = script.split_halves(full.mean(1), 50, 20, np.random.default_rng(1))
    assert script.cheaper_agreement(full, full, [50], 20, seed=0)["split_halves"][0] == own


def test_the_cheaper_forwards_asked_for_are_scored_beside_the_full_fitness():
    args = script.parse_args(["--num-fitness", "128", "--subset-sizes", "64", "--image-sizes", "128",
                              "--token-fractions", "0.5"])
    assert script.cheaper_settings(args) == {"full": {}, "image_size=128": {"image_size": 128},
                                             "token_fraction=0.5": {"token_fraction": 0.5}}
    assert script.cheaper_settings(script.parse_args([])) == {"full": {}}


def test_subsets_need_two_disjoint_halves_of_the_scored_images():
    with pytest.raises(SystemExit):
        script.parse_args(["--num-fitness", "100", "--subset-sizes", "64"])
    assert script.parse_args(["--num-fitness", "128", "--subset-sizes", "64"]).subset_sizes == [64]


@pytest.mark.slow  # the shared ViT-Tiny on a few train images
@requires_shared(SHARED_MODEL, SHARED_TRAIN)
def test_fitness_by_sparsity_reads_saved_rankings_in_budget_order_and_scores_the_dense_size_as_the_dense_model(
        tmp_path):
    import json

    from transformers import AutoModelForImageClassification

    import hf_snapvit as hs
    from hf_snapvit.budget import model_shape

    by_sparsity = load_benchmark("fitness_by_sparsity")
    model = AutoModelForImageClassification.from_pretrained(SHARED.joinpath(*SHARED_MODEL))
    shape = model_shape(model)
    rng = np.random.default_rng(0)
    folder = tmp_path / "rankings"
    folder.mkdir()
    for g in (20, 3):  # written out of order; g3 must come first (numeric, not text, order)
        ranking = hs.ElasticRanking(head_scores=rng.random((shape.num_layers, shape.num_heads)),
                                    neuron_scores=rng.random((shape.num_layers, shape.intermediate_size)),
                                    shape=shape)
        (folder / f"run-g{g}.json").write_text(json.dumps({"head_scores": ranking.head_scores.tolist(),
                                                           "neuron_scores": ranking.neuron_scores.tolist(),
                                                           "mode": "global", "info": {"generations": g}}))
    (folder / "run.fit.json").write_text("{}")  # not a ranking
    output = tmp_path / "out.json"
    by_sparsity.main(["--rankings", str(folder), "--num-images", "8", "--sparsities", "0", "0.5",
                      "--precision", "fp32", "--output", str(output)])
    result = json.loads(output.read_text())
    assert list(result["rankings"]) == ["run-g3", "run-g20"]
    for row in result["rankings"].values():
        dense, half = row["similarity"]["0.0"], row["similarity"]["0.5"]
        assert dense == pytest.approx(1.0, abs=1e-4) and half < 0.99  # a random half of the units changes it
        assert row["loss"] == pytest.approx(1 - (dense + half) / 2)
