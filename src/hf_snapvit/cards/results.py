"""Measured results on a model card: :class:`Evaluation` records, their parsing, table columns and ``model-index``.

Evaluations are records with the keys ``sparsity`` (the fraction asked for at load time), ``metric`` (e.g.
``"accuracy"``), ``value`` (what the metric returned; accuracies as fractions in ``[0, 1]``) and ``dataset`` (a Hub
dataset id or a name), and optionally ``split`` and ``num_samples``. Give a list of such dicts (or
:class:`Evaluation`), or any object whose ``to_dict()`` returns such a list or a dict with such a list under
``"results"``. Results of :mod:`hf_snapvit.evaluation` (``EvaluationResult`` or its ``to_dict()``: one model, with
``sparsity``, ``top1``, ``knn_top1``, ``linear_top1``, ``retention``, ``num_eval``) are accepted too; each metric
that was computed becomes one record, with ``dataset`` / ``split`` taken from the ``eval_dataset`` /
``eval_split`` arguments.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from huggingface_hub import EvalResult

from ..errors import BudgetError, ModelCardError
from ..elastic.ranking import ElasticRanking


@dataclass(frozen=True)
class Evaluation:
    """One measured number of one sparsity.

    Args:
        sparsity: The sparsity the model was loaded at (``from_pretrained(..., sparsity=...)``), in ``[0, 1)``.
        metric: Metric name, e.g. ``"accuracy"`` (top-1) or ``"knn_accuracy"``.
        value: The metric's value; accuracies as fractions in ``[0, 1]`` (shown as percentages in the table).
        dataset: Hub dataset id or name, e.g. ``"zh-plus/tiny-imagenet"``.
        split: Dataset split, e.g. ``"validation"``.
        num_samples: Number of images measured on.
    """

    sparsity: float
    metric: str
    value: float
    dataset: str
    split: str | None = None
    num_samples: int | None = None


# Metric fields of hf_snapvit.evaluation.EvaluationResult and the metric names they get on a card.
RESULT_METRICS = {"top1": "accuracy", "knn_top1": "knn_accuracy", "linear_top1": "linear_probe_accuracy",
                  "retention": "retention"}


def percent(sparsity: float) -> str:
    """A sparsity as the card writes it, e.g. ``"30 %"``."""
    return f"{100 * sparsity:.4g} %"


def format_value(metric: str, value: float) -> str:
    """A measured value as the table shows it: accuracies in ``[0, 1]`` as percentages."""
    looks_like_accuracy = any(word in metric.lower() for word in ("acc", "top", "knn", "k-nn"))
    return f"{100 * value:.1f} %" if looks_like_accuracy and 0.0 <= value <= 1.0 else f"{value:.4g}"


def _expand_result(record: Mapping[str, Any], index: int, dataset: str | None, split: str | None) -> list[dict]:
    """One record per computed metric of an ``EvaluationResult``-style dict."""
    if dataset is None and not record.get("dataset"):
        raise ModelCardError(
            f"evaluations[{index}] is an evaluation result without a dataset name; pass eval_dataset='<Hub id or "
            "name>' (and eval_split=...) to name the data it was measured on."
        )
    return [
        {"sparsity": record.get("sparsity"), "metric": name, "value": record[field_name],
         "dataset": record.get("dataset") or dataset, "split": record.get("split") or split,
         "num_samples": record.get("num_eval") or None}
        for field_name, name in RESULT_METRICS.items() if record.get(field_name) is not None
    ]


def _as_list(evaluations: Any) -> Iterable[Any]:
    """The list of records inside whatever form the evaluations were given in."""
    if hasattr(evaluations, "to_dict") and not isinstance(evaluations, Mapping):
        evaluations = evaluations.to_dict()
    if isinstance(evaluations, Mapping) and "results" not in evaluations \
            and any(k in evaluations for k in RESULT_METRICS):
        evaluations = [evaluations]  # a single evaluation result
    if isinstance(evaluations, Mapping):
        if "results" not in evaluations:
            raise ModelCardError(
                f"evaluations is a dict without a 'results' list (keys: {sorted(evaluations)}). Give a list of "
                "{'sparsity', 'metric', 'value', 'dataset'} records, or {'results': [...]}."
            )
        evaluations = evaluations["results"]
    if isinstance(evaluations, (str, bytes)) or not isinstance(evaluations, Iterable):
        raise ModelCardError(
            f"evaluations must be a list of {{'sparsity', 'metric', 'value', 'dataset'}} records, got "
            f"{type(evaluations).__name__}."
        )
    return evaluations


def _checked(i: int, record: Any) -> Evaluation:
    """``record`` (``evaluations[i]``) as an :class:`Evaluation`, or an error naming what is wrong with it."""
    if not isinstance(record, Mapping):
        raise ModelCardError(f"evaluations[{i}] must be a dict or Evaluation, got {type(record).__name__}.")
    missing = {"sparsity", "metric", "value", "dataset"} - set(record)
    if missing:
        raise ModelCardError(
            f"evaluations[{i}] lacks {sorted(missing)}; each record needs sparsity, metric, value and dataset "
            f"(got keys {sorted(record)})."
        )
    sparsity, value = record["sparsity"], record["value"]
    if not isinstance(sparsity, numbers.Real) or not 0.0 <= sparsity < 1.0:
        raise ModelCardError(f"evaluations[{i}].sparsity={sparsity!r} must be a number in [0, 1).")
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ModelCardError(f"evaluations[{i}].value={value!r} must be a finite number.")
    for name in ("metric", "dataset"):
        if not isinstance(record[name], str) or not record[name].strip():
            raise ModelCardError(f"evaluations[{i}].{name}={record[name]!r} must be a non-empty string.")
    num_samples = record.get("num_samples")
    if num_samples is not None and (not isinstance(num_samples, numbers.Integral) or num_samples < 1):
        raise ModelCardError(f"evaluations[{i}].num_samples={num_samples!r} must be a positive integer.")
    return Evaluation(float(sparsity), record["metric"], float(value), record["dataset"], record.get("split"),
                      None if num_samples is None else int(num_samples))


def parse_evaluations(
    evaluations: Any, *, eval_dataset: str | None = None, eval_split: str | None = None
) -> list[Evaluation]:
    """Validate evaluations given as :class:`Evaluation` objects, dicts, or an object with ``to_dict()``.

    Args:
        evaluations: See the module docstring; ``None`` means none.
        eval_dataset: Dataset name for evaluation results that do not carry one.
        eval_split: Split name for evaluation results that do not carry one.

    Returns:
        The evaluations as :class:`Evaluation` records, in the order given.
    """
    if evaluations is None:
        return []
    records: list[tuple[int, Any]] = []
    for i, record in enumerate(_as_list(evaluations)):
        if isinstance(record, Evaluation):
            record = record.__dict__
        elif hasattr(record, "to_dict") and not isinstance(record, Mapping):
            record = record.to_dict()
        if isinstance(record, Mapping) and "metric" not in record and any(k in record for k in RESULT_METRICS):
            records += [(i, r) for r in _expand_result(record, i, eval_dataset, eval_split)]
        else:
            records.append((i, record))
    return [_checked(i, record) for i, record in records]


def file_under_grid(
    records: list[Evaluation], ranking: ElasticRanking | None, sparsities: Sequence[float]
) -> list[Evaluation]:
    """``records`` with each realised sparsity replaced by the grid sparsity that loads exactly that model.

    A measured result reports the sparsity the model really has (within one unit of the one asked for); this files
    it under the grid row it belongs to instead of a row of its own.
    """
    if ranking is None:
        return records
    realised = {}
    for s in sparsities:
        try:
            realised[round(ranking.keep_counts(s).sparsity, 6)] = s
        except BudgetError:
            pass  # reported with the full message when its row is built
    return [replace(r, sparsity=realised.get(round(r.sparsity, 6), r.sparsity)) for r in records]


def check_measured_sparsities(records: Sequence[Evaluation], saved: float, has_ranking: bool) -> None:
    """Refuse results that the checkpoint (saved at sparsity ``saved``) cannot be loaded at."""
    if not has_ranking and any(abs(r.sparsity - saved) > 1e-6 for r in records):
        raise ModelCardError(
            f"This sliced checkpoint has no ranking, so it only serves its saved sparsity {saved:.6f}; evaluations at "
            f"{sorted({r.sparsity for r in records})} do not describe it."
        )
    too_small = [r.sparsity for r in records if r.sparsity < saved - 1e-6]
    if too_small:
        raise ModelCardError(
            f"evaluations at sparsities {too_small} are below this checkpoint's saved sparsity {saved:.4f}; a sliced "
            "checkpoint only serves sparsities >= its own."
        )


class MetricColumns:
    """The table's measured columns, one per (metric, dataset, split), in the order first given."""

    def __init__(self, records: Sequence[Evaluation]) -> None:
        self.keys: list[tuple[str, str, str | None]] = []
        for r in records:
            if (r.metric, r.dataset, r.split) not in self.keys:
                self.keys.append((r.metric, r.dataset, r.split))
        self._values = {(round(r.sparsity, 6), r.metric, r.dataset, r.split): r.value for r in records}

    def headers(self) -> list[str]:
        """Column headers, e.g. ``"accuracy (zh-plus/tiny-imagenet, validation)"``."""
        return [f"{m} ({d}{', ' + s if s else ''})" for m, d, s in self.keys]

    def cells(self, sparsity: float) -> list[str]:
        """The measured values of one row; ``"–"`` where nothing was measured."""
        cells = []
        for m, d, s in self.keys:
            value = self._values.get((round(sparsity, 6), m, d, s))
            cells.append("–" if value is None else format_value(m, value))
        return cells


def measurement_notes(records: Sequence[Evaluation]) -> str:
    """The sentences under the table saying what was measured on how many images."""
    notes = []
    sample_notes = sorted({f"{r.metric} ({r.dataset}{', ' + r.split if r.split else ''}) on {r.num_samples} images"
                           for r in records if r.num_samples})
    if sample_notes:
        notes.append("Measured: " + "; ".join(sample_notes) + ".")
    if records:
        notes.append("No retraining or fine-tuning after pruning.")
    return " ".join(notes)


def model_index(records: Sequence[Evaluation], pipeline_tag: str) -> list[EvalResult] | None:
    """The card's ``model-index`` entries, one per record; ``None`` without records (no ``model-index``)."""
    return [
        EvalResult(
            task_type=pipeline_tag,
            dataset_type=r.dataset,
            dataset_name=r.dataset,
            dataset_split=r.split,
            metric_type=r.metric,
            metric_value=r.value,
            metric_name=f"{r.metric} at {percent(r.sparsity)} sparsity",
            metric_args={"sparsity": r.sparsity, **({"num_samples": r.num_samples} if r.num_samples else {})},
        )
        for r in records
    ] or None
