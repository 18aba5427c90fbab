"""Representation retention: mean cosine similarity of a pruned model's embeddings to the dense model's."""

import evaluate
from hf_snapvit.evaluation.evaluate_metrics import metric_info
from hf_snapvit.evaluation import representation_retention

_DESCRIPTION = """
Representation retention: the mean, over images, of the cosine similarity between the embedding a (pruned) model
computes and the embedding the dense model computes for the same image. 1.0 means the embeddings are unchanged.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `list` of `float`): [N, D] embeddings of the evaluated model.
    references (`list` of `list` of `float`): [N, D] embeddings of the same images under the dense model.
Returns:
    representation_retention (`float`): mean cosine similarity, in [-1, 1].
Examples:
    >>> from hf_snapvit.evaluation.evaluate_metrics import load_metric
    >>> retention = load_metric("representation_retention")
    >>> retention.compute(predictions=[[1.0, 0.0]], references=[[2.0, 0.0]])
    {'representation_retention': 1.0}
"""

_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RepresentationRetention(evaluate.Metric):
    def _info(self):
        return metric_info(_DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION, predictions="vector", references="vector")

    def _compute(self, predictions, references):
        return {"representation_retention": representation_retention(predictions, references)}
