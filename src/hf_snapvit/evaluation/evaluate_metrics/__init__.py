"""``evaluate`` metric modules shipped inside hf_snapvit: they load from the installed package, offline.

``evaluate.load("accuracy")`` downloads a script from the Hub at run time; these modules are local files, so
``evaluate.load`` copies them from the package folder instead and never touches the network::

    from hf_snapvit.evaluation.evaluate_metrics import load_metric
    knn = load_metric("knn_accuracy")
    knn.compute(predictions=query_features, references=query_labels, bank_features=bank, bank_labels=bank_labels)

Each module computes exactly what the matching function of :mod:`hf_snapvit.evaluation` computes.
"""

from __future__ import annotations

from .shipped import METRIC_NAMES, load_metric, metric_info, metric_path

__all__ = ["METRIC_NAMES", "load_metric", "metric_info", "metric_path"]
