"""Evaluate models: :class:`Evaluator` (many models on the same data, the dense model's features extracted once),
:func:`evaluate` (one model or checkpoint), :class:`EvaluationResult` and :func:`load_model`."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from ..architectures import model_class
from ..architectures.budget import backbone_parameters, layer_widths
from ..architectures.flops import estimate_gflops
from ..errors import EvaluationError
from ..utils.files import public_name, write_text_atomic
from ..elastic.ranking import ElasticRanking
from ..data.views import load_processor
from .features import Features, extract_features, has_classifier
from .images import ImageSet, load_split
from .metrics import METRICS, knn_accuracy, representation_retention, top1_accuracy
from .probe import LinearProbeConfig, train_linear_probe


@dataclass
class EvaluationResult:
    """Every metric of one model on one evaluation set (``None`` where a metric was not computed).

    Args:
        name: A label (method and sparsity in a sweep, the checkpoint path otherwise).
        top1: Top-1 accuracy of the model's own classifier on the evaluation images.
        knn_top1: k-NN top-1 accuracy (bank = the train features).
        linear_top1: Linear-probe top-1 accuracy (trained on the bank, epoch chosen on a split of it).
        retention: Mean cosine similarity of the embeddings to the dense model's.
        num_params: Backbone parameters of the model.
        total_params: Every parameter, task head included.
        gflops: Theoretical GFLOPs of one forward pass (the paper's formulas).
        sparsity: Fraction of the dense backbone's parameters removed (when the dense size is known).
        heads, neurons: Per-block head counts and FFN widths.
        num_eval, num_bank: Images evaluated on and in the k-NN / probe bank.
        k: k of the k-NN.
        linear_probe: The probe's chosen epoch, validation accuracy and protocol.
        seconds: Wall time of each stage (feature extraction, probe training).
    """

    name: str | None = None
    top1: float | None = None
    knn_top1: float | None = None
    linear_top1: float | None = None
    retention: float | None = None
    num_params: int | None = None
    total_params: int | None = None
    gflops: float | None = None
    sparsity: float | None = None
    heads: list[int] | None = None
    neurons: list[int] | None = None
    num_eval: int = 0
    num_bank: int | None = None
    k: int | None = None
    linear_probe: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable values."""
        return dataclasses.asdict(self)

    def to_json(self, path: str | os.PathLike | None = None, indent: int = 2) -> str:
        """The JSON text; written atomically to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=indent)
        if path is not None:
            write_text_atomic(path, text)
        return text

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EvaluationResult":
        """The result :meth:`to_dict` gave (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class Evaluator:
    """Evaluates many models on the same data, extracting the dense model's features once.

    Args:
        eval_data: Images to evaluate on (PIL images, a ``datasets.Dataset`` with image and label columns, a pixel
            tensor, or an :class:`ImageSet`); the test split of every metric.
        bank_data: Labelled train images: the k-NN memory bank and the linear probe's training data.
        eval_labels: Labels of ``eval_data`` when it is not a labelled dataset.
        bank_labels: Labels of ``bank_data`` when it is not a labelled dataset.
        dense_model: The unpruned model, reference of the retention metric; its features are cached.
        processor: Image processor for PIL/dataset sources (default: the evaluated model's own).
        metrics: Subset of :data:`METRICS` (``"top1"``, ``"knn"``, ``"linear"``, ``"retention"``); by default every
            metric the data and models allow. A requested metric that cannot be computed raises.
        k: Neighbours of the k-NN.
        probe: Linear-probe protocol.
        batch_size: Images per forward pass.
        image_column: Image column of dataset sources.
        label_column: Label column of dataset sources.
        show_progress: Show progress bars.
    """

    def __init__(
        self,
        eval_data: Any,
        *,
        bank_data: Any = None,
        eval_labels: Any = None,
        bank_labels: Any = None,
        dense_model: PreTrainedModel | None = None,
        processor: Any = None,
        metrics: Sequence[str] | None = None,
        k: int = 20,
        probe: LinearProbeConfig | None = None,
        batch_size: int = 64,
        image_column: str | None = None,
        label_column: str = "label",
        show_progress: bool = True,
    ) -> None:
        self.eval_set = ImageSet.from_data(eval_data, eval_labels, image_column=image_column,
                                           label_column=label_column)
        self.bank_set = None if bank_data is None else ImageSet.from_data(
            bank_data, bank_labels, image_column=image_column, label_column=label_column)
        if metrics is not None:
            unknown = sorted(set(metrics) - set(METRICS))
            if unknown:
                raise EvaluationError(f"Unknown metrics {unknown}; choose from {list(METRICS)}.")
        self.metrics = None if metrics is None else tuple(metrics)
        self.dense_model = dense_model
        self.processor = processor
        self.k = k
        self.probe = probe or LinearProbeConfig()
        self.batch_size = batch_size
        self.show_progress = show_progress
        self._dense_eval: Features | None = None
        self._dense_bank: Features | None = None
        self._check_requirements()

    def _check_requirements(self) -> None:
        if self.metrics is None:
            return
        needs_labels = {"top1", "knn", "linear"} & set(self.metrics)
        if needs_labels and self.eval_set.labels is None:
            raise EvaluationError(f"Metrics {sorted(needs_labels)} need labelled evaluation data: give a dataset with "
                                  "a label column or eval_labels=...; retention alone needs no labels.")
        bank_metrics = {"knn", "linear"} & set(self.metrics)
        if bank_metrics and (self.bank_set is None or self.bank_set.labels is None):
            raise EvaluationError(f"Metrics {sorted(bank_metrics)} need labelled train images: pass bank_data=... "
                                  "(e.g. a train split with a label column).")
        if "knn" in self.metrics and len(self.bank_set) < self.k:
            raise EvaluationError(f"k={self.k} exceeds the bank's {len(self.bank_set)} images; use a larger bank "
                                  "or a smaller k.")
        if "retention" in self.metrics and self.dense_model is None:
            raise EvaluationError("The retention metric needs the dense model: pass dense_model=... "
                                  "(--dense-model, or --sparsity with an elastic checkpoint).")

    def _wanted(self, metric: str, model: PreTrainedModel) -> bool:
        possible = {
            "top1": self.eval_set.labels is not None and has_classifier(model),
            "knn": self.eval_set.labels is not None and self.bank_set is not None
            and self.bank_set.labels is not None and len(self.bank_set) >= self.k,
            "retention": self.dense_model is not None,
        }
        possible["linear"] = possible["knn"] or (self.eval_set.labels is not None and self.bank_set is not None
                                                 and self.bank_set.labels is not None and len(self.bank_set) >= 2)
        if self.metrics is None:
            return possible[metric]
        if metric in self.metrics and not possible[metric]:
            raise EvaluationError(f"Metric {metric!r} cannot be computed for {type(model).__name__}: "
                                  + ("it has no classifier head." if metric == "top1" else "data or labels missing."))
        return metric in self.metrics

    def features(self, model: PreTrainedModel, *, bank: bool = True, label: str = "") -> tuple[Features,
                                                                                                Features | None]:
        """Features of ``model`` on the evaluation images and (with ``bank``) the bank; cached for the dense model."""
        dense = model is self.dense_model
        processor = self.processor
        if processor is None and not isinstance(self.eval_set.source, (torch.Tensor, Mapping)):
            processor = self.processor = load_processor(model, purpose="preprocess the evaluation images")
        eval_features = self._dense_eval if dense else None
        if eval_features is None:
            eval_features = extract_features(model, self.eval_set, processor=processor, batch_size=self.batch_size,
                                             show_progress=self.show_progress, desc=f"{label}eval features".strip())
            if dense:
                self._dense_eval = eval_features
        bank_features = None
        if bank and self.bank_set is not None:
            bank_features = self._dense_bank if dense else None
            if bank_features is None:
                bank_features = extract_features(model, self.bank_set, processor=processor,
                                                 batch_size=self.batch_size, logits=False,
                                                 show_progress=self.show_progress,
                                                 desc=f"{label}bank features".strip())
                if dense:
                    self._dense_bank = bank_features
        return eval_features, bank_features

    def evaluate(self, model: PreTrainedModel, *, name: str | None = None) -> EvaluationResult:
        """Every wanted metric of ``model`` (dense or sliced), as an :class:`EvaluationResult`."""
        wanted = {metric: self._wanted(metric, model) for metric in METRICS}
        label = f"{name}: " if name else ""
        eval_features, bank_features = self.features(model, bank=wanted["knn"] or wanted["linear"], label=label)
        result = EvaluationResult(name=name, num_eval=len(self.eval_set),
                                  num_bank=None if bank_features is None else len(self.bank_set))
        result.seconds["features"] = eval_features.seconds + (bank_features.seconds if bank_features else 0.0)
        labels = self.eval_set.labels
        if wanted["top1"]:
            result.top1 = top1_accuracy(eval_features.logits, labels)
        if wanted["knn"]:
            result.k = self.k
            result.knn_top1 = knn_accuracy(bank_features.embeddings, self.bank_set.labels, eval_features.embeddings,
                                           labels, self.k)
        if wanted["linear"]:
            start = time.perf_counter()
            classes = int(max(self.bank_set.labels.max(), labels.max())) + 1
            probe = train_linear_probe(bank_features.embeddings, self.bank_set.labels, num_classes=classes,
                                       config=self.probe)
            result.linear_top1 = probe.accuracy(eval_features.embeddings, labels)
            result.linear_probe = probe.summary()
            result.seconds["linear_probe"] = time.perf_counter() - start
        if wanted["retention"]:
            dense_eval, _ = self.features(self.dense_model, bank=False, label="dense: ")
            result.retention = representation_retention(eval_features.embeddings, dense_eval.embeddings)
        _describe_model(model, result, self.dense_model)
        return result


def _describe_model(model: PreTrainedModel, result: EvaluationResult, dense_model: PreTrainedModel | None) -> None:
    result.heads, result.neurons = layer_widths(model)
    result.num_params = backbone_parameters(model)
    result.total_params = sum(p.numel() for p in model.parameters())
    result.gflops = estimate_gflops(model)
    dense_params = None
    stored = getattr(model.config, "elastic_ranking", None)
    if dense_model is not None:
        dense_params = backbone_parameters(dense_model)
    elif stored is not None:
        dense_params = ElasticRanking.from_dict(stored).shape.num_params()
    elif getattr(model.config, "elastic_layout", None) is None and len(set(result.heads)) == 1 \
            and len(set(result.neurons)) == 1:
        dense_params = result.num_params  # an unsliced model
    if dense_params:
        result.sparsity = 1.0 - result.num_params / dense_params


def evaluate(
    model: PreTrainedModel | str | os.PathLike,
    eval_data: Any,
    *,
    sparsity: float | None = None,
    bank_data: Any = None,
    eval_labels: Any = None,
    bank_labels: Any = None,
    dense_model: PreTrainedModel | str | os.PathLike | None = None,
    processor: Any = None,
    metrics: Sequence[str] | None = None,
    k: int = 20,
    probe: LinearProbeConfig | None = None,
    batch_size: int = 64,
    show_progress: bool = True,
    output: str | os.PathLike | None = None,
) -> EvaluationResult:
    """Evaluate one model: top-1 with its head, k-NN, linear probe and retention, whichever the inputs allow.

    Args:
        model: A model, or a path/Hub id of a checkpoint (an elastic checkpoint is loaded at ``sparsity``).
        eval_data: Evaluation images (PIL images with ``eval_labels``, a ``datasets.Dataset`` with image and label
            columns, or a pixel tensor), or a path/dataset name whose ``"validation"`` split is read.
        sparsity: Budget at which to load an elastic checkpoint given by path (ignored for a model object). A sliced
            checkpoint (one with ``elastic_layout``) holds no dense model, so slicing it further needs ``dense_model``.
        bank_data: Labelled train images for k-NN and the linear probe, or a path/dataset name whose ``"train"``
            split is read.
        eval_labels: Labels of ``eval_data`` when it is not a labelled dataset.
        bank_labels: Labels of ``bank_data`` when it is not a labelled dataset.
        dense_model: The unpruned model (or its path) for the retention metric. For an elastic checkpoint given by
            path with a ``sparsity``, the checkpoint's dense model is used by default.
        processor: The image processor (default: the checkpoint's).
        metrics: Subset of :data:`METRICS`; default: every metric the inputs allow.
        k: Neighbours of the k-NN.
        probe: Linear-probe protocol.
        batch_size: Images per forward pass.
        show_progress: Show progress bars.
        output: Also write the result as JSON here (atomically).

    Returns:
        The :class:`EvaluationResult`.

    Raises:
        EvaluationError: A sliced checkpoint given by path with a ``sparsity`` and no ``dense_model``, or a metric
            asked for whose inputs are missing.

    Example:
        >>> result = evaluate("vit-tiny-elastic", "../shared/data/tiny-imagenet-200", sparsity=0.3)  # doctest: +SKIP
        >>> result.top1, result.retention  # doctest: +SKIP
    """
    name = None
    if isinstance(model, (str, os.PathLike)):
        name = public_name(model) + (f"@{sparsity}" if sparsity is not None else "")  # results name no path
        if dense_model is None and sparsity:
            _refuse_resliced(model, sparsity)
            dense_model = model
        model = load_model(model, sparsity)
    if isinstance(dense_model, (str, os.PathLike)):
        dense_model = load_model(dense_model, None)
    if isinstance(eval_data, (str, os.PathLike)):
        eval_data = load_split(eval_data, "validation")
    if isinstance(bank_data, (str, os.PathLike)):
        bank_data = load_split(bank_data, "train")
    evaluator = Evaluator(eval_data, bank_data=bank_data, eval_labels=eval_labels, bank_labels=bank_labels,
                          dense_model=dense_model, processor=processor, metrics=metrics, k=k, probe=probe,
                          batch_size=batch_size, show_progress=show_progress)
    result = evaluator.evaluate(model, name=name)
    if output is not None:
        result.to_json(output)
    return result


def _refuse_resliced(path_or_repo_id: str | os.PathLike, sparsity: float) -> None:
    """A sliced checkpoint loaded at a new sparsity has no dense model to compare with: refuse, saying what to do."""
    from transformers import AutoConfig

    layout = getattr(AutoConfig.from_pretrained(path_or_repo_id), "elastic_layout", None)
    if layout is None:
        return
    saved = layout.get("sparsity") if isinstance(layout, Mapping) else None
    raise EvaluationError(
        f"{str(path_or_repo_id)!r} is a sliced checkpoint (saved at sparsity {saved}), so it holds no dense model: "
        f"loaded at sparsity {sparsity} its retention would be measured against itself and its sparsity against its "
        f"own size. Evaluate the dense elastic checkpoint at sparsity {sparsity} (--sparsity), evaluate this one as "
        "saved (without a sparsity), or pass the dense model it was cut from (dense_model=..., --dense-model)."
    )


def load_model(path_or_repo_id: str | os.PathLike, sparsity: float | None = None) -> PreTrainedModel:
    """Load a checkpoint for evaluation: elastic ones through ``ElasticViTModel`` (at ``sparsity``), others with the
    transformers class named in their config (e.g. ``ViTForImageClassification``)."""
    from transformers import AutoConfig

    from ..loading.modeling import ElasticViTModel

    config = AutoConfig.from_pretrained(path_or_repo_id)
    if getattr(config, "elastic_ranking", None) is not None or getattr(config, "elastic_layout", None) is not None:
        return ElasticViTModel.from_pretrained(path_or_repo_id, sparsity=sparsity)
    if sparsity:
        raise EvaluationError(f"{str(path_or_repo_id)!r} is not an elastic checkpoint, so it cannot be loaded at "
                              f"sparsity={sparsity}; rank it and save it with hf_snapvit.save_elastic first.")
    return model_class(config).from_pretrained(path_or_repo_id).eval()
