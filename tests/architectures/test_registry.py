"""The architecture registry: lookups, registration and the unsupported-architecture error."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from transformers import BertConfig, ViTConfig, ViTModel

import hf_snapvit as hs
from hf_snapvit.architectures import get_backbone, get_layers, get_spec, register_architecture
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.architectures.registry import _REGISTRY, _TASKS, register_task_model, task_model_spec
from hf_snapvit.surgery.slicing import slice_model_

from helpers import CASES


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


# Registered model types with no tiny case in helpers.CASES, and why. The tests over the ``case`` fixture call a
# backbone or classifier on pixels, read its logits or last hidden state, and cut heads; these cannot be such a case.
_TASK = ("a task model (its forward reads text with image tokens, or gives depth maps): tests/architectures/"
         "test_task_models.py runs it (support/task_models.TASKS, support/vlms.VLMS)")
_EVERY_HEAD = "keeps every head (prune_heads=False), where the case tests cut heads: tested in tests/architectures/"
NOT_A_CASE = {
    "blip_2_vision_model": _EVERY_HEAD + "test_fused_qkv.py (support/fused.blip2)",
    "eomt": _EVERY_HEAD + "test_eomt.py",
    **dict.fromkeys(("blip-2", "depth_anything", "dpt", "gemma3", "idefics3", "internvl", "llava", "llava_next",
                     "llava_onevision", "paligemma", "qwen2_vl", "smolvlm", "vipllava", "zoedepth"), _TASK),
}


@functools.cache
def _case_types() -> frozenset[str]:
    return frozenset(case.build().config.model_type for case in CASES)


def types_without_a_case() -> list[str]:
    """Registered model types (backbones and task models) that neither have a case in helpers.CASES nor are listed in
    NOT_A_CASE: the ``case`` fixture would leave them untested without a word."""
    return sorted(set(hs.supported_model_types()) - _case_types() - set(NOT_A_CASE))


def test_every_registered_model_type_has_a_case_or_a_reason_it_cannot():
    assert not types_without_a_case(), f"registered without a case in tests/helpers.py CASES: {types_without_a_case()}"
    # Each listed reason still holds: registered, no case, and a task model or a model that keeps every head.
    assert set(NOT_A_CASE) <= set(hs.supported_model_types()) and not set(NOT_A_CASE) & _case_types()
    for model_type, why in NOT_A_CASE.items():
        assert (task_model_spec(model_type) is not None) if why == _TASK else not get_spec(model_type).prune_heads


def test_a_family_registered_without_a_case_is_named(monkeypatch):
    monkeypatch.setattr("hf_snapvit.architectures.registry._REGISTRY", dict(_REGISTRY))
    monkeypatch.setattr("hf_snapvit.architectures.registry._TASKS", dict(_TASKS))
    register_architecture(dataclasses.replace(get_spec("vit"), model_type="throwaway_vit"))
    register_task_model(dataclasses.replace(task_model_spec("llava"), model_type="throwaway_vlm"))
    assert types_without_a_case() == ["throwaway_vit", "throwaway_vlm"]
    monkeypatch.undo()
    assert types_without_a_case() == [] and "throwaway_vit" not in hs.supported_model_types()
