"""The linear probe: a linear classifier trained on frozen features, its epoch chosen on validation data (never on
test), with the chosen epoch's weights kept as a real copy."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm

from ..errors import EvaluationError
from ..utils.validation import Settings
from .images import as_labels
from .metrics import feature_matrix, top1_accuracy


@dataclass(frozen=True)
class LinearProbeConfig(Settings):
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

    error_class = EvaluationError

    def __post_init__(self) -> None:
        self._check_int("epochs", 1)
        self._check_int("batch_size", 1)
        self._check_real("val_fraction", 0, 1, low_open=True, high_open=True, hint="e.g. 0.2")
        self._check_real("lr", 0, low_open=True)
        self._check_real("momentum", 0, 1, high_open=True)
        self._check_real("weight_decay", 0)


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
        """Validation accuracy of the chosen epoch."""
        return self.history[self.best_epoch - 1]["val_accuracy"]

    @torch.no_grad()
    def predict(self, features: Any) -> torch.Tensor:
        """``[N]`` predicted labels for ``[N, D]`` features."""
        return self.classifier(feature_matrix(features, "features")).argmax(1)

    def accuracy(self, features: Any, labels: Any) -> float:
        """Top-1 accuracy on labelled features (e.g. the test split, after selection)."""
        return top1_accuracy(self.predict(features), labels)

    def summary(self) -> dict[str, Any]:
        """The chosen epoch, its validation accuracy, the split sizes and the protocol, as plain values."""
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
    x = feature_matrix(features, "features")
    y = as_labels(labels, x.shape[0], "labels")
    generator = torch.Generator().manual_seed(config.seed)
    x, y, x_val, y_val = _validation_split(x, y, val_features, val_labels, config, generator)
    classes = int(max(y.max(), y_val.max())) + 1 if num_classes is None else int(num_classes)
    classifier = nn.Linear(x.shape[1], classes)
    with torch.no_grad():
        classifier.weight.normal_(0.0, 0.01, generator=generator)
        classifier.bias.zero_()
    optimizer = torch.optim.SGD(classifier.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs, eta_min=0.0)
    history: list[dict[str, float]] = []
    best_state: dict[str, torch.Tensor] | None = None
    best_epoch, best_accuracy = 0, -1.0
    for epoch in tqdm(range(1, config.epochs + 1), desc="linear probe", unit="epoch", disable=not show_progress):
        lr = optimizer.param_groups[0]["lr"]
        train_loss = _train_epoch(classifier, optimizer, x, y, config.batch_size, generator)
        schedule.step()
        classifier.eval()
        with torch.no_grad():
            accuracy = float((classifier(x_val).argmax(1) == y_val).double().mean())
        history.append({"epoch": epoch, "lr": lr, "train_loss": train_loss, "val_accuracy": accuracy})
        if accuracy > best_accuracy:
            best_epoch, best_accuracy = epoch, accuracy
            best_state = {k: v.detach().clone() for k, v in classifier.state_dict().items()}
    classifier.load_state_dict(best_state)
    classifier.eval()
    return LinearProbe(classifier, best_epoch, history, int(x.shape[0]), int(x_val.shape[0]), config)


def _validation_split(x: torch.Tensor, y: torch.Tensor, val_features: Any, val_labels: Any,
                      config: LinearProbeConfig, generator: torch.Generator
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(train x, train y, val x, val y)``: the given validation split, or a seeded share carved from the train."""
    if (val_features is None) != (val_labels is None):
        raise EvaluationError("Give both val_features and val_labels, or neither (to carve them from the train data).")
    if val_features is None:
        if x.shape[0] < 2:
            raise EvaluationError(
                f"The linear probe needs at least 2 train examples to hold some out; got {x.shape[0]}.")
        order = torch.randperm(x.shape[0], generator=generator)
        num_val = min(x.shape[0] - 1, max(1, round(x.shape[0] * config.val_fraction)))
        return x[order[num_val:]], y[order[num_val:]], x[order[:num_val]], y[order[:num_val]]
    x_val = feature_matrix(val_features, "val_features")
    y_val = as_labels(val_labels, x_val.shape[0], "val_labels")
    if x_val.shape[1] != x.shape[1]:
        raise EvaluationError(f"val_features have {x_val.shape[1]} dimensions, train features {x.shape[1]}.")
    return x, y, x_val, y_val


def _train_epoch(classifier: nn.Linear, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 batch_size: int, generator: torch.Generator) -> float:
    """One pass over the train features in a fresh seeded order; returns the mean training loss."""
    classifier.train()
    loss_fn = nn.CrossEntropyLoss()
    order = torch.randperm(x.shape[0], generator=generator)
    total_loss = 0.0
    for start in range(0, x.shape[0], batch_size):
        index = order[start:start + batch_size]
        loss = loss_fn(classifier(x[index]), y[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total_loss += float(loss.detach()) * index.shape[0]
    return total_loss / x.shape[0]
