"""k-NN top-1 accuracy of frozen image features (hf_snapvit's protocol), as an ``evaluate`` metric."""

import evaluate
from hf_snapvit.errors import EvaluationError
from hf_snapvit.evaluation.evaluate_metrics import metric_info
from hf_snapvit.evaluation import knn_accuracy

_DESCRIPTION = """
k-NN top-1 accuracy: features are L2-normalised, each query takes the k nearest entries of a labelled memory bank
(smallest Euclidean distance, ties to the earlier bank entry) and predicts their majority label (ties to the smallest
label). The SnapViT paper's protocol uses k = 20 and the train split as the bank.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): [N, D] features of the query (test) images.
    references (`list` of `int`): [N] labels of the query images.
    bank_features (`list` of `list` of `float` or array): [M, D] features of the labelled bank (train) images.
    bank_labels (`list` of `int` or array): [M] labels of the bank images.
    k (`int`, defaults to 20): number of neighbours, at most M.
Returns:
    knn_accuracy (`float`): fraction of queries whose k-NN prediction equals their label.
Examples:
    >>> from hf_snapvit.evaluation.evaluate_metrics import load_metric
    >>> knn = load_metric("knn_accuracy")
    >>> knn.compute(predictions=[[1.0, 0.0]], references=[1], bank_features=[[1.0, 0.1], [0.0, 1.0]],
    ...             bank_labels=[1, 0], k=1)
    {'knn_accuracy': 1.0}
"""

_CITATION = """
@inproceedings{snapvit2025,
  title={Elastic ViTs from Pretrained Models without Retraining},
  booktitle={NeurIPS},
  year={2025}
}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class KnnAccuracy(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, predictions="vector", references="class")

    def _compute(self, predictions, references, bank_features=None, bank_labels=None, k=20):
        if bank_features is None or bank_labels is None:
            raise EvaluationError("knn_accuracy needs bank_features=[M, D] and bank_labels=[M] (the labelled train set).")
        return {"knn_accuracy": knn_accuracy(bank_features, bank_labels, predictions, references, k=int(k))}
