"""Switching a model's width in place: every projection computes with a prefix view of its full weight.

An elastic checkpoint stores each block's heads and FFN neurons in rank order, so every budget keeps a *prefix* of
every projection: the first rows of q/k/v and of the FFN input projections, the first columns of the attention and
FFN output projections. :class:`PrefixLinear` is an ``nn.Linear`` whose ``out_features`` / ``in_features`` may be
smaller than its weight: it multiplies by ``weight[:out_features, :in_features]``, a view (row prefixes are contiguous;
column prefixes are strided, which matrix products take without a copy). Switching size therefore sets a few
integers per block and never copies, allocates or frees a weight. Parameters keep their full shape, so
``state_dict`` stays the dense checkpoint and gradients reach exactly the active prefix.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedModel

from .architectures import ArchitectureSpec, get_attention, get_layers, get_mlp, get_spec, head_dim
from .errors import UnsupportedArchitectureError
from .slicing import set_head_count_


class PrefixLinear(nn.Linear):
    """An ``nn.Linear`` that uses the first ``out_features`` rows and first ``in_features`` columns of its weight.

    ``in_features`` and ``out_features`` say what the layer computes now, as on any ``nn.Linear``; the weight keeps
    its full (capacity) shape. Built by :func:`make_switchable_` from an existing ``nn.Linear`` (its class is swapped,
    its parameters are kept).
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's own argument name)
        weight, bias = self.weight, self.bias
        if self.out_features != weight.shape[0]:
            weight = weight[: self.out_features]
            bias = None if bias is None else bias[: self.out_features]
        if self.in_features != weight.shape[1]:
            weight = weight[:, : self.in_features]
        return F.linear(input, weight, bias)


def _projections(layer: nn.Module, spec: ArchitectureSpec) -> tuple[list[nn.Linear], nn.Linear, list[nn.Linear],
                                                                     nn.Linear]:
    """``(q/k/v, attention output, FFN inputs, FFN output)`` projections of one block."""
    attention = get_attention(layer, spec)
    mlp, variant = get_mlp(layer, spec)
    return ([getattr(attention, n) for n in (spec.q_proj, spec.k_proj, spec.v_proj)], getattr(attention, spec.o_proj),
            [getattr(mlp, n) for n in variant.in_proj], getattr(mlp, variant.out_proj))


def make_switchable_(model: PreTrainedModel) -> PreTrainedModel:
    """Turn every prunable projection of ``model`` into a :class:`PrefixLinear`, in place, at its current width.

    Only the class of those modules changes: parameters, buffers and outputs are untouched. Returns ``model``.

    Raises:
        UnsupportedArchitectureError: a projection is not a plain ``nn.Linear`` (quantised or adapter-wrapped layers
            have their own forward, which prefix views would bypass).
    """
    spec = get_spec(model)
    for index, layer in enumerate(get_layers(model, spec)):
        qkv, o_proj, ffn_in, ffn_out = _projections(layer, spec)
        for linear in (*qkv, o_proj, *ffn_in, ffn_out):
            if type(linear) not in (nn.Linear, PrefixLinear):
                raise UnsupportedArchitectureError(
                    f"Block {index} has a {type(linear).__module__}.{type(linear).__name__} projection; a switchable "
                    "model needs plain torch.nn.Linear projections. Make the model switchable before quantising it "
                    "or adding adapters, or load it at one size with from_pretrained(path, sparsity=...)."
                )
            linear.__class__ = PrefixLinear
    return model


def capacity(model: PreTrainedModel) -> tuple[list[int], list[int]]:
    """``(heads, neurons)`` per block that a switchable model's weights hold (the largest widths it can switch to)."""
    spec = get_spec(model)
    heads, neurons = [], []
    for layer in get_layers(model, spec):
        qkv, _, _, ffn_out = _projections(layer, spec)
        heads.append(qkv[0].weight.shape[0] // head_dim(get_attention(layer, spec), spec))
        neurons.append(ffn_out.weight.shape[1])
    return heads, neurons


def set_widths_(model: PreTrainedModel, heads: Sequence[int], neurons: Sequence[int]) -> None:
    """Make every block of a switchable ``model`` compute with its first ``heads[l]`` heads and ``neurons[l]`` FFN
    neurons, in place. Only integers change; the caller checks the widths against :func:`capacity`."""
    spec = get_spec(model)
    for layer, h, f in zip(get_layers(model, spec), heads, neurons):
        attention = get_attention(layer, spec)
        qkv, o_proj, ffn_in, ffn_out = _projections(layer, spec)
        rows = int(h) * head_dim(attention, spec)
        for linear in qkv:
            linear.out_features = rows
        o_proj.in_features = rows
        for linear in ffn_in:
            linear.out_features = int(f)
        ffn_out.in_features = int(f)
        set_head_count_(attention, spec, int(h), head_dim(attention, spec))
