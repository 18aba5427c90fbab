"""A model's parts as its spec names them: the backbone, the blocks, each block's attention and FFN, the q/k/v/o
projections (and the row blocks of a fused qkv), per-head tables, and the head count and width. Every other module
reaches heads and neurons only through these."""

from __future__ import annotations

import torch.nn as nn

from ..errors import UnsupportedArchitectureError
from .registry import ArchitectureSpec, MlpSpec, get_spec


def _get(module: nn.Module, path: str) -> nn.Module:
    return module.get_submodule(path) if path else module


def find_attribute(owner: object, path: str) -> object:
    """What the dotted ``path`` names inside ``owner`` (a module, parameter or plain attribute; ``"bias_shape[-1]"``:
    an entry of a tuple attribute), ``None`` if absent."""
    for name in path.split(".") if path else ():
        name, _, index = name.partition("[")
        owner = getattr(owner, name, None)
        if index:
            try:
                owner = owner[int(index.rstrip("]"))]
            except (TypeError, IndexError, ValueError):
                return None
    return owner


def set_attribute(owner: object, path: str, value: object) -> None:
    """Set what the dotted ``path`` names inside ``owner`` (see :func:`find_attribute`) to ``value``, if it exists;
    a tuple entry is set by replacing the tuple."""
    parent, _, name = path.rpartition(".")
    owner = find_attribute(owner, parent)
    name, _, index = name.partition("[")
    if not hasattr(owner, name):
        return
    if not index:
        setattr(owner, name, value)
        return
    entries = list(getattr(owner, name))
    entries[int(index.rstrip("]"))] = value
    setattr(owner, name, type(getattr(owner, name))(entries))


def get_projection(module: nn.Module, path: str) -> nn.Linear:
    """The projection a spec names by the dotted ``path`` inside ``module`` (``"q_proj"``, ``"attention.query"``)."""
    return module.get_submodule(path)


def head_tables(layer: nn.Module, spec: ArchitectureSpec) -> list[tuple[nn.Module, str]]:
    """``(owning module, parameter name)`` of each of the spec's per-head tables that this block has."""
    found = []
    for path in spec.head_tables:
        owner, _, name = path.rpartition(".")
        module = find_attribute(layer, owner)
        if isinstance(getattr(module, name, None), nn.Parameter):
            found.append((module, name))
    return found


def head_rows(layer: nn.Module, spec: ArchitectureSpec) -> list[nn.Linear]:
    """The ``nn.Linear`` layers of the spec's ``head_rows`` that this block has: one output row per head."""
    return [m for m in (find_attribute(layer, path) for path in spec.head_rows) if isinstance(m, nn.Linear)]


def get_backbone(model: nn.Module, spec: ArchitectureSpec | None = None) -> nn.Module:
    """The vision backbone of ``model`` (the model itself for a bare backbone, e.g. ``vit`` of a classifier, the
    vision tower of a task model)."""
    spec = spec or get_spec(model)
    vision = _get(model, spec.encoder)
    if spec.backbone is not None:
        return _get(vision, spec.backbone)
    return getattr(vision, "base_model", vision)


def feature_module(model: nn.Module, spec: ArchitectureSpec | None = None) -> nn.Module:
    """The module whose output holds what is read of ``model``'s vision features: a task model's transformers
    backbone where its task reads feature maps (ZoeDepth's ``BeitBackbone``, whose inner ``BeitModel`` returns
    none), else :func:`get_backbone`."""
    spec = spec or get_spec(model)
    if spec.task is not None and spec.task.features == "feature_maps" and spec.encoder:
        return _get(model, spec.encoder)
    return get_backbone(model, spec)


def get_layers(model: nn.Module, spec: ArchitectureSpec | None = None) -> nn.ModuleList:
    """The transformer blocks of ``model``, in depth order."""
    spec = spec or get_spec(model)
    backbone = get_backbone(model, spec)
    for name, value, why in spec.unsupported_config:
        if getattr(getattr(backbone, "config", None), name, None) == value:
            raise UnsupportedArchitectureError(
                f"This {spec.model_type} model has config.{name}={value!r}, which hf_snapvit cannot prune: {why}"
            )
    return _get(backbone, spec.layers)


def get_attention(layer: nn.Module, spec: ArchitectureSpec) -> nn.Module:
    return _get(layer, spec.attention)


def get_mlp(layer: nn.Module, spec: ArchitectureSpec) -> tuple[nn.Module, MlpSpec]:
    """The FFN module of a block and the variant of :class:`MlpSpec` that describes it."""
    mlp = _get(layer, spec.mlp)
    for variant in spec.mlp_variants:
        names = (*variant.in_proj, variant.out_proj)
        if all(isinstance(find_attribute(mlp, name), nn.Linear) for name in names):
            return mlp, variant
    raise UnsupportedArchitectureError(
        f"The FFN of this {spec.model_type!r} block ({type(mlp).__name__}) matches none of the registered layouts "
        f"{[(*v.in_proj, v.out_proj) for v in spec.mlp_variants]}; register an MlpSpec for it."
    )


def ffn_inputs(mlp: nn.Module, variant: MlpSpec) -> list[tuple[nn.Linear, int]]:
    """Each row-sliced FFN projection with its number of equal row blocks: 1, or 2 where one projection computes
    the value and the gate (timm's ``GluMlp``, packed SwiGLU), whose neuron ``j`` is row ``j`` of each block."""
    width = get_projection(mlp, variant.out_proj).in_features
    found = []
    for name in variant.in_proj:
        linear = get_projection(mlp, name)
        if width <= 0 or linear.out_features % width:
            raise UnsupportedArchitectureError(
                f"The FFN projection {name!r} has {linear.out_features} rows for {width} neurons (the columns of "
                f"{variant.out_proj!r}); hf_snapvit slices FFN projections of one row per neuron, or of equal row "
                "blocks of one row per neuron. Register an MlpSpec naming the right projections.")
        found.append((linear, linear.out_features // width))
    return found


def ffn_rows(mlp: nn.Module, variant: MlpSpec) -> list[tuple[nn.Linear, slice]]:
    """Each row-sliced FFN projection with the rows of one of its row blocks (one entry per block): each entry holds
    one row per neuron, in neuron order."""
    rows = []
    for linear, blocks in ffn_inputs(mlp, variant):
        width = linear.out_features // blocks
        rows += [(linear, slice(b * width, (b + 1) * width)) for b in range(blocks)]
    return rows


def row_blocks(spec: ArchitectureSpec, path: str) -> int:
    """How many equal row blocks (one per query, key or value it computes) the projection at ``path`` holds."""
    return (spec.q_proj, spec.k_proj, spec.v_proj).count(path)


def qkv_projections(attention: nn.Module, spec: ArchitectureSpec) -> list[tuple[nn.Linear, int]]:
    """Each distinct query/key/value projection once (one fused ``qkv``, or three), with its number of row blocks."""
    paths = dict.fromkeys((spec.q_proj, spec.k_proj, spec.v_proj))
    return [(get_projection(attention, path), row_blocks(spec, path)) for path in paths]


def qkv_rows(attention: nn.Module, spec: ArchitectureSpec, role: int) -> tuple[nn.Linear, slice]:
    """The projection computing the query (``role`` 0), key (1) or value (2) heads, and the rows of its weight that
    hold them (all of them, or one block of a fused projection)."""
    path = (spec.q_proj, spec.k_proj, spec.v_proj)[role]
    linear = get_projection(attention, path)
    width = linear.weight.shape[0] // row_blocks(spec, path)
    return linear, slice(spec.qkv_blocks[role] * width, (spec.qkv_blocks[role] + 1) * width)


def head_dim(attention: nn.Module, spec: ArchitectureSpec) -> int:
    """Width of one head. Read from the module, so it stays right after heads are removed."""
    if isinstance(spec.head_width, int):  # a constant the forward splits by
        return spec.head_width
    if spec.head_width:
        return int(find_attribute(attention, spec.head_width))
    counts = [c for c in (find_attribute(attention, path) for path in spec.head_count_attrs) if isinstance(c, int)]
    if not counts:  # no width kept, and no count to derive it from (query rows over the head count)
        raise UnsupportedArchitectureError(f"{spec.model_type!r}: head_width is '' and no head_count_attrs is set.")
    return get_projection(attention, spec.q_proj).out_features // row_blocks(spec, spec.q_proj) // int(counts[0])


def num_heads(attention: nn.Module, spec: ArchitectureSpec) -> int:
    """Current number of heads, derived from the q projection so it is right for sliced modules."""
    rows = get_projection(attention, spec.q_proj).out_features // row_blocks(spec, spec.q_proj)
    return rows // head_dim(attention, spec)
