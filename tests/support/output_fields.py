"""Every field of a model's output by name, compared field by field; the forwards a family's contract is checked with
(hidden states, eager attentions, tuples, another resolution, masked patches) and which of them stock transformers
itself can run for the dense model. Used by tests/contract/test_output_contract.py and utils/supported_models.py (the
page says what the contract test checks, from the same probe)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
from typing import Any, Callable, Iterator

import torch
import transformers
from torch import nn

from hf_snapvit.architectures.skeleton import no_init_weights

# The forwards of the contract, each the family's own inputs and what :func:`forward_kwargs` adds to them.
KINDS = ("outputs", "hidden states", "attentions", "tuples", "other resolution", "masked patches")
EAGER = ("attentions", "tuples")  # the forwards that return attention weights: run under eager attention


def output_fields(out: Any, prefix: str = "") -> dict[str, Any]:
    """Every field of a model output by name: ``last_hidden_state``, ``hidden_states[3]``, ``attentions[1]``,
    ``vision_model_output.pooler_output``, ``[0]`` for ``return_dict=False`` tuples, a KV cache's
    ``past_key_values.layers[0].keys``. A declared field left ``None`` is listed with the value ``None`` (a
    ``ModelOutput`` hides those from its keys), so comparing two listings finds a field one side lacks."""
    if isinstance(out, torch.Tensor) or out is None or isinstance(out, (bool, int, float, str)):
        return {prefix: out}
    if isinstance(out, transformers.utils.ModelOutput):
        declared = [f.name for f in dataclasses.fields(out)]
        names = declared + [k for k in out.keys() if k not in declared]
        items = [(name, getattr(out, name, None)) for name in names]
        return _join(prefix, ((f".{k}" if prefix else k, v) for k, v in items))
    if isinstance(out, (tuple, list)):
        return _join(prefix, ((f"[{i}]", v) for i, v in enumerate(out)))
    if isinstance(out, dict):
        return _join(prefix, ((f"[{k!r}]", v) for k, v in out.items()))
    layers = getattr(out, "layers", None)  # a transformers Cache: its layers' keys and values
    if isinstance(layers, list):
        return _join(prefix, ((f".layers[{i}].{part}", getattr(layer, part, None)) for i, layer in enumerate(layers)
                              for part in ("keys", "values")))
    raise TypeError(f"output_fields cannot list {prefix or 'the output'} of type {type(out).__name__}")


def _join(prefix: str, items) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name, value in items:
        fields.update(output_fields(value, prefix + name))
    return fields


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {list(value.shape)}"
    return "None" if value is None else repr(value)


def field_mismatches(actual: dict[str, Any], expected: dict[str, Any], *, rtol: float = 1e-4, atol: float = 1e-5,
                     names: tuple[str, str] = ("loaded", "masked")) -> list[str]:
    """One line per field of :func:`output_fields` listings that differ: a field only one side has (or ``None`` on
    one side, a tensor on the other), another shape or dtype, values off by more than ``atol + rtol·|expected|``,
    or a non-finite expected value (which no comparison could trust)."""
    problems = []
    for name in sorted(set(actual) | set(expected)):
        a, e = actual.get(name), expected.get(name)
        if a is None and e is None:
            continue
        field = name or "the output"
        if not (isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)):
            if isinstance(a, torch.Tensor) or isinstance(e, torch.Tensor) or a != e:
                problems.append(f"{field}: {_describe(a)} in {names[0]}, {_describe(e)} in {names[1]}")
            continue
        if a.shape != e.shape or a.dtype != e.dtype:
            problems.append(f"{field}: {list(a.shape)} {a.dtype} in {names[0]}, {list(e.shape)} {e.dtype} in "
                            f"{names[1]}")
            continue
        if a.is_floating_point():
            close = torch.isclose(a, e, rtol=rtol, atol=atol)
            if not bool(torch.isfinite(e).all()):
                problems.append(f"{field}: {int((~torch.isfinite(e)).sum())} non-finite values in {names[1]}")
            elif not bool(close.all()):
                worst = float((a - e).abs().nan_to_num(float("inf")).max())
                problems.append(f"{field}: {int((~close).sum())} of {a.numel()} values differ, max "
                                f"|{names[0]} - {names[1]}| = {worst:.3g}")
        elif not torch.equal(a, e):
            problems.append(f"{field}: {int((a != e).sum())} of {a.numel()} values differ")
    return problems


@contextlib.contextmanager
def recorded_sources(modules: list[nn.Module]) -> Iterator[dict[int, tuple[int, torch.Tensor]]]:
    """``{id(tensor): (i, tensor)}`` of every tensor that a submodule of ``modules[i]`` returns during the forwards
    run inside the block: which output fields (attention weights) a pruned block's attention produced."""
    seen: dict[int, tuple[int, torch.Tensor]] = {}

    def hook(index: int) -> Callable:
        def record(module, args, output):
            for value in output if isinstance(output, (tuple, list)) else (output,):
                if isinstance(value, torch.Tensor):
                    seen[id(value)] = (index, value)
        return record

    handles = [sub.register_forward_hook(hook(i)) for i, module in enumerate(modules) for sub in module.modules()]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _pixel_key(inputs: dict) -> str | None:
    return next((k for k in ("pixel_values", "pixel_values_videos") if isinstance(inputs.get(k), torch.Tensor)
                 and inputs[k].ndim in (4, 5)), None)


def other_resolution(model: nn.Module, inputs: dict) -> dict | None:
    """``inputs`` at 1.5 times the side (images or video frames), with ``interpolate_pos_encoding=True`` where the
    forward takes it (and ViTMAE's ``noise`` for the new patch count); ``None`` where the family's inputs are not
    image tensors alone (patch sequences, grids, text)."""
    key = _pixel_key(inputs)
    if key is None or set(inputs) - {key, "noise"}:
        return None
    pixels = inputs[key]
    side = pixels.shape[-1] * 3 // 2
    generator = torch.Generator().manual_seed(7)
    wider = {key: torch.randn(*pixels.shape[:-2], side, side, generator=generator, dtype=pixels.dtype)}
    if "noise" in inputs:  # ViTMAE's patch shuffle: the identity order again
        wider["noise"] = torch.arange(float((side // _patch(model)) ** 2)).expand(pixels.shape[0], -1)
    if "interpolate_pos_encoding" in inspect.signature(model.forward).parameters:
        wider["interpolate_pos_encoding"] = True
    return wider


def _patch(model: nn.Module) -> int:
    config = getattr(model.config, "vision_config", None) or model.config
    return config.patch_size if isinstance(config.patch_size, int) else config.patch_size[0]


def masked_patches(model: nn.Module, inputs: dict) -> dict | None:
    """``inputs`` with ``bool_masked_pos`` (every third patch, the same ones in every image, as VideoMAE requires)
    where the forward takes it; ``None`` otherwise."""
    key = _pixel_key(inputs)
    if key is None or "bool_masked_pos" not in inspect.signature(model.forward).parameters:
        return None
    pixels, patch = inputs[key], _patch(model)
    count = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)
    if pixels.ndim == 5:  # a clip: tubelets of frames
        count *= pixels.shape[1] // getattr(model.config, "tubelet_size", 1)
    mask = (torch.arange(count) % 3 == 1).expand(pixels.shape[0], -1)
    return {**inputs, "bool_masked_pos": mask}


def forward_kwargs(kind: str, model: nn.Module, inputs: dict, gaps: dict[str, str] | None = None) -> dict | None:
    """The call of contract forward ``kind`` (one of :data:`KINDS`) on ``inputs``; ``None``: the forward takes no
    such input. ``tuples`` asks for the hidden states and attentions, unless ``gaps`` (:func:`stock_gaps`) says
    stock cannot return them."""
    if kind == "outputs":
        return dict(inputs)
    if kind == "hidden states":
        return {**inputs, "output_hidden_states": True}
    if kind == "attentions":
        return {**inputs, "output_attentions": True}
    if kind == "tuples":
        flags = {f"output_{kind.replace(' ', '_')}": True for kind in ("hidden states", "attentions")
                 if kind not in (gaps or {})}
        return {**inputs, **flags, "return_dict": False}
    if kind == "other resolution":
        return other_resolution(model, inputs)
    if kind == "masked patches":
        return masked_patches(model, inputs)
    raise ValueError(f"kind={kind!r}; one of {KINDS}")


def eager(model: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """A copy of the dense ``model`` built with eager attention (the implementation that returns its weights), as
    ``from_pretrained(..., attn_implementation="eager")`` builds it: some classes cannot switch after they are built
    (``set_attn_implementation`` leaves BEiT's and SAM's sdpa modules)."""
    with no_init_weights():  # every weight is loaded next
        built = type(model)._from_config(copy.deepcopy(model.config), attn_implementation="eager")
    built.load_state_dict(model.state_dict())
    return built.eval()


def at_heads(weights: torch.Tensor, heads: torch.Tensor, count: int) -> torch.Tensor | None:
    """The self-attention ``weights`` of a block with ``count`` heads at ``heads`` (in that order): ``[B, H, N, N]``,
    or ``[B·H, N, N]`` with the heads inside the batch (SAM's); ``None`` if neither layout fits (a tensor that is no
    attention map: Qwen2-VL's tower records its attention's output under ``attentions``)."""
    if weights.ndim < 3 or weights.shape[-1] != weights.shape[-2]:
        return None
    if weights.ndim == 4 and weights.shape[1] == count:
        return weights[:, heads]
    if weights.ndim == 3 and weights.shape[0] % count == 0:
        return weights.unflatten(0, (-1, count))[:, heads].flatten(0, 1)
    return None


def remote_code_gap(model: nn.Module) -> str | None:
    """Why the sliced checkpoint of ``model`` has no loading module for ``trust_remote_code`` (its class is not one
    transformers exports: a user's own, or Qwen2-VL's tower), or ``None`` where it has one."""
    cls = type(model)
    if getattr(transformers, cls.__name__, None) is cls:
        return None
    return f"{cls.__name__} is not a class transformers exports: its sliced checkpoint has no loading module"


def run(model: nn.Module, kwargs: dict) -> Any:
    """``model(**kwargs)`` without gradients."""
    with torch.no_grad():
        return model(**kwargs)


def stock_gaps(dense: nn.Module, inputs: dict) -> dict[str, str]:
    """``{kind: why}`` for each of :data:`KINDS` that stock transformers cannot run for the ``dense`` model (eager
    attention for ``attentions`` and ``tuples``): the forward takes no such input, fails, or returns no such field.
    The contract is checked for every other kind, and a sliced model must then give every field."""
    gaps: dict[str, str] = {}
    name = type(dense).__name__
    attention = eager(dense)
    for kind in KINDS:
        model = attention if kind in EAGER else dense
        kwargs = forward_kwargs(kind, model, inputs, gaps)
        if kwargs is None:
            gaps[kind] = (f"{name}'s forward takes no bool_masked_pos" if kind == "masked patches" else
                          f"{name}'s inputs are not images alone: no other resolution")
            continue
        try:
            out = run(model, kwargs)
        except Exception as error:  # noqa: BLE001 - what stock cannot run is the reason to skip
            gaps[kind] = f"stock {name} fails it: {type(error).__name__}: {str(error)[:120]}"
            continue
        if kind == "tuples" and not isinstance(out, tuple):
            gaps[kind] = f"stock {name} returns a {type(out).__name__}, not a tuple, with return_dict=False"
        for field in ("hidden_states", "attentions"):
            if kind == field.replace("_", " ") and not any(
                    v is not None for k, v in output_fields(out).items() if field in k):
                gaps[kind] = f"stock {name} returns no {field} (output_{field}=True" + (
                    ", eager attention)" if field == "attentions" else ")")
    return gaps
