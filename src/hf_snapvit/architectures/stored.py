"""The spec a checkpoint stores (``config.json["elastic_spec"]``): its data form, and its check against the model it
is applied to.

A stored spec is data from outside: it was proven when it was saved, but a config can be edited, copied or corrupted.
:func:`spec_from_dict` checks each field's type; :func:`check_stored_spec` holds every field to the model (the
loader's meta-device skeleton, or a model read with transformers) before anything is sliced with it: the paths exist,
the projections are ``nn.Linear`` of the widths a ViT block has, the head attributes agree with those widths, the
forward runs the projections in the order a block does (:func:`~.tracing.trace_block`, where the model's forward can
run), the token counts are the ones an image gives. Every refusal names ``elastic_spec``, the field, the value found
and the one expected.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import torch.nn as nn
from transformers import PretrainedConfig

from ..errors import UnsupportedArchitectureError
from .inputs import pixel_shape, takes_grid
from .parts import find_attribute
from .registry import SPEC_KEY, ArchitectureSpec, MlpSpec, supported_model_types, task_model_spec, vision_config
from .structure import by_role, head_attributes, patch_count
from .tracing import trace

SPEC_FORMAT = 1
_PATH_FIELDS = ("layers", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "mlp")
# Fields written only where they differ from their default (specs saved before them read as the default).
_OPTIONAL = {"head_tables": (), "head_rows": (), "frames_in_batch": 0, "image_size": 0}
_FIELDS = frozenset({"format", *_PATH_FIELDS, "head_width", "mlp_in", "mlp_out", "embedding", "head_count_attrs",
                     "head_size_attrs", "extra_tokens", "num_patches", "qkv_blocks", "grid_inputs", "backbone",
                     "prune_heads", "excluded_from_budget", *_OPTIONAL})
FIX = "Re-save the checkpoint with hf_snapvit.save_elastic, or register an ArchitectureSpec for this model."


def spec_to_dict(spec: ArchitectureSpec, config: PretrainedConfig) -> dict[str, Any]:
    """The data form of a discovered spec, stored as ``config.json["elastic_spec"]``."""
    variant = spec.mlp_variants[0]
    optional = {name: list(value) if isinstance(value, tuple) else value
                for name, value in ((name, getattr(spec, name)) for name in _OPTIONAL) if value != _OPTIONAL[name]}
    return {"format": SPEC_FORMAT, **{name: getattr(spec, name) for name in _PATH_FIELDS},
            "head_width": spec.head_width, **optional,
            "mlp_in": list(variant.in_proj), "mlp_out": variant.out_proj, "embedding": spec.embedding,
            "head_count_attrs": list(spec.head_count_attrs), "head_size_attrs": list(spec.head_size_attrs),
            "extra_tokens": int(spec.extra_tokens(config)), "num_patches": int(spec.num_patches(config)),
            "qkv_blocks": list(spec.qkv_blocks), "grid_inputs": spec.grid_inputs, "backbone": spec.backbone,
            "prune_heads": spec.prune_heads, "excluded_from_budget": list(spec.excluded_from_budget)}


def spec_from_dict(model_type: str, data: Any, source: str | os.PathLike | None = None) -> ArchitectureSpec:
    """A spec from its data form, every field's type checked (a checkpoint's config is not trusted); what the fields
    name is checked against the model by :func:`check_stored_spec`."""
    where = f"config.json[{SPEC_KEY!r}]" + (f" of {str(source)!r}" if source else "")

    def fail(what: str) -> UnsupportedArchitectureError:
        return UnsupportedArchitectureError(f"{where} {what}. {FIX}")

    if not isinstance(data, dict):
        raise fail(f"must be a JSON object, got {type(data).__name__}")
    if data.get("format") != SPEC_FORMAT:
        raise fail(f"has format {data.get('format')!r}; this hf_snapvit reads format {SPEC_FORMAT}")
    if unknown := sorted(set(data) - _FIELDS):
        raise fail(f"has unknown fields {unknown}; format {SPEC_FORMAT} knows {', '.join(sorted(_FIELDS))}")
    for name in (*_PATH_FIELDS, "mlp_out", "embedding"):
        if not isinstance(data.get(name), str):
            raise fail(f"needs a string {name!r}, got {data.get(name)!r}")
    width = data.get("head_width")
    if not isinstance(width, str) and (isinstance(width, bool) or not isinstance(width, int) or width <= 0):
        raise fail(f"needs a string (an attribute path) or a positive integer 'head_width', got {width!r}")
    for name in ("mlp_in", "head_count_attrs", "head_size_attrs", "excluded_from_budget", "head_tables", "head_rows"):
        value = data.get(name, [] if name in ("excluded_from_budget", "head_tables", "head_rows") else None)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (name == "mlp_in"
                                                                                         and not value):
            raise fail(f"needs a list of strings {name!r}, got {value!r}")
    for name in ("extra_tokens", "num_patches", "frames_in_batch", "image_size"):
        value = data.get(name, _OPTIONAL.get(name))
        if isinstance(value, bool) or not isinstance(value, int) or value < (name == "num_patches"):
            raise fail(f"needs a {'positive' if name == 'num_patches' else 'non-negative'} integer {name!r}, got "
                       f"{value!r}")
    blocks = data.get("qkv_blocks", [0, 0, 0])  # absent in specs saved before fused projections
    if blocks not in ([0, 0, 0], [0, 1, 2]) or any(isinstance(b, bool) for b in blocks):
        raise fail(f"has qkv_blocks {blocks!r}; expected [0, 0, 0] (separate q/k/v) or [0, 1, 2] (one fused qkv)")
    if blocks == [0, 1, 2] and not data["q_proj"] == data["k_proj"] == data["v_proj"]:
        raise fail("has qkv_blocks [0, 1, 2] (one fused qkv) but names different q_proj, k_proj and v_proj")
    if blocks == [0, 0, 0] and len({data["q_proj"], data["k_proj"], data["v_proj"]}) < 3:
        raise fail(f"has qkv_blocks [0, 0, 0] (separate q/k/v) but names q_proj={data['q_proj']!r}, "
                   f"k_proj={data['k_proj']!r}, v_proj={data['v_proj']!r}: three separate projections, or [0, 1, 2]")
    for name in ("grid_inputs", "prune_heads"):  # absent in specs saved before them: False, True
        if not isinstance(data.get(name, name == "prune_heads"), bool):
            raise fail(f"needs a boolean {name!r}, got {data.get(name)!r}")
    if data.get("backbone") not in (None, ""):
        raise fail(f"has backbone {data.get('backbone')!r}; expected null (the model's base model) or \"\" (the "
                   "model itself)")
    if data["embedding"] not in ("cls", "pooled", "cls_dist_mean"):
        raise fail(f"has embedding {data['embedding']!r}; expected 'cls', 'pooled' or 'cls_dist_mean'")
    return ArchitectureSpec(
        model_type=model_type, **{name: data[name] for name in _PATH_FIELDS}, head_width=width,
        head_tables=tuple(data.get("head_tables", ())), head_rows=tuple(data.get("head_rows", ())),
        frames_in_batch=data.get("frames_in_batch", 0), image_size=data.get("image_size", 0),
        mlp_variants=(MlpSpec(tuple(data["mlp_in"]), data["mlp_out"]),), embedding=data["embedding"],
        head_count_attrs=tuple(data["head_count_attrs"]), head_size_attrs=tuple(data["head_size_attrs"]),
        extra_tokens=lambda c, e=data["extra_tokens"]: e, num_patches=lambda c, n=data["num_patches"]: n,
        token_subsets=False, qkv_blocks=tuple(blocks), grid_inputs=data.get("grid_inputs", False),
        backbone=data.get("backbone"), prune_heads=data.get("prune_heads", True),
        excluded_from_budget=tuple(data.get("excluded_from_budget", [])))


class _Refusal:
    """Builds the error for one field of the stored spec of ``model``."""

    def __init__(self, model: nn.Module) -> None:
        source = getattr(model.config, "_name_or_path", "") or ""
        self.where = f"config.json[{SPEC_KEY!r}]" + (f" of {source!r}" if source else "")
        self.model = type(model).__name__

    def __call__(self, field: str, value: Any, why: str) -> UnsupportedArchitectureError:
        return UnsupportedArchitectureError(f"{self.where} has {field}={value!r}, which does not fit this "
                                            f"{self.model}: {why}. {FIX}")


def _stored(spec: ArchitectureSpec, field: str) -> Any:
    """The value of ``field`` as config.json stores it."""
    variant = spec.mlp_variants[0]
    return list(variant.in_proj) if field == "mlp_in" else variant.out_proj if field == "mlp_out" else getattr(
        spec, field)


def _what(value: object) -> str:
    name = type(value).__name__
    return "nothing" if value is None else f"{'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"


def check_stored_spec(model: nn.Module, spec: ArchitectureSpec) -> None:
    """Hold ``spec``, read from ``model``'s ``config.json``, to ``model`` field by field (see the module's
    docstring), before anything is sliced with it.

    Raises:
        UnsupportedArchitectureError: naming ``elastic_spec``, the field, its value, what was found and the fix.
    """
    refuse = _Refusal(model)
    layers = _stack(model, spec, refuse)
    found = [_block(block, index, spec, refuse) for index, block in enumerate(layers)]
    heads, width = found[0]
    config = vision_config(model.config)
    expected = getattr(config, "num_attention_heads", None)
    if (isinstance(expected, int) and not isinstance(expected, bool) and expected != heads
            and getattr(model.config, "elastic_layout", None) is None):
        field = "head_width" if spec.head_width else "head_count_attrs"
        raise refuse(field, getattr(spec, field), f"it gives {heads} heads of the attention width {width}, but "
                     f"config.num_attention_heads is {expected}")
    if spec.grid_inputs != takes_grid(model):
        raise refuse("grid_inputs", spec.grid_inputs, f"the model's forward takes {'' if takes_grid(model) else 'no '}"
                     "patch sequences with their grid_thw")
    clip = pixel_shape(model.config, 1)
    if spec.frames_in_batch not in (0, clip[1] if len(clip) == 5 else 0):
        raise refuse("frames_in_batch", spec.frames_in_batch, "expected 0, or the config's num_frames for a video "
                     f"tower that takes each clip's frames in its batch (its clips are {list(clip[1:])})")
    backbone = _backbone(model, spec)
    for path in spec.excluded_from_budget:
        if not path or not isinstance(find_attribute(backbone, path), nn.Module):
            raise refuse("excluded_from_budget", list(spec.excluded_from_budget), f"{path!r} names "
                         f"{_what(find_attribute(backbone, path)) if path else 'the whole backbone'}, not a module "
                         "of the backbone")
        if f"{path}.".startswith(f"{spec.layers}.") or f"{spec.layers}.".startswith(f"{path}."):
            raise refuse("excluded_from_budget", list(spec.excluded_from_budget), f"{path!r} holds blocks, whose "
                         "heads and neurons are the budget")
    _check_forward(model, layers[0], spec, refuse)


def _backbone(model: nn.Module, spec: ArchitectureSpec) -> nn.Module:
    return model if spec.backbone == "" else getattr(model, "base_model", model)


def _stack(model: nn.Module, spec: ArchitectureSpec, refuse: _Refusal) -> nn.Module:
    """The stack of blocks ``spec.layers`` names: one ``nn.ModuleList`` or ``nn.Sequential`` of one class, as long
    as the config says."""
    def stack(owner: nn.Module) -> nn.Module | None:
        found = find_attribute(owner, spec.layers)
        return found if isinstance(found, (nn.ModuleList, nn.Sequential)) and len(found) and len(
            set(map(type, found))) == 1 else None

    backbone = _backbone(model, spec)
    layers = stack(backbone)
    if layers is None:
        other = model if spec.backbone is None else getattr(model, "base_model", model)
        if other is not backbone and stack(other) is not None:
            right = '""' if spec.backbone is None else "null"
            raise refuse("backbone", spec.backbone, f"its blocks ({spec.layers!r}) are in the model's "
                         f"{'base model' if spec.backbone == '' else 'own modules'}: expected backbone={right}")
        raise refuse("layers", spec.layers, f"it names {_what(find_attribute(backbone, spec.layers))} in the "
                     "backbone, expected an nn.ModuleList or nn.Sequential of blocks of one class")
    depth = getattr(vision_config(model.config), "num_hidden_layers", None)
    if isinstance(depth, int) and not isinstance(depth, bool) and depth != len(layers):
        raise refuse("layers", spec.layers, f"it holds {len(layers)} blocks, config.num_hidden_layers is {depth}")
    return layers


def _linear(owner: nn.Module, path: str, field: str, index: int, refuse: _Refusal) -> nn.Linear:
    found = find_attribute(owner, path) if path else owner
    if not isinstance(found, nn.Linear):
        raise refuse(field, path, f"in block {index} it names {_what(found)}, expected an nn.Linear")
    return found


def _block(block: nn.Module, index: int, spec: ArchitectureSpec, refuse: _Refusal) -> tuple[int, int]:
    """Check one block's modules, widths and head attributes; its ``(heads, attention width)``."""
    attention, mlp = (find_attribute(block, path) if path else block for path in (spec.attention, spec.mlp))
    for field, module in (("attention", attention), ("mlp", mlp)):
        if not isinstance(module, nn.Module):
            raise refuse(field, getattr(spec, field), f"in block {index} it names {_what(module)}, expected a module")
    fields = ("q_proj", "k_proj", "v_proj", "o_proj")
    q, k, v, o = (_linear(attention, getattr(spec, f), f, index, refuse) for f in fields)
    variant = spec.mlp_variants[0]
    ins = [_linear(mlp, path, "mlp_in", index, refuse) for path in variant.in_proj]
    out = _linear(mlp, variant.out_proj, "mlp_out", index, refuse)
    modules = [(f, m) for f, m in zip(fields, (q, k, v, o)) if spec.qkv_blocks == (0, 0, 0) or f in ("q_proj",
                                                                                                     "o_proj")]
    modules += [("mlp_in", m) for m in ins] + [("mlp_out", out)]
    for position, (field, module) in enumerate(modules):
        if same := [f for f, other in modules[:position] if other is module]:
            raise refuse(field, _stored(spec, field), f"in block {index} it names the projection {same[0]} names")
    # The residual width: what most of the projections agree on (one edited path cannot outvote the rest).
    hidden = Counter([q.in_features, k.in_features, v.in_features, o.out_features, out.out_features,
                      *(m.in_features for m in ins)]).most_common(1)[0][0]
    for field, features in (("q_proj", q.in_features), ("k_proj", k.in_features), ("v_proj", v.in_features),
                            ("o_proj", o.out_features), ("mlp_out", out.out_features),
                            *(("mlp_in", m.in_features) for m in ins)):
        if features != hidden:
            verb = "gives" if field in ("o_proj", "mlp_out") else "takes"
            raise refuse(field, _stored(spec, field), f"in block {index} it {verb} {features} features, expected "
                         f"the model width {hidden}")
    fused = spec.qkv_blocks == (0, 1, 2)
    if fused and q.out_features % 3:
        raise refuse("qkv_blocks", list(spec.qkv_blocks), f"{spec.q_proj!r} gives {q.out_features} rows in block "
                     f"{index}, not three equal blocks of query, key and value")
    width = q.out_features // 3 if fused else q.out_features
    for field, features in (("k_proj", k.out_features // (3 if fused else 1)),
                            ("v_proj", v.out_features // (3 if fused else 1)), ("o_proj", o.in_features)):
        if features != width:
            verb = "takes" if field == "o_proj" else "gives"
            raise refuse(field, getattr(spec, field), f"in block {index} it {verb} {features} features, expected the "
                         f"attention width {width} (the query's rows)")
    neurons = out.in_features
    for path, linear in zip(variant.in_proj, ins):
        if linear.out_features not in (neurons, 2 * neurons):
            raise refuse("mlp_in", list(variant.in_proj), f"{path!r} gives {linear.out_features} rows in block "
                         f"{index} for {neurons} FFN neurons (the inputs of mlp_out {variant.out_proj!r}): expected "
                         f"{neurons}, or {2 * neurons} (value and gate)")
    # Another attention of the block (TimeSformer's temporal one, of the attention's class) holds no FFN input.
    named = {id(m) for _, m in modules} | {id(m) for other in mlp.modules() if type(other) is type(attention)
                                           and other is not mlp for m in other.modules()}
    left = [name for name, m in mlp.named_modules() if isinstance(m, nn.Linear) and id(m) not in named
            and m.in_features == hidden and m.out_features in (neurons, 2 * neurons)]
    if left:  # an FFN input the spec leaves out would keep every row while its neurons go
        raise refuse("mlp_in", list(variant.in_proj), f"it leaves out {left}, which block {index}'s FFN also "
                     f"computes its {neurons} neurons with")
    heads = _heads(attention, index, width, spec, refuse)
    _per_head(block, index, spec, heads, refuse)
    return heads, width


def _per_head(block: nn.Module, index: int, spec: ArchitectureSpec, heads: int, refuse: _Refusal) -> None:
    """The per-head tables (a parameter whose last dimension has one entry per head) and layers (an ``nn.Linear`` of
    one output row per head) the spec names in one block."""
    for field, kind, size in (("head_tables", nn.Parameter, lambda t: t.shape[-1] if t.ndim else 0),
                              ("head_rows", nn.Linear, lambda m: m.out_features)):
        for path in getattr(spec, field):
            found = find_attribute(block, path)
            if not isinstance(found, kind) or size(found) != heads:
                what = f"{_what(found)}" + (f" of {size(found)}" if isinstance(found, kind) else "")
                raise refuse(field, list(getattr(spec, field)), f"{path!r} names {what} in block {index}, expected "
                             f"{'a parameter' if kind is nn.Parameter else 'an nn.Linear'} of one "
                             f"{'entry' if kind is nn.Parameter else 'output row'} per head ({heads})")


def _integer(owner: nn.Module, path: str) -> int | None:
    value = find_attribute(owner, path)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _heads(attention: nn.Module, index: int, width: int, spec: ArchitectureSpec, refuse: _Refusal) -> int:
    """The head count of one block's attention, its attributes checked against its ``width``."""
    for field in ("head_count_attrs", "head_size_attrs"):
        for path in getattr(spec, field):
            if _integer(attention, path) is None:
                raise refuse(field, list(getattr(spec, field)), f"{path!r} is {find_attribute(attention, path)!r} in "
                             f"block {index}, expected a positive integer")
    counts = [_integer(attention, path) for path in spec.head_count_attrs]
    if isinstance(spec.head_width, int):  # a constant the forward splits by
        head_dim = spec.head_width
    elif spec.head_width:
        head_dim = _integer(attention, spec.head_width)
        if head_dim is None:
            raise refuse("head_width", spec.head_width, f"in block {index} it is "
                         f"{find_attribute(attention, spec.head_width)!r}, expected one head's width (an integer)")
    elif not counts:
        raise refuse("head_width", "", "one head's width is then the query rows over the first head_count_attrs, "
                     "and head_count_attrs is empty")
    else:
        head_dim = width // counts[0] if width % counts[0] == 0 else 0
    if not head_dim or width % head_dim:
        field = "head_width" if spec.head_width else "head_count_attrs"
        raise refuse(field, getattr(spec, field), f"block {index}'s attention width {width} is no whole number of "
                     f"heads of width {head_dim or width / counts[0]:g}")
    heads = width // head_dim
    for field, expected in (("head_count_attrs", heads), ("head_size_attrs", width)):
        for path in getattr(spec, field):
            if _integer(attention, path) != expected:
                by = f" by head_width={spec.head_width!r}" if spec.head_width else ""
                raise refuse(field, list(getattr(spec, field)), f"{path!r} is {_integer(attention, path)} in block "
                             f"{index}, expected {expected} ({heads} heads of width {head_dim}{by})")
    if index == 0:  # every attribute discovery finds for these heads must change with them
        must = head_attributes(attention, heads, head_dim, any_size_name=False)[:2]
        for field, names in zip(("head_count_attrs", "head_size_attrs"), must):
            if missing := [name for name in names if name not in getattr(spec, field)]:
                raise refuse(field, list(getattr(spec, field)), f"it lacks {missing}, which hold "
                             f"{'the head count' if field == 'head_count_attrs' else 'heads × head width'} "
                             "and must change with it")
    return heads


def _check_forward(model: nn.Module, block: nn.Module, spec: ArchitectureSpec, refuse: _Refusal) -> None:
    """What one forward shows (where the model's forward can run on its device): the projections run as a block's
    do, and the tokens the block sees are the spec's patch and other tokens."""
    clip = pixel_shape(model.config, 1)
    try:
        found, _ = trace(model, block, clip[1:] if spec.frames_in_batch else clip)
        calls, tokens, traced = found.calls, found.tokens, found.patches // max(1, spec.frames_in_batch)
    except UnsupportedArchitectureError:  # a forward the meta device cannot run (one that reads a value): no trace
        calls, tokens, traced = None, 0, 0
    patches = patch_count(model, tokens, traced) if tokens or not takes_grid(model) else spec.num_patches(model.config)
    if spec.num_patches(model.config) != patches:
        raise refuse("num_patches", spec.num_patches(model.config), f"an image of the configured size gives "
                     f"{patches} patch tokens")
    if tokens and spec.extra_tokens(model.config) != max(0, tokens - patches):
        raise refuse("extra_tokens", spec.extra_tokens(model.config), f"block 0 sees {tokens} tokens: {patches} "
                     f"patches and {max(0, tokens - patches)} others (class, register tokens)")
    if calls is None:
        return
    order = [name for name, _ in calls]

    def full(field: str, path: str) -> str:
        parent = spec.attention if field in ("q_proj", "k_proj", "v_proj", "o_proj") else spec.mlp
        return f"{parent}.{path}" if parent and path else parent or path

    variant = spec.mlp_variants[0]
    named = [(f, getattr(spec, f)) for f in ("q_proj", "k_proj", "v_proj", "o_proj")]
    named += [("mlp_in", p) for p in variant.in_proj] + [("mlp_out", variant.out_proj)]
    for field, path in named:
        if full(field, path) not in order:
            raise refuse(field, path, f"block 0's forward never runs it (it runs {order})")
    at = {full(field, path): order.index(full(field, path)) for field, path in named}
    qkv = sorted(dict.fromkeys(full(f, getattr(spec, f)) for f in ("q_proj", "k_proj", "v_proj")), key=at.get)
    if at[qkv[-1]] > at[full("o_proj", spec.o_proj)]:
        raise refuse("o_proj", spec.o_proj, f"block 0's forward runs it before {qkv[-1]!r}, but the output "
                     f"projection runs after q_proj, k_proj and v_proj ({order})")
    if spec.qkv_blocks == (0, 0, 0):
        roles = [name for name, _ in by_role([(name, None) for name in qkv])]
        if roles != [full(f, getattr(spec, f)) for f in ("q_proj", "k_proj", "v_proj")]:
            raise refuse("q_proj/k_proj/v_proj", [spec.q_proj, spec.k_proj, spec.v_proj], f"by their names and "
                         f"the order block 0's forward runs them, query, key and value are {roles}")
    ffn = [full("mlp_in", p) for p in variant.in_proj] + [full("mlp_out", variant.out_proj)]
    if [at[name] for name in ffn] != sorted(at[name] for name in ffn):
        raise refuse("mlp_in/mlp_out", [list(variant.in_proj), variant.out_proj], "block 0's forward runs "
                     f"the FFN projections in the order {sorted(ffn, key=at.get)}: mlp_in in that order, then "
                     "mlp_out")


def require_stored_spec(config: PretrainedConfig, source: str | os.PathLike) -> None:
    """Refuse an elastic checkpoint of a model (or a task model's encoder) that no registry knows whose config.json
    has no ``elastic_spec``: its structure would be guessed, unproven, on the loader's meta-device skeleton."""
    if getattr(config, SPEC_KEY, None) is not None or not any(
            getattr(config, key, None) is not None for key in ("elastic_ranking", "elastic_layout")):
        return
    task = task_model_spec(config.model_type)
    kind = getattr(getattr(config, task.encoder_config, None), "model_type", None) if task else config.model_type
    if kind in supported_model_types():
        return
    raise UnsupportedArchitectureError(
        f"{str(source)!r} is an elastic checkpoint of {kind!r}, a model_type no registry knows, but its config.json "
        f"has no {SPEC_KEY!r} (the proven structure save_elastic stores), and hf_snapvit does not slice by a guess. "
        "Re-save it with hf_snapvit.save_elastic (AutoModel.from_pretrained reads it dense), or register an "
        f"ArchitectureSpec for {kind!r}.")
