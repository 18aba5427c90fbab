"""The architecture registry: lookups, registration and the unsupported-architecture error."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import BertConfig, ViTConfig, ViTModel

import hf_snapvit as hs
from hf_snapvit.architectures import get_spec, register_architecture
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.architectures import get_backbone, get_layers
from hf_snapvit.architectures.registry import _REGISTRY


def test_supported_types_cover_the_issue_list():
    assert {"vit", "deit", "dinov2", "dinov2_with_registers", "dinov3_vit", "siglip_vision_model",
            "siglip2_vision_model", "clip_vision_model"} <= set(hs.supported_model_types())


def test_unsupported_architecture_names_type_list_and_fix():
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        get_spec(BertConfig())
    message = str(info.value)
    assert "model_type='bert'" in message and "dinov2" in message and "register_architecture" in message
    assert isinstance(info.value, ValueError)


def test_register_a_new_architecture(monkeypatch):
    monkeypatch.setattr("hf_snapvit.architectures.registry._REGISTRY", dict(_REGISTRY))

    class MyViTConfig(ViTConfig):
        model_type = "my_vit"

    with pytest.raises(ValueError, match="already registered"):
        register_architecture(dataclasses.replace(get_spec("vit")))
    register_architecture(dataclasses.replace(get_spec("vit"), model_type="my_vit"))
    config = MyViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                         image_size=32, patch_size=8)
    model = ViTModel(config)
    assert get_backbone(model) is model and len(get_layers(model)) == 2
    counts = hs.rank(model).keep_counts(0.2)
    slice_model_(model, hs.rank(model).keep_indices(counts))
    assert layer_widths(model) == (counts.heads, counts.neurons)
