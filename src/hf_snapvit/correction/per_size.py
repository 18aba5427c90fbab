"""The per-size correction, :func:`correct_model_`: fit the kept columns of one size, then slice the removed ones
away.

Propagation decides which inputs ``X`` a block sees:

* ``"dense"``: every block is fitted on the dense model's activations (collected before any correction);
* ``"sequential"``: as in SparseGPT, block ``l`` is fitted on the activations of the already corrected and pruned
  blocks ``0 … l-1``.

Both fit each layer to reproduce the dense layer's output on the inputs it is given; see
:attr:`CorrectionConfig.propagation` for the measurements behind the default.

With ``CorrectionConfig.guard`` (the default) the last quarter of the calibration batches is held out from fitting:
block by block, those images run through the dense model and through the pruned model as corrected so far, and the
block keeps only the corrections (attention output, FFN output, both or neither) that bring its output closest to the
dense block's. A correction fitted on one set of activations can hurt on the ones the pruned model really produces.
Finally the whole model is checked on the same images: the kept corrections stay only if, together, they bring the
model's outputs (class distributions, or embeddings for a backbone) clearly closer to the dense model's than the plain
slice does, by more than two standard errors of the per-image difference; otherwise all of them are put back.

Memory stays bounded for large models: the calibration set goes through the network one block at a time (its
hidden states are kept: ``N × tokens × width``, twice while a block runs, plus a second copy of the held-out images
for the guard), only the current block's two Hessians exist at once, and they are
accumulated batch by batch in float32. The solve runs in float64 (on CPU and CUDA), which costs little at these
sizes and keeps the Cholesky factorisation of large, badly conditioned Hessians (ViT-L ``fc2``: 4096²) stable.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures import get_attention, get_layers, get_mlp, get_projection, get_spec, num_heads
from ..data.calibration import calibration_batches
from ..data.views import model_inputs
from ..errors import CorrectionError
from ..surgery.slicing import OUTPUT_KINDS, slice_model_

from .config import CorrectionConfig, CorrectionSummary, LayerCorrection
from .guard import final_outputs, guard_block, guard_model, split_held_out
from .inputs import BlockInputs, HessianHook, capture_first_block_inputs, halve, output_columns, output_projections
from .solve import compensate_removed_columns, reconstruction_errors


def _solve_linear(linear: nn.Linear, hook: HessianHook, columns: np.ndarray, config: CorrectionConfig,
                  name: str, block: int, kind: str) -> tuple[LayerCorrection, torch.Tensor, torch.Tensor]:
    """The corrected and the merely dropped weight of one linear layer, and their errors on its fitting inputs."""
    H = hook.hessian()
    original = linear.weight.data
    new, damping = compensate_removed_columns(original, H, columns, config)
    dropped = original.clone()
    dropped[:, np.setdiff1d(np.arange(original.shape[1]), columns)] = 0
    before, after = reconstruction_errors(original, [dropped, new], H)
    del hook.sum
    report = LayerCorrection(name=name, block=block, kind=kind, in_features=original.shape[1],
                             removed=original.shape[1] - len(columns), damping=damping, error_before=before,
                             error_after=after)
    return report, new, dropped


def _fit_pass(layer: nn.Module, targets: list, fit: list[BlockInputs], keep_outputs: bool
              ) -> tuple[list[HessianHook], list[torch.Tensor]]:
    """Run the (still dense) block on the fitting inputs, accumulating its two layers' Hessians."""
    hooks = [HessianHook(linear) for _, linear, _ in targets]
    outputs = []
    try:
        for item in fit:
            out = item.call(layer)
            if keep_outputs:
                outputs.append(out)
    finally:
        for hook in hooks:
            hook.handle.remove()
    return hooks, outputs


def _calibration_inputs(model: nn.Module, spec, images_or_pixels: Any, processor: Any, config: CorrectionConfig,
                        show_progress: bool) -> tuple[int, list[BlockInputs], list[BlockInputs], list[BlockInputs],
                                                      list[Any]]:
    """``(number of images, fitting inputs, held-out inputs through the dense and the pruned model, held-out
    batches)``: the calibration images drawn, embedded up to the first block, and split for the guard."""
    batches, num_images = calibration_batches(images_or_pixels, processor, num_samples=config.num_samples,
                                              batch_size=config.batch_size, seed=config.seed, model=model)
    if config.guard and len(batches) == 1:
        batches = halve(batches[0])  # one batch: the guard still needs images it was not fitted on
    inputs = capture_first_block_inputs(model, spec, batches, processor, show_progress)
    fit, held_dense, held_pruned = split_held_out(inputs, config, num_images)
    # The held-out images are run through the whole model three times (dense, corrected, plain): preprocess them once.
    parameter = next(model.parameters())
    held_batches = [model_inputs(batch, processor, parameter.device, parameter.dtype, as_pixels=True)
                    for batch in batches[len(batches) - len(held_dense):]] if held_dense else []
    return num_images, fit, held_dense, held_pruned, held_batches


def _layer_targets(layer: nn.Module, spec, heads: np.ndarray, neurons: np.ndarray):
    return list(zip(OUTPUT_KINDS, output_projections(layer, spec), output_columns(layer, spec, (heads, neurons))))


def _check_keep(model: nn.Module, spec, keep: Sequence[tuple[Any, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = get_layers(model, spec)
    if len(keep) != len(layers):
        raise CorrectionError(f"keep has {len(keep)} entries but the model has {len(layers)} blocks; pass "
                              "ranking.keep_indices(ranking.keep_counts(sparsity)).")
    checked = []
    for index, (layer, (heads, neurons)) in enumerate(zip(layers, keep)):
        attention = get_attention(layer, spec)
        heads_here = num_heads(attention, spec)
        mlp, variant = get_mlp(layer, spec)
        width = get_projection(mlp, variant.out_proj).in_features
        heads, neurons = np.asarray(heads, dtype=np.int64), np.asarray(neurons, dtype=np.int64)
        for what, values, limit in (("head", heads, heads_here), ("neuron", neurons, width)):
            if values.ndim != 1 or values.size == 0 or values.min() < 0 or values.max() >= limit or \
                    len(np.unique(values)) != values.size:
                raise CorrectionError(
                    f"Block {index}: the {what} indices to keep must be distinct integers in [0, {limit}) and at "
                    f"least one; got {values.tolist()}."
                )
        checked.append((heads, neurons))
    return checked


@torch.no_grad()
def correct_model_(
    model: PreTrainedModel,
    keep: Sequence[tuple[Any, Any]],
    images_or_pixels: Any,
    processor: Any = None,
    config: CorrectionConfig | None = None,
    *,
    show_progress: bool = True,
) -> CorrectionSummary:
    """Correct the weights of ``model`` for removing the units not in ``keep``, then slice them away (in place).

    Args:
        model: A supported model, normally dense, in eval mode, on the device to compute on.
        keep: Per block ``(head indices, neuron indices)`` to keep, e.g.
            ``ranking.keep_indices(ranking.keep_counts(sparsity))``.
        images_or_pixels: Unlabelled calibration images: PIL images, a ``datasets`` Dataset, a ``[N, C, H, W]``
            tensor of preprocessed pixel values, or a dict of preprocessed input tensors.
        processor: The model's image processor (needed for PIL / dataset images).
        config: :class:`CorrectionConfig`; defaults apply when ``None``.
        show_progress: Show progress bars.

    Returns:
        A :class:`CorrectionSummary` with the per-layer reconstruction error on the calibration inputs before and
        after correction. ``model`` is corrected and sliced to ``keep``; its function then equals the corrected
        model with the removed units zeroed.
    """
    config = config or CorrectionConfig()
    if not isinstance(config, CorrectionConfig):
        raise CorrectionError(f"config must be a CorrectionConfig, got {type(config).__name__}.")
    start_time = time.perf_counter()
    spec = get_spec(model)
    keep = _check_keep(model, spec, keep)
    was_training = model.training
    model.eval()
    num_images, fit, held_dense, held_pruned, held_batches = _calibration_inputs(
        model, spec, images_or_pixels, processor, config, show_progress)
    dense_final = final_outputs(model, spec, held_batches, processor)  # for the whole-model check
    uncorrected: list[tuple[nn.Linear, torch.Tensor, LayerCorrection]] = []  # every kept correction's fallback
    num_tokens = sum(int(np.prod(item.hidden.shape[:-1])) for item in fit)

    layers = get_layers(model, spec)
    prefix = {id(module): name for name, module in model.named_modules()}
    report: list[LayerCorrection] = []
    for block, (layer, (heads, neurons)) in enumerate(
        tqdm(list(zip(layers, keep)), desc=f"correction ({config.propagation})", unit="block",
             disable=not show_progress)
    ):
        targets = _layer_targets(layer, spec, heads, neurons)
        last = block == len(layers) - 1
        dense_outputs = [item.call(layer) for item in held_dense]  # the target: the dense block on dense inputs
        hooks, outputs = _fit_pass(layer, targets, fit, keep_outputs=config.propagation == "dense" and not last)
        solved = [_solve_linear(linear, hook, columns, config, prefix.get(id(linear), ""), block, kind)
                  for (kind, linear, columns), hook in zip(targets, hooks)]
        linears = [linear for _, linear, _ in targets]
        if held_dense:
            reports, held_outputs = guard_block(layer, linears, solved, held_pruned, dense_outputs)
            uncorrected += [(linear, dropped, r) for linear, (_, _, dropped), r in zip(linears, solved, reports)
                            if r.kept]
        else:
            for linear, (_, new, _) in zip(linears, solved):
                linear.weight.data.copy_(new)
            reports, held_outputs = [item[0] for item in solved], []
        report.extend(reports)
        if config.propagation == "sequential" and not last:
            # The corrected block with its removed columns zeroed computes what the sliced block will.
            outputs = [item.call(layer) for item in fit]
        if not last:
            for stream, new_hidden in ((fit, outputs), (held_dense, dense_outputs), (held_pruned, held_outputs)):
                for item, out in zip(stream, new_hidden):
                    item.hidden = out
    extra = {}
    if config.guard:
        report, check = guard_model(model, spec, held_batches, processor, dense_final, uncorrected, report)
        extra = {"num_held_out_images": sum(item.hidden.shape[0] for item in held_pruned), "end_to_end": check}
    slice_model_(model, keep)
    model.train(was_training)
    return CorrectionSummary(report, num_images, num_tokens, config, seconds=time.perf_counter() - start_time,
                             extra=extra)


__all__ = ["correct_model_"]
