"""Budgets, floors, both ranking modes and the stored format, on shapes of real ViTs (no weights needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import ViTConfig

import hf_snapvit as hs
from hf_snapvit.architectures.budget import ModelShape
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.architectures.budget import model_shape, skeleton
from helpers import CASES

CASE = {c.name: c for c in CASES}


def vit_shape(hidden: int, layers: int, heads: int, num_labels: int | None = None) -> ModelShape:
    kwargs = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden)
    if num_labels:
        kwargs.update(num_labels=num_labels, architectures=["ViTForImageClassification"])
    return model_shape(skeleton(ViTConfig(**kwargs)))


VIT_B = vit_shape(768, 12, 12)
VIT_L = vit_shape(1024, 24, 16)


def random_ranking(shape: ModelShape, seed: int = 0, **kwargs) -> hs.ElasticRanking:
    rng = np.random.default_rng(seed)
    # Log-normal scores spanning many decades, with a per-block scale, as real gradient scores do.
    scale = 10.0 ** rng.uniform(-12, -6, size=(shape.num_layers, 1))
    return hs.ElasticRanking(
        head_scores=scale * 10.0 ** rng.normal(0, 1, (shape.num_layers, shape.num_heads)) * shape.params_per_head,
        neuron_scores=scale * 10.0 ** rng.normal(0, 1, (shape.num_layers, shape.intermediate_size))
        * shape.params_per_neuron,
        shape=shape,
        **kwargs,
    )


@pytest.mark.parametrize(
    "hidden, layers, heads, expected", [(384, 12, 6, 9.2), (768, 12, 12, 35.1), (1024, 24, 16, 123.2)]
)
def test_gflops_match_the_paper_table(hidden, layers, heads, expected):
    config = ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       intermediate_size=4 * hidden, num_labels=1000, architectures=["ViTForImageClassification"])
    assert round(hs.estimate_gflops(config), 1) == expected


def test_vit_b_parameter_accounting():
    # ViT-B/16 backbone without pooler: 85.80 M (the reference's DINO ViT-B/16 count).
    assert VIT_B.num_params() == 85_798_656
    assert VIT_B.params_per_head == 4 * 768 * 64 + 3 * 64
    assert VIT_B.params_per_neuron == 2 * 768 + 1


@pytest.mark.parametrize("mode", ["global", "paired"])
def test_budget_lands_within_one_unit(mode):
    ranking = random_ranking(VIT_B, mode=mode)
    dense = VIT_B.num_params()
    unit = max(VIT_B.params_per_head, VIT_B.params_per_neuron)
    for sparsity in np.linspace(0, ranking.max_sparsity, 13):
        counts = ranking.keep_counts(float(sparsity))
        assert abs(counts.num_params - (1 - sparsity) * dense) <= unit
        assert counts.num_params == VIT_B.num_params(counts.heads, counts.neurons)
    target = int(0.6 * dense)
    assert abs(ranking.keep_counts(target_params=target).num_params - target) <= unit
    flops_target = 0.5 * VIT_B.gflops()
    counts = ranking.keep_counts(target_gflops=flops_target)
    per_unit = VIT_B.gflops([1] + [0] * 11, [0] * 12)  # one head costs more than one neuron
    assert abs(counts.gflops - flops_target) <= per_unit


@pytest.mark.parametrize("mode", ["global", "paired"])
# int(12 * 0.2) heads and int(3072 * 0.05) neurons as in the reference; the default multiple rounds the latter up.
@pytest.mark.parametrize("multiple, expected_floor", [(1, 153), (None, 192)])
def test_keep_counts_are_monotone_and_respect_floors(mode, multiple, expected_floor):
    ranking = random_ranking(VIT_B, seed=1, mode=mode)
    head_floor, neuron_floor = ranking.floors(multiple)
    assert (head_floor, neuron_floor) == (2, expected_floor)
    previous = None
    for sparsity in np.linspace(0, ranking.max_sparsity_for(multiple), 25):
        counts = ranking.keep_counts(float(sparsity), width_multiple=multiple)
        assert min(counts.heads) >= head_floor and min(counts.neurons) >= neuron_floor
        if previous is not None:
            assert all(a <= b for a, b in zip(counts.heads, previous.heads))
            assert all(a <= b for a, b in zip(counts.neurons, previous.neurons))
        previous = counts
    assert previous.heads == [head_floor] * 12 or mode == "paired"
    assert previous.neurons == [neuron_floor] * 12


def test_floor_never_below_one_unit():
    shape = CASE["vit"].build()
    ranking = hs.rank(shape, min_head_keep_ratio=0.0, min_neuron_keep_ratio=0.0)
    assert ranking.floors() == (1, 1)
    counts = ranking.keep_counts(ranking.max_sparsity)
    assert counts.heads == [1, 1] and counts.neurons == [1, 1]


def test_paired_mode_prunes_the_reference_totals():
    """The reference's unit budgets: int(36864 * r_mlp) neurons and int(144 * r_head) heads for ViT-B."""
    ranking = random_ranking(VIT_B, seed=2, mode="paired")
    pairs = [(0.15, 0.0), (0.25, 0.1), (0.35, 0.2), (0.45, 0.3), (0.55, 0.4), (0.65, 0.5)]
    neurons_pruned = [5529, 9216, 12902, 16588, 20275, 23961]
    heads_pruned = [0, 14, 28, 43, 57, 72]
    for (r_mlp, r_head), n, h in zip(pairs, neurons_pruned, heads_pruned):
        counts = ranking.keep_counts_for_ratios(r_mlp, r_head)
        assert 36864 - sum(counts.neurons) == n
        assert 144 - sum(counts.heads) == h


def test_paired_budget_follows_the_head_offset():
    ranking = random_ranking(VIT_B, seed=3, mode="paired")
    for sparsity in (0.1, 0.3, 0.5):
        counts = ranking.keep_counts(sparsity)
        r_mlp = 1 - sum(counts.neurons) / 36864
        assert 144 - sum(counts.heads) == int(144 * max(0.0, r_mlp - 0.15) + 1e-9)


def test_floors_bind_on_a_weak_block():
    """A block whose scores are all tiny is cut down to its floor first (the AugReg last-block pattern)."""
    ranking = random_ranking(VIT_B, seed=4, mode="paired")
    neurons = ranking.neuron_scores.copy()
    before = ranking.keep_counts_for_ratios(0.35, 0.2).neurons[11]
    neurons[11] *= 1e-30
    weak = hs.ElasticRanking(ranking.head_scores, neurons, VIT_B, mode="paired")
    counts = weak.keep_counts_for_ratios(0.35, 0.2)
    assert before > 153 and counts.neurons[11] == 153
    assert 36864 - sum(counts.neurons) == 12902


def test_global_mode_normalises_by_parameter_cost():
    # Equal per-parameter importance everywhere: global removal then follows the per-parameter tie-break only,
    # and a head (98k parameters) is never preferred over 64 neurons of the same score per parameter.
    shape = VIT_B
    heads = np.full((12, 12), 2.0 * shape.params_per_head)
    neurons = np.full((12, 3072), 1.0 * shape.params_per_neuron)
    ranking = hs.ElasticRanking(heads, neurons, shape)
    counts = ranking.keep_counts(0.3)
    assert counts.heads == [12] * 12  # heads are worth more per parameter: every neuron above its floor goes first
    assert sum(counts.neurons) < 36864


def test_max_sparsity_error_names_the_limit():
    ranking = random_ranking(VIT_B)
    with pytest.raises(hs.BudgetError, match=rf"0 <= sparsity <= {ranking.max_sparsity:.4f}.*floors"):
        ranking.keep_counts(0.95)
    with pytest.raises(hs.BudgetError, match="exactly one of"):
        ranking.keep_counts(0.3, target_params=10)
    with pytest.raises(hs.BudgetError, match="target_params=5 is out of range"):
        ranking.keep_counts(target_params=5)
    with pytest.raises(hs.BudgetError, match="target_gflops=1000.0 is out of range"):
        ranking.keep_counts(target_gflops=1000.0)


def test_invalid_scores_are_rejected():
    with pytest.raises(hs.RankingFormatError, match="non-negative"):
        hs.ElasticRanking(-np.ones((12, 12)), np.ones((12, 3072)), VIT_B)
    with pytest.raises(hs.RankingFormatError, match=r"shape \(11, 12\), expected \(12, 12\)"):
        hs.ElasticRanking(np.ones((11, 12)), np.ones((12, 3072)), VIT_B)


def test_zero_and_tied_scores_are_handled_with_explicit_masks():
    """Scores of exactly 0 (dead units, underflow) rank last but are never treated as 'already pruned'."""
    heads = np.zeros((12, 12))
    neurons = np.zeros((12, 3072))
    ranking = hs.ElasticRanking(heads, neurons, VIT_B)
    assert ranking.keep_counts(0.0).neurons == [3072] * 12
    counts = ranking.keep_counts(0.2)
    assert counts.sparsity == pytest.approx(0.2, abs=1e-3)
    stored = hs.ElasticRanking.from_dict(ranking.to_dict())
    assert stored.keep_counts(0.2) == counts


@pytest.mark.parametrize("mode", ["global", "paired"])
def test_format_round_trip_preserves_keep_counts(mode):
    ranking = random_ranking(VIT_B, seed=5, mode=mode).sorted()
    data = json.loads(json.dumps(ranking.to_dict()))
    stored = hs.ElasticRanking.from_dict(data)
    assert stored.mode == mode and stored.shape == VIT_B
    for sparsity in (0.1, 0.3, 0.5):
        a, b = ranking.keep_counts(sparsity), stored.keep_counts(sparsity)
        # Neuron scores are stored within 0.005 decades, so only near-ties between blocks can move.
        assert a.heads == b.heads
        assert np.abs(np.subtract(a.neurons, b.neurons)).sum() <= 0.002 * 36864
    # Parsing what was parsed is exact.
    assert hs.ElasticRanking.from_dict(stored.to_dict()).keep_counts(0.3) == stored.keep_counts(0.3)


def test_stored_ranking_is_compact_for_vit_l():
    ranking = random_ranking(VIT_L, seed=6).sorted()
    config = ViTConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
    config.elastic_ranking = ranking.to_dict()
    size = len(config.to_json_string().encode())
    assert size < 300_000, size


def test_unsorted_ranking_cannot_be_stored():
    with pytest.raises(hs.RankingFormatError, match="sorted"):
        random_ranking(VIT_B).to_dict()


def test_provenance_is_recorded():
    model = CASE["vit"].build()
    data = hs.rank(model, method="random", seed=11).sorted().to_dict()
    provenance = data["provenance"]
    assert provenance["method"] == "random" and provenance["seed"] == 11
    assert provenance["library"] == "hf_snapvit" and provenance["library_version"] == hs.__version__
    assert {"settings", "calibration_data", "base_model"} <= set(provenance)


def test_rank_is_deterministic_and_methods_differ():
    model = CASE["vit"].build()
    a, b = hs.rank(model, method="random", seed=1), hs.rank(model, method="random", seed=1)
    assert np.array_equal(a.neuron_scores, b.neuron_scores)
    assert not np.array_equal(a.neuron_scores, hs.rank(model, method="random", seed=2).neuron_scores)
    magnitude = hs.rank(model, method="magnitude")
    assert magnitude.keep_counts(0.3) == hs.rank(model, method="magnitude", seed=5).keep_counts(0.3)


def test_magnitude_scores_are_l1_norms():
    model = CASE["vit"].build()
    ranking = hs.rank(model, method="magnitude")
    fc1 = model.layers[0].mlp.fc1
    fc2 = model.layers[0].mlp.fc2
    expected = fc1.weight.abs().sum(1) + fc1.bias.abs() + fc2.weight.abs().sum(0)
    np.testing.assert_allclose(ranking.neuron_scores[0], expected.detach().double().numpy(), rtol=1e-6)


def test_unknown_method_and_sliced_model_are_rejected():
    model = CASE["vit"].build()
    with pytest.raises(hs.SnapViTError, match="Unknown ranking method 'snip2'.*magnitude"):
        hs.rank(model, method="snip2")
    slice_model_(model, [([0, 1], list(range(10))), ([0], list(range(20)))])
    with pytest.raises(hs.SnapViTError, match="already sliced"):
        hs.rank(model)
