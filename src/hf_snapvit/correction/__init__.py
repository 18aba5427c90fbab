"""Post-pruning weight correction: fold the removed heads' and neurons' contribution into the kept weights.

Removing an attention head deletes ``head_dim`` input columns of the attention output projection (``o_proj``);
removing an FFN neuron deletes one input column of the FFN output projection (``fc2`` / ``down_proj``). The rows
removed from q/k/v and ``fc1`` are simply gone, so only those two column-pruned layers can be corrected. For each of
them, with ``X`` the layer's inputs on unlabelled calibration images and ``H = XXᵀ/n + λI``, the kept columns ``K``
are re-fitted so that the layer reproduces its dense output ``WX`` from the kept inputs alone (optimal brain surgeon,
as in SparseGPT). Every removed column is processed before any kept one, so each removed column's error reaches
every kept column, and the result equals the least-squares solution ``W_K' = W H[:, K] H[K, K]⁻¹`` on the damped
Hessian. The bias is unchanged.

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

import itertools
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures import (get_attention, get_layers, get_mlp, get_spec, head_dim, image_embedding,
                             patchify, pooled_embedding, vision_config)
from ..calibration import calibration_batches
from ..views import model_inputs, processor_inputs
from ..errors import CorrectionError
from ..slicing import slice_model_

from .config import CorrectionConfig, CorrectionSummary, LayerCorrection
from .solve import compensate_removed_columns, damping_value, reconstruction_error, reconstruction_errors


# ------------------------------------------------------------------------------------------------ the model pass
def _model_inputs(batch: Any, processor: Any, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    # Images become [B, C, H, W] pixels as the scorer sees them (SigLIP2 grids made square), not the processor's dict.
    if not isinstance(batch, dict):
        batch = processor_inputs(batch, processor, batch_size=len(batch))
    return model_inputs(batch, None, device, dtype)


class _StopForward(Exception):
    """Raised by the hook that captures the first block's inputs, so the rest of the network is not run."""


@dataclass
class _BlockInputs:
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
        return out[0] if isinstance(out, (tuple, list)) else out


def _capture_first_block_inputs(model: nn.Module, spec, batches: Sequence[Any], processor: Any,
                                show_progress: bool) -> list[_BlockInputs]:
    first = get_layers(model, spec)[0]
    parameter = next(model.parameters())
    captured: list[_BlockInputs] = []

    def hook(module, args, kwargs):
        if args:
            captured.append(_BlockInputs(args[0], tuple(args[1:]), dict(kwargs), False))
        else:
            rest = dict(kwargs)
            captured.append(_BlockInputs(rest.pop("hidden_states"), (), rest, True))
        raise _StopForward

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in tqdm(batches, desc="correction: embed calibration images", disable=not show_progress):
            try:
                # The backbone's own embedding path (patchifying, position-embedding interpolation) up to block 0.
                image_embedding(model, _model_inputs(batch, processor, parameter.device, parameter.dtype), spec)
            except _StopForward:
                pass
    finally:
        handle.remove()
    if len(captured) != len(batches):
        raise CorrectionError("The first transformer block was not reached by the forward pass; the architecture "
                              "spec's 'layers' path does not match how the model runs.")
    return captured


class _HessianHook:
    """Accumulates ``Σ xxᵀ`` (float32) over every token a linear layer sees."""

    def __init__(self, linear: nn.Linear) -> None:
        self.sum = torch.zeros(linear.in_features, linear.in_features, dtype=torch.float32,
                               device=linear.weight.device)
        self.count = 0
        self.handle = linear.register_forward_hook(self)

    def __call__(self, module, args, output) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        self.sum.addmm_(x.T, x)
        self.count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return self.sum / max(self.count, 1)


def _solve_linear(linear: nn.Linear, hook: _HessianHook, columns: np.ndarray, config: CorrectionConfig,
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


def _fit_pass(layer: nn.Module, targets: list, fit: list[_BlockInputs], keep_outputs: bool
              ) -> tuple[list[_HessianHook], list[torch.Tensor]]:
    """Run the (still dense) block on the fitting inputs, accumulating its two layers' Hessians."""
    hooks = [_HessianHook(linear) for _, linear, _ in targets]
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


def _block_error(outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float:
    error = sum(float(((out.double() - target.double()) ** 2).sum()) for out, target in zip(outputs, targets))
    total = sum(float((target.double() ** 2).sum()) for target in targets)
    return error / total if total > 0 else 0.0


def _guard_block(layer: nn.Module, linears: list[nn.Linear], solved: list, held: list[_BlockInputs],
                 dense_outputs: list[torch.Tensor]) -> tuple[list[LayerCorrection], list[torch.Tensor]]:
    """Try every subset of the block's corrections on the held-out images and keep the one whose block output is
    closest to the dense model's; ties keep fewer corrections. Leaves the chosen weights in place."""
    best = None
    for choice in itertools.product((False, True), repeat=len(linears)):  # (False, ...) first: no correction
        for linear, (_, new, dropped), use in zip(linears, solved, choice):
            linear.weight.data.copy_(new if use else dropped)
        outputs = [item.call(layer) for item in held]
        error = _block_error(outputs, dense_outputs)
        if best is None:
            baseline = error
        if best is None or error < best[0]:
            best = (error, choice, outputs)
    error, choice, outputs = best
    for linear, (_, new, dropped), use in zip(linears, solved, choice):
        linear.weight.data.copy_(new if use else dropped)
    reports = [replace(report, kept=use, held_out_error_before=baseline, held_out_error_after=error)
               for (report, _, _), use in zip(solved, choice)]
    return reports, outputs


@torch.no_grad()
def _final_outputs(model: nn.Module, spec, batches: Sequence[Any], processor: Any
                   ) -> tuple[list[torch.Tensor], str]:
    """Per batch, what a user of the model reads, and how to compare it (:func:`_distance`): class log-probabilities
    (``"logits_kl"``) where the model has a classifier, else the image embedding (``"embedding_mse"``)."""
    parameter = next(model.parameters())
    outputs, measure = [], "embedding_mse"
    for batch in batches:
        kwargs = _model_inputs(batch, processor, parameter.device, parameter.dtype)
        if spec.patch_inputs and kwargs["pixel_values"].ndim == 4:
            kwargs.update(patchify(kwargs["pixel_values"], int(vision_config(model.config).patch_size)))
        out = model(**kwargs)
        logits = getattr(out, "logits", None)
        if logits is not None:
            measure = "logits_kl"
        outputs.append(torch.log_softmax(logits.double(), -1) if logits is not None else pooled_embedding(out, spec))
    return outputs, measure


def _distances(outputs: list[torch.Tensor], reference: list[torch.Tensor], measure: str) -> torch.Tensor:
    """Per image: KL(reference ‖ output) of the class log-probabilities, or the squared error of the embedding over
    the reference embeddings' mean square (so that the mean is the relative squared error of the whole set)."""
    if measure == "logits_kl":
        return torch.cat([(r.exp() * (r - o)).sum(-1) for o, r in zip(outputs, reference)]).cpu()
    scale = torch.cat([r.double().pow(2).sum(-1) for r in reference]).mean()
    return torch.cat([(o.double() - r.double()).pow(2).sum(-1) for o, r in zip(outputs, reference)]).cpu() / scale


#: The whole-model check keeps corrections only when they bring the held-out outputs closer by more than this many
#: standard errors of the paired per-image difference: held-out sets are small, and an improvement within their
#: noise is no evidence (at 10 % sparsity a 0.8 % lower KL on 76 images came with 2.7 points lower top-1).
_EVIDENCE = 2.0


def _guard_model(model: nn.Module, spec, held_batches: Sequence[Any], processor: Any,
                 dense: tuple[list[torch.Tensor], str], corrections: list) -> dict[str, Any]:
    """Keep the corrections the block guards chose only if, together, they bring the model's outputs on the held-out
    images clearly closer to the dense model's than the plain slice does; else put the uncorrected weights back.

    Block by block each choice looked right, yet the errors they leave can add up to outputs no closer to the dense
    ones than the plain slice gives (measured: docs/correction.md). The outputs compared are the class distributions
    (KL divergence) where the model has a classifier, since its users read those, else the image embeddings (relative
    squared error). "Clearly" means by more than ``_EVIDENCE`` standard errors of the per-image differences."""
    dense_outputs, measure = dense
    corrected = _distances(_final_outputs(model, spec, held_batches, processor)[0], dense_outputs, measure)
    record = {"measure": measure, "held_out_error_corrected": float(corrected.mean()),
              "held_out_error_uncorrected": float(corrected.mean()), "standard_error": 0.0, "kept": False}
    if not corrections:
        return record
    chosen = [linear.weight.data.clone() for linear, _, _ in corrections]
    for linear, dropped, _ in corrections:
        linear.weight.data.copy_(dropped)
    plain = _distances(_final_outputs(model, spec, held_batches, processor)[0], dense_outputs, measure)
    gain = plain - corrected
    error = float(gain.std() / len(gain) ** 0.5) if len(gain) > 1 else 0.0
    keep = float(gain.mean()) > _EVIDENCE * error
    if keep:
        for (linear, _, _), weight in zip(corrections, chosen):
            linear.weight.data.copy_(weight)
    return {**record, "held_out_error_uncorrected": float(plain.mean()), "standard_error": error, "kept": keep}


def _halve(batch: Any) -> list[Any]:
    """One calibration batch (a list of images or a dict of tensors sharing the first dimension) as two."""
    size = len(batch) if isinstance(batch, list) else batch["pixel_values"].shape[0]
    if size < 2:
        return [batch]
    half = (size + 1) // 2
    if isinstance(batch, list):
        return [batch[:half], batch[half:]]
    return [{key: value[:half] for key, value in batch.items()}, {key: value[half:] for key, value in batch.items()}]


def _split_held_out(inputs: list[_BlockInputs], config: CorrectionConfig, num_images: int
                    ) -> tuple[list[_BlockInputs], list[_BlockInputs], list[_BlockInputs]]:
    """``(fit, held-out through the dense model, held-out through the pruned model)``; both held-out lists are empty
    without the guard."""
    if not config.guard:
        return inputs, [], []
    if len(inputs) < 2:
        raise CorrectionError(
            f"guard=True holds out part of the calibration images, so it needs at least 2; got {num_images}. Give more "
            "images, or set CorrectionConfig(guard=False)."
        )
    num_held = min(len(inputs) - 1, max(1, round(config.held_out_fraction * len(inputs))))
    held = inputs[len(inputs) - num_held:]
    pruned = [_BlockInputs(item.hidden, item.args, item.kwargs, item.hidden_in_kwargs) for item in held]
    return inputs[:len(inputs) - num_held], held, pruned


def _layer_targets(layer: nn.Module, spec, heads: np.ndarray, neurons: np.ndarray):
    attention = get_attention(layer, spec)
    hd = head_dim(attention, spec)
    columns = (np.asarray(heads, dtype=np.int64)[:, None] * hd + np.arange(hd)).reshape(-1)
    mlp, variant = get_mlp(layer, spec)
    return [
        ("attention_output", getattr(attention, spec.o_proj), columns),
        ("ffn_output", getattr(mlp, variant.out_proj), np.asarray(neurons, dtype=np.int64)),
    ]


def _check_keep(model: nn.Module, spec, keep: Sequence[tuple[Any, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = get_layers(model, spec)
    if len(keep) != len(layers):
        raise CorrectionError(f"keep has {len(keep)} entries but the model has {len(layers)} blocks; pass "
                              "ranking.keep_indices(ranking.keep_counts(sparsity)).")
    checked = []
    for index, (layer, (heads, neurons)) in enumerate(zip(layers, keep)):
        attention = get_attention(layer, spec)
        num_heads = getattr(attention, spec.q_proj).out_features // head_dim(attention, spec)
        mlp, variant = get_mlp(layer, spec)
        width = getattr(mlp, variant.out_proj).in_features
        heads, neurons = np.asarray(heads, dtype=np.int64), np.asarray(neurons, dtype=np.int64)
        for what, values, limit in (("head", heads, num_heads), ("neuron", neurons, width)):
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
    batches, num_images = calibration_batches(images_or_pixels, processor, num_samples=config.num_samples,
                                              batch_size=config.batch_size, seed=config.seed, model=model)
    if config.guard and len(batches) == 1:
        batches = _halve(batches[0])  # one batch: the guard still needs images it was not fitted on
    inputs = _capture_first_block_inputs(model, spec, batches, processor, show_progress)
    fit, held_dense, held_pruned = _split_held_out(inputs, config, num_images)
    held_batches = batches[len(batches) - len(held_dense):] if held_dense else []
    dense_outputs_end = _final_outputs(model, spec, held_batches, processor)
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
            reports, held_outputs = _guard_block(layer, linears, solved, held_pruned, dense_outputs)
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
    del inputs
    extra = {}
    if config.guard:
        extra = {"num_held_out_images": sum(item.hidden.shape[0] for item in held_pruned),
                 "end_to_end": _guard_model(model, spec, held_batches, processor, dense_outputs_end, uncorrected)}
        kept_ids = {id(r) for _, _, r in uncorrected if r.kept}
        if not extra["end_to_end"]["kept"]:
            report = [replace(r, kept=False, held_out_error_after=r.held_out_error_before) if id(r) in kept_ids
                      else r for r in report]
    slice_model_(model, keep)
    model.train(was_training)
    return CorrectionSummary(report, num_images, num_tokens, config, seconds=time.perf_counter() - start_time,
                             extra=extra)


__all__ = [
    "CorrectionConfig",
    "CorrectionSummary",
    "LayerCorrection",
    "compensate_removed_columns",
    "correct_model_",
    "damping_value",
    "reconstruction_error",
]
