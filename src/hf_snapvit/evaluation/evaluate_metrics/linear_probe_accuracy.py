"""Linear-probe top-1 accuracy of frozen image features (hf_snapvit's protocol), as an ``evaluate`` metric."""

import evaluate
from hf_snapvit.errors import EvaluationError
from hf_snapvit.evaluation.evaluate_metrics import metric_info
from hf_snapvit.evaluation import LinearProbeConfig, train_linear_probe

_DESCRIPTION = """
Linear-probe top-1 accuracy: a linear classifier is trained on frozen train features (SGD, momentum 0.9, lr 1e-3,
cosine schedule, batch 256, shuffled with a seed), its epoch is chosen on a validation split carved from the train
features (or given), never on the test features, and the chosen weights are evaluated on the test features.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): [N, D] features of the test images.
    references (`list` of `int`): [N] labels of the test images.
    train_features (`list` of `list` of `float` or array): [M, D] train features.
    train_labels (`list` of `int` or array): [M] train labels.
    val_features, val_labels (optional): an explicit validation split; by default `val_fraction` of the train
        features is held out.
    epochs (`int`, 100), lr (`float`, 1e-3), momentum (`float`, 0.9), weight_decay (`float`, 0.0),
    batch_size (`int`, 256), val_fraction (`float`, 0.2), seed (`int`, 0): the protocol.
Returns:
    linear_probe_accuracy (`float`): test top-1 accuracy of the selected epoch.
    best_epoch (`int`): the selected epoch (1-based).
    best_val_accuracy (`float`): its validation accuracy.
"""

_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class LinearProbeAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, predictions="vector", references="class")

    def _compute(self, predictions, references, train_features=None, train_labels=None, val_features=None,
                 val_labels=None, num_classes=None, epochs=100, lr=1e-3, momentum=0.9, weight_decay=0.0,
                 batch_size=256, val_fraction=0.2, seed=0):
        if train_features is None or train_labels is None:
            raise EvaluationError("linear_probe_accuracy needs train_features=[M, D] and train_labels=[M].")
        config = LinearProbeConfig(epochs=int(epochs), lr=float(lr), momentum=float(momentum),
                                   weight_decay=float(weight_decay), batch_size=int(batch_size),
                                   val_fraction=float(val_fraction), seed=int(seed))
        if num_classes is None:
            num_classes = int(max(max(train_labels), max(references))) + 1
        probe = train_linear_probe(train_features, train_labels, val_features=val_features, val_labels=val_labels,
                                   num_classes=num_classes, config=config)
        return {"linear_probe_accuracy": probe.accuracy(predictions, references), "best_epoch": probe.best_epoch,
                "best_val_accuracy": probe.best_val_accuracy}
