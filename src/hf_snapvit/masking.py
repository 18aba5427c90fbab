"""Evaluate a pruned model without changing its weights: zero the inputs of o_proj and the FFN output projection.

Zeroing the context columns of a dropped head, or the activation of a dropped neuron, right where they enter the
output projection is exactly equivalent to removing the unit (``tests/test_slicing.py`` checks masked == sliced), so
the search can score many candidate rankings against one set of weights, with no copies.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from .architectures import get_attention, get_layers, get_mlp, get_spec, head_dim


@contextmanager
def unit_masks(model: PreTrainedModel, keep: Sequence[tuple[np.ndarray, np.ndarray]] | None) -> Iterator[None]:
    """Within the block, block ``l`` behaves as if it kept only heads ``keep[l][0]`` and neurons ``keep[l][1]``."""
    if keep is None:
        yield
        return
    spec = get_spec(model)
    handles = []
    try:
        for layer, (heads, neurons) in zip(get_layers(model, spec), keep):
            attention = get_attention(layer, spec)
            o_proj = getattr(attention, spec.o_proj)
            hd = head_dim(attention, spec)
            head_mask = torch.zeros(o_proj.in_features // hd, dtype=o_proj.weight.dtype, device=o_proj.weight.device)
            head_mask[torch.as_tensor(np.asarray(heads, dtype=np.int64), device=head_mask.device)] = 1
            mlp, variant = get_mlp(layer, spec)
            out_proj = getattr(mlp, variant.out_proj)
            neuron_mask = torch.zeros(out_proj.in_features, dtype=out_proj.weight.dtype, device=out_proj.weight.device)
            neuron_mask[torch.as_tensor(np.asarray(neurons, dtype=np.int64), device=neuron_mask.device)] = 1
            handles.append(o_proj.register_forward_pre_hook(_multiply(head_mask.repeat_interleave(hd))))
            handles.append(out_proj.register_forward_pre_hook(_multiply(neuron_mask)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _multiply(mask: torch.Tensor):
    def hook(module, args):
        return (args[0] * mask, *args[1:])

    return hook
