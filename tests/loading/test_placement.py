"""Models that do not fit one device (issue 65): sliced loading placed by accelerate's big-model engine, reading
only the kept slices; ranking and saving a model the caller dispatched with a device map (offloaded weights)."""

from __future__ import annotations

import contextlib
import copy
import gc
import weakref

import numpy as np
import pytest
import torch
import transformers
from accelerate import cpu_offload, dispatch_model
from safetensors.torch import load_file

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.architectures.placement import weights_reloaded_for_backward
from hf_snapvit.data.views import MultiCropConfig
from hf_snapvit.elastic.checkpoint import CheckpointReader
from hf_snapvit.errors import ConfigError, UnsupportedArchitectureError
from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores
from hf_snapvit.surgery.masking import masked
from hf_snapvit.surgery.slicing import slice_model_

from helpers import CASES, PROCESSOR, images, output_of, tiny_vit_classifier

CASE = {c.name: c for c in CASES}

# Half the blocks on the CPU, the rest offloaded to disk: accelerate's hooks load them for every forward.
SPREAD = {"vit.embeddings": "cpu", "vit.layers.0": "cpu", "vit.layers.1": "disk", "vit.layernorm": "cpu",
          "classifier": "cpu"}


@pytest.fixture(scope="module")
def vit_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big") / "vit-cls"
    model = tiny_vit_classifier()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), folder, model_card=False)
    return folder


def _inputs():
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}


def test_a_device_map_dict_places_the_sliced_model_with_accelerate_and_computes_the_same(vit_checkpoint, tmp_path):
    plain = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3)
    spread = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, device_map=SPREAD,
                                                offload_folder=tmp_path / "offload")
    assert spread.hf_device_map == SPREAD
    offloaded = [n for n, p in spread.named_parameters() if p.device.type == "meta"]
    assert offloaded and all(n.startswith("vit.layers.1.") for n in offloaded)  # held on disk by accelerate
    assert layer_widths(spread) == layer_widths(plain)
    torch.testing.assert_close(output_of(spread, _inputs()), output_of(plain, _inputs()))


def test_a_device_map_that_cannot_place_the_model_is_refused_naming_the_fix(vit_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match=r"names \['vit.nowhere'\].*top-level modules are \['classifier', 'vit'\]"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, device_map={**SPREAD, "vit.nowhere": "cpu"})
    partial = {k: v for k, v in SPREAD.items() if k != "classifier"}
    with pytest.raises(ConfigError, match="does not place every weight.*classifier"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, device_map=partial)
    with pytest.raises(ConfigError, match="'disk', which needs offload_folder="):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, device_map=SPREAD)
    with pytest.raises(ConfigError, match="switchable=True re-slices.*on one device"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, switchable=True, device_map=SPREAD, offload_folder=tmp_path)
    with pytest.raises(ConfigError, match="offload_folder=.*pass a device_map dict"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, offload_folder=tmp_path)


def test_a_strategy_with_max_memory_is_computed_by_accelerate_for_the_sliced_model(vit_checkpoint, tmp_path):
    plain = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3)
    block = sum(p.numel() * p.element_size() for p in plain.vit.layers[0].parameters())
    # Room on the CPU for the embeddings: accelerate sends the rest to disk, whole blocks at a time.
    spread = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, device_map="sequential",
                                                max_memory={"cpu": 3 * block}, offload_folder=tmp_path)
    assert "disk" in spread.hf_device_map.values() and "cpu" in spread.hf_device_map.values()
    assert not any(name.startswith("vit.layers.0.") for name in spread.hf_device_map)  # a block is never split
    torch.testing.assert_close(output_of(spread, _inputs()), output_of(plain, _inputs()))
    with pytest.raises(ConfigError, match="sends every module to disk.*raise max_memory"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, device_map="sequential",
                                           max_memory={"cpu": block}, offload_folder=tmp_path)
    with pytest.raises(ConfigError, match="max_memory=.*needs device_map='auto', 'balanced' or 'sequential'"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, max_memory={"cpu": "1GB"}, device_map="cpu")
    with pytest.raises(ConfigError, match="over devices by 'sequential'.*switchable=True"):
        hs.ElasticViTModel.from_pretrained(vit_checkpoint, switchable=True, device_map="sequential",
                                           max_memory={"cpu": "1GB"})


def test_dtype_is_passed_through_to_the_slices(vit_checkpoint):
    model = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    plain = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.3)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p, q.to(torch.bfloat16)), name


def test_the_loader_reads_only_the_kept_slices_of_every_block(vit_checkpoint, monkeypatch):
    reads: dict[str, tuple[int, ...]] = {}
    original = CheckpointReader.read

    def recording(self, key, shape, chunk=None):
        tensor = original(self, key, shape, chunk)
        if tensor.numel() >= torch.Size(reads.get(key, ())).numel():  # the largest read of each tensor
            reads[key] = tuple(tensor.shape)
        return tensor

    monkeypatch.setattr(CheckpointReader, "read", recording)
    model = hs.ElasticViTModel.from_pretrained(vit_checkpoint, sparsity=0.5, width_multiple=1)
    heads, neurons = layer_widths(model)
    assert heads != [4, 4] or neurons != [37, 37]  # something was sliced
    for block, (h, f) in enumerate(zip(heads, neurons)):
        prefix = f"vit.encoder.layer.{block}."
        assert reads[prefix + "attention.attention.value.weight"] == (h * 8, 32)
        assert reads[prefix + "attention.output.dense.weight"] == (32, h * 8)
        assert reads[prefix + "intermediate.dense.weight"] == (f, 32)
        assert reads[prefix + "output.dense.weight"] == (32, f)


# ------------------------------------------------------------------ ranking and saving a model accelerate placed
FEW = dict(num_gradient_images=3, num_fitness_images=6, scores=ScoreConfig(crops=MultiCropConfig(num_local=2)),
           max_generations=2, max_evaluations=None, fitness_sparsities=(0.1, 0.3), pca_components=8, precision="fp32")


def _placed(model, how: str, folder):
    """``model``'s copy placed by accelerate: half on the CPU and half offloaded to disk (by ``dispatch_model``, or
    by transformers' ``from_pretrained(device_map=...)``), or all offloaded to host memory (``cpu_offload``); its
    weights then wait on the meta device between forwards."""
    spread = {"embeddings": "cpu", "layers.0": "cpu", "layers.1": "disk", "layernorm": "cpu", "pooler": "cpu"}
    if how == "transformers":
        model.save_pretrained(folder / "dense")
        return transformers.AutoModel.from_pretrained(folder / "dense", device_map=spread,
                                                      offload_folder=folder / "offload").eval()
    model = copy.deepcopy(model)
    if how == "disk":
        return dispatch_model(model, spread, offload_dir=folder)
    return cpu_offload(model, execution_device="cpu")


def _state(model):
    return {name: (p.requires_grad, p.is_meta) for name, p in model.named_parameters()}, model.training


@pytest.fixture(scope="module")
def plain_ranking():
    model = CASE["vit"].build().eval()
    return model, hs.SnapViTPruner(hs.SnapViTConfig(**FEW)).fit(model, images(12), processor=PROCESSOR,
                                                                  show_progress=False)


@pytest.mark.parametrize("how", ["disk", "cpu_offload", "transformers"])
def test_a_model_accelerate_offloaded_ranks_and_saves_as_the_plain_model(plain_ranking, how, tmp_path):
    model, expected = plain_ranking
    placed = _placed(model, how, tmp_path)
    before = _state(placed)
    assert any(p.is_meta for p in placed.parameters())
    ranking = hs.SnapViTPruner(hs.SnapViTConfig(**FEW)).fit(placed, images(12), processor=PROCESSOR,
                                                            show_progress=False)
    np.testing.assert_allclose(ranking.head_scores, expected.head_scores, rtol=1e-5)
    np.testing.assert_allclose(ranking.neuron_scores, expected.neuron_scores, rtol=1e-5)
    for sparsity in (0.3, 0.5):
        assert ranking.keep_counts(sparsity) == expected.keep_counts(sparsity)
    assert _state(placed) == before  # still offloaded, flags as they were
    # save_elastic reads the offloaded weights a block at a time: the same checkpoint as the plain model's.
    hs.save_elastic(placed, ranking, tmp_path / "placed", model_card=False)
    hs.save_elastic(model, expected, tmp_path / "plain", model_card=False)
    found, wanted = (load_file(tmp_path / name / "model.safetensors") for name in ("placed", "plain"))
    assert found.keys() == wanted.keys() and all(torch.equal(found[k], wanted[k]) for k in wanted)
    assert _state(placed) == before


def test_data_free_methods_read_offloaded_weights_and_grad_based_ones_are_refused(tmp_path):
    model = CASE["vit"].build().eval()
    placed = _placed(model, "disk", tmp_path)
    for method in ("magnitude", "lamp"):
        got, want = hs.rank(placed, method=method), hs.rank(model, method=method)
        np.testing.assert_array_equal(got.head_scores, want.head_scores)
        np.testing.assert_array_equal(got.neuron_scores, want.neuron_scores)
    before = _state(placed)
    with pytest.raises(ConfigError, match="definition='accumulated'.*offload hooks.*'obd' or 'fisher'"):
        gradient_scores(placed, images(2), PROCESSOR, ScoreConfig(definition="accumulated", batch_size=2,
                                                                   crops=MultiCropConfig(num_local=0)),
                        show_progress=False)
    assert _state(placed) == before


@pytest.mark.parametrize("name", ["vit", "dinov2-swiglu"])
def test_masking_the_removed_units_computes_what_slicing_them_computes(name):
    model = CASE[name].build().eval()
    _, neurons = layer_widths(model)
    keep = [(np.array([2, 0]), np.arange(0, f, 3)) for f in neurons]
    inputs = CASE[name].inputs(2, 3)
    with masked(model, keep):
        found = output_of(model, inputs)
    sliced = slice_model_(copy.deepcopy(model), keep)
    torch.testing.assert_close(found, output_of(sliced, inputs), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(output_of(model, inputs), found)  # the hooks are gone afterwards


def test_an_architecture_no_registry_knows_is_refused_when_placed_naming_the_fix():
    from hf_snapvit.architectures import discovery

    torch.manual_seed(0)
    config = transformers.IJepaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=48, image_size=32, patch_size=8)
    discovery._DISCOVERED.clear()  # a spec discovered for this model, never proven
    placed = cpu_offload(transformers.IJepaModel(config).eval(), execution_device="cpu")
    try:
        with pytest.raises(UnsupportedArchitectureError, match="no registered architecture.*copies of the "
                                                               "whole model.*register_architecture.*on one device"):
            hs.rank(placed, method="magnitude")
    finally:
        discovery._DISCOVERED.clear()


def test_a_forward_with_gradients_holds_no_loaded_weight_until_the_backward(monkeypatch, tmp_path):
    model = CASE["vit"].build().eval()
    placed = _placed(model, "cpu_offload", tmp_path).requires_grad_(False)  # as the gradient scores run it
    loaded = []  # the weight tensors the offloaded linears ran with
    linear = torch.nn.functional.linear

    def recording(x, weight, bias=None):
        loaded.append(weakref.ref(weight))
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", recording)
    pixels = CASE["vit"].inputs(2, 3)["pixel_values"]

    def gradient(context) -> torch.Tensor:
        loaded.clear()
        x = pixels.clone().requires_grad_(True)
        with context:
            loss = placed(pixel_values=x).last_hidden_state.square().sum()
        gc.collect()
        alive = sum(ref() is not None for ref in loaded)
        loss.backward()
        return alive, x.grad

    held, expected = gradient(contextlib.nullcontext())
    assert held >= len(loaded) - 1 > 0  # autograd keeps every loaded weight for the backward (not the pooler's)
    alive, found = gradient(weights_reloaded_for_backward(placed))
    assert alive == 0  # ... unless they are loaded again when it needs them
    torch.testing.assert_close(found, expected, rtol=0, atol=0)
