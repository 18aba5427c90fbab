"""Removing units without touching the weights: the inputs of a block's two output projections masked to the kept
heads and neurons, for the forward passes of a model whose weights cannot be sliced in place or copied (one
accelerate placed over several devices or offloaded, issue 65).

A removed head (neuron) contributes only through its ``head_dim`` input columns of the attention output projection
(its input column of the FFN output projection): zeroing those inputs computes what the sliced model computes, up to
the order of float additions. That equality is what the proof checks of every spec before it ranks
(:func:`hf_snapvit.surgery.proof.masked_copy` against :func:`~hf_snapvit.surgery.slicing.slice_model_`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from ..architectures import get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim


def _column_mask(width: int, kept: np.ndarray) -> torch.Tensor:
    mask = torch.zeros(width)
    mask[torch.as_tensor(kept, dtype=torch.int64)] = 1.0
    return mask


def _masking_hook(mask: torch.Tensor):
    cast: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def hook(module: nn.Module, args: tuple) -> tuple:
        x = args[0]
        key = (x.device, x.dtype)
        if key not in cast:  # once per device and dtype: the input arrives where the previous module ran
            cast[key] = mask.to(device=x.device, dtype=x.dtype)
        return (x * cast[key], *args[1:])

    return hook


@contextlib.contextmanager
def masked(model: nn.Module, keep: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Iterator[nn.Module]:
    """Inside the block, ``model`` computes as if only the heads ``keep[l][0]`` and FFN neurons ``keep[l][1]`` of
    every block ``l`` were kept (their order does not matter); its weights are never read or changed."""
    spec = get_spec(model)
    handles = []
    try:
        for layer, (heads, neurons) in zip(get_layers(model, spec), keep, strict=True):
            attention = get_attention(layer, spec)
            o_proj = get_projection(attention, spec.o_proj)
            hd = head_dim(attention, spec)
            heads = np.asarray(torch.as_tensor(heads).cpu(), dtype=np.int64)
            columns = (heads[:, None] * hd + np.arange(hd)).reshape(-1)
            mlp, variant = get_mlp(layer, spec)
            out_proj = get_projection(mlp, variant.out_proj)
            neurons = np.asarray(torch.as_tensor(neurons).cpu(), dtype=np.int64)
            for linear, kept in ((o_proj, columns), (out_proj, neurons)):
                handles.append(linear.register_forward_pre_hook(_masking_hook(_column_mask(linear.in_features,
                                                                                           kept))))
        yield model
    finally:
        for handle in handles:
            handle.remove()


__all__ = ["masked"]
