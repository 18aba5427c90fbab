"""Physical surgery on transformers modules: keep (and reorder) a subset of attention heads and FFN neurons.

One operation serves three purposes: permuting a dense model into rank order (keep every unit, reordered),
slicing a model to a budget (keep a prefix of that order), and building the shapes of a meta-device skeleton before
weights are read. Only the q/k/v rows, the o_proj columns, the FFN input rows and the FFN output columns change; block
outputs, norms, embeddings and task heads keep their width.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
from transformers import PreTrainedModel

from .architectures import ArchitectureSpec, get_attention, get_layers, get_mlp, get_spec, head_dim

IndexLike = Sequence[int] | np.ndarray | torch.Tensor


def _as_index(index: IndexLike, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(index, dtype=np.int64), device=device)


def _take(linear: nn.Linear, index: torch.Tensor, dim: int) -> None:
    """Keep ``index`` along ``dim`` of the weight (0 = output rows, with the bias; 1 = input columns)."""
    weight = linear.weight
    index = index.to(weight.device)
    linear.weight = nn.Parameter(weight.data.index_select(dim, index), requires_grad=weight.requires_grad)
    if dim == 0:
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias.data.index_select(0, index), requires_grad=linear.bias.requires_grad)
        linear.out_features = len(index)
    else:
        linear.in_features = len(index)


def slice_heads_(attention: nn.Module, spec: ArchitectureSpec, keep: IndexLike) -> None:
    """Keep the heads ``keep`` (in that order) of one attention module, in place."""
    hd = head_dim(attention, spec)
    device = getattr(attention, spec.q_proj).weight.device
    heads = _as_index(keep, device)
    rows = (heads[:, None] * hd + torch.arange(hd, device=device)).reshape(-1)
    for name in (spec.q_proj, spec.k_proj, spec.v_proj):
        _take(getattr(attention, name), rows, 0)
    _take(getattr(attention, spec.o_proj), rows, 1)
    # Older layouts reshape with these attributes; newer ones infer heads from the tensor, so keep both right.
    for name in spec.head_count_attrs:
        if hasattr(attention, name):
            setattr(attention, name, len(heads))
    if hasattr(attention, "all_head_size"):
        attention.all_head_size = len(heads) * hd


def slice_neurons_(layer: nn.Module, spec: ArchitectureSpec, keep: IndexLike) -> None:
    """Keep the FFN neurons ``keep`` (in that order) of one block, in place."""
    mlp, variant = get_mlp(layer, spec)
    out_proj = getattr(mlp, variant.out_proj)
    index = _as_index(keep, out_proj.weight.device)
    for name in variant.in_proj:
        _take(getattr(mlp, name), index, 0)
    _take(out_proj, index, 1)


def slice_model_(model: PreTrainedModel, keep: Sequence[tuple[IndexLike, IndexLike]]) -> PreTrainedModel:
    """Keep, in every block ``l``, the heads ``keep[l][0]`` and the FFN neurons ``keep[l][1]`` (in that order).

    Works on real and meta-device models. Passing full permutations reorders units without removing any, which is
    function-preserving. Returns ``model`` (modified in place).
    """
    spec = get_spec(model)
    layers = get_layers(model, spec)
    if len(keep) != len(layers):
        raise ValueError(f"keep has {len(keep)} entries but the model has {len(layers)} blocks")
    for layer, (heads, neurons) in zip(layers, keep):
        slice_heads_(get_attention(layer, spec), spec, heads)
        slice_neurons_(layer, spec, neurons)
    return model
