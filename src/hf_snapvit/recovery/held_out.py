"""Recovery must never leave a size worse than it found it. The last ``held_out_images`` of the seeded image draw are
never trained on. Before and after training, each size's distillation loss against the dense teacher is measured on
them; sizes whose loss rose are reported, not hidden.

A recovery run at one size checks that size. An elastic run checks both ends of its range and every tenth between
them, each as a prefix view of the model being trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

import torch

from ..data.held_out import hold_out_end
from ..utils.distributed import process_state, reduce_sum
from ..elastic.size_grid import sparsity_grid
from .config import RecoveryConfig
from .forward import forward_outputs, per_image_loss, prefix_view
from .train import AugmentedBatches


def split_held_out(images: Any, wanted: int, config: RecoveryConfig) -> tuple[Any, Any, str | None]:
    """``(training images, held-out images or None, why there are none)`` of a draw of up to ``wanted`` +
    ``config.held_out_images`` images. The draw is seeded and its order is a prefix, so the training images are the
    ones a run without the check would use. When the data runs short, the held-out images come off the end, as long
    as at least as many are left to train on (:func:`~hf_snapvit.data.held_out.hold_out_end`)."""
    held = config.held_out_images
    if held == 0:
        return images[:wanted], None, "held_out_images=0"
    return hold_out_end(images, count=held, wanted=wanted, min_fitted=held, too_few=lambda count: (
        f"only {count} images, fewer than twice held_out_images={held}; give more images or a smaller "
        "held_out_images"))


#: Elastic recovery checks both ends of its range and every multiple of this between them.
CHECK_STEP = 0.1


def held_out_sizes(views: list[tuple[float | None, Any]]) -> list[tuple[float | None, Any]]:
    """The sizes the held-out check measures: the one size of a per-size run, or for elastic recovery both ends of
    the range and every multiple of :data:`CHECK_STEP` between them
    (:func:`~hf_snapvit.elastic.size_grid.sparsity_grid`), each with its keep counts."""
    if views[0][0] is None:
        return [(None, None)]
    (low, ranking), (high, _) = views
    return [(s, ranking.keep_counts(s)) for s in sparsity_grid(high, CHECK_STEP, low=low)]


class HeldOutCheck:
    """The held-out images as fixed, unaugmented batches, and the loss of each checked size on them."""

    def __init__(self, images: Any, config: RecoveryConfig, processor: Any, size: int,
                 sizes: list[tuple[float | None, Any]]) -> None:
        self.config = config
        # Whole images, no flip: the same pixels before and after training.
        self.batches = AugmentedBatches(images, dataclasses.replace(
            config, batch_size=len(images), crop_scale=(1.0, 1.0), flip=0.0), processor, size)
        self.sizes = sizes
        self._target: Any = None  # the frozen teacher's outputs on this process's share, computed once

    @torch.no_grad()
    def losses(self, student: Any, teacher: Any, spec: Any, device: torch.device) -> list[float]:
        """Mean loss per checked size (equal on every process: sums and counts are reduced)."""
        state = process_state()
        pixels = self.batches.share(0, state.process_index, state.num_processes)
        sums = torch.zeros(len(self.sizes) + 1, dtype=torch.float64, device=device)
        if pixels is not None:
            if self._target is None:
                teacher_device = next(teacher.parameters()).device
                self._target = forward_outputs(teacher, spec, pixels.to(teacher_device)).to(device)
            target = self._target
            for i, (_, counts) in enumerate(self.sizes):
                view = prefix_view(student, spec, counts.heads, counts.neurons) if counts is not None \
                    else contextlib.nullcontext()
                with view:
                    out = forward_outputs(student, spec, pixels.to(device))
                sums[i] = per_image_loss(out, target, self.config).double().sum()
            sums[-1] = len(pixels)
        sums = reduce_sum([sums])[0]
        return [float(s / sums[-1]) for s in sums[:-1]]


def held_out_record(sizes: list[tuple[float | None, Any]], before: list[float], after: list[float],
                    num_images: int) -> dict[str, Any]:
    """What ``config.elastic_recovery["held_out"]`` records, warning once about every size that got worse."""
    rows = [{"sparsity": s, "loss_before": round(b, 6), "loss_after": round(a, 6)}
            for (s, _), b, a in zip(sizes, before, after)]
    worse = [row for row in rows if not row["loss_after"] <= row["loss_before"]]  # NaN counts as worse
    if worse:
        named = ", ".join(f"{_size_name(row['sparsity'])} ({row['loss_before']:.4g} -> {row['loss_after']:.4g})"
                          for row in worse)
        warnings.warn(f"Recovery left {len(worse)} of {len(rows)} checked sizes worse than before on {num_images} "
                      f"held-out images: {named}. Load those sizes from the checkpoint before recovery, or recover "
                      "with a range (elastic_range) that covers them, more steps or a lower learning rate.",
                      UserWarning, stacklevel=3)
    return {"num_images": num_images, "sizes": rows,
            "worse": [row["sparsity"] for row in worse]}


def _size_name(sparsity: float | None) -> str:
    return "this size" if sparsity is None else f"sparsity {sparsity:g}"


def skipped_record(why: str) -> dict[str, Any]:
    """The record of a run without the check, saying why; a check lost to too few images also warns."""
    if why != "held_out_images=0":
        warnings.warn(f"Recovery could not check its result on held-out images: {why}.", UserWarning, stacklevel=3)
    return {"num_images": 0, "sizes": [], "worse": [], "skipped": why}
