"""benchmarks/fitness_noise.py: its measurements of the fitness's noise and agreement give the known answers on
synthetic similarities (the shared-model run is the benchmark itself)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import load_benchmark

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


def test_subsets_need_two_disjoint_halves_of_the_scored_images():
    with pytest.raises(SystemExit):
        script.parse_args(["--num-fitness", "100", "--subset-sizes", "64"])
    assert script.parse_args(["--num-fitness", "128", "--subset-sizes", "64"]).subset_sizes == [64]
