"""ViTMAE, ViTMSN, BEiT and Data2Vec-vision: masked dense equals physically sliced on random architectures of each
family, the per-head relative position bias tables follow their heads (slicing, budget, switching), a shared table is
refused with its fix, and ViTMAE is ranked with every patch seen."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.architectures import get_layers, get_spec, head_tables
from hf_snapvit.architectures.budget import backbone_parameters, layer_widths, model_shape
from hf_snapvit.correction.guard import final_outputs
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.errors import UnsupportedArchitectureError
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.surgery.switching import HeadPrefix
from helpers import masked_copy, output_of

T = transformers
# family -> (config class, bare model class, classifier class or None)
FAMILIES = {
    "vit_mae": (T.ViTMAEConfig, T.ViTMAEModel, None),
    "vit_msn": (T.ViTMSNConfig, T.ViTMSNModel, T.ViTMSNForImageClassification),
    "beit": (T.BeitConfig, T.BeitModel, T.BeitForImageClassification),
    "data2vec-vision": (T.Data2VecVisionConfig, T.Data2VecVisionModel, T.Data2VecVisionForImageClassification),
}
WITH_TABLES = ("beit", "data2vec-vision")


def _perturbed(model: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """``model`` with every parameter moved off its init, the zero-initialised bias tables by a lot: a table column
    landing on the wrong head must change the output."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.02)
            if name.endswith("relative_position_bias_table"):
                p.normal_()
    return model.eval()


def _build(family: str, classifier: bool = False, **overrides) -> tuple[transformers.PreTrainedModel, dict]:
    """A seeded tiny model of ``family`` and its inputs (ViTMAE's with a fixed ``noise``: its patch masking and
    order are random otherwise)."""
    config_class, bare, head = FAMILIES[family]
    settings = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=32,
                    patch_size=8)
    if family in WITH_TABLES:
        settings["use_relative_position_bias"] = True
    settings.update(overrides)
    if classifier:
        settings["num_labels"] = 3
    torch.manual_seed(0)
    model = _perturbed((head if classifier else bare)(config_class(**settings)))
    size, patches = settings["image_size"], (settings["image_size"] // settings["patch_size"]) ** 2
    generator = torch.Generator().manual_seed(2)
    inputs = {"pixel_values": torch.randn(2, 3, size, size, generator=generator)}
    if family == "vit_mae":
        inputs["noise"] = torch.rand(2, patches, generator=generator)
    return model, inputs


def _random_architecture(family: str, rng: np.random.Generator) -> tuple[transformers.PreTrainedModel, dict]:
    heads = int(rng.integers(2, 6))
    settings = dict(hidden_size=8 * heads, num_attention_heads=heads, num_hidden_layers=int(rng.integers(1, 4)),
                    intermediate_size=int(rng.integers(8, 80)), image_size=int(rng.choice([16, 32])))
    if family in ("vit_mae", "vit_msn"):
        settings["qkv_bias"] = bool(rng.integers(0, 2))
    else:
        settings.update(use_relative_position_bias=bool(rng.random() < 0.75),
                        use_mean_pooling=bool(rng.integers(0, 2)),
                        layer_scale_init_value=float(rng.choice([0.0, 0.1])))
    classifier = FAMILIES[family][2] is not None and bool(rng.integers(0, 2))
    return _build(family, classifier, **settings)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("family", FAMILIES)
def test_masked_dense_equals_sliced_on_random_architectures(family, seed):
    rng = np.random.default_rng(seed)
    model, inputs = _random_architecture(family, rng)
    ranking = hs.rank(model, method="random", seed=seed)
    counts = ranking.keep_counts(float(rng.uniform(0.4, 1.0)) * ranking.max_sparsity)
    keep = ranking.keep_indices(counts)
    shape = ranking.shape
    assert sum(counts.heads) + sum(counts.neurons) < shape.num_layers * (shape.num_heads + shape.intermediate_size)

    sliced = slice_model_(copy.deepcopy(model), keep)
    assert layer_widths(sliced) == (counts.heads, counts.neurons)
    expected = output_of(masked_copy(model, keep), inputs)
    assert not torch.allclose(expected, output_of(model, inputs), atol=1e-4)  # units were removed
    torch.testing.assert_close(output_of(sliced, inputs), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_rank_save_and_load_at_sparsity_zero_and_sliced(family, tmp_path):
    model, inputs = _build(family, classifier=FAMILIES[family][2] is not None)
    ranking = hs.rank(model, method="random", seed=3)  # every unit moves: the tables must move with their heads
    hs.save_elastic(model, ranking, tmp_path)
    dense = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.0)
    torch.testing.assert_close(output_of(dense, inputs), output_of(model, inputs), atol=1e-5, rtol=0)
    stock = type(model).from_pretrained(tmp_path).eval()  # a normal checkpoint: permuted units, the same outputs
    torch.testing.assert_close(output_of(stock, inputs), output_of(model, inputs), atol=1e-5, rtol=1e-4)
    assert isinstance(dense, type(model))

    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3, width_multiple=1)
    counts = ranking.keep_counts(0.3, width_multiple=1)
    assert layer_widths(sliced) == (counts.heads, counts.neurons)
    masked = masked_copy(model, ranking.keep_indices(counts))
    torch.testing.assert_close(output_of(sliced, inputs), output_of(masked, inputs), atol=1e-5, rtol=1e-4)
    for layer, heads in zip(get_layers(sliced), counts.heads):
        assert all(getattr(owner, name).shape[-1] == heads for owner, name in head_tables(layer, get_spec(sliced)))


@pytest.mark.parametrize("family", WITH_TABLES)
def test_bias_tables_keep_their_heads_columns_in_rank_order(family):
    model, _ = _build(family)
    spec = get_spec(model)
    keep = [([2, 0, 3], np.arange(37)), ([1, 3], np.arange(37))]
    sliced = slice_model_(copy.deepcopy(model), keep)
    for dense_layer, layer, (heads, _) in zip(get_layers(model), get_layers(sliced), keep):
        (dense_owner, name), = head_tables(dense_layer, spec)
        (owner, _), = head_tables(layer, spec)
        torch.testing.assert_close(getattr(owner, name), getattr(dense_owner, name)[:, heads], atol=0, rtol=0)


@pytest.mark.parametrize("family", WITH_TABLES)
def test_a_heads_cost_counts_its_bias_table_entries(family):
    with_table, _ = _build(family)
    without, _ = _build(family, use_relative_position_bias=False)
    table = next(getattr(o, n) for o, n in head_tables(get_layers(with_table)[0], get_spec(with_table)))
    shape = model_shape(with_table)
    assert shape.params_per_head - model_shape(without).params_per_head == table.shape[0]
    assert shape.num_params() == backbone_parameters(with_table)


@pytest.mark.parametrize("family", WITH_TABLES)
def test_a_shared_bias_table_is_refused_before_ranking_and_loading(family, tmp_path):
    shared, _ = _build(family, use_relative_position_bias=False, use_shared_relative_position_bias=True)
    with pytest.raises(UnsupportedArchitectureError) as info:
        hs.rank(shared, method="magnitude")
    message = str(info.value)
    assert "use_shared_relative_position_bias=True" in message and "use_shared_relative_position_bias=False" in message
    assert "use_relative_position_bias=True" in message  # the fix: a table per block

    model, _ = _build(family)
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "use_shared_relative_position_bias": True}))
    with pytest.raises(UnsupportedArchitectureError, match="use_shared_relative_position_bias=True"):
        hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)


def test_mae_is_ranked_with_every_patch_and_its_mask_ratio_is_restored():
    model, _ = _build("vit_mae")
    assert model.config.mask_ratio == 0.75
    lengths = []
    handle = model.embeddings.register_forward_hook(lambda module, args, out: lengths.append(out[0].shape[1]))
    config = hs.SnapViTConfig(num_gradient_images=2, num_fitness_images=4, max_generations=1, max_evaluations=None,
                              fitness_sparsities=(0.3,), pca_components=4)
    try:
        ranking = hs.rank(model, "snapvit", torch.randn(6, 3, 32, 32), config=config, show_progress=False)
    finally:
        handle.remove()
    assert lengths and set(lengths) == {1 + 16}  # the CLS token and all 16 patches, never a masked subset
    assert model.config.mask_ratio == 0.75
    assert ranking.shape.num_tokens == 17 and ranking.shape.num_patches == 16  # GFLOPs of inference: no masking

    pixels = {"pixel_values": torch.randn(2, 3, 32, 32)}
    with torch.no_grad():
        assert not torch.equal(model(**pixels).last_hidden_state, model(**pixels).last_hidden_state)  # random masks
        torch.testing.assert_close(image_embedding(model, pixels), image_embedding(model, pixels))


def test_mae_latency_and_the_correction_guard_see_every_patch(tmp_path):
    model, _ = _build("vit_mae")
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path)
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    lengths = []
    switchable.embeddings.register_forward_hook(lambda module, args, out: lengths.append(out[0].shape[1]))
    hs.measure_latency(switchable, sparsities=[0.3], repeats=1, warmup=0, show_progress=False)
    assert lengths and set(lengths) == {17} and switchable.config.mask_ratio == 0.75

    batches = [{"pixel_values": torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(s))} for s in (1, 2)]
    first, _ = final_outputs(model, get_spec(model), batches, None)
    second, _ = final_outputs(model, get_spec(model), batches, None)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(first, second))  # no random masks between runs


def test_beit_switches_its_bias_tables_with_its_heads(tmp_path):
    model, inputs = _build("beit", classifier=True)
    hs.save_elastic(model, hs.rank(model, method="random", seed=4), tmp_path)
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    tables = [getattr(o, n) for layer in get_layers(switchable) for o, n in head_tables(layer, get_spec(model))]
    storage = [(t.data_ptr(), tuple(t.shape)) for t in tables]
    for sparsity in (0.4, 0.0, 0.2):
        budget = switchable.set_budget(sparsity=sparsity, width_multiple=1)
        assert sparsity == 0.0 or sum(budget.heads) < 2 * 4
        reference = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=sparsity, width_multiple=1)
        torch.testing.assert_close(output_of(switchable, inputs), output_of(reference, inputs), atol=1e-5, rtol=1e-4)
    assert [(t.data_ptr(), tuple(t.shape)) for t in tables] == storage  # a switch never touches a table
    twin = copy.deepcopy(switchable)  # its hooks are its own: switching it leaves the original's size alone
    twin.set_budget(sparsity=0.4, width_multiple=1)
    torch.testing.assert_close(output_of(switchable, inputs), output_of(reference, inputs), atol=1e-5, rtol=1e-4)

    sliced = switchable.to_sliced()
    assert [getattr(o, n).shape[-1] for layer in get_layers(sliced) for o, n in head_tables(layer, get_spec(model))] \
        == list(switchable.elastic_budget.heads)
    assert not any(isinstance(hook, HeadPrefix) for m in sliced.modules() for hook in m._forward_hooks.values())
    torch.testing.assert_close(output_of(sliced, inputs), output_of(switchable, inputs), atol=1e-6, rtol=0)


def test_a_bias_module_of_another_layout_is_refused_when_switched():
    hook = HeadPrefix(capacity=4, heads=2)
    assert hook(torch.nn.Identity(), (), torch.ones(1, 4, 5, 5)).shape == (1, 2, 5, 5)
    with pytest.raises(UnsupportedArchitectureError, match=r"heads=4.*sparsity="):
        hook(torch.nn.Identity(), (), torch.ones(1, 5, 5, 4))


def test_evaluating_or_timing_a_beit_does_not_break_training_it_afterwards(tmp_path):
    # transformers caches BEiT's relative position index across models; one made under torch.inference_mode cannot
    # be used by autograd later, so evaluation and latency measurement must run under no_grad.
    from hf_snapvit.evaluation.features import extract_features
    from hf_snapvit.recovery import RecoveryConfig, recover

    model, inputs = _build("beit", image_size=48)  # a window size no other test has cached
    extract_features(model, inputs["pixel_values"], batch_size=2, show_progress=False)
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path)
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    hs.measure_latency(switchable, batch_size=1, repeats=1, warmup=0, sparsities=[0.3], show_progress=False)
    student = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    trained, summary = recover(student, model, inputs["pixel_values"].repeat(4, 1, 1, 1),
                               RecoveryConfig(steps=1, batch_size=4, held_out_images=0), show_progress=False)
    assert len(summary.losses) == 1 and all(map(torch.isfinite, torch.tensor(summary.losses)))
