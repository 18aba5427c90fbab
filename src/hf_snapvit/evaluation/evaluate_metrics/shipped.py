"""Where the shipped metric scripts are, their ``evaluate.MetricInfo``, and ``load_metric`` (``evaluate.load`` of
one, offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import EvaluationError

METRIC_NAMES: tuple[str, ...] = ("knn_accuracy", "linear_probe_accuracy", "representation_retention", "top1_accuracy")


# Feature kinds of the metric inputs: class ids, or one feature vector per image.
_FEATURES = {"class": ("Value", "int64"), "vector": ("Sequence", "float32")}


def metric_info(description: str, inputs_description: str, citation: str, *, predictions: str, references: str):
    """The ``evaluate.MetricInfo`` of a shipped metric whose ``predictions`` and ``references`` are ``"class"`` ids or
    feature ``"vector"``s."""
    import datasets
    import evaluate

    def feature(kind: str):
        wrapper, dtype = _FEATURES[kind]
        value = datasets.Value(dtype)
        return datasets.Sequence(value) if wrapper == "Sequence" else value

    return evaluate.MetricInfo(description=description, citation=citation, inputs_description=inputs_description,
                               features=datasets.Features({"predictions": feature(predictions),
                                                           "references": feature(references)}))


def metric_path(name: str) -> str:
    """Path of the shipped metric script ``name`` (one of :data:`METRIC_NAMES`), for ``evaluate.load(path)``."""
    if name not in METRIC_NAMES:
        raise EvaluationError(f"Unknown hf_snapvit metric {name!r}; available: {', '.join(METRIC_NAMES)}.")
    return str(Path(__file__).with_name(f"{name}.py"))


def load_metric(name: str, **kwargs: Any):
    """``evaluate.load`` of a shipped metric (no Hub access); ``kwargs`` go to ``evaluate.load``.

    Args:
        name: One of :data:`METRIC_NAMES`.
        **kwargs: ``experiment_id``, ``keep_in_memory``, ``cache_dir``, ``num_process``, ``process_id``, ...

    Returns:
        The ``evaluate.EvaluationModule``.

    Raises:
        MissingExtraError: ``evaluate`` is not installed (``pip install "hf-snapvit[eval]"``).
    """
    from ...utils.extras import require_extra

    evaluate = require_extra("evaluate", f"load_metric({name!r})")

    return evaluate.load(metric_path(name), **kwargs)


__all__ = ["METRIC_NAMES", "load_metric", "metric_info", "metric_path"]
