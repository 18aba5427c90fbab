"""The Torch-Pruning peer benchmark prunes to hf_snapvit's budgets, correctly, and 0 % is the identity."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_snapvit
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.architectures.budget import backbone_parameters, model_shape

from helpers import load_benchmark

pytest.importorskip("torch_pruning", reason="torch-pruning (the peer under comparison) is not installed; "
                                            "pip install -e '.[test]'")

peer = load_benchmark("peer_torch_pruning")

CONFIG = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48, image_size=32,
              patch_size=8, num_labels=5)


def _model() -> transformers.ViTForImageClassification:
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(**CONFIG)).eval()
    with torch.no_grad():  # random init leaves biases at 0; make every weight matter and magnitudes distinct
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _pixels(n: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def dense():
    return _model()


@pytest.fixture(scope="module")
def gradients(dense):
    labels = torch.arange(8) % CONFIG["num_labels"]
    return peer.accumulate_gradients(dense, _pixels(8, seed=2), labels, batch_size=4)


def _masked_reference(dense: torch.nn.Module, pruned: torch.nn.Module) -> torch.nn.Module:
    """The dense model with every unit the pruned model lacks silenced (its output columns zeroed).

    Which heads/neurons survived is read from the weights, so this checks Torch-Pruning's surgery and the head-count
    bookkeeping against an independent construction that never changes a shape.
    """
    import copy

    reference = copy.deepcopy(dense)
    hd = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    for layer, small in zip(reference.vit.layers, pruned.vit.layers):
        q = layer.attention.q_proj.weight.view(-1, hd, CONFIG["hidden_size"])
        kept_q = small.attention.q_proj.weight.view(-1, hd, CONFIG["hidden_size"])
        kept = {next(h for h in range(len(q)) if torch.equal(q[h], k)) for k in kept_q}
        assert len(kept) == len(kept_q)
        with torch.no_grad():
            for h in set(range(len(q))) - kept:
                layer.attention.o_proj.weight[:, h * hd:(h + 1) * hd] = 0
            rows = layer.mlp.fc1.weight
            kept_rows = {next(j for j in range(len(rows)) if torch.equal(rows[j], r)) for r in small.mlp.fc1.weight}
            assert len(kept_rows) == small.mlp.fc1.out_features
            for j in set(range(len(rows))) - kept_rows:
                layer.mlp.fc2.weight[:, j] = 0
    return reference


@pytest.mark.parametrize("importance, sparsity", [("l2", 0.15), ("l2", 0.4), ("taylor", 0.15), ("taylor", 0.4),
                                                  ("l1", 0.4), ("taylor-pseudo", 0.15)])
def test_prunes_to_the_budget_and_runs(dense, gradients, importance, sparsity):
    shape = model_shape(dense)
    grads = gradients if peer.importances()[importance].gradients else None
    pruned, record = peer.prune_to_sparsity(dense, sparsity, importance, {"pixel_values": _pixels(1)},
                                            gradients=grads)
    target = (1 - sparsity) * backbone_parameters(dense)
    assert abs(backbone_parameters(pruned) - target) <= shape.params_per_neuron  # within one neuron
    assert record["params"] == backbone_parameters(pruned)
    heads, neurons = layer_widths(pruned)
    assert record["heads"] == heads and record["neurons"] == neurons
    assert sum(heads) < shape.num_layers * shape.num_heads and sum(neurons) < shape.num_layers * shape.intermediate_size
    min_heads, min_neurons = peer.floors(shape)
    assert min(heads) >= min_heads and min(neurons) >= min_neurons
    for layer in pruned.vit.layers:  # head counts follow the projections, the hidden width is untouched
        attention = layer.attention
        assert attention.num_attention_heads * attention.head_dim == attention.q_proj.out_features
        assert attention.o_proj.out_features == layer.mlp.fc2.out_features == CONFIG["hidden_size"]
    x = _pixels()
    with torch.inference_mode():
        out = pruned(pixel_values=x, output_hidden_states=True)
        expected = _masked_reference(dense, pruned)(pixel_values=x).logits
    assert out.hidden_states[-1].shape[-1] == CONFIG["hidden_size"]
    assert out.logits.shape == (len(x), CONFIG["num_labels"])
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-4)
    assert not any(p.grad is not None for p in pruned.parameters())
    assert all(p.grad is None for p in dense.parameters())  # the dense model is left as it was


def test_zero_sparsity_is_the_identity(dense):
    pruned, record = peer.prune_to_sparsity(dense, 0.0, "l2", {"pixel_values": _pixels(1)})
    assert record["removed_heads"] == record["removed_neurons"] == 0
    assert record["params"] == backbone_parameters(dense)
    x = _pixels()
    with torch.inference_mode():
        torch.testing.assert_close(pruned(pixel_values=x).logits, dense(pixel_values=x).logits, atol=0, rtol=0)


def test_importances_rank_differently(dense, gradients):
    """Magnitude and Taylor scores disagree somewhere on a random model, so the importance really reaches the pruner."""
    example = {"pixel_values": _pixels(1)}
    widths = {name: peer.prune_to_sparsity(dense, 0.4, name, example, gradients=gradients)[1]
              for name in ("l2", "taylor")}
    kept = {name: (r["heads"], r["neurons"]) for name, r in widths.items()}
    assert kept["l2"] != kept["taylor"]


@pytest.mark.parametrize("rule", ["proportional", "paired"])
def test_plan_matches_budget_semantics(dense, rule):
    shape = model_shape(dense)
    for sparsity in (0.0, 0.1, 0.3, 0.5):
        heads, neurons, target = peer.plan_removals(shape, sparsity, rule)
        removed = heads * shape.params_per_head + neurons * shape.params_per_neuron
        assert target == pytest.approx((1 - sparsity) * shape.num_params())
        assert abs(shape.num_params() - removed - target) <= shape.params_per_head / 2 + shape.params_per_neuron
        total_heads, total_neurons = shape.num_layers * shape.num_heads, shape.num_layers * shape.intermediate_size
        if rule == "paired":  # the reference's rule: head ratio = neuron ratio - 0.15
            assert heads == int(total_heads * max(0.0, neurons / total_neurons - 0.15) + 1e-9)
        else:  # the same fraction of head and of FFN parameters, to within one head
            head_share = heads * shape.params_per_head / (total_heads * shape.params_per_head)
            assert abs(head_share - removed / (total_heads * shape.params_per_head
                                                + total_neurons * shape.params_per_neuron)) <= 1 / total_heads
    assert peer.plan_removals(shape, 0.02, "paired")[0] == 0  # heads are spared below a neuron ratio of 0.15


def test_bad_budgets_fail_clearly(dense):
    shape = model_shape(dense)
    with pytest.raises(hf_snapvit.BudgetError, match="sparsity=0.99 is out of range"):
        peer.plan_removals(shape, 0.99)
    with pytest.raises(hf_snapvit.BudgetError, match="head_rule"):
        peer.plan_removals(shape, 0.1, "uniform")
    with pytest.raises(hf_snapvit.BudgetError, match="needs gradients"):
        peer.prune_to_sparsity(dense, 0.1, "taylor", {"pixel_values": _pixels(1)})


def test_tables_show_every_method_and_mark_missing_cells():
    row = {"target_sparsity": 0.1, "top1": 0.5, "knn_top1": 0.25, "retention": 0.8, "gflops": 1.5,
           "latency_ratio": {"8": 0.9}, "prune_seconds": 2.0}
    results = {"dense": {"top1": 0.75, "knn_top1": 0.5, "gflops": 2.0},
               "methods": {"l2": {"rows": [row]},
                           "snapvit": {"rows": [{**row, "target_sparsity": 0.3, "latency_ratio": {"8": 0.7, "64": 0.6},
                                                 "load_seconds": 1.0}]}}}
    text = peer.format_tables(results)
    assert "| Torch-Pruning l2 | 50.0 / - | 25.0 / - | 0.80 / - |" in text
    assert "| hf_snapvit SnapViT | - / 50.0 |" in text
    assert "| Torch-Pruning l2 | 1.50 / - | 0.90 / - | - / - | 2.0 |" in text
