"""Every family hf_snapvit serves, as one list of tiny models and their inputs, gathered from the builders the tests
and the supported-models page already have: the page's rows (registered and discovered backbones, timm's ViTs), the
registered variants of :data:`helpers.CASES`, the task models of support.task_models and support.vlms, the discovered
families of support.discovered (with a user's own model) and support.fused, and models with a mask token (which take
``bool_masked_pos``). tests/contract/test_output_contract.py checks the contract on each; utils/supported_models.py
says so on the page."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from dataclasses import dataclass
from typing import Any, Callable

import torch
import transformers

from hf_snapvit.architectures.embedding import dummy_inputs

from helpers import BENCHMARKS, CASES, COMMON, load_benchmark
from support import discovered, fused, task_models, vlms

PAGE = load_benchmark("supported_models", BENCHMARKS.parent / "utils")


def family_inputs(model: transformers.PreTrainedModel) -> dict:
    """The seeded inputs of the model's configured size (:func:`dummy_inputs`: clips, grids, patch sequences),
    with ViTMAE's ``noise`` fixed to the identity order (its patches are otherwise shuffled at random)."""
    inputs = dummy_inputs(model, 2, seed=3)
    if "noise" in inspect.signature(model.forward).parameters:
        pixels = inputs["pixel_values"]
        inputs["noise"] = torch.arange(float((pixels.shape[-1] // model.config.patch_size) ** 2)).expand(2, -1)
    return inputs


@dataclass(frozen=True)
class Family:
    """A tiny model of one family (weights moved off their init: zero biases would hide a wrong slice), the inputs
    its forward takes, and (filled in by :func:`_families`) its class and ``model_type``."""

    name: str
    build: Callable[[], transformers.PreTrainedModel]
    inputs: Callable[[transformers.PreTrainedModel], dict] = family_inputs
    class_name: str = ""
    model_type: str = ""

    def __repr__(self) -> str:
        return self.name


def _perturbed(build: Callable[[], Any]) -> Callable[[], transformers.PreTrainedModel]:
    @functools.wraps(build)
    def perturbed():
        torch.manual_seed(0)
        model = build()
        if model is None:  # a class this transformers lacks
            return None
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02)
        return model.eval()
    return perturbed


_VIT = dict(COMMON, intermediate_size=37)
T = transformers
# Models with a mask token take ``bool_masked_pos`` (a ViTModel built plainly has none, and stock fails it).
_MASK_TOKEN = {
    "vit-mim": lambda: T.ViTForMaskedImageModeling(T.ViTConfig(**_VIT, encoder_stride=8)),
    "deit-mim": lambda: T.DeiTForMaskedImageModeling(T.DeiTConfig(**_VIT, encoder_stride=8)),
    "beit-mim": lambda: T.BeitForMaskedImageModeling(T.BeitConfig(**_VIT, use_mask_token=True,
                                                                  use_relative_position_bias=True)),
    "data2vec-vision (mask token)": lambda: T.Data2VecVisionModel(T.Data2VecVisionConfig(**_VIT, use_mask_token=True)),
    "internvl_vision (mask token)": lambda: T.InternVLVisionModel(T.InternVLVisionConfig(**_VIT, use_mask_token=True)),
}


def _families() -> list[Family]:
    """The page's rows first, under the page's names; then the others. A model of a family already listed (the same
    class and config switches: :func:`_switches`) is left out: families differ in structure, not in sizes."""
    own = (("plain", {}), ("gated", {"gated": True}), ("fused", {"fused": True}))
    families = [Family(name, _perturbed(functools.partial(PAGE.build, name))) for name in PAGE.FAMILIES]
    families += [Family(f"case {case.name}", case.build, lambda model, case=case: case.inputs(2)) for case in CASES]
    families += [Family(f"task {case.name}", case.model, case.inputs) for case in task_models.TASKS]
    families += [Family(f"task {name}", _perturbed(build), inputs)
                 for name, (build, inputs) in vlms.VLMS.items()]
    families += [Family("task blip-2", _perturbed(fused.blip2_whole), fused.blip2_whole_inputs)]
    families += [Family(f"discovered {name}", _perturbed(functools.partial(build, transformers)))
                 for name, build in discovered.FAMILIES.items()]
    families += [Family(f"own model {name}", _perturbed(functools.partial(
        discovered.CustomModel, discovered.CustomConfig(**options)))) for name, options in own]
    families += [Family(f"fused {name}", _perturbed(build)) for name, (build, *_) in fused.FAMILIES.items()]
    # A relative-position MLP of one output row per head, sliced with the heads (timm's own keeps every head).
    families += [Family("own model relative-position MLP", discovered.relpos_model)]
    families += [Family(name, _perturbed(build)) for name, build in _MASK_TOKEN.items()]
    unique, seen = [], set()
    for family in families:
        model = family.build()
        if model is None:
            continue
        key = (type(model).__qualname__, json.dumps(_switches(model.config.to_dict()), sort_keys=True))
        if key not in seen:
            seen.add(key)
            unique.append(dataclasses.replace(family, class_name=type(model).__name__,
                                              model_type=model.config.model_type))
    return unique


def _switches(value: Any) -> Any:
    """A config's entries that choose structure (flags, names, lists of them), its sizes (numbers) left out."""
    if isinstance(value, dict):
        return {k: _switches(v) for k, v in value.items() if not str(k).startswith("_") and _switches(v) is not None}
    if isinstance(value, (list, tuple)):
        items = [_switches(v) for v in value]
        return items if all(v is not None for v in items) else None
    return value if isinstance(value, (bool, str)) or value is None else None


FAMILIES = _families()
