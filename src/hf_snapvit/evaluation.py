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
available as ``evaluate`` modules shipped inside the package (:mod:`hf_snapvit.metrics`), which load offline.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from .architectures import ArchitectureSpec, get_backbone, get_spec, image_embedding
from .budget import backbone_parameters, estimate_gflops, layer_widths
from .data import find_image_column, to_rgb
from .errors import EvaluationError
from .files import write_text_atomic
from .ranking import ElasticRanking

METRICS: tuple[str, ...] = ("top1", "knn", "linear", "retention")



# --------------------------------------------------------------------------------------------------- data


@dataclass
class ImageSet:
    """Images to evaluate on, with optional integer labels, read batch by batch on every pass.

    Build one with :meth:`from_data`. The source is kept as given (a ``datasets.Dataset`` decodes each batch when it
    is read), so large splits need no memory beyond one batch.

    Args:
        source: A list of PIL images, a ``datasets.Dataset``, a ``[N, C, H, W]`` tensor of preprocessed pixel
            values, or a mapping of model-input tensors with a shared first dimension.
        labels: ``[N]`` integer labels, or ``None``.
        image_column: The image column of a ``datasets.Dataset`` source.
        description: Provenance recorded in results (source type, dataset name, size).
    """

    source: Any
    labels: torch.Tensor | None = None
    image_column: str | None = None
    description: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_data(
        cls,
        data: Any,
        labels: Sequence[int] | torch.Tensor | np.ndarray | None = None,
        *,
        image_column: str | None = None,
        label_column: str | None = "label",
    ) -> "ImageSet":
        """Wrap ``data`` (PIL images, a ``datasets`` (Iterable)Dataset, a pixel tensor or an ``ImageSet``).

        Args:
            data: The images. A streaming ``IterableDataset`` is read into memory once (use ``.take(n)`` first).
            labels: Labels for list or tensor sources (a dataset's come from ``label_column``); they override the
                dataset's when given.
            image_column: The image column of a dataset (default: the first ``datasets.Image`` feature).
            label_column: The label column of a dataset; a dataset without it gives an unlabelled set.

        Returns:
            The wrapped images and labels.
        """
        if isinstance(data, ImageSet):
            if labels is None:
                return data
            return dataclasses.replace(data, labels=_as_labels(labels, len(data), "labels"))
        import datasets

        column = None
        found: Any = None
        if isinstance(data, datasets.IterableDataset):
            column = image_column or find_image_column(list(data.features or {}) or data.column_names or [],
                                                       data.features)
            examples = list(data)
            if label_column is not None and examples and label_column in examples[0] and labels is None:
                found = [example[label_column] for example in examples]
            data = [to_rgb(example[column]) for example in examples]
            column = None
        if isinstance(data, datasets.Dataset):
            column = image_column or find_image_column(data.column_names, data.features)
            if labels is None and label_column is not None and label_column in data.column_names:
                found = data[label_column]
            source: Any = data
            kind = "datasets.Dataset"
        elif isinstance(data, torch.Tensor):
            if data.ndim != 4:
                raise EvaluationError(
                    "A tensor of images must be preprocessed pixel values [N, C, H, W]; got shape "
                    f"{tuple(data.shape)}. "
                    "Pass PIL images or a datasets.Dataset to have the model's processor prepare them."
                )
            source, kind = data, "tensor"
        elif isinstance(data, Mapping):
            lengths = {k: v.shape[0] for k, v in data.items() if isinstance(v, torch.Tensor)}
            if not lengths or len(set(lengths.values())) != 1:
                raise EvaluationError(
                    f"A mapping of model inputs needs tensors with one shared batch size; got {lengths or 'none'}."
                )
            source, kind = dict(data), "inputs"
        elif isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise EvaluationError(
                f"Unsupported evaluation data of type {type(data).__name__}: give PIL images, a datasets Dataset with "
                "image and label columns, or a [N, C, H, W] tensor of pixel values (use load_split for a path)."
            )
        else:
            source, kind = [to_rgb(image) for image in data], "images"
        name = getattr(getattr(source, "info", None), "dataset_name", None)
        result = cls(source=source, image_column=column, description={"source": kind, "name": name})
        given = labels if labels is not None else found
        if given is not None:
            result.labels = _as_labels(given, len(result), "labels" if labels is not None else repr(label_column))
        result.description["num_images"] = len(result)
        return result

    def __len__(self) -> int:
        if isinstance(self.source, Mapping):
            return int(next(v.shape[0] for v in self.source.values() if isinstance(v, torch.Tensor)))
        return len(self.source)

    def batches(self, batch_size: int) -> Iterator[Any]:
        """Consecutive batches: lists of PIL images, pixel tensors, or mappings of input tensors."""
        for start in range(0, len(self), batch_size):
            stop = min(start + batch_size, len(self))
            if isinstance(self.source, Mapping):
                yield {k: (v[start:stop] if isinstance(v, torch.Tensor) else v) for k, v in self.source.items()}
            elif isinstance(self.source, torch.Tensor):
                yield self.source[start:stop]
            elif self.image_column is not None:
                yield [to_rgb(image) for image in self.source[start:stop][self.image_column]]
            else:
                yield self.source[start:stop]


def _as_labels(labels: Any, expected: int, name: str) -> torch.Tensor:
    tensor = torch.as_tensor(np.asarray(labels))
    if tensor.ndim != 1 or tensor.shape[0] != expected:
        raise EvaluationError(f"{name} must be a 1-D sequence of {expected} labels (one per image); got shape "
                              f"{tuple(tensor.shape)}.")
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise EvaluationError(f"{name} must be integer class ids, got dtype {tensor.dtype}.")
    if expected and int(tensor.min()) < 0:
        raise EvaluationError(f"{name} must be non-negative class ids; found {int(tensor.min())}.")
    return tensor.long()


def load_split(
    path_or_name: str | os.PathLike,
    split: str,
    *,
    num_samples: int | None = None,
    seed: int = 0,
) -> Any:
    """A ``datasets.Dataset`` split: a parquet file, a folder of ``{split}.parquet`` files, or a dataset name.

    Args:
        path_or_name: ``data/validation.parquet``, a folder holding ``{split}.parquet``, or anything
            ``datasets.load_dataset`` accepts (a Hub id or a local dataset folder).
        split: The split to read (``"train"``, ``"validation"``, ...).
        num_samples: Keep a seeded random subset of this size (default: all).
        seed: Seed of the subset's shuffle.

    Returns:
        The (sub)split, a ``datasets.Dataset``.
    """
    import datasets

    path = Path(path_or_name)
    if path.is_file() or path.suffix == ".parquet":
        dataset = datasets.load_dataset("parquet", data_files={split: str(path)}, split=split)
    elif (path / f"{split}.parquet").is_file():
        dataset = datasets.load_dataset("parquet", data_files={split: str(path / f"{split}.parquet")}, split=split)
    else:
        dataset = datasets.load_dataset(str(path_or_name), split=split)
    if num_samples is not None:
        if num_samples < 1:
            raise EvaluationError(f"num_samples={num_samples} must be at least 1 (or None for the whole split).")
        dataset = dataset.shuffle(seed=seed).select(range(min(num_samples, len(dataset))))
    return dataset


# --------------------------------------------------------------------------------------------------- features


@dataclass
class Features:
    """What one model computes for an :class:`ImageSet`.

    Args:
        embeddings: ``[N, D]`` float32 image embeddings (``architectures.image_embedding``), on the CPU.
        logits: ``[N, C]`` float32 logits of the model's classifier, or ``None`` for a bare backbone.
        labels: The image set's labels, or ``None``.
        seconds: Wall time of the extraction.
    """

    embeddings: torch.Tensor
    logits: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    seconds: float = 0.0


def has_classifier(model: PreTrainedModel) -> bool:
    """Whether ``model`` has a head on top of its vision backbone (a ``*ForImageClassification``)."""
    return get_backbone(model) is not model


def _embedding_from_output(output: Any, spec: ArchitectureSpec) -> torch.Tensor | None:
    """The embedding :func:`image_embedding` takes from a backbone output, or ``None`` if the output is not one."""
    hidden = getattr(output, "last_hidden_state", None)
    if hidden is None:
        return None
    if spec.embedding == "pooled":
        pooled = getattr(output, "pooler_output", None)
        return pooled if pooled is not None else hidden.mean(1)
    if spec.embedding == "cls_dist_mean":
        return hidden[:, :2].mean(1)
    if spec.embedding == "cls":
        return hidden[:, 0]
    return None


def _model_inputs(batch: Any, processor: Any, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    if isinstance(batch, Mapping):
        inputs = dict(batch)
    elif isinstance(batch, torch.Tensor):
        inputs = {"pixel_values": batch}
    else:
        if processor is None:
            raise EvaluationError("PIL images need the model's image processor: pass processor=... "
                                  "(AutoImageProcessor.from_pretrained(<model>)).")
        inputs = dict(processor(images=batch, return_tensors="pt"))
    return {k: (v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
                if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def default_processor(model: PreTrainedModel) -> Any:
    """``AutoImageProcessor`` of the checkpoint ``model`` was loaded from."""
    from transformers import AutoImageProcessor

    name = getattr(model.config, "_name_or_path", None)
    if not name:
        raise EvaluationError("The model does not say where it was loaded from, so its image processor cannot be "
                              "found; pass processor=AutoImageProcessor.from_pretrained(<checkpoint>).")
    return AutoImageProcessor.from_pretrained(name)


@torch.inference_mode()
def extract_features(
    model: PreTrainedModel,
    data: ImageSet | Any,
    *,
    processor: Any = None,
    batch_size: int = 64,
    logits: bool | None = None,
    show_progress: bool = True,
    desc: str = "features",
) -> Features:
    """Embeddings (and classifier logits) of every image, from one forward pass per batch.

    Args:
        model: A model of a supported architecture, dense or sliced.
        data: An :class:`ImageSet` or anything :meth:`ImageSet.from_data` accepts.
        processor: The model's image processor, for PIL images (default: loaded from ``model.name_or_path``).
        batch_size: Images per forward pass.
        logits: Also return the classifier's logits (default: when the model has a classifier).
        show_progress: Show a progress bar.
        desc: Label of the progress bar.

    Returns:
        :class:`Features` on the CPU, in float32.
    """
    images = ImageSet.from_data(data)
    if batch_size < 1:
        raise EvaluationError(f"batch_size={batch_size} must be at least 1.")
    if len(images) == 0:
        raise EvaluationError("The evaluation data is empty; give at least one image.")
    spec = get_spec(model)
    backbone = get_backbone(model, spec)
    want_logits = has_classifier(model) if logits is None else logits
    if want_logits and backbone is model:
        raise EvaluationError(f"{type(model).__name__} has no classifier head, so it gives no logits; use a "
                              "*ForImageClassification model for top-1, or logits=False.")
    if processor is None and not isinstance(images.source, (torch.Tensor, Mapping)):
        processor = default_processor(model)
    parameter = next(model.parameters())
    was_training = model.training
    model.eval()
    captured: list[Any] = []
    # One pass gives both outputs: the hook keeps what the backbone returned while the full model computes logits.
    handle = backbone.register_forward_hook(lambda module, args, output: captured.append(output)) if want_logits \
        else None
    embeddings, all_logits = [], []
    start = time.perf_counter()
    try:
        total = math.ceil(len(images) / batch_size)
        for batch in tqdm(images.batches(batch_size), total=total, desc=desc, unit="batch",
                          disable=not show_progress):
            inputs = _model_inputs(batch, processor, parameter.device, parameter.dtype)
            if want_logits:
                pixels = inputs.get("pixel_values")
                if getattr(spec, "patch_inputs", False) and pixels is not None and pixels.ndim == 4:
                    from .architectures import patchify  # SigLIP2 classifiers take patch sequences

                    config = getattr(model.config, "vision_config", None) or model.config
                    inputs.update(patchify(pixels, int(config.patch_size)))
                captured.clear()
                output = model(**inputs)
                embedding = _embedding_from_output(captured[0], spec) if captured else None
                if embedding is None:  # an output this module does not know: ask the backbone again
                    embedding = image_embedding(model, inputs, spec)
                all_logits.append(output.logits.float().cpu())
            else:
                embedding = image_embedding(model, inputs, spec)
            embeddings.append(embedding.float().cpu())
    finally:
        if handle is not None:
            handle.remove()
        model.train(was_training)
    return Features(
        embeddings=torch.cat(embeddings),
        logits=torch.cat(all_logits) if want_logits else None,
        labels=images.labels,
        seconds=time.perf_counter() - start,
    )


# --------------------------------------------------------------------------------------------------- metrics


def _features(x: Any, name: str) -> torch.Tensor:
    tensor = torch.as_tensor(np.asarray(x, dtype=np.float32)) if not isinstance(x, torch.Tensor) else x.float()
    if tensor.ndim != 2 or tensor.shape[0] == 0:
        raise EvaluationError(f"{name} must be a non-empty [N, D] array of features; got shape {tuple(tensor.shape)}.")
    return tensor


def top1_accuracy(logits_or_predictions: torch.Tensor | np.ndarray, labels: Any) -> float:
    """Fraction of images whose predicted class (argmax of ``[N, C]`` logits, or ``[N]`` class ids) is the label."""
    predictions = torch.as_tensor(np.asarray(logits_or_predictions))
    if predictions.ndim == 2:
        predictions = predictions.argmax(1)
    labels = _as_labels(labels, predictions.shape[0], "labels")
    if predictions.shape[0] == 0:
        raise EvaluationError("top-1 accuracy needs at least one prediction.")
    return float((predictions.long() == labels).double().mean())


def knn_predict(
    bank_features: Any,
    bank_labels: Any,
    query_features: Any,
    k: int = 20,
    *,
    num_classes: int | None = None,
    chunk_size: int = 512,
) -> torch.Tensor:
    """k-NN class predictions: L2-normalised features, the ``k`` nearest bank entries, uniform majority vote.

    Nearest means the smallest Euclidean distance between normalised features (equivalently the largest cosine
    similarity). Entries equally far away are taken in bank order; a tied vote goes to the smallest label.

    Args:
        bank_features: ``[M, D]`` features of the labelled memory bank (e.g. a train split).
        bank_labels: ``[M]`` integer labels of the bank.
        query_features: ``[N, D]`` features to classify.
        k: Number of neighbours, ``1 <= k <= M``.
        num_classes: Number of classes (default: the largest bank label + 1).
        chunk_size: Queries per similarity block (bounds memory at ``chunk_size x M`` floats).

    Returns:
        ``[N]`` predicted labels (int64).
    """
    bank = _features(bank_features, "bank_features")
    queries = _features(query_features, "query_features")
    labels = _as_labels(bank_labels, bank.shape[0], "bank_labels")
    if bank.shape[1] != queries.shape[1]:
        raise EvaluationError(f"bank_features have {bank.shape[1]} dimensions but query_features {queries.shape[1]}; "
                              "extract both with the same model.")
    if not isinstance(k, int) or not 1 <= k <= bank.shape[0]:
        raise EvaluationError(f"k={k!r} must be an integer in [1, {bank.shape[0]}] (the bank size); use a larger "
                              "bank or a smaller k.")
    classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if int(labels.max()) >= classes:
        raise EvaluationError(f"num_classes={num_classes} but the bank has label {int(labels.max())}.")
    bank = nn.functional.normalize(bank, dim=1)
    queries = nn.functional.normalize(queries, dim=1)
    position = torch.arange(bank.shape[0], 0, -1, dtype=torch.float64)  # earlier bank entries win ties
    predictions = []
    for start in range(0, queries.shape[0], chunk_size):
        similarity = queries[start:start + chunk_size] @ bank.T
        kth = similarity.topk(k, dim=1).values[:, -1:]
        # Everything strictly closer than the k-th neighbour is in; among entries tied with it, the earliest.
        key = torch.where(similarity > kth, float(bank.shape[0] + 1),
                          torch.where(similarity == kth, position, -1.0).to(torch.float64))
        nearest = key.topk(k, dim=1).indices
        votes = nn.functional.one_hot(labels[nearest], classes).sum(1)
        predictions.append(votes.argmax(1))  # argmax returns the first maximum: the smallest label
    return torch.cat(predictions)


def knn_accuracy(bank_features: Any, bank_labels: Any, query_features: Any, query_labels: Any, k: int = 20) -> float:
    """Top-1 accuracy of :func:`knn_predict` on labelled queries."""
    predictions = knn_predict(bank_features, bank_labels, query_features, k)
    return top1_accuracy(predictions, query_labels)


def representation_retention(embeddings: Any, dense_embeddings: Any) -> float:
    """Mean cosine similarity between each image's embedding and its dense-model embedding (1 = unchanged).

    Args:
        embeddings: ``[N, D]`` embeddings of the evaluated (e.g. sliced) model.
        dense_embeddings: ``[N, D]`` embeddings of the same images under the dense model.
    """
    a = _features(embeddings, "embeddings")
    b = _features(dense_embeddings, "dense_embeddings")
    if a.shape != b.shape:
        raise EvaluationError(f"embeddings {tuple(a.shape)} and dense_embeddings {tuple(b.shape)} must have the same "
                              "shape: the same images, embedded by models with the same hidden size.")
    return float(nn.functional.cosine_similarity(a.double(), b.double(), dim=1).mean())


# --------------------------------------------------------------------------------------------------- linear probe


@dataclass(frozen=True)
class LinearProbeConfig:
    """Linear-probe protocol (the paper's appendix).

    Args:
        epochs: Training epochs; the cosine schedule anneals the learning rate to 0 over them.
        lr: SGD learning rate.
        momentum: SGD momentum.
        weight_decay: SGD weight decay.
        batch_size: Examples per step; the train features are reshuffled every epoch.
        val_fraction: Fraction of the train features held out to choose the epoch, when no validation split is given.
        seed: Seed of the initialisation, the validation carve and the shuffles.
    """

    epochs: int = 100
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    batch_size: int = 256
    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise EvaluationError(f"{name}={getattr(self, name)!r} must be a positive integer.")
        if not 0.0 < self.val_fraction < 1.0:
            raise EvaluationError(f"val_fraction={self.val_fraction} must be in (0, 1), e.g. 0.2.")
        if self.lr <= 0 or not 0.0 <= self.momentum < 1.0 or self.weight_decay < 0:
            raise EvaluationError(f"Need lr > 0, 0 <= momentum < 1 and weight_decay >= 0; got lr={self.lr}, "
                                  f"momentum={self.momentum}, weight_decay={self.weight_decay}.")


@dataclass
class LinearProbe:
    """A trained linear probe and how its epoch was chosen.

    Args:
        classifier: The ``nn.Linear`` holding the weights of the best epoch (a copy, not the last epoch's tensors).
        best_epoch: The chosen epoch (1-based): highest validation accuracy, the earliest on ties.
        history: One record per epoch: ``epoch``, ``lr``, ``train_loss``, ``val_accuracy``.
        num_train: Examples the probe was trained on.
        num_val: Examples it was selected on.
        config: The protocol.
    """

    classifier: nn.Linear
    best_epoch: int
    history: list[dict[str, float]]
    num_train: int
    num_val: int
    config: LinearProbeConfig

    @property
    def best_val_accuracy(self) -> float:
        return self.history[self.best_epoch - 1]["val_accuracy"]

    @torch.no_grad()
    def predict(self, features: Any) -> torch.Tensor:
        """``[N]`` predicted labels for ``[N, D]`` features."""
        return self.classifier(_features(features, "features")).argmax(1)

    def accuracy(self, features: Any, labels: Any) -> float:
        """Top-1 accuracy on labelled features (e.g. the test split, after selection)."""
        return top1_accuracy(self.predict(features), labels)

    def summary(self) -> dict[str, Any]:
        return {"best_epoch": self.best_epoch, "best_val_accuracy": self.best_val_accuracy,
                "num_train": self.num_train, "num_val": self.num_val, "config": dataclasses.asdict(self.config)}


def train_linear_probe(
    features: Any,
    labels: Any,
    *,
    val_features: Any = None,
    val_labels: Any = None,
    num_classes: int | None = None,
    config: LinearProbeConfig | None = None,
    show_progress: bool = False,
) -> LinearProbe:
    """Train a linear classifier on frozen train features and choose its epoch on validation data.

    Test data never enters this function: evaluate the returned probe on it with :meth:`LinearProbe.accuracy`.

    Args:
        features: ``[N, D]`` train features.
        labels: ``[N]`` train labels.
        val_features: ``[V, D]`` validation features; by default ``config.val_fraction`` of the train features are
            held out (a seeded random split) and the probe trains on the rest.
        val_labels: ``[V]`` validation labels, with ``val_features``.
        num_classes: Number of classes (default: the largest label + 1).
        config: The protocol (default :class:`LinearProbeConfig`).
        show_progress: Show a progress bar over epochs.

    Returns:
        The probe with the weights of its best validation epoch.
    """
    config = config or LinearProbeConfig()
    x = _features(features, "features")
    y = _as_labels(labels, x.shape[0], "labels")
    generator = torch.Generator().manual_seed(config.seed)
    if (val_features is None) != (val_labels is None):
        raise EvaluationError("Give both val_features and val_labels, or neither (to carve them from the train data).")
    if val_features is None:
        if x.shape[0] < 2:
            raise EvaluationError(
                f"The linear probe needs at least 2 train examples to hold some out; got {x.shape[0]}.")
        order = torch.randperm(x.shape[0], generator=generator)
        num_val = min(x.shape[0] - 1, max(1, round(x.shape[0] * config.val_fraction)))
        x_val, y_val, x, y = x[order[:num_val]], y[order[:num_val]], x[order[num_val:]], y[order[num_val:]]
    else:
        x_val = _features(val_features, "val_features")
        y_val = _as_labels(val_labels, x_val.shape[0], "val_labels")
        if x_val.shape[1] != x.shape[1]:
            raise EvaluationError(f"val_features have {x_val.shape[1]} dimensions, train features {x.shape[1]}.")
    classes = int(max(y.max(), y_val.max())) + 1 if num_classes is None else int(num_classes)
    classifier = nn.Linear(x.shape[1], classes)
    with torch.no_grad():
        classifier.weight.normal_(0.0, 0.01, generator=generator)
        classifier.bias.zero_()
    optimizer = torch.optim.SGD(classifier.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs, eta_min=0.0)
    loss_fn = nn.CrossEntropyLoss()
    history: list[dict[str, float]] = []
    best_state: dict[str, torch.Tensor] | None = None
    best_epoch, best_accuracy = 0, -1.0
    for epoch in tqdm(range(1, config.epochs + 1), desc="linear probe", unit="epoch", disable=not show_progress):
        lr = optimizer.param_groups[0]["lr"]
        classifier.train()
        order = torch.randperm(x.shape[0], generator=generator)
        total_loss = 0.0
        for start in range(0, x.shape[0], config.batch_size):
            index = order[start:start + config.batch_size]
            loss = loss_fn(classifier(x[index]), y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += float(loss.detach()) * index.shape[0]
        schedule.step()
        classifier.eval()
        with torch.no_grad():
            accuracy = float((classifier(x_val).argmax(1) == y_val).double().mean())
        history.append({"epoch": epoch, "lr": lr, "train_loss": total_loss / x.shape[0], "val_accuracy": accuracy})
        if accuracy > best_accuracy:
            best_epoch, best_accuracy = epoch, accuracy
            best_state = {k: v.detach().clone() for k, v in classifier.state_dict().items()}
    classifier.load_state_dict(best_state)
    classifier.eval()
    return LinearProbe(classifier, best_epoch, history, int(x.shape[0]), int(x_val.shape[0]), config)


# --------------------------------------------------------------------------------------------------- evaluator


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
            raise EvaluationError("The retention metric needs the dense model: pass dense_model=...")

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
            processor = self.processor = default_processor(model)
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
        sparsity: Budget at which to load an elastic checkpoint given by path (ignored for a model object).
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

    Example:
        >>> result = evaluate("vit-tiny-elastic", "../shared/data/tiny-imagenet-200", sparsity=0.3)  # doctest: +SKIP
        >>> result.top1, result.retention  # doctest: +SKIP
    """
    name = None
    if isinstance(model, (str, os.PathLike)):
        name = str(model) + (f"@{sparsity}" if sparsity is not None else "")
        if dense_model is None and sparsity:
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


def load_model(path_or_repo_id: str | os.PathLike, sparsity: float | None = None) -> PreTrainedModel:
    """Load a checkpoint for evaluation: elastic ones through ``ElasticViTModel`` (at ``sparsity``), others with the
    transformers class named in their config (e.g. ``ViTForImageClassification``)."""
    import transformers
    from transformers import AutoConfig

    from .modeling import ElasticViTModel

    config = AutoConfig.from_pretrained(path_or_repo_id)
    if getattr(config, "elastic_ranking", None) is not None or getattr(config, "elastic_layout", None) is not None:
        return ElasticViTModel.from_pretrained(path_or_repo_id, sparsity=sparsity)
    if sparsity:
        raise EvaluationError(f"{str(path_or_repo_id)!r} is not an elastic checkpoint, so it cannot be loaded at "
                              f"sparsity={sparsity}; rank it and save it with hf_snapvit.save_elastic first.")
    cls = next((getattr(transformers, n) for n in (config.architectures or []) if hasattr(transformers, n)),
               transformers.AutoModel)
    return cls.from_pretrained(path_or_repo_id).eval()
