"""How well a pruned model keeps the dense model's representation: SnapViT's search objective (paper §3.3).

The dense (teacher) embeddings of the fitness images are computed once and reduced by PCA. A candidate ranking is
scored at each fitness sparsity by the mean cosine similarity between the PCA projections of the teacher and of the
pruned model's embeddings; the loss minimised by the search is one minus the average over sparsities.

Pruned models are evaluated physically sliced, so a forward pass costs what the pruned model costs: one working copy
of the model is re-sliced from the dense weights for every (candidate, sparsity), never copied again.

On several processes (``accelerate launch``) the candidates of a generation are split across processes and their
losses gathered (:func:`hf_snapvit.distributed.map_across_processes`); each candidate is evaluated by one process
exactly as one process would, so every process holds the same loss vector. Forward passes autocast to the
configured mixed precision.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from .architectures import get_spec, image_embedding
from .distributed import autocast, map_across_processes
from .slicing import slice_model_
from .ranking import ElasticRanking


class EmbeddingFitness:
    """Teacher embeddings, their PCA, and the loss of candidate rankings.

    Args:
        model: The dense model (its weights are never changed).
        pixel_values: ``[N, C, H, W]`` fitness images, preprocessed; kept in memory for the whole search.
        sparsities: Budgets each candidate is evaluated at (clamped to the ranking's maximum).
        pca_components: Dimensions kept by the PCA (all, if the embedding is smaller).
        batch_size: Images per forward pass.
        width_multiple: FFN widths of the evaluated candidates, as in :meth:`ElasticRanking.keep_counts` (the
            default is the loading default).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        pixel_values: torch.Tensor,
        *,
        sparsities: Sequence[float] = (0.1, 0.3, 0.5, 0.6),
        pca_components: int = 192,
        batch_size: int = 64,
        width_multiple: int | None = None,
    ) -> None:
        self.model = model
        # Candidates are scored at the widths a user loads (aligned by default), so the search optimises those models.
        self.width_multiple = width_multiple
        self.spec = get_spec(model)
        self.device = next(model.parameters()).device
        self.pixel_values = pixel_values.to(self.device)
        self.sparsities = tuple(sparsities)
        self.batch_size = batch_size
        self.forward_seconds = 0.0
        self.work = copy.deepcopy(model)  # re-sliced from ``model`` for every evaluation
        teacher = self.embed(None)
        self.mean = teacher.mean(0, keepdim=True)
        centred = teacher - self.mean
        k = min(pca_components, centred.shape[1], centred.shape[0])
        # Principal directions of the teacher embeddings: right singular vectors of the centred matrix.
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        self.components = vh[:k]  # [k, D]
        self.target = self.project(teacher)

    @torch.no_grad()
    def embed(self, keep) -> torch.Tensor:
        """Embeddings ``[N, D]`` (float32) of the fitness images with only ``keep`` units active."""
        import time

        model = self.model if keep is None else slice_model_(self.work, keep, source=self.model)
        start = time.perf_counter()
        chunks = []
        with autocast(self.device):
            for i in range(0, len(self.pixel_values), self.batch_size):
                batch = {"pixel_values": self.pixel_values[i:i + self.batch_size]}
                chunks.append(image_embedding(model, batch, self.spec).float())
        self.forward_seconds += time.perf_counter() - start
        return torch.cat(chunks)

    def project(self, embeddings: torch.Tensor) -> torch.Tensor:
        return (embeddings - self.mean) @ self.components.T

    def similarity(self, ranking: ElasticRanking, sparsity: float) -> float:
        """Mean cosine similarity of the PCA projections at one sparsity."""
        m = self.width_multiple
        counts = ranking.keep_counts(min(sparsity, ranking.max_sparsity_for(m)), width_multiple=m)
        pruned = self.project(self.embed(ranking.keep_indices(counts)))
        return F.cosine_similarity(pruned, self.target, dim=1).mean().item()

    def loss(self, ranking: ElasticRanking) -> float:
        """``1 - mean over sparsities of the mean cosine similarity``; lower is better."""
        return 1.0 - float(np.mean([self.similarity(ranking, s) for s in self.sparsities]))

    def batch_loss(self, rankings: Callable[[np.ndarray], ElasticRanking], candidates: np.ndarray) -> np.ndarray:
        """Loss of every candidate vector (one row each), built into a ranking by ``rankings``.

        The candidates are split across processes; every process returns the losses of all of them.

        Args:
            rankings: Builds the ranking a candidate vector stands for.
            candidates: ``[n, d]`` candidate vectors, the same on every process.

        Returns:
            ``[n]`` losses, in the order of ``candidates``.
        """
        return np.array(map_across_processes(lambda c: self.loss(rankings(c)), list(candidates)))
