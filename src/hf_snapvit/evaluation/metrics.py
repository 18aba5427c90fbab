"""The metrics, on features already extracted: top-1, k-NN (the SnapViT paper's protocol, deterministic ties) and
representation retention (mean cosine similarity to the dense model's embeddings)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ..errors import EvaluationError
from .images import as_labels

METRICS: tuple[str, ...] = ("top1", "knn", "linear", "retention")


def feature_matrix(x: Any, name: str) -> torch.Tensor:
    """``x`` as a non-empty ``[N, D]`` float32 tensor; ``name`` is how errors refer to it."""
    tensor = torch.as_tensor(np.asarray(x, dtype=np.float32)) if not isinstance(x, torch.Tensor) else x.float()
    if tensor.ndim != 2 or tensor.shape[0] == 0:
        raise EvaluationError(f"{name} must be a non-empty [N, D] array of features; got shape {tuple(tensor.shape)}.")
    return tensor


def top1_accuracy(logits_or_predictions: torch.Tensor | np.ndarray, labels: Any) -> float:
    """Fraction of images whose predicted class (argmax of ``[N, C]`` logits, or ``[N]`` class ids) is the label."""
    predictions = torch.as_tensor(np.asarray(logits_or_predictions))
    if predictions.ndim == 2:
        predictions = predictions.argmax(1)
    labels = as_labels(labels, predictions.shape[0], "labels")
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
    bank = feature_matrix(bank_features, "bank_features")
    queries = feature_matrix(query_features, "query_features")
    labels = as_labels(bank_labels, bank.shape[0], "bank_labels")
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
    a = feature_matrix(embeddings, "embeddings")
    b = feature_matrix(dense_embeddings, "dense_embeddings")
    if a.shape != b.shape:
        raise EvaluationError(f"embeddings {tuple(a.shape)} and dense_embeddings {tuple(b.shape)} must have the same "
                              "shape: the same images, embedded by models with the same hidden size.")
    return float(nn.functional.cosine_similarity(a.double(), b.double(), dim=1).mean())

