"""Physical surgery on transformers modules: keep (and reorder) a subset of attention heads and FFN neurons.

One operation serves three purposes: permuting a dense model into rank order (keep every unit, reordered),
slicing a model to a budget (keep a prefix of that order), and building the shapes of a meta-device skeleton before
weights are read. Only the q/k/v rows (in each row block of a fused ``qkv``), the o_proj columns, the FFN input rows,
the FFN output columns, the heads' entries of per-head tables (BEiT's relative position bias) and the rows of per-head
layers (timm's relative-position MLP) change; block outputs, norms, embeddings and task heads keep their width.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
from transformers import PreTrainedModel

from ..architectures import (ArchitectureSpec, ffn_inputs, get_attention, get_layers, get_mlp, get_projection,
                             get_spec, head_dim, head_rows, head_tables, qkv_projections, set_attribute)

IndexLike = Sequence[int] | np.ndarray | torch.Tensor


def _as_index(index: IndexLike, device: torch.device) -> torch.Tensor:
    if isinstance(index, torch.Tensor):  # already on the device, as the search passes it: no host round trip
        return index.to(device=device, dtype=torch.int64)
    return torch.as_tensor(np.asarray(index, dtype=np.int64), device=device)


def _take(linear: nn.Linear, index: torch.Tensor, dim: int, source: nn.Linear | None = None) -> None:
    """Keep ``index`` along ``dim`` of the weight (0 = output rows, with the bias; 1 = input columns).

    With ``source``, the kept slices are taken from ``source`` (a dense twin) instead of ``linear`` itself.
    """
    source = source or linear
    weight = source.weight
    index = index.to(weight.device)
    linear.weight = nn.Parameter(weight.data.index_select(dim, index), requires_grad=weight.requires_grad)
    if dim == 0:
        if source.bias is not None:
            linear.bias = nn.Parameter(source.bias.data.index_select(0, index), requires_grad=source.bias.requires_grad)
        linear.out_features = len(index)
    else:
        if source is not linear and source.bias is not None:
            linear.bias = source.bias
        linear.in_features = len(index)


def slice_heads_(attention: nn.Module, spec: ArchitectureSpec, keep: IndexLike, source: nn.Module | None = None) -> None:
    """Keep the heads ``keep`` (in that order) of one attention module, in place (taken from ``source`` if given).

    A fused projection keeps the heads' rows in each of its row blocks (query, key, value), blocks in their order."""
    source = source or attention
    hd = head_dim(source, spec)
    device = get_projection(source, spec.q_proj).weight.device
    heads = _as_index(keep, device)
    rows = (heads[:, None] * hd + torch.arange(hd, device=device)).reshape(-1)
    for (linear, blocks), (origin, _) in zip(qkv_projections(attention, spec), qkv_projections(source, spec)):
        width = origin.weight.shape[0] // blocks
        _take(linear, torch.cat([block * width + rows for block in range(blocks)]), 0, origin)
    _take(get_projection(attention, spec.o_proj), rows, 1, get_projection(source, spec.o_proj))
    set_head_count_(attention, spec, len(heads), hd)


def slice_head_tables_(layer: nn.Module, spec: ArchitectureSpec, keep: IndexLike,
                       source: nn.Module | None = None) -> None:
    """Keep the entries of the heads ``keep`` (in that order) in the block's per-head tables (the last dimension of
    BEiT's relative position bias) and the rows of its per-head layers (``head_rows``: timm's relative-position
    MLP), in place (taken from ``source``, a dense twin block, if given)."""
    origins = head_tables(source if source is not None else layer, spec)
    for (owner, name), (origin, _) in zip(head_tables(layer, spec), origins):
        table = getattr(origin, name)
        index = _as_index(keep, table.device)
        setattr(owner, name, nn.Parameter(table.data.index_select(-1, index), requires_grad=table.requires_grad))
    for linear, origin in zip(head_rows(layer, spec), head_rows(source if source is not None else layer, spec)):
        _take(linear, _as_index(keep, origin.weight.device), 0, origin)


def set_head_count_(attention: nn.Module, spec: ArchitectureSpec, count: int, width: int) -> None:
    """Record ``count`` heads of ``width`` on an attention module. Older layouts reshape with these attributes; newer
    ones infer heads from the tensor, so keep both right."""
    for paths, value in ((spec.head_count_attrs, count), (spec.head_size_attrs, count * width)):
        for path in paths:
            set_attribute(attention, path, value)


def slice_neurons_(layer: nn.Module, spec: ArchitectureSpec, keep: IndexLike, source: nn.Module | None = None) -> None:
    """Keep the FFN neurons ``keep`` (in that order) of one block, in place (taken from ``source`` if given)."""
    mlp, variant = get_mlp(layer, spec)
    source_mlp, _ = get_mlp(source, spec) if source is not None else (mlp, variant)
    out_proj = get_projection(source_mlp, variant.out_proj)
    index, width = _as_index(keep, out_proj.weight.device), out_proj.in_features
    for (linear, _), (origin, blocks) in zip(ffn_inputs(mlp, variant), ffn_inputs(source_mlp, variant)):
        _take(linear, torch.cat([b * width + index for b in range(blocks)]), 0, origin)
    _take(get_projection(mlp, variant.out_proj), index, 1, get_projection(source_mlp, variant.out_proj))


#: A block's two column-pruned projections (attention output, FFN output), by the names corrections give them.
OUTPUT_KINDS = ("attention_output", "ffn_output")


def output_projections(layer: nn.Module, spec: ArchitectureSpec) -> tuple[nn.Linear, nn.Linear]:
    """A block's attention and FFN output projections (the layers whose input columns pruning removes), in the order
    of :data:`OUTPUT_KINDS`."""
    mlp, variant = get_mlp(layer, spec)
    return get_projection(get_attention(layer, spec), spec.o_proj), get_projection(mlp, variant.out_proj)


def prefixes(heads: Sequence[int], neurons: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``keep`` for :func:`slice_model_` that keeps the first ``heads[l]`` heads and ``neurons[l]`` neurons of each
    block: what every budget keeps of a model in rank order."""
    return [(np.arange(h), np.arange(f)) for h, f in zip(heads, neurons)]


def slice_model_(
    model: PreTrainedModel,
    keep: Sequence[tuple[IndexLike, IndexLike]],
    source: PreTrainedModel | None = None,
) -> PreTrainedModel:
    """Keep, in every block ``l``, the heads ``keep[l][0]`` and the FFN neurons ``keep[l][1]`` (in that order).

    Works on real and meta-device models. Passing full permutations reorders units without removing any, which is
    function-preserving. With ``source`` (a dense model of the same architecture), the kept weights are copied from
    it, so one working copy can be re-sliced to any candidate without accumulating cuts. Returns ``model``
    (modified in place).
    """
    spec = get_spec(model)
    layers = get_layers(model, spec)
    sources = get_layers(source, spec) if source is not None else [None] * len(layers)
    if len(keep) != len(layers):
        raise ValueError(f"keep has {len(keep)} entries but the model has {len(layers)} blocks")
    for layer, origin, (heads, neurons) in zip(layers, sources, keep):
        slice_heads_(get_attention(layer, spec), spec, heads,
                     get_attention(origin, spec) if origin is not None else None)
        slice_head_tables_(layer, spec, heads, origin)
        slice_neurons_(layer, spec, neurons, origin)
    return model


def slice_to_layout_(model: PreTrainedModel) -> PreTrainedModel:
    """Cut every block of a freshly built ``model`` to the widths in ``config.elastic_layout`` (the first units of
    each, as a sliced checkpoint stores them), in place; without a layout the model is left as it is. Sliced classes
    call this in ``__init__``, so transformers' own loading fills the sliced modules."""
    layout = getattr(model.config, "elastic_layout", None)
    if layout:
        slice_model_(model, prefixes(layout["num_heads"], layout["intermediate_size"]))
    return model
