"""The rules that tell a vision transformer's parts apart, shared by discovery (:mod:`.discovery`, which finds a spec
by them) and by the check of a spec a checkpoint stores (:mod:`.stored`, which holds the spec to them): which
projection is the query, key or value, which attributes hold the head count and width, how many heads a forward
splits the query into, how many patch tokens an image gives, and whether a stack of blocks is one of a plain ViT."""

from __future__ import annotations

import math
from collections import Counter

import torch.nn as nn

from .inputs import patch_side, pixel_shape, takes_grid
from .registry import vision_config
from .tracing import Split


def role(name: str) -> int | None:
    """0, 1 or 2 where a projection's name says query, key or value (``query``, ``to_q``, ``q_proj``), else None."""
    last = name.rsplit(".", 1)[-1].lower()
    for index, (letter, word) in enumerate((("q", "query"), ("k", "key"), ("v", "value"))):
        if last in (letter, word) or last.startswith((f"{letter}_", f"{word}_")) or last.endswith(f"_{letter}"):
            return index
    return None


def by_role(calls: list[tuple[str, nn.Linear]]) -> list[tuple[str, nn.Linear]]:
    """The three attention projections as query, key, value where their names say so, else in call order (their
    roles are symmetric for slicing)."""
    roles = [role(name) for name, _ in calls]
    if sorted(r for r in roles if r is not None) == [0, 1, 2]:
        return [call for _, call in sorted(zip(roles, calls), key=lambda pair: pair[0])]
    return calls


def head_attributes(attention: nn.Module, heads: int, width: int,
                    any_size_name: bool) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The attention module's attributes holding the head count, heads × head width, and one head's width (``""`` if
    it keeps none): those whose names contain "head", each taken by its value, or where values coincide (a head
    width equal to the head count) by its name (:func:`_head_role`); with ``any_size_name`` also the attention
    module's own integers equal to heads × head width whatever their name (an ``embed_dim`` that a forward reshapes
    to). All empty where the module keeps none of them (the forward may split by constants: see
    :func:`traced_heads`)."""
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
            found = _head_role(name, value, heads, width)
            {"count": counts, "size": sizes, "width": widths}.get(found, []).append(path)
    return tuple(counts), tuple(sizes), widths[0] if widths else ""  # "": the width is rows over the head count


def _head_role(name: str, value: int, heads: int, width: int) -> str | None:
    """Whether an attribute named ``name`` holding ``value`` is the head ``count``, heads × head width (``size``) or
    one head's ``width``: by its value, and where several fit (4 heads of width 4), by its name (``head_dim``,
    ``head_size``, ``head_width``: a width; ``num_heads``, ``n_heads``, ``head_count``: a count; ``all_head_size``:
    heads × width)."""
    roles = [role for role, fits in (("count", heads), ("size", heads * width), ("width", width)) if fits == value]
    if len(roles) > 1:
        lower = name.lower()
        if lower.startswith(("num", "n_")) or "count" in lower or lower.endswith("heads"):
            named = "count"
        elif any(word in lower for word in ("dim", "size", "width")):
            named = "size" if lower.startswith(("all_", "total_", "inner_")) else "width"
        else:
            named = roles[0]
        roles = [named] if named in roles else roles
    return roles[0] if roles else None


def shape_attributes(attention: nn.Module, owners: list[str], heads: int) -> tuple[str, ...]:
    """Entries of tuple attributes that hold the head count last (``rel_pos.bias_shape[-1]``: timm's
    relative-position modules view their bias to it) in the modules ``owners`` (paths inside ``attention``) that
    compute each head's position bias: they change with the heads."""
    found = []
    for owner in dict.fromkeys(owners):
        module = attention.get_submodule(owner) if owner else attention
        for name, value in vars(module).items():
            if (isinstance(value, tuple) and len(value) > 1 and all(isinstance(v, int) for v in value)
                    and value[-1] == heads):
                found.append(f"{owner}.{name}[-1]" if owner else f"{name}[-1]")
    return tuple(found)


def traced_heads(splits: list[Split], rows: int, width: int) -> int:
    """The head count a block's forward shows: the first reshape, after a query/key/value projection of ``rows``
    outputs ran, that splits those outputs (or a fused qkv's third of them) into ``[..., heads, head_dim]`` (or
    ``[..., 3, heads, head_dim]``) for an attention ``width`` (heads × head_dim); 0 if none does."""
    for calls, before, after in splits:
        if calls < 1 or not before or before[-1] not in (rows, width) or len(after) <= len(before) or (
                after[-1] >= before[-1]):
            continue
        for start in range(len(after) - 2, -1, -1):  # the shortest tail of the new shape that holds the rows
            if math.prod(after[start:]) == before[-1]:
                return width // after[-1] if width % after[-1] == 0 else 0
    return 0


def patch_count(model: nn.Module, tokens: int, traced: int = 0) -> int:
    """Patch tokens of one input at the configured size (of one frame, for a tower that takes a clip's frames in its
    batch): the patch grid (times the tubelets of a video model), or for a tower that takes every patch in one
    sequence, the ``tokens`` its block sees. Where that grid holds more patches than the block sees ``tokens`` (a
    hybrid's stem downsamples before its patch embedding), the ``traced`` patches the patch embedding gave it."""
    if takes_grid(model):
        return tokens
    config = vision_config(model.config)
    patches = (pixel_shape(model.config, 1)[-1] // patch_side(model)) ** 2
    frames, tubelet = getattr(config, "num_frames", None), getattr(config, "tubelet_size", None)
    if isinstance(frames, int) and isinstance(tubelet, int) and tubelet > 0:
        patches *= frames // tubelet
    return traced if tokens and patches > tokens and 0 < traced <= tokens else patches


def uneven_blocks(layers: nn.Module) -> str:
    """How the blocks of the stack ``layers`` differ, where they are not those of a plain ViT (their projections
    differ in width or in number: hierarchical stages), else ``""``."""
    kinds = (nn.Linear, nn.Conv1d, nn.Conv2d)
    shapes = [Counter(tuple(m.weight.shape) for m in block.modules() if isinstance(m, kinds)) for block in layers]
    if all(s == shapes[0] for s in shapes):
        return ""
    widths = [next((int(m.weight.shape[1]) for m in block.modules() if isinstance(m, nn.Linear)), None)
              or next((int(m.weight.shape[0]) for m in block.modules() if isinstance(m, kinds)), 0)
              for block in layers]
    if len(set(widths)) > 1:
        return f"differ in width ({', '.join(map(str, dict.fromkeys(widths)))}): hierarchical stages"
    counts = list(dict.fromkeys(sum(s.values()) for s in shapes))
    if len(counts) > 1:
        return f"differ in structure ({' vs '.join(map(str, counts))} projections): stages, not one repeated block"
    other = next(i for i, shape in enumerate(shapes) if shape != shapes[0])
    first, then = shapes[0], shapes[other]
    mine, theirs = (sorted((a - b).elements())[:2] for a, b in ((first, then), (then, first)))
    return (f"differ in their projections' shapes (block 0 has {mine}, block {other} {theirs} weights): not one "
            "repeated block")
