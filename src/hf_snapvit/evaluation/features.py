"""What a model computes for an :class:`~hf_snapvit.evaluation.images.ImageSet`: image embeddings and, for a
classifier, its logits, from one forward pass per batch."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures import ArchitectureSpec, get_backbone, get_spec
from ..architectures.capture import CapturedOutputs, capture_block_outputs
from ..architectures.registry import auto_class_names
from ..architectures.embedding import forward_inputs, image_embedding, pooled_embedding, returns_embedding
from ..errors import EvaluationError
from ..data.views import load_processor, model_inputs
from .images import ImageSet


@dataclass
class Features:
    """What one model computes for an :class:`ImageSet`.

    Args:
        embeddings: ``[N, D]`` float32 image embeddings (``embedding.image_embedding``), on the CPU.
        logits: ``[N, C]`` float32 logits of the model's classifier, or ``None`` for a bare backbone.
        labels: The image set's labels, or ``None``.
        seconds: Wall time of the extraction.
    """

    embeddings: torch.Tensor
    logits: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    seconds: float = 0.0


def has_classifier(model: PreTrainedModel) -> bool:
    """Whether ``model`` has a classifier on top of its vision backbone (a ``*ForImageClassification``, also where
    the whole model is the backbone, as timm's); a task model's depth head or language model is not one: it is
    evaluated on the features its task reads."""
    name = type(model).__name__
    classifiers = auto_class_names("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES")
    named = name in classifiers if classifiers else name.endswith("ForImageClassification")
    return get_spec(model).task is None and (get_backbone(model) is not model or named)


def _classifier_outputs(model: PreTrainedModel, inputs: dict[str, Any], spec: ArchitectureSpec,
                        captured: CapturedOutputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(embedding, logits)`` of one batch from the full model; ``captured`` receives the backbone's output and the
    last block's (the embedding of a backbone that returns logits only, as timm's)."""
    inputs.update(forward_inputs(model, inputs, spec))  # SigLIP2 classifiers take patch sequences
    captured.clear()
    output = model(**inputs)
    backbone_output = captured.backbone[-1] if captured.backbone else None
    last = captured.calls[-1] if captured.calls else None
    embedding = pooled_embedding(backbone_output, spec, model.config) \
        if getattr(backbone_output, "last_hidden_state", None) is not None else None
    if embedding is None and last is not None and not returns_embedding(backbone_output, spec):
        embedding = last.flatten(1, -2).mean(1)
    if embedding is None:  # an output this module does not know: ask the backbone again
        embedding = image_embedding(model, inputs, spec)
    return embedding, output.logits


# no_grad, not inference_mode: transformers caches tensors across models (BEiT's relative position index), and one
# made in inference mode breaks any later training in the process (recovering the model just evaluated).
@torch.no_grad()
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
    want_logits = has_classifier(model) if logits is None else logits
    if want_logits and not has_classifier(model):
        raise EvaluationError(f"{type(model).__name__} has no classifier head, so it gives no logits; use a "
                              "*ForImageClassification model for top-1, or logits=False.")
    if processor is None and not isinstance(images.source, (torch.Tensor, Mapping)):
        processor = load_processor(model, purpose="preprocess the evaluation images")
    parameter = next(model.parameters())
    was_training = model.training
    model.eval()
    # One pass gives both outputs: the hooks keep what the backbone and its last block returned while the full model
    # computes logits.
    capture = capture_block_outputs(model, spec, blocks="last", backbone=True) if want_logits \
        else contextlib.nullcontext()
    embeddings, all_logits = [], []
    start = time.perf_counter()
    try:
        with capture as captured:
            total = math.ceil(len(images) / batch_size)
            for batch in tqdm(images.batches(batch_size), total=total, desc=desc, unit="batch",
                              disable=not show_progress):
                inputs = model_inputs(batch, processor, parameter.device, parameter.dtype)
                if want_logits:
                    embedding, batch_logits = _classifier_outputs(model, inputs, spec, captured)
                    all_logits.append(batch_logits.float().cpu())
                else:
                    embedding = image_embedding(model, inputs, spec)
                embeddings.append(embedding.float().cpu())
    finally:
        model.train(was_training)
    return Features(
        embeddings=torch.cat(embeddings),
        logits=torch.cat(all_logits) if want_logits else None,
        labels=images.labels,
        seconds=time.perf_counter() - start,
    )
