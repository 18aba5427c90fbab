"""Models that do not fit one device (issue 65): sliced loading placed by accelerate's big-model engine, reading
only the kept slices; ranking and saving a model the caller dispatched with a device map (offloaded weights)."""

from __future__ import annotations

import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.elastic.checkpoint import CheckpointReader
from hf_snapvit.errors import ConfigError

from helpers import output_of, tiny_vit_classifier

# Half the blocks on the CPU, the rest offloaded to disk: accelerate's hooks load them for every forward.
SPREAD = {"vit.embeddings": "cpu", "vit.layers.0": "cpu", "vit.layers.1": "disk", "vit.layernorm": "cpu",
          "classifier": "cpu"}


@pytest.fixture(scope="module")
def elastic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("big") / "vit-cls"
    model = tiny_vit_classifier()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), folder, model_card=False)
    return folder


def _inputs():
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}


def test_a_device_map_dict_places_the_sliced_model_with_accelerate_and_computes_the_same(elastic, tmp_path):
    plain = hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3)
    spread = hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3, device_map=SPREAD,
                                                offload_folder=tmp_path / "offload")
    assert spread.hf_device_map == SPREAD
    offloaded = [n for n, p in spread.named_parameters() if p.device.type == "meta"]
    assert offloaded and all(n.startswith("vit.layers.1.") for n in offloaded)  # held on disk by accelerate
    assert layer_widths(spread) == layer_widths(plain)
    torch.testing.assert_close(output_of(spread, _inputs()), output_of(plain, _inputs()))


def test_a_device_map_that_cannot_place_the_model_is_refused_naming_the_fix(elastic, tmp_path):
    with pytest.raises(ConfigError, match=r"names \['vit.nowhere'\].*top-level modules are \['classifier', 'vit'\]"):
        hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3, device_map={**SPREAD, "vit.nowhere": "cpu"})
    partial = {k: v for k, v in SPREAD.items() if k != "classifier"}
    with pytest.raises(ConfigError, match="does not place every weight.*classifier"):
        hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3, device_map=partial)
    with pytest.raises(ConfigError, match="'disk', which needs offload_folder="):
        hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3, device_map=SPREAD)
    with pytest.raises(ConfigError, match="switchable=True re-slices.*on one device"):
        hs.ElasticViTModel.from_pretrained(elastic, switchable=True, device_map=SPREAD, offload_folder=tmp_path)
    with pytest.raises(ConfigError, match="offload_folder=.*pass a device_map dict"):
        hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3, offload_folder=tmp_path)


def test_dtype_is_passed_through_to_the_slices(elastic):
    model = hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    plain = hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.3)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p, q.to(torch.bfloat16)), name


def test_the_loader_reads_only_the_kept_slices_of_every_block(elastic, monkeypatch):
    reads: dict[str, tuple[int, ...]] = {}
    original = CheckpointReader.read

    def recording(self, key, shape, chunk=None):
        tensor = original(self, key, shape, chunk)
        if tensor.numel() >= torch.Size(reads.get(key, ())).numel():  # the largest read of each tensor
            reads[key] = tuple(tensor.shape)
        return tensor

    monkeypatch.setattr(CheckpointReader, "read", recording)
    model = hs.ElasticViTModel.from_pretrained(elastic, sparsity=0.5, width_multiple=1)
    heads, neurons = layer_widths(model)
    assert heads != [4, 4] or neurons != [37, 37]  # something was sliced
    for block, (h, f) in enumerate(zip(heads, neurons)):
        prefix = f"vit.encoder.layer.{block}."
        assert reads[prefix + "attention.attention.value.weight"] == (h * 8, 32)
        assert reads[prefix + "attention.output.dense.weight"] == (32, h * 8)
        assert reads[prefix + "intermediate.dense.weight"] == (f, 32)
        assert reads[prefix + "output.dense.weight"] == (32, f)
