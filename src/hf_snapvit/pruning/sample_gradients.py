"""Per-sample squared weight gradients of ``nn.Linear`` layers for a whole batch, from one backward pass.

The gradient of a linear layer's weight for one sample is ``Σ_t g_t x_tᵀ`` over the sample's tokens ``t`` (``x`` the
layer's input, ``g`` the loss gradient at its output). Recording ``x`` in a forward hook and asking autograd for
``g`` only (:func:`torch.autograd.grad` on the layer outputs, so no weight gradient is formed) gives every sample's
gradient with one batched matrix product per layer, instead of one backward pass per image. A layer called several
times in one forward (the global and the local crops of a multi-crop loss) contributes the tokens of every call to
the same samples: the calls' rows must be sample-major (``[samples * views, ...]``), as ``flatten(0, 1)`` of
``[samples, views, ...]`` gives.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..utils.precision import tf32_matmuls

# Largest per-sample gradient block formed at once, in elements (float32 then float64): bounds the transient memory
# of a wide layer on a large batch to about 1.5 GB.
_BLOCK_ELEMENTS = 128 * 1024 * 1024


class SquaredSampleGradients:
    """Adds, for each of ``layers``, the squares of every sample's weight gradient to a float64 sum.

    Use as a context manager around the forward pass that builds the loss, then call :meth:`accumulate`::

        with SquaredSampleGradients(layers) as recorder:
            loss = per_sample_losses.sum()
        recorder.accumulate(loss, num_samples, sums)

    Forward calls made with gradients off (a frozen teacher under ``no_grad``) are not recorded.

    Args:
        layers: The linear layers whose weights are scored; their weights must require gradients.
    """

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        self.layers = list(layers)
        self._calls: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in self.layers]
        self._handles: list = []
        self._recording = True

    def __enter__(self) -> "SquaredSampleGradients":
        for calls, layer in zip(self._calls, self.layers):
            self._handles.append(layer.register_forward_hook(_recorder(calls, self)))
        return self

    def __exit__(self, exc_type, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if exc_type is not None:  # a failed forward (out of memory) must not leave its calls for the next attempt
            for calls in self._calls:
                calls.clear()

    def accumulate(self, loss: torch.Tensor, num_samples: int, sums: list[torch.Tensor],
                   scales: Sequence[torch.Tensor | None] | None = None) -> None:
        """Add ``Σ_samples (∂loss_sample/∂W)²`` of each layer to ``sums[i]`` (float64).

        A ``sums[i]`` of the weight's shape receives every weight's sum; a one-dimensional one (a value per output
        row) receives each row's sum over its inputs, so that a score defined per unit never holds a float64 copy
        of the weights. ``scales[i]``, where given, multiplies each weight's squared gradient by the square of that
        weight-shaped tensor first (the OBD saliency's ``w²``).

        ``loss`` must be the sum of independent per-sample losses (no cross-sample term), so that the gradient
        reaching a sample's rows is that sample's own. The recorded calls are released.
        """
        scales = list(scales) if scales is not None else [None] * len(sums)
        self._recording = False  # a checkpointed block's forward, run again in the backward pass, adds no calls
        try:
            outputs = [output for calls in self._calls for _, output in calls]
            # A layer the loss does not reach (an unused head) gets zero gradients rather than an error.
            grads = iter(torch.autograd.grad(loss, outputs, allow_unused=True, materialize_grads=True))
            for calls, total, scale in zip(self._calls, sums, scales):
                if not calls:  # not called with gradients on: its samples' gradients are zero
                    continue
                inputs = [x.reshape(num_samples, -1, x.shape[-1]) for x, _ in calls]
                output_grads = [next(grads).reshape(num_samples, -1, out.shape[-1]) for _, out in calls]
                _add_squared(torch.cat(output_grads, 1), torch.cat(inputs, 1), total, scale)
        finally:
            self._recording = True
            for calls in self._calls:
                calls.clear()


def _recorder(calls: list, recorder: SquaredSampleGradients):
    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if output.requires_grad and recorder._recording:
            calls.append((args[0].detach(), output))

    return hook


def _add_squared(output_grads: torch.Tensor, inputs: torch.Tensor, total: torch.Tensor,
                 scale: torch.Tensor | None = None) -> None:
    """``total += Σ_b (g_bᵀ x_b)²`` (times ``scale²``; summed over inputs when ``total`` is one value per row) for
    ``g [B, T, out]``, ``x [B, T, in]``, a block of samples at a time."""
    per_block = max(1, _BLOCK_ELEMENTS // (output_grads.shape[-1] * inputs.shape[-1]))
    factor = None if scale is None else scale.detach().double().square()
    for start in range(0, output_grads.shape[0], per_block):
        g = output_grads[start:start + per_block].float()
        x = inputs[start:start + per_block].float()
        # On CUDA the products run on TF32 tensor cores: their factors come from a bf16 (autocast) or TF32 forward,
        # so TF32's 10-bit mantissa keeps what they hold. In full float32 they were the gradient phase's largest
        # kernel on an H200 (benchmarks/results/profile_ranking/profile_ranking_nvidia-h200.json). A CPU computes in
        # float32.
        with tf32_matmuls(total.device):
            per_sample = torch.bmm(g.transpose(1, 2), x)  # [b, out, in], float32 like a weight gradient
        squared = per_sample.double().square_().sum(0)
        if factor is not None:
            squared *= factor
        total += squared if total.ndim == 2 else squared.sum(1)
