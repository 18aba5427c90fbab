"""The guard: held-out calibration images decide which corrections stay, block by block and then for the whole model.

See :mod:`hf_snapvit.correction` for why and ``docs/correction.md`` for what it measured.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Sequence

import torch
import torch.nn as nn

from ..architectures.embedding import forward_inputs, image_embedding, inference_settings, pooled_embedding
from ..data.held_out import fraction_count, hold_out_end
from ..data.views import model_inputs
from ..errors import CorrectionError
from .config import CorrectionConfig, LayerCorrection
from .inputs import BlockInputs


def block_error(outputs: list[torch.Tensor], targets: list[torch.Tensor]) -> float:
    error = sum(float(((out.double() - target.double()) ** 2).sum()) for out, target in zip(outputs, targets))
    total = sum(float((target.double() ** 2).sum()) for target in targets)
    return error / total if total > 0 else 0.0


def guard_block(layer: nn.Module, linears: list[nn.Linear], solved: list, held: list[BlockInputs],
                 dense_outputs: list[torch.Tensor]) -> tuple[list[LayerCorrection], list[torch.Tensor]]:
    """Try every subset of the block's corrections on the held-out images and keep the one whose block output is
    closest to the dense model's; ties keep fewer corrections. Leaves the chosen weights in place."""
    best = None
    for choice in itertools.product((False, True), repeat=len(linears)):  # (False, ...) first: no correction
        for linear, (_, new, dropped), use in zip(linears, solved, choice):
            linear.weight.data.copy_(new if use else dropped)
        outputs = [item.call(layer) for item in held]
        error = block_error(outputs, dense_outputs)
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
def final_outputs(model: nn.Module, spec, batches: Sequence[Any], processor: Any
                   ) -> tuple[list[torch.Tensor], str]:
    """Per batch, what a user of the model reads, and how to compare it (:func:`_distance`): class log-probabilities
    (``"logits_kl"``) where the model has a classifier, else the image embedding (``"embedding_mse"``; for a task
    model, the summary of the encoder features its task reads)."""
    parameter = next(model.parameters())
    outputs, measure = [], "embedding_mse"
    for batch in batches:
        inputs = model_inputs(batch, processor, parameter.device, parameter.dtype, as_pixels=True)
        if spec.task is not None:  # a task model: its head or language model reads the encoder's features
            outputs.append(image_embedding(model, inputs, spec))
            continue
        kwargs = forward_inputs(model, inputs, spec)
        with inference_settings(model, spec):  # ViTMAE: every patch, as the embeddings compared with are taken
            out = model(**kwargs)
        logits = getattr(out, "logits", None)
        if logits is not None:
            measure = "logits_kl"
        outputs.append(torch.log_softmax(logits.double(), -1) if logits is not None else pooled_embedding(
            out, spec, model.config, kwargs.get("grid_thw")))
    return outputs, measure


def distances(outputs: list[torch.Tensor], reference: list[torch.Tensor], measure: str) -> torch.Tensor:
    """Per image: KL(reference ‖ output) of the class log-probabilities, or the squared error of the embedding over
    the reference embeddings' mean square (so that the mean is the relative squared error of the whole set)."""
    if measure == "logits_kl":
        return torch.cat([(r.exp() * (r - o)).sum(-1) for o, r in zip(outputs, reference)]).cpu()
    scale = torch.cat([r.double().pow(2).sum(-1) for r in reference]).mean()
    return torch.cat([(o.double() - r.double()).pow(2).sum(-1) for o, r in zip(outputs, reference)]).cpu() / scale


#: The whole-model check keeps corrections only when they bring the held-out outputs closer by more than this many
#: standard errors of the paired per-image difference: held-out sets are small, and an improvement within their
#: noise is no evidence (at 10 % sparsity a 0.8 % lower KL on 76 images came with 2.7 points lower top-1).
EVIDENCE = 2.0


def guard_model(model: nn.Module, spec, held_batches: Sequence[Any], processor: Any,
                dense: tuple[list[torch.Tensor], str], corrections: list, report: list[LayerCorrection]
                ) -> tuple[list[LayerCorrection], dict[str, Any]]:
    """Keep the corrections the block guards chose only if, together, they bring the model's outputs on the held-out
    images clearly closer to the dense model's than the plain slice does; else put the uncorrected weights back.

    Block by block each choice looked right, yet the errors they leave can add up to outputs no closer to the dense
    ones than the plain slice gives (measured: docs/correction.md). The outputs compared are the class distributions
    (KL divergence) where the model has a classifier, since its users read those, else the image embeddings (relative
    squared error). "Clearly" means by more than ``EVIDENCE`` standard errors of the per-image differences.

    ``corrections`` holds ``(layer, uncorrected weight, its LayerCorrection)`` for every kept correction; returns
    ``report`` with those marked not kept when they were put back, and the record of the check."""
    record = _check_whole_model(model, spec, held_batches, processor, dense, corrections)
    if record["kept"] or not corrections:
        return report, record
    reverted = {id(r) for _, _, r in corrections}
    return [replace(r, kept=False, held_out_error_after=r.held_out_error_before) if id(r) in reverted else r
            for r in report], record


def _check_whole_model(model: nn.Module, spec, held_batches: Sequence[Any], processor: Any,
                       dense: tuple[list[torch.Tensor], str], corrections: list) -> dict[str, Any]:
    dense_outputs, measure = dense
    corrected = distances(final_outputs(model, spec, held_batches, processor)[0], dense_outputs, measure)
    record = {"measure": measure, "held_out_error_corrected": float(corrected.mean()),
              "held_out_error_uncorrected": float(corrected.mean()), "standard_error": 0.0, "kept": False}
    if not corrections:
        return record
    chosen = [linear.weight.data.clone() for linear, _, _ in corrections]
    for linear, dropped, _ in corrections:
        linear.weight.data.copy_(dropped)
    plain = distances(final_outputs(model, spec, held_batches, processor)[0], dense_outputs, measure)
    gain = plain - corrected
    error = float(gain.std() / len(gain) ** 0.5) if len(gain) > 1 else 0.0
    keep = float(gain.mean()) > EVIDENCE * error
    if keep:
        for (linear, _, _), weight in zip(corrections, chosen):
            linear.weight.data.copy_(weight)
    return {**record, "held_out_error_uncorrected": float(plain.mean()), "standard_error": error, "kept": keep}


def held_out_count(config: CorrectionConfig, num_batches: int) -> int:
    """How many of ``num_batches`` calibration batches the guard holds out: ``held_out_fraction`` of them, at least
    one and at most all but one (none without the guard)."""
    if not config.guard:
        return 0
    return fraction_count(config.held_out_fraction, num_batches)


def split_held_out(inputs: list[BlockInputs], config: CorrectionConfig, num_images: int
                   ) -> tuple[list[BlockInputs], list[BlockInputs], list[BlockInputs]]:
    """``(fit, held-out through the dense model, held-out through the pruned model)``: the last ``held_out_fraction``
    of the batches are held out (:func:`~hf_snapvit.data.held_out.hold_out_end`); both held-out lists are empty
    without the guard."""
    if not config.guard:
        return inputs, [], []
    fit, held, _ = hold_out_end(inputs, fraction=config.held_out_fraction, error=CorrectionError, too_few=lambda _: (
        f"guard=True holds out part of the calibration images, so it needs at least 2; got {num_images}. Give more "
        "images, or set CorrectionConfig(guard=False)."))
    pruned = [BlockInputs(item.hidden, item.args, item.kwargs, item.hidden_in_kwargs) for item in held]
    return fit, held, pruned
