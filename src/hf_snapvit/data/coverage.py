"""Whether a draw represents its source: measured, recorded in the provenance, and warned about with the fix.

:mod:`hf_snapvit.data.sampling` draws uniformly from what it reads; what it cannot do is read past the prefix of a long
stream. What a draw covers is therefore measured where it can be:

* with labels (a ``ClassLabel`` column, or the ``label_column`` asked for): the classes the sample holds, the
  classes of the rows it was drawn from, and, for a stream cut at its prefix, whether those rows hold every class
  of the label feature or follow one another in label order (a sorted stream read in part);
* without labels, for a stream cut at its prefix: whether each sampled image's nearest neighbour, as the model
  embeds them, was read near it or far away (:func:`neighbour_gap`); in a shuffled stream it is anywhere.

:func:`check_coverage` warns (:class:`CoverageWarning`) with the numbers and the fix: a larger
prefix (:class:`~hf_snapvit.data.sampling.StreamSource`), a shuffled dataset, more shards.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np


#: A sample of fewer classes than this (when it has at least twice as many images) is warned about.
MIN_CLASSES = 10
#: A cut stream whose images' nearest neighbours were read closer than this (as a share of the sample; about 1/3 in a
#: shuffled stream) is taken to be ordered.
ORDERED_NEIGHBOUR_GAP = 1 / 6
#: Images embedded at most for :func:`neighbour_gap`.
MAX_COMPARED = 512
#: The key of a drawn dataset's ``info.description`` (JSON) under which :func:`~hf_snapvit.data.images.load_image_dataset`
#: records its draw's coverage.
DRAW_KEY = "hf_snapvit_draw"
_FIX = ("Draw from more of the data: a larger prefix (hf_snapvit.StreamSource(data, prefix=N), CLI "
        "--stream-prefix), a shuffled dataset (dataset.shuffle(seed) before streaming, or streaming=False), or a "
        "dataset stored in more shards.")


class CoverageWarning(UserWarning):
    """A sample of images may not represent its source: a few classes, or a long stream read only in part. The
    message gives the numbers and the fix."""


@dataclass(frozen=True)
class Coverage:
    """What a draw covered.

    Attributes:
        method: ``"random access"`` (every row could be drawn) or ``"stream prefix"``.
        rows_read: Rows the draw chose from (all rows for random access).
        complete: Whether every row of the source could be drawn.
        shard_groups: Shard groups a stream was read in (1 for other sources).
        prefix: The most rows a stream draw reads (``None`` for random access).
        sample_classes: Classes in the sample (``None`` without labels).
        classes_read: Classes among the rows read.
        label_classes: Classes the label feature names (a ``ClassLabel``'s ``num_classes``).
        label_order: For a stream with labels: the share of neighbouring rows read that share a label, and what a
            shuffled stream with those labels would give (``[observed, shuffled]``).
        neighbour_gap: For a cut stream without labels, given an embedding: how far in reading order the sampled
            images' nearest neighbours were read (:func:`neighbour_gap`).
        few_classes: Names of the sample's classes when there are fewer than :data:`MIN_CLASSES`.
    """

    method: str
    rows_read: int
    complete: bool
    shard_groups: int = 1
    prefix: int | None = None
    sample_classes: int | None = None
    classes_read: int | None = None
    label_classes: int | None = None
    label_order: tuple[float, float] | None = None
    neighbour_gap: float | None = None
    few_classes: tuple[str, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record, as the ranking's provenance stores it."""
        record = {k: v for k, v in asdict(self).items() if v is not None}
        for key in ("label_order", "few_classes"):
            if key in record:
                record[key] = list(record[key])
        return record

    def problems(self, count: int) -> list[str]:
        """Why the sample of ``count`` images may not represent its source (empty when nothing shows)."""
        found = []
        where = (f"the first {self.rows_read} rows read of a longer stream ({self.shard_groups} shard group"
                 f"{'s' if self.shard_groups > 1 else ''}, prefix {self.prefix})") if not self.complete else None
        if self.sample_classes is not None and self.sample_classes < MIN_CLASSES and count >= 2 * MIN_CLASSES:
            names = ", ".join(self.few_classes or ())
            found.append(f"the {count} images cover only {self.sample_classes} classes ({names}); a ranking "
                         "calibrated on a few classes keeps the units those classes use")
        if where and self.label_classes and self.classes_read is not None and self.classes_read < self.label_classes:
            found.append(f"{where} hold {self.classes_read} of the {self.label_classes} classes of the label feature")
        elif where and self.label_order and self.label_order[0] > max(0.5, 5 * self.label_order[1]):
            found.append(f"{where} come in label order ({self.label_order[0]:.0%} of neighbouring rows share a label, "
                         f"{self.label_order[1]:.1%} would in a shuffled stream), so the rows after them likely hold "
                         "other classes")
        if where and self.neighbour_gap is not None and self.neighbour_gap < ORDERED_NEIGHBOUR_GAP:
            found.append(f"{where} change along the stream: the sampled images' nearest neighbours (as the model "
                         f"embeds them) were read {self.neighbour_gap:.0%} of the sample away on average, where a "
                         "shuffled stream gives about 33%, so the rows after them likely differ too")
        return found


def check_coverage(coverage: Coverage, count: int, what: str = "calibration sample") -> None:
    """Warn (:class:`CoverageWarning`) when :meth:`Coverage.problems` finds any, with the fix."""
    problems = coverage.problems(count)
    if problems:
        warnings.warn(f"The {what} may not represent its data: " + "; ".join(problems) + ". " + _FIX,
                      CoverageWarning, stacklevel=3)


def label_coverage(sample_labels: Sequence[Any], source_labels: Sequence[Any] | np.ndarray | None,
                   names: Sequence[str] | None, ordered: bool) -> dict[str, Any]:
    """The label fields of a :class:`Coverage`: classes in the sample and in the rows it was drawn from, the label
    feature's class count (``names``), the sample's class names when few, and (``ordered``: rows in reading order)
    how often neighbouring rows share a label."""
    in_sample = Counter(_hashable(label) for label in sample_labels)
    fields: dict[str, Any] = {"sample_classes": len(in_sample), "label_classes": len(names) if names else None}
    if len(in_sample) < MIN_CLASSES:
        fields["few_classes"] = tuple(sorted(_name(label, names) for label in in_sample))
    if source_labels is not None:
        read = [_hashable(label) for label in source_labels]
        counts = Counter(read)
        fields["classes_read"] = len(counts)
        if ordered and len(read) > 1:
            same = sum(a == b for a, b in zip(read, read[1:])) / (len(read) - 1)
            shuffled = sum((n / len(read)) ** 2 for n in counts.values())
            fields["label_order"] = (round(same, 4), round(shuffled, 4))
    return fields


def neighbour_gap(embed: Callable[[Sequence[Any]], np.ndarray], images: Sequence[Any],
                  positions: Sequence[tuple[int, int]]) -> float | None:
    """How far apart in reading order the sampled images and their nearest neighbours (as ``embed`` sees them) were
    read: the mean gap between an image's rank in reading order and its neighbour's, as a share of the images
    compared. A shuffled stream gives about 1/3; a stream in class order, much less. At most
    :data:`MAX_COMPARED` images, evenly spread in reading order, are embedded (``None`` for fewer than 8)."""
    order = sorted(range(len(images)), key=lambda i: positions[i])
    order = order[::max(1, math.ceil(len(order) / MAX_COMPARED))]
    if len(order) < 8:
        return None
    vectors = np.asarray(embed([images[i] for i in order]), dtype=np.float64)
    vectors = vectors - vectors.mean(0)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    similarity = vectors @ vectors.T
    np.fill_diagonal(similarity, -np.inf)
    nearest = similarity.argmax(1)
    return round(float(np.abs(np.arange(len(order)) - nearest).mean() / len(order)), 4)


def coverage_column(features: Any, label_column: str | None, columns: Sequence[str]) -> str | None:
    """The column whose labels measure a draw's coverage: ``label_column`` if the data has it, else the first
    ``ClassLabel`` feature (``None`` when there is neither)."""
    if label_column is not None and label_column in columns:
        return label_column
    datasets = sys.modules.get("datasets")  # a datasets feature exists only once datasets is imported
    if datasets is None or not features:
        return None
    return next((name for name, feature in features.items() if isinstance(feature, datasets.ClassLabel)), None)


def class_names(features: Any, column: str | None) -> list[str] | None:
    """The class names of a ``ClassLabel`` column (``None`` for any other)."""
    names = getattr((features or {}).get(column), "names", None) if column is not None else None
    return list(names) if names else None


def recorded_draw(description: Any) -> dict[str, Any] | None:
    """The coverage :func:`~hf_snapvit.data.images.load_image_dataset` recorded (under :data:`DRAW_KEY`) in the JSON
    ``info.description`` of the dataset it drew, if any."""
    if not isinstance(description, str) or DRAW_KEY not in description:
        return None
    try:
        record = json.loads(description)
    except ValueError:
        return None
    return record.get(DRAW_KEY) if isinstance(record, dict) and isinstance(record.get(DRAW_KEY), dict) else None


def _hashable(label: Any) -> Any:
    if hasattr(label, "item") and getattr(label, "ndim", 0) == 0:
        return label.item()
    return label if isinstance(label, (int, str, float, bool, type(None))) else str(label)


def _name(label: Any, names: Sequence[str] | None) -> str:
    if names and isinstance(label, int) and 0 <= label < len(names):
        return names[label]
    return str(label)
