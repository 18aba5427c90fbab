"""Top-1 accuracy of class predictions, as an ``evaluate`` metric that needs no Hub download."""

import evaluate
from hf_snapvit.evaluation.evaluate_metrics import metric_info
from hf_snapvit.evaluation import top1_accuracy

_DESCRIPTION = """
Top-1 accuracy: the fraction of images whose predicted class (e.g. the argmax of the model's own classifier) equals
the label.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `int`): [N] predicted class ids.
    references (`list` of `int`): [N] labels.
Returns:
    top1_accuracy (`float`): fraction of correct predictions.
Examples:
    >>> from hf_snapvit.evaluation.evaluate_metrics import load_metric
    >>> load_metric("top1_accuracy").compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'top1_accuracy': 0.6666666666666666}
"""

_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Top1Accuracy(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, predictions="class", references="class")

    def _compute(self, predictions, references):
        return {"top1_accuracy": top1_accuracy(predictions, references)}
