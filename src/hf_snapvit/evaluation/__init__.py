"""Evaluate (sliced) models: top-1 with the model's head, k-NN, linear probe and representation retention.

The protocols follow the SnapViT paper's appendix, with the reference code's bugs fixed:

* **k-NN**: ``k = 20``, L2-normalised features, uniform majority vote, fitted on a labelled memory bank (a train
  split). Distance ties go to the lower bank index, vote ties to the smallest label, so results are deterministic.
* **Linear probe**: ``nn.Linear`` on frozen features; SGD (momentum 0.9, lr 1e-3, no weight decay), a cosine
  schedule, batch 256, examples shuffled every epoch with a seeded generator. The best epoch is chosen on a
  validation split carved from the *train* features (or given explicitly), never on test, and its weights are kept as
  a real copy (the reference kept references to the live tensors, so it always reported the last epoch).
* **Top-1**: argmax of the model's own classifier, when it has one.
* **Representation retention**: mean cosine similarity between each image's embedding under the evaluated model and
  under the dense model.

Features are extracted once per model (one forward pass gives both the embedding and the logits); the dense model's
features are computed once per :class:`Evaluator` and reused for every model it evaluates. The same metrics are
available as ``evaluate`` modules shipped inside the package (:mod:`hf_snapvit.evaluation.evaluate_metrics`),
which load offline.

Modules: :mod:`.images` (what to evaluate on), :mod:`.features` (one forward pass per batch), :mod:`.metrics`,
:mod:`.probe` (the linear probe), :mod:`.evaluator` (:class:`Evaluator`, :func:`evaluate`), :mod:`.sweep` (a grid of
methods x sparsities), :mod:`.sweep_result` (its rows and files). :mod:`hf_snapvit.plots` draws the sweep's
plots; :func:`plot_accuracy` and :func:`plot_latency` here (:mod:`.sweep_plots`) are their deprecated names.

May import every earlier stage, the pruner (sweeps rank) and the benchmarks included; publishing and the CLI
import it, never the other way.
"""

from .evaluator import EvaluationResult, Evaluator, evaluate, load_model
from .features import Features, extract_features, has_classifier
from .images import ImageSet, load_split
from .metrics import METRICS, knn_accuracy, knn_predict, representation_retention, top1_accuracy
from .probe import LinearProbe, LinearProbeConfig, train_linear_probe
from .sweep import run_sweep, sweep_from_paths
from .sweep_plots import plot_accuracy, plot_latency
from .sweep_result import ACCURACY_METRICS, CSV_COLUMNS, SweepResult

__all__ = [
    "ACCURACY_METRICS",
    "CSV_COLUMNS",
    "METRICS",
    "EvaluationResult",
    "Evaluator",
    "Features",
    "ImageSet",
    "LinearProbe",
    "LinearProbeConfig",
    "SweepResult",
    "evaluate",
    "extract_features",
    "has_classifier",
    "knn_accuracy",
    "knn_predict",
    "load_model",
    "load_split",
    "plot_accuracy",
    "plot_latency",
    "representation_retention",
    "run_sweep",
    "sweep_from_paths",
    "top1_accuracy",
    "train_linear_probe",
]
