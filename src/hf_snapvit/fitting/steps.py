"""The fitting verbs and the steps the loader runs for them: correction for one size, recovery from the dense model.

:func:`correct` is ``from_pretrained`` with a :class:`~hf_snapvit.loading.fit_step.FitStep` that corrects: the loader
reads the dense weights, the step fits the kept units' output projections
(:func:`hf_snapvit.correction.correct_model_`) and slices the model. :func:`fit_step` builds that step, also for the deprecated ``correction_data=`` /
``recovery_data=`` of ``from_pretrained``, so both give the same model.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from transformers import PreTrainedModel

from ..correction import CorrectionConfig, correct_model_
from ..errors import CorrectionError, RecoveryError
from ..loading.fit_step import FitStep, Keep
from ..loading.modeling import load_elastic
from ..recovery import RecoveryConfig, recover_
from ..surgery.slicing import slice_model_

__all__ = ["correct", "fit_step"]


def correct(source: str | os.PathLike, sparsity: float | None = None, *, data: Any,
            config: CorrectionConfig | None = None, target_params: int | None = None,
            target_gflops: float | None = None, width_multiple: int | None = None, processor: Any = None,
            **kwargs: Any) -> PreTrainedModel:
    """Load the dense elastic checkpoint ``source``, correct it for the size a budget keeps, and slice it to that size.

    The removed heads' and neurons' contribution is compensated into the kept output-projection weights by a
    least-squares fit on ``data`` (:mod:`hf_snapvit.correction`); the model is otherwise what
    ``ElasticViTModel.from_pretrained(source, sparsity, ...)`` returns. It records ``config.elastic_correction`` and,
    saved, reloads at its size only. To store a correction for every size in the checkpoint instead, use
    :func:`hf_snapvit.add_prefix_correction`.

    Args:
        source: A Hub repo id or local folder of a dense elastic checkpoint (from :func:`hf_snapvit.save_elastic`).
        sparsity, target_params, target_gflops, width_multiple: The budget, as ``from_pretrained`` takes it (none:
            the stored widths, so nothing is removed).
        data: Unlabelled calibration images: PIL images, a ``datasets`` Dataset or a ``[N, C, H, W]`` pixel tensor.
        config: :class:`~hf_snapvit.correction.CorrectionConfig` (defaults if ``None``).
        processor: The images' image processor; by default the checkpoint's own.
        **kwargs: ``from_pretrained``'s other keyword arguments (``dtype``, ``device_map``, the Hub's, ...).

    Returns:
        The corrected, sliced model (the stock transformers class), in eval mode.

    Raises:
        CorrectionError: ``data`` is ``None``, the checkpoint is sliced, or ``config`` is invalid.

    Example: ``hf_snapvit.correct("my-org/vit-elastic", sparsity=0.5, data=train_images)``.
    """
    if data is None:
        raise CorrectionError("hf_snapvit.correct needs calibration images: pass data= (PIL images, a datasets "
                              "Dataset or a [N, C, H, W] pixel tensor).")
    return load_elastic(source, sparsity, target_params=target_params, target_gflops=target_gflops,
                        width_multiple=width_multiple, fit=fit_step(data, config, None, None), processor=processor,
                        **kwargs)


def fit_step(correction_data: Any, correction: CorrectionConfig | None, recovery_data: Any,
             recovery: RecoveryConfig | None) -> FitStep:
    """The step that corrects (``correction_data``) and/or recovers (``recovery_data``, after any correction) a
    load's dense weights for its size; the teacher of a recovery is the dense model as loaded."""

    def check(layout: dict | None, resized: bool) -> None:
        _check_arguments(correction_data, correction, recovery_data, recovery, layout, resized)

    def fit(model: PreTrainedModel, keep: Keep, processor: Any) -> None:
        elastic = recovery is not None and recovery.elastic
        teacher = copy.deepcopy(model) if recovery_data is not None and not elastic else None
        if correction_data is not None:
            _correct(model, keep, correction_data, processor, correction)
        else:
            slice_model_(model, keep)
        if recovery_data is not None:
            recover_(model, teacher, recovery_data, recovery, processor=processor)

    return FitStep(fit, correction_data if correction_data is not None else recovery_data, check)


def _check_arguments(correction_data: Any, correction: Any, recovery_data: Any, recovery: Any, layout: dict | None,
                     resized: bool) -> None:
    if correction is not None and correction_data is None:
        raise CorrectionError("correction= was given without correction_data=; pass the calibration images too.")
    if correction_data is not None and layout is not None:
        raise CorrectionError(
            "Correction needs the dense weights, but this checkpoint is already sliced (config.elastic_layout is "
            "set). Correct the dense elastic checkpoint instead (hf_snapvit.correct(dense, sparsity=..., data=...))."
        )
    if recovery is not None and not isinstance(recovery, RecoveryConfig):
        raise RecoveryError(f"recovery must be a RecoveryConfig, got {type(recovery).__name__}.")
    if recovery is not None and recovery_data is None:
        raise RecoveryError("recovery= was given without recovery_data=; pass the unlabelled images too.")
    if recovery_data is not None and layout is not None:
        raise RecoveryError(
            "Recovery distils from the dense weights, but this checkpoint is already sliced (config.elastic_layout "
            "is set). Recover from the dense elastic checkpoint instead (hf_snapvit.recover with its dense model as "
            "the teacher)."
        )
    if recovery is not None and recovery.elastic and (resized or correction_data is not None):
        raise RecoveryError("RecoveryConfig(elastic=True) trains the dense elastic model for every size: load it "
                            "without sparsity/target_params/target_gflops and without correction_data, save it with "
                            "hf_snapvit.save_elastic, then load any size from that checkpoint.")


def _correct(model: PreTrainedModel, keep: Keep, data: Any, processor: Any,
             correction: CorrectionConfig | None) -> None:
    summary = correct_model_(model, keep, data, processor, correction or CorrectionConfig())
    if summary.num_removed:
        model.config.elastic_correction = {
            "settings": summary.config.to_dict(),
            "num_images": summary.num_images,
            "num_tokens": summary.num_tokens,
            "mean_error_before": round(summary.mean_error("before"), 6),
            "mean_error_after": round(summary.mean_error("after"), 6),
            **summary.guard_record(),
        }
