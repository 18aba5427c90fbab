"""Activation checkpointing of every block for the gradient phase, when the memory plan says it pays.

A gradient step keeps every block's activations for the backward pass: for a 7 B ViT or a 512-px SigLIP tower that
is tens of GB per image. Wrapped in :func:`torch.utils.checkpoint.checkpoint` (non-reentrant), a block keeps only
its input and runs its forward again in the backward pass, so a step holds one block's activations at a time (and
what the per-sample recorder keeps: the scored layers' inputs and outputs). The gradients are the same computation,
so the scores change only by float rounding; the cost is a second forward of every block.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..architectures import get_layers, get_spec

_MISSING = object()


@contextlib.contextmanager
def checkpointed_blocks(model: nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, every block of ``model`` recomputes its activations in the backward pass; each block's
    own ``forward`` is restored on exit (the model is otherwise unchanged). Forwards without gradients (the frozen
    teacher's) run as before."""
    if not enabled:
        yield
        return
    layers = get_layers(model, get_spec(model))
    saved = [layer.__dict__.get("forward", _MISSING) for layer in layers]
    for layer in layers:
        layer.forward = _checkpointed(layer.forward)
    try:
        yield
    finally:
        for layer, forward in zip(layers, saved):
            if forward is _MISSING:
                del layer.forward
            else:
                layer.forward = forward


def _checkpointed(forward):
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
