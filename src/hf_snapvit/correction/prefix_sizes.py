"""Where a prefix correction helps: the whole-model check of the per-size guard, run once per size on a grid.

The factors are fitted on the dense model's activations. At a small size the pruned model feeds each layer inputs
close to those and the correction helps; at a large size they drift, and measured on the shared ViT-Tiny the
correction can then raise top-1 and lower k-NN accuracy at once (``docs/correction.md``). So, as the per-size guard
does for one size, the held-out calibration images decide: at each checked sparsity the corrected and the plain
slice are compared with the dense model on what users read: the image embeddings (relative squared error), which
held-out images each image's embedding has as its nearest neighbours (the share of the dense model's neighbours it
keeps: what retrieval and k-NN read, and what the squared error misses), and, where the model has a classifier, its
class distributions (KL divergence). The correction counts as helping only when, on each of them, its mean per-image
gain exceeds :data:`~hf_snapvit.correction.guard.EVIDENCE` standard errors.
Only the first run of sizes where it helps is corrected (:func:`~hf_snapvit.correction.prefix.first_band`), and
:func:`~hf_snapvit.correction.prefix.applies_at` turns the grid into the decision for any size.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures import get_spec
from ..architectures.capture import capture_block_outputs
from ..errors import CorrectionError
from ..surgery.slicing import prefixes, slice_model_
from ..architectures.embedding import image_embedding, pooled_embedding, returns_embedding
from ..data.views import model_inputs
from ..elastic.size_grid import sparsity_grid
from .guard import EVIDENCE, distances, final_outputs
from .prefix import MIN_CHECKED_IMAGES, PrefixCorrection, first_band

#: Sparsities checked by default: every 5 % up to the ranking's maximum.
GRID_STEP = 0.05
#: Nearest neighbours compared per held-out image (fewer when there are fewer than 40 held-out images).
NEIGHBOURS = 10


def default_grid(max_sparsity: float) -> list[float]:
    """``0.05, 0.10, …`` (every :data:`GRID_STEP`) up to ``max_sparsity``, and ``max_sparsity`` itself
    (:func:`~hf_snapvit.elastic.size_grid.sparsity_grid`)."""
    return sparsity_grid(max_sparsity, GRID_STEP)


@torch.no_grad()
def outputs_of(model: PreTrainedModel, spec: Any, batches: Sequence[dict]) -> dict[str, list[torch.Tensor]]:
    """Per measure, the model's outputs on ``batches``: ``"embedding_mse"`` (the image embeddings) and, for a model
    with a classifier, ``"logits_kl"`` (class log-probabilities)."""
    def embedded(out: Any, kwargs: dict[str, Any]) -> torch.Tensor | None:  # outputs with none are embedded below
        return pooled_embedding(out, spec, model.config, kwargs.get("grid_thw")) if returns_embedding(out, spec) \
            else None

    # A classifier's forward runs its backbone: read the embedding there rather than in a second forward pass.
    with capture_block_outputs(model, spec, blocks=None, on_backbone=embedded) as hooked:
        outputs, measure = final_outputs(model, spec, batches, None)
    if measure == "embedding_mse":
        return {measure: outputs}
    captured = hooked.backbone
    if len(captured) != len(batches):  # a backbone called more or less than once per batch: embed separately
        parameter = next(model.parameters())
        captured = [image_embedding(model, model_inputs(b, None, parameter.device, parameter.dtype, as_pixels=True),
                                    spec) for b in batches]
    return {measure: outputs, "embedding_mse": captured}


def neighbours(embeddings: list[torch.Tensor]) -> torch.Tensor:
    """``[N, k]``: each image's nearest other images by cosine similarity of the embeddings."""
    e = torch.nn.functional.normalize(torch.cat(embeddings).double(), dim=-1)
    k = min(NEIGHBOURS, max(1, (e.shape[0] - 1) // 4))
    similarity = e @ e.T
    similarity.fill_diagonal_(-2.0)
    return similarity.topk(k, dim=1).indices.cpu()


def agreement(found: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per image, the share of its ``reference`` neighbours that are among its ``found`` ones."""
    hits = (found[:, :, None] == reference[:, None, :]).any(dim=1)
    return hits.double().mean(dim=1)


def per_image_gains(plain: dict[str, list[torch.Tensor]], corrected: dict[str, list[torch.Tensor]],
                    dense: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per measure (:func:`outputs_of`'s and ``"embedding_neighbours"``), how much closer to the dense model each
    held-out image is with the correction than without (positive: the correction helps)."""
    gains = {measure: distances(plain[measure], reference, measure) - distances(corrected[measure], reference, measure)
             for measure, reference in dense.items()}
    wanted = neighbours(dense["embedding_mse"])
    gains["embedding_neighbours"] = (agreement(neighbours(corrected["embedding_mse"]), wanted)
                                     - agreement(neighbours(plain["embedding_mse"]), wanted))
    return gains


@torch.no_grad()
def check_sizes(correction: PrefixCorrection, model: PreTrainedModel, ranking: Any,
                sparsities: Sequence[float] | None = None, width_multiple: int | None = None, *,
                show_progress: bool = True) -> list[dict[str, Any]]:
    """Measure, at each of ``sparsities``, whether the correction brings the model's outputs on the held-out images
    clearly closer to the dense model's than the plain slice; record the result in ``correction.sizes``.

    Args:
        correction: Fitted with ``CorrectionConfig(guard=True)`` on ``model`` (so it holds images it was not fitted on).
        model: The dense model, its units in the rank order of ``ranking`` (not changed).
        ranking: The ranking sizes are resolved with, in rank order (an elastic checkpoint's).
        sparsities: The sizes to check; ``None``: every 5 % up to ``ranking.max_sparsity_for(width_multiple)``.
        width_multiple: As in :meth:`~hf_snapvit.ElasticRanking.keep_counts`.
        show_progress: Show a progress bar over the sizes.
    """
    if not correction.held_out:
        raise CorrectionError("The size check needs held-out images: fit the correction with "
                              f"CorrectionConfig(guard=True) (the default) and at least {MIN_CHECKED_IMAGES} "
                              "calibration images.")
    if sparsities is None:
        sparsities = default_grid(ranking.max_sparsity_for(width_multiple))
    spec = get_spec(model)
    dense = outputs_of(model, spec, correction.held_out)
    sizes = []
    for sparsity in tqdm(list(sparsities), desc="prefix correction: sizes", unit="size", disable=not show_progress):
        counts = ranking.keep_counts(float(sparsity), width_multiple=width_multiple)
        keep = prefixes(counts.heads, counts.neurons)
        plain = slice_model_(copy.deepcopy(model), keep)
        corrected = copy.deepcopy(model)
        correction.correct_(corrected, keep)
        slice_model_(corrected, keep)
        per_image = per_image_gains(outputs_of(plain, spec, correction.held_out),
                                    outputs_of(corrected, spec, correction.held_out), dense)
        gains = {measure: float(gain.mean()) for measure, gain in per_image.items()}
        errors = {measure: float(gain.std() / len(gain) ** 0.5) if len(gain) > 1 else 0.0
                  for measure, gain in per_image.items()}
        sizes.append({"sparsity": float(counts.sparsity), "requested": float(sparsity), "gain": gains,
                      "standard_error": errors, "helped": all(gains[m] > EVIDENCE * errors[m] for m in gains)})
        del plain, corrected
    order = sorted(range(len(sizes)), key=lambda i: sizes[i]["sparsity"])
    # "kept": corrected at this size; "helped": what its own check said (first_band says why they can differ).
    for i, kept in zip(order, first_band([sizes[i]["helped"] for i in order])):
        sizes[i]["kept"] = kept
    correction.sizes = sizes
    return sizes


__all__ = ["GRID_STEP", "NEIGHBOURS", "agreement", "check_sizes", "default_grid", "neighbours", "outputs_of",
           "per_image_gains"]
