"""Second-order unit orders: greedy elimination checked step by step against errors computed from their definitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_snapvit.architectures import get_attention, get_layers, get_spec, head_dim
from hf_snapvit.architectures.budget import model_shape
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.correction.prefix import output_projections
from hf_snapvit.errors import ConfigError
from hf_snapvit.pruning.methods.snapvit.block_order import block_orders, elimination_order, reorder_scores
from hf_snapvit.elastic.ranking import ElasticRanking

from helpers import CASES

FAST = {c.name: c for c in CASES}


def layer_problem(units: int, group: int, out: int = 7, seed: int = 0):
    """A weight and an input Hessian with correlated inputs (so cross terms matter)."""
    g = torch.Generator().manual_seed(seed)
    n = units * group
    mix = torch.randn(n, n, generator=g, dtype=torch.float64) * 0.6 + torch.eye(n, dtype=torch.float64)
    X = mix @ torch.randn(n, 400, generator=g, dtype=torch.float64)
    return torch.randn(out, n, generator=g, dtype=torch.float64), X @ X.T / X.shape[1]


def columns(units, group):
    return [c for u in units for c in range(u * group, (u + 1) * group)]


def plain_error(W, H, removed, group):
    """The mean squared output change when the removed units' columns are cut and the rest stay as they are."""
    cut = columns(removed, group)
    return float(torch.trace(W[:, cut] @ H[cut][:, cut] @ W[:, cut].T)) if cut else 0.0


def refit_error(W, H, kept, group):
    """The error left after the kept columns are re-fitted by least squares: tr(W (H - H_:K H_KK⁻¹ H_K:) Wᵀ)."""
    K = columns(kept, group)
    schur = H - H[:, K] @ torch.linalg.solve(H[K][:, K], H[K, :]) if K else H
    return float(torch.trace(W @ schur @ W.T))


def greedy_reference(W, H, units, group, error, per_step=1):
    """The elimination written from its definition: remove the unit (or the ``per_step`` units) whose removal alone
    leaves the least error."""
    alive, removals = list(range(units)), []
    while alive:
        if error is plain_error:
            costs = [error(W, H, removals + [u], group) for u in alive]
        else:
            costs = [error(W, H, [k for k in alive if k != u], group) for u in alive]
        picks = [alive[i] for i in np.argsort(costs, kind="stable")[:min(per_step, max(len(alive) - 1, 1))]]
        removals += picks
        alive = [u for u in alive if u not in picks]
    return removals[::-1]


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_output_order_is_the_greedy_elimination_of_the_plain_slice_error(group, seed):
    W, H = layer_problem(6, group, seed=seed)
    order = elimination_order(W, H, group=group, order="output")
    assert order.tolist() == greedy_reference(W, H, 6, group, plain_error)


def test_output_order_follows_the_definition_over_many_steps_and_breaks_ties_by_index():
    W, H = layer_problem(40, 1, out=5, seed=3)
    assert elimination_order(W, H, order="output").tolist() == greedy_reference(W, H, 40, 1, plain_error)
    # Four units with equal, uncorrelated costs: removed in index order, so the most important first is the last.
    tied = elimination_order(torch.ones(2, 4, dtype=torch.float64), torch.eye(4, dtype=torch.float64))
    assert tied.tolist() == [3, 2, 1, 0]


@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_obs_order_is_the_greedy_elimination_of_the_refit_error(group, seed):
    """The OBS updates of the weight and inverse Hessian give, at each step, the choice a fresh least-squares fit of
    every candidate set makes (damping ~0 so both solve the same problem)."""
    W, H = layer_problem(6, group, seed=seed)
    config = CorrectionConfig(damping_fraction=1e-12)
    order = elimination_order(W, H, group=group, order="obs", config=config)
    assert order.tolist() == greedy_reference(W, H, 6, group, refit_error)


@pytest.mark.parametrize("group", [1, 2])
def test_a_wide_obs_order_removes_the_cheapest_few_units_per_step(group):
    """Capped at 3 steps, 8 units go 3, 3, then 1 + the last: each step's cheapest single removals."""
    W, H = layer_problem(8, group, seed=4)
    config = CorrectionConfig(damping_fraction=1e-12)
    order = elimination_order(W, H, group=group, order="obs", config=config, max_steps=3)
    assert order.tolist() == greedy_reference(W, H, 8, group, refit_error, per_step=3)
    with pytest.raises(ConfigError, match="max_steps=0"):
        elimination_order(W, H, group=group, max_steps=0)


def test_orders_differ_from_the_diagonal_when_inputs_are_correlated():
    """Two copies of one strong input: cutting both costs four times one, so the orders keep one of them early, which a
    per-unit (diagonal) score cannot see."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 500, generator=g, dtype=torch.float64)
    X = torch.cat([x, 3 * x[:1]])  # unit 5 is unit 0 scaled: fully redundant with the re-fit
    W = torch.randn(4, 6, generator=g, dtype=torch.float64)
    H = X @ X.T / X.shape[1]
    obs = elimination_order(W, H, order="obs", config=CorrectionConfig(damping_fraction=1e-9))
    assert not {0, 5} <= set(obs[:2].tolist())  # the re-fit keeps at most one of the twins among the first two
    assert {0, 5} & set(obs[:3].tolist())


def test_bad_arguments_are_named():
    W, H = layer_problem(4, 2)
    with pytest.raises(ConfigError, match="order='fisher'"):
        elimination_order(W, H, group=2, order="fisher")
    with pytest.raises(ConfigError, match="group 3"):
        elimination_order(W, H, group=3)
    with pytest.raises(ConfigError, match=r"\[8, 8\] Hessian"):
        elimination_order(W, H[:4, :4], group=2)


@pytest.mark.parametrize("order", ["output", "obs"])
def test_block_orders_use_the_dense_models_input_hessians(order):
    """Against Hessians gathered here with plain forward hooks on the whole dense model's forward pass."""
    case = FAST["vit"]
    model = case.build().eval()
    inputs = case.inputs(6)
    pixels = inputs["pixel_values"]
    spec = get_spec(model)
    sums, hooks = [], []
    for layer in get_layers(model, spec):
        for linear in output_projections(layer, spec):
            sums.append([torch.zeros(linear.in_features, linear.in_features), 0])

            def hook(module, args, output, slot=sums[-1]):
                x = args[0].reshape(-1, args[0].shape[-1]).float()
                slot[0] += x.T @ x
                slot[1] += x.shape[0]
            hooks.append(linear.register_forward_hook(hook))
    with torch.no_grad():
        model(pixel_values=pixels)
    for h in hooks:
        h.remove()
    config = CorrectionConfig(num_samples=None, batch_size=4, guard=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ours = block_orders(model, pixels, order=order, config=config, show_progress=False)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    for block, layer in enumerate(get_layers(model, spec)):
        attention, ffn = output_projections(layer, spec)
        width = head_dim(get_attention(layer, spec), spec)
        expected = (elimination_order(attention.weight, sums[2 * block][0] / sums[2 * block][1], group=width,
                                      order=order, config=config),
                    elimination_order(ffn.weight, sums[2 * block + 1][0] / sums[2 * block + 1][1], order=order,
                                      config=config))
        assert [o.tolist() for o in ours[block]] == [o.tolist() for o in expected]


@pytest.mark.parametrize("name", ["dinov2-swiglu", "clip-vision", "siglip2-vision", "beit", "dinov3-gated"])
def test_block_orders_cover_other_families(name):
    case = FAST[name]
    model = case.build().eval()
    inputs = case.inputs(4)
    data = inputs if len(inputs) > 1 else inputs["pixel_values"]
    orders = block_orders(model, data, config=CorrectionConfig(num_samples=None, batch_size=2), show_progress=False)
    shape = model_shape(model)
    assert len(orders) == shape.num_layers
    for heads, neurons in orders:
        assert sorted(heads.tolist()) == list(range(shape.num_heads))
        assert sorted(neurons.tolist()) == list(range(shape.intermediate_size))


def test_reordered_scores_keep_each_blocks_counts_and_follow_the_order():
    model = FAST["vit"].build()
    shape = model_shape(model)
    rng = np.random.default_rng(0)
    heads = rng.random((shape.num_layers, shape.num_heads))
    neurons = rng.random((shape.num_layers, shape.intermediate_size))
    orders = [(rng.permutation(shape.num_heads), rng.permutation(shape.intermediate_size))
              for _ in range(shape.num_layers)]
    before = ElasticRanking(head_scores=heads, neuron_scores=neurons, shape=shape)
    after = ElasticRanking(head_scores=reorder_scores(heads, [h for h, _ in orders]),
                           neuron_scores=reorder_scores(neurons, [n for _, n in orders]), shape=shape)
    for sparsity in (0.1, 0.3, 0.5):
        assert after.keep_counts(sparsity) == before.keep_counts(sparsity)
        for (kept_heads, kept_neurons), (head_order, neuron_order) in zip(
                after.keep_indices(after.keep_counts(sparsity)), orders):
            assert set(kept_heads.tolist()) == set(head_order[:len(kept_heads)].tolist())
            assert set(kept_neurons.tolist()) == set(neuron_order[:len(kept_neurons)].tolist())
    np.testing.assert_array_equal(np.sort(after.neuron_scores, 1), np.sort(neurons, 1))


def test_reorder_scores_refuses_orders_that_do_not_fit():
    scores = np.arange(6.0).reshape(2, 3)
    with pytest.raises(ConfigError, match="2 blocks"):
        reorder_scores(scores, [np.arange(3)])
    with pytest.raises(ConfigError, match="Block 1"):
        reorder_scores(scores, [np.arange(3), np.array([0, 0, 1])])


def test_snapvit_hands_its_scores_out_in_the_block_orders_of_the_fitness_images():
    """A fit with ``unit_order`` equals the plain fit's scores reordered by block_orders on the same fitness images
    (no search: the starting factors scale whole blocks, so the order within a block is the scores' order)."""
    import hf_snapvit as hs
    from hf_snapvit.data.calibration import split_calibration
    from hf_snapvit.pruning.scoring import ScoreConfig
    from hf_snapvit.data.views import MultiCropConfig, processor_inputs

    from helpers import PROCESSOR, images

    model = FAST["vit"].build()
    pictures = images(12)
    settings = dict(num_gradient_images=3, num_fitness_images=6, max_generations=0, fitness_sparsities=(0.3,),
                    pca_components=8, scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), seed=4)
    rankings = {order: hs.SnapViTPruner(hs.SnapViTConfig(**settings, unit_order=order)).fit(
        model, pictures, processor=PROCESSOR, show_progress=False) for order in ("scores", "obs")}
    fitness = processor_inputs(split_calibration(pictures, 3, 6, seed=4).fitness, PROCESSOR)
    orders = block_orders(model, fitness, order="obs", config=CorrectionConfig(num_samples=None, guard=False),
                          show_progress=False)
    plain, ordered = rankings["scores"], rankings["obs"]
    np.testing.assert_array_equal(ordered.neuron_scores, reorder_scores(plain.neuron_scores, [n for _, n in orders]))
    np.testing.assert_array_equal(ordered.head_scores, reorder_scores(plain.head_scores, [h for h, _ in orders]))
    assert ordered.provenance["settings"]["unit_order"] == "obs"
    assert not np.array_equal(ordered.neuron_scores, plain.neuron_scores)
    with pytest.raises(hs.SnapViTError, match="unit_order"):
        hs.SnapViTConfig(unit_order="fisher")
