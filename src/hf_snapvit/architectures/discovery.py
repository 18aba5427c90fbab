"""Discovery: the :class:`ArchitectureSpec` of a vision transformer no registry knows, read from its module tree and
one forward pass, and its data form for ``config.json``.

The stack of blocks is the ``nn.ModuleList`` (or ``nn.Sequential``: timm's) of same-class modules holding the most
parameters. In its first block,
the order in which one forward uses the ``nn.Linear`` weights (:mod:`.tracing`: through the layer or ``F.linear``)
names them: three projections from the hidden width to
one attention width (query, key, value), or one fused projection to three times that width (its rows the query, key
and value blocks), one back (the output projection), then the FFN: one or two projections out of the hidden width (a
gated FFN has two; a packed one, value and gate in one, twice the neurons) and one back. The attention and FFN modules
are the closest common parents
of their projections. A spec found here is a guess until :func:`hf_snapvit.surgery.proof.prove_spec` shows that slicing
with it equals masking (the last guess keeps every head, for attention that cannot run with fewer); ``save_elastic``
proves it before it writes anything, then stores :func:`spec_to_dict` in the
checkpoint's ``config.json`` (``elastic_spec``), so loading needs no registration.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from typing import Any

import torch.nn as nn
from transformers import PretrainedConfig

from ..errors import UnsupportedArchitectureError
from .inputs import patch_side, pixel_shape, takes_grid
from .tracing import classifier_paths, trace_block
from .registry import (SPEC_KEY, ArchitectureSpec, MlpSpec, on_unregistered, supported_model_types,
                       vision_config)

# Specs of unregistered models, by model type and structure (_structure_key): read from a checkpoint's config.json or
# discovered in a model. One model type can hold many structures (every timm model is a "timm_wrapper").
_DISCOVERED: dict[tuple[str, str], ArchitectureSpec] = {}
_STORED: dict[str, ArchitectureSpec] = {}  # parsed config.json specs, by their JSON: one object per stored spec
# Config entries that do not shape the modules discovery reads (hf_snapvit's own entries start with "elastic_").
_NOT_STRUCTURE = frozenset({"_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype",
                            "id2label", "label2id", "num_labels", "problem_type", "label_names", "num_classes"})
SPEC_FORMAT = 1
_PATH_FIELDS = ("layers", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "mlp", "head_width")


def _block_stack(root: nn.Module) -> tuple[str, nn.Module]:
    """The dotted path and the ``nn.ModuleList`` or ``nn.Sequential`` of same-class blocks holding the most
    parameters."""
    best: tuple[int, str, nn.Module] | None = None
    for name, module in root.named_modules():
        if (isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0
                and len({type(m) for m in module}) == 1):
            size = sum(p.numel() for p in module.parameters())
            if size and (best is None or size > best[0]):
                best = (size, name, module)
    if best is None:
        raise UnsupportedArchitectureError(
            f"{type(root).__name__} has no stack of repeated blocks (an nn.ModuleList or nn.Sequential of same-class "
            "modules), so "
            "hf_snapvit cannot find its transformer blocks. Describe them with hf_snapvit.ArchitectureSpec and call "
            "hf_snapvit.register_architecture(spec).")
    return best[1], best[2]


def _role(name: str) -> int | None:
    """0, 1 or 2 where a projection's name says query, key or value (``query``, ``to_q``, ``q_proj``), else None."""
    last = name.rsplit(".", 1)[-1].lower()
    for index, (letter, word) in enumerate((("q", "query"), ("k", "key"), ("v", "value"))):
        if last in (letter, word) or last.startswith((f"{letter}_", f"{word}_")) or last.endswith(f"_{letter}"):
            return index
    return None


def _by_role(calls: list[tuple[str, nn.Linear]]) -> list[tuple[str, nn.Linear]]:
    """The three attention projections as query, key, value where their names say so, else in call order (their
    roles are symmetric for slicing)."""
    roles = [_role(name) for name, _ in calls]
    if sorted(r for r in roles if r is not None) == [0, 1, 2]:
        return [call for _, call in sorted(zip(roles, calls), key=lambda pair: pair[0])]
    return calls


def _parent(paths: list[str]) -> str:
    """The closest common parent of dotted paths (``""``: the block itself)."""
    parts = [p.split(".")[:-1] for p in paths]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common)


def _relative(path: str, parent: str) -> str:
    return path[len(parent) + 1:] if parent else path


def _head_attributes(attention: nn.Module, heads: int, width: int,
                     any_size_name: bool) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The attention module's attributes holding the head count, heads × head width, and one head's width (``""`` if
    it keeps none, when it keeps the count): those whose names contain "head"; with ``any_size_name`` also the
    attention module's own integers equal to heads × head width whatever their name (an ``embed_dim`` that a forward
    reshapes to)."""
    counts, sizes, widths = [], [], []
    for prefix, module in attention.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, bool) or not isinstance(value, int):
                continue
            path = f"{prefix}.{name}" if prefix else name
            if "head" not in name:
                if any_size_name and not prefix and value == heads * width:
                    sizes.append(path)
                continue
            if value == heads:
                counts.append(path)
            elif value == heads * width:
                sizes.append(path)
            elif value == width:
                widths.append(path)
    if not widths and not counts:
        raise UnsupportedArchitectureError(
            f"{type(attention).__name__} keeps no attribute naming one head's width ({width}) or the head count "
            f"({heads}), so hf_snapvit cannot follow its heads. Register an ArchitectureSpec whose head_width names "
            "it.")
    return tuple(counts), tuple(sizes), widths[0] if widths else ""  # "": the width is rows over the head count


def discover_spec(model: nn.Module, *, any_size_name: bool = False) -> ArchitectureSpec:
    """The spec of ``model`` found in its module tree and one forward pass (not yet proven); ``any_size_name``: see
    :func:`_head_attributes` (the second guess, when the first fails its proof).

    Raises:
        UnsupportedArchitectureError: naming what could not be matched (no block stack, no q/k/v/o projections, no
            FFN), with the fix: a registered :class:`ArchitectureSpec`.
    """
    config = vision_config(model.config)
    base = getattr(model, "base_model", model)
    # Embedding calls the backbone with pixel_values; timm's model inside TimmWrapper* takes x: use the wrapper.
    whole = base is not model and "pixel_values" not in inspect.signature(base.forward).parameters
    base = model if whole else base
    layers_path, layers = _block_stack(base)
    calls, tokens = trace_block(model, layers[0])
    problem = "hf_snapvit could not match"
    fused = _is_fused(calls)
    if len(calls) < (3 if fused else 5):
        raise UnsupportedArchitectureError(
            f"{problem} attention and FFN projections in block 0 of {layers_path} ({type(layers[0]).__name__}): its "
            f"forward called {len(calls)} nn.Linear layers ({[n for n, _ in calls]}). Register an ArchitectureSpec.")
    hidden = calls[0][1].in_features
    q, k, v = (calls[0],) * 3 if fused else _by_role(calls[:3])
    after = 1 if fused else 3  # the calls after the query, key and value projections
    width = q[1].out_features // (3 if fused else 1)
    if not fused and any(m.in_features != hidden or m.out_features != width for _, m in (q, k, v)):
        raise UnsupportedArchitectureError(
            f"{problem} query, key and value projections in block 0 of {layers_path}: the first three nn.Linear "
            f"calls are {[(n, m.in_features, m.out_features) for n, m in (q, k, v)]}, expected three {hidden} -> "
            f"{width}. Register an ArchitectureSpec naming them.")
    o = calls[after]
    rest = calls[after + 1:]
    ups = [(n, m) for n, m in rest if m.in_features == hidden and m.out_features != hidden]
    # A packed FFN (timm's GluMlp) computes value and gate in one projection of twice the neurons.
    downs = [(n, m) for n, m in rest if m.out_features == hidden and ups
             and ups[0][1].out_features in (m.in_features, 2 * m.in_features)]
    if o[1].in_features != width or o[1].out_features != hidden or not ups or not downs:
        raise UnsupportedArchitectureError(
            f"{problem} an output projection ({width} -> {hidden}) and an FFN ({hidden} -> n -> {hidden}) in block 0 "
            f"of {layers_path}; its nn.Linear calls after q/k/v: {[(n, m.in_features, m.out_features) for n, m in rest]}"
            ". Register an ArchitectureSpec naming them.")
    attention = _parent([q[0], k[0], v[0], o[0]])
    block = layers[0]
    heads = _head_count(config, block.get_submodule(attention) if attention else block)
    if heads <= 0 or width % heads:
        raise UnsupportedArchitectureError(
            f"{problem} the head count: config.num_attention_heads is {heads or 'missing'} for an attention width of "
            f"{width}, and the attention module keeps no num_heads. Set it on the config, or register an "
            "ArchitectureSpec.")
    ups = ups[:2] if len(ups) > 1 and ups[1][1].out_features == ups[0][1].out_features else ups[:1]
    mlp = _parent([*(n for n, _ in ups), downs[0][0]])
    counts, sizes, head_width = _head_attributes(block.get_submodule(attention) if attention else block, heads,
                                                 width // heads, any_size_name)
    side, patch = pixel_shape(model.config, 1)[-1], patch_side(model)
    patches = (side // patch) ** 2 if not takes_grid(model) else tokens
    frames, tubelet = getattr(config, "num_frames", None), getattr(config, "tubelet_size", None)
    if isinstance(frames, int) and isinstance(tubelet, int) and tubelet > 0:
        patches *= frames // tubelet
    extra = max(0, tokens - patches)
    return ArchitectureSpec(
        model_type=model.config.model_type, layers=layers_path, attention=attention,
        q_proj=_relative(q[0], attention), k_proj=_relative(k[0], attention), v_proj=_relative(v[0], attention),
        o_proj=_relative(o[0], attention), mlp=mlp,
        mlp_variants=(MlpSpec(tuple(_relative(n, mlp) for n, _ in ups), _relative(downs[0][0], mlp)),),
        embedding="pooled", extra_tokens=lambda c, e=extra: e, num_patches=lambda c, n=patches: n,
        head_count_attrs=counts, head_size_attrs=sizes, head_width=head_width, token_subsets=False,
        qkv_blocks=(0, 1, 2) if fused else (0, 0, 0), grid_inputs=takes_grid(model), backbone="" if whole else None,
        excluded_from_budget=classifier_paths(model) if whole else ())


def _head_count(config: PretrainedConfig, attention: nn.Module) -> int:
    """The head count the config names, else the attention module's own ``num_heads`` (a timm model's config keeps
    only the timm architecture's name)."""
    for owner, name in ((config, "num_attention_heads"), (config, "num_heads"), (attention, "num_heads"),
                        (attention, "num_attention_heads")):
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _is_fused(calls: list[tuple[str, nn.Linear]]) -> bool:
    """Whether the block's first projection is one fused qkv: three times as many outputs as the next projection
    (the output projection) takes and gives back, where separate ones would have called two more of its width."""
    if len(calls) < 2:
        return False
    first, second = calls[0][1], calls[1][1]
    return first.out_features == 3 * second.in_features and second.out_features == first.in_features


def discovery_guesses(model: nn.Module) -> list[ArchitectureSpec]:
    """The specs discovery proposes for ``model``, most likely first (distinct ones only); the last keeps every head,
    for an attention whose forward cannot run with fewer (timm's EVA reshapes its output to the model width), so
    its FFN neurons can still be pruned."""
    first = discover_spec(model)
    second = discover_spec(model, any_size_name=True)
    guesses = [first] if second.head_size_attrs == first.head_size_attrs else [first, second]
    return [*guesses, dataclasses.replace(first, prune_heads=False)]


def spec_to_dict(spec: ArchitectureSpec, config: PretrainedConfig) -> dict[str, Any]:
    """The data form of a discovered spec, stored as ``config.json["elastic_spec"]``."""
    variant = spec.mlp_variants[0]
    return {"format": SPEC_FORMAT, **{name: getattr(spec, name) for name in _PATH_FIELDS},
            "mlp_in": list(variant.in_proj), "mlp_out": variant.out_proj, "embedding": spec.embedding,
            "head_count_attrs": list(spec.head_count_attrs), "head_size_attrs": list(spec.head_size_attrs),
            "extra_tokens": int(spec.extra_tokens(config)), "num_patches": int(spec.num_patches(config)),
            "qkv_blocks": list(spec.qkv_blocks), "grid_inputs": spec.grid_inputs, "backbone": spec.backbone,
            "prune_heads": spec.prune_heads, "excluded_from_budget": list(spec.excluded_from_budget)}


def spec_from_dict(model_type: str, data: Any, source: str | os.PathLike | None = None) -> ArchitectureSpec:
    """A spec from its data form, every field checked (a checkpoint's config is not trusted)."""
    where = f"config.json[{SPEC_KEY!r}]" + (f" of {str(source)!r}" if source else "")
    fix = "Re-save the checkpoint with hf_snapvit.save_elastic, or register an ArchitectureSpec for this model."

    def fail(what: str) -> UnsupportedArchitectureError:
        return UnsupportedArchitectureError(f"{where} {what}. {fix}")

    if not isinstance(data, dict):
        raise fail(f"must be a JSON object, got {type(data).__name__}")
    if data.get("format") != SPEC_FORMAT:
        raise fail(f"has format {data.get('format')!r}; this hf_snapvit reads format {SPEC_FORMAT}")
    for name in (*_PATH_FIELDS, "mlp_out", "embedding"):
        if not isinstance(data.get(name), str):
            raise fail(f"needs a string {name!r}, got {data.get(name)!r}")
    for name in ("mlp_in", "head_count_attrs", "head_size_attrs", "excluded_from_budget"):
        value = data.get(name, [] if name == "excluded_from_budget" else None)  # absent in specs saved before it
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (name == "mlp_in"
                                                                                         and not value):
            raise fail(f"needs a list of strings {name!r}, got {value!r}")
    for name in ("extra_tokens", "num_patches"):
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(f"needs a non-negative integer {name!r}, got {value!r}")
    blocks = data.get("qkv_blocks", [0, 0, 0])  # absent in specs saved before fused projections
    if blocks not in ([0, 0, 0], [0, 1, 2]) or any(isinstance(b, bool) for b in blocks):
        raise fail(f"has qkv_blocks {blocks!r}; expected [0, 0, 0] (separate q/k/v) or [0, 1, 2] (one fused qkv)")
    if blocks == [0, 1, 2] and not data["q_proj"] == data["k_proj"] == data["v_proj"]:
        raise fail("has qkv_blocks [0, 1, 2] (one fused qkv) but names different q_proj, k_proj and v_proj")
    for name in ("grid_inputs", "prune_heads"):  # absent in specs saved before them: False, True
        if not isinstance(data.get(name, name == "prune_heads"), bool):
            raise fail(f"needs a boolean {name!r}, got {data.get(name)!r}")
    if data.get("backbone") not in (None, ""):
        raise fail(f"has backbone {data.get('backbone')!r}; expected null (the model's base model) or \"\" (the "
                   "model itself)")
    if data["embedding"] not in ("cls", "pooled", "cls_dist_mean"):
        raise fail(f"has embedding {data['embedding']!r}; expected 'cls', 'pooled' or 'cls_dist_mean'")
    return ArchitectureSpec(
        model_type=model_type, **{name: data[name] for name in _PATH_FIELDS},
        mlp_variants=(MlpSpec(tuple(data["mlp_in"]), data["mlp_out"]),), embedding=data["embedding"],
        head_count_attrs=tuple(data["head_count_attrs"]), head_size_attrs=tuple(data["head_size_attrs"]),
        extra_tokens=lambda c, e=data["extra_tokens"]: e, num_patches=lambda c, n=data["num_patches"]: n,
        token_subsets=False, qkv_blocks=tuple(blocks), grid_inputs=data.get("grid_inputs", False),
        backbone=data.get("backbone"), prune_heads=data.get("prune_heads", True),
        excluded_from_budget=tuple(data.get("excluded_from_budget", [])))


def _structure_key(model_or_config: object, model_type: str | None) -> tuple[str, str]:
    """The model type and the config entries that shape its modules: models of one key have one spec."""
    config = getattr(model_or_config, "config", model_or_config)
    if not isinstance(config, PretrainedConfig):
        return str(model_type), ""
    # vars, not to_dict: to_dict would copy a dense checkpoint's whole ranking on every spec lookup.
    kept = {k: v for k, v in vars(config).items() if k not in _NOT_STRUCTURE and not k.startswith(("elastic_", "_"))}
    return str(model_type), json.dumps(kept, sort_keys=True, default=str)


def unregistered_spec(model_or_config: object, config: PretrainedConfig | None,
                       model_type: str | None) -> ArchitectureSpec:
    """The spec of a model no registry holds: stored in its config (``elastic_spec``), else discovered in the model
    itself; kept for the process by model type and structure."""
    key = _structure_key(model_or_config, model_type)
    stored = getattr(config, SPEC_KEY, None) if config is not None else None
    if stored is not None:  # proven when it was saved, and what the checkpoint's weights were sliced with
        text = json.dumps(stored, sort_keys=True, default=str)
        if text not in _STORED:
            _STORED[text] = spec_from_dict(str(model_type), stored)
        _DISCOVERED[key] = _STORED[text]
        return _STORED[text]
    if key in _DISCOVERED:
        return _DISCOVERED[key]
    same_type = [spec for (kind, _), spec in _DISCOVERED.items() if kind == key[0]]
    if isinstance(model_or_config, nn.Module) and model_type:
        spec = discover_spec(model_or_config)
    elif len(same_type) == 1:  # a config alone, edited after discovery (labels, dtype): the one structure known
        return same_type[0]
    else:
        raise UnsupportedArchitectureError(
            f"model_type={model_type!r} is not supported by hf_snapvit. Supported: {', '.join(supported_model_types())}"
            ". Pass the model itself (hf_snapvit.rank(model, ...)) and its structure is discovered and proven; or "
            "describe where its blocks, q/k/v/o projections and FFN live with hf_snapvit.ArchitectureSpec and call "
            "hf_snapvit.register_architecture(spec); for a task model built on a supported backbone, describe where "
            "its encoder lives with hf_snapvit.TaskModelSpec and call hf_snapvit.register_task_model(spec)."
        )
    _DISCOVERED[key] = spec
    return spec


def is_discovered(spec: ArchitectureSpec) -> bool:
    """Whether ``spec`` was discovered or read from a checkpoint rather than registered."""
    return any(known is spec for known in _DISCOVERED.values())


def discovered_spec(model: nn.Module) -> ArchitectureSpec | None:
    """The spec kept for ``model``'s type and structure, if any."""
    return _DISCOVERED.get(_structure_key(model, model.config.model_type))


def adopt_discovered(spec: ArchitectureSpec, model: nn.Module) -> None:
    """Keep ``spec`` (a proven guess) as the spec of ``model``'s type and structure for the process."""
    _DISCOVERED[_structure_key(model, spec.model_type)] = spec


def forget_discovered(model_type: str, model: nn.Module | None = None) -> None:
    """Drop the spec kept for ``model``'s structure (one whose proof failed), or every one of ``model_type`` (a spec
    was registered for it)."""
    for key in [k for k in _DISCOVERED if k[0] == model_type]:
        if model is None or key == _structure_key(model, model_type):
            del _DISCOVERED[key]


on_unregistered(unregistered_spec, forget_discovered)
