"""What a block sees: calibration batches as model inputs, and the first block's captured inputs, which the
correction then runs through the network one block at a time; and the two layers of a block it corrects, with their
input columns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm

from ..architectures import get_attention, get_layers, head_dim
from ..architectures.capture import block_hidden_states
from ..architectures.embedding import image_embedding
from ..errors import CorrectionError
from ..surgery.slicing import output_projections
from ..architectures.placement import execution_device
from ..data.views import model_inputs


class _StopForward(Exception):
    """Raised by the hook that captures the first block's inputs, so the rest of the network is not run."""


@dataclass
class BlockInputs:
    hidden: torch.Tensor
    args: tuple
    kwargs: dict
    hidden_in_kwargs: bool

    def call(self, layer: nn.Module, hidden: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.hidden if hidden is None else hidden
        if self.hidden_in_kwargs:
            out = layer(*self.args, **{**self.kwargs, "hidden_states": hidden})
        else:
            out = layer(hidden, *self.args, **self.kwargs)
        return block_hidden_states(out)


class HessianHook:
    """Accumulates ``Σ xxᵀ`` (float32) over every token a linear layer sees."""

    def __init__(self, linear: nn.Linear) -> None:
        self.width = linear.in_features
        # A weight accelerate offloaded waits on the meta device: the sum goes where the layer's first input is.
        meta = linear.weight.device.type == "meta"
        self.sum = None if meta else torch.zeros(self.width, self.width, dtype=torch.float32,
                                                 device=linear.weight.device)
        self.count = 0
        self.handle = linear.register_forward_hook(self)

    def __call__(self, module, args, output) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        if self.sum is None:
            self.sum = torch.zeros(self.width, self.width, dtype=torch.float32, device=x.device)
        self.sum.addmm_(x.T, x)
        self.count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.sum is None:  # never called
            return torch.zeros(self.width, self.width)
        return self.sum / max(self.count, 1)


def output_columns(layer: nn.Module, spec, units: tuple[Any, Any] | None) -> list[np.ndarray]:
    """The input columns of the two output projections that a block's ``(heads, neurons)`` occupy, in that order
    (each head its ``head_dim`` columns); ``None``: every unit, in stored order."""
    width = head_dim(get_attention(layer, spec), spec)
    attention, ffn = output_projections(layer, spec)
    if units is None:
        units = (np.arange(attention.in_features // width), np.arange(ffn.in_features))
    heads, neurons = (np.asarray(u, dtype=np.int64) for u in units)
    return [(heads[:, None] * width + np.arange(width)).reshape(-1), neurons]


def capture_first_block_inputs(model: nn.Module, spec, batches: Sequence[Any], processor: Any,
                                show_progress: bool) -> list[BlockInputs]:
    first = get_layers(model, spec)[0]
    dtype, device = next(model.parameters()).dtype, execution_device(model)  # offloaded weights wait on meta
    captured: list[BlockInputs] = []

    def hook(module, args, kwargs):
        if args:
            captured.append(BlockInputs(args[0], tuple(args[1:]), dict(kwargs), False))
        else:
            rest = dict(kwargs)
            captured.append(BlockInputs(rest.pop("hidden_states"), (), rest, True))
        raise _StopForward

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in tqdm(batches, desc="correction: embed calibration images", disable=not show_progress):
            try:
                # The backbone's own embedding path (patchifying, position-embedding interpolation) up to block 0.
                image_embedding(model, model_inputs(batch, processor, device, dtype, as_pixels=True), spec)
            except _StopForward:
                pass
    finally:
        handle.remove()
    if len(captured) != len(batches):
        raise CorrectionError("The first transformer block was not reached by the forward pass; the architecture "
                              "spec's 'layers' path does not match how the model runs.")
    return captured


def halve(batch: Any) -> list[Any]:
    """One calibration batch (a list of images or a dict of tensors sharing the first dimension) as two."""
    size = len(batch) if isinstance(batch, list) else batch["pixel_values"].shape[0]
    if size < 2:
        return [batch]
    half = (size + 1) // 2
    if isinstance(batch, list):
        return [batch[:half], batch[half:]]
    return [{key: value[:half] for key, value in batch.items()}, {key: value[half:] for key, value in batch.items()}]


def dense_block_hessians(model: nn.Module, spec, inputs: list[BlockInputs], desc: str, show_progress: bool
                         ) -> Iterator[tuple[int, nn.Module, list[tuple[nn.Linear, HessianHook]]]]:
    """Block by block of the dense ``model``: ``(index, block, [(output projection, its input Hessian), ...])`` (the
    attention output, then the FFN output), from ``inputs`` that each block's outputs then replace."""
    for block, layer in enumerate(tqdm(get_layers(model, spec), desc=desc, unit="block", disable=not show_progress)):
        projections = output_projections(layer, spec)
        hooks = [HessianHook(linear) for linear in projections]
        try:
            outputs = [item.call(layer) for item in inputs]
        finally:
            for hook in hooks:
                hook.handle.remove()
        yield block, layer, list(zip(projections, hooks))
        for item, out in zip(inputs, outputs):
            item.hidden = out
