"""How well a pruned model keeps the dense model's representation: SnapViT's search objective (paper §3.3).

The dense (teacher) embeddings of the fitness images are computed once and reduced by PCA. A candidate ranking is
scored at each fitness sparsity by the mean cosine similarity between the PCA projections of the teacher and of the
pruned model's embeddings; the loss minimised by the search is one minus the average over sparsities. Every sparsity
scores every fitness image (the paper), or, with ``split_images``, each sparsity its own share of them: the search
then sees every image for a quarter of the forwards (four sparsities).

Pruned models are evaluated physically sliced, so a forward pass costs what the pruned model costs: one working copy
of the model is re-sliced from the dense weights for every (candidate, sparsity), never copied again.

On an accelerator the search never waits for the device between candidates: the pixels stay on the device, a
candidate's kept indices travel in one asynchronous copy, slicing, the PCA projection and the similarities run
there, and one generation's losses come back to the host together. Forward time is measured with device events.

On several processes (``accelerate launch``) the candidates of a generation are split across processes and their
losses gathered (:func:`hf_snapvit.utils.distributed.map_across_processes`); each candidate is evaluated by one process
exactly as one process would, so every process holds the same loss vector. Forward passes run in the ranking's
precision (:func:`hf_snapvit.utils.precision.resolve_precision`), by default accelerate's mixed precision. In bf16 the
teacher and every candidate run on a bf16 copy of the weights rather than under autocast: the search only compares
candidates with a teacher computed the same way, and on a CPU with AMX this cut the ``fast`` preset's search from 94
to 75 s with the same ranking (``docs/results.md``). Other precisions autocast.

A model accelerate placed (``device_map``, ``cpu_offload``: :mod:`hf_snapvit.architectures.placement`) cannot be
copied or sliced in place: its candidates run on it with the removed units masked
(:func:`hf_snapvit.surgery.masking.masked`), which computes what the sliced model computes at the dense model's cost,
and bf16 autocasts.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ....architectures import get_layers, get_spec, vision_config
from .cka import linear_cka
from ....architectures.capture import capture_block_outputs
from ....architectures.embedding import image_embedding
from ....utils.distributed import map_across_processes, process_state
from ....utils.precision import autocast, mixed_precision
from ....errors import ConfigError
from ....architectures.placement import execution_device, is_dispatched
from ....surgery.masking import masked
from ....surgery.slicing import slice_model_
from .token_subset import TokenSubset
from ....utils.validation import is_real
from ....elastic.ranking import ElasticRanking


MEASURES = ("cosine", "cka", "blocks")


class EmbeddingFitness:
    """Teacher embeddings, their PCA, and the loss of candidate rankings.

    Args:
        model: The dense model (its weights are never changed).
        pixel_values: ``[N, C, H, W]`` fitness images, preprocessed; kept on the model's device for the whole search.
        sparsities: Budgets each candidate is evaluated at (clamped to the ranking's maximum).
        pca_components: Dimensions kept by the PCA (all, if the embedding is smaller).
        batch_size: Images per forward pass.
        width_multiple: FFN widths of the evaluated candidates, as in :meth:`ElasticRanking.keep_counts` (the
            default is the loading default).
        precision: Precision of the forward passes (``"no"``, ``"bf16"``, ...); ``None`` follows accelerate's
            configuration. ``"bf16"`` runs on bf16 weights, others autocast. Embeddings, PCA and similarities stay
            float32.
        measure: ``"cosine"`` (the paper): the mean over images of the cosine similarity of the pruned and dense
            PCA projections. ``"cka"``: the linear CKA of the two projections over the fitness images, which asks
            only that the pruned embeddings keep the images' geometry (any rotation or scale of them scores 1).
            ``"blocks"``: the cosine similarity of every block's output (averaged over tokens, centred on the dense
            model's mean), averaged over images and blocks: the pruned model must follow the dense one at every
            depth, not only at its output.
        split_images: Deal the images out among the sparsities, in contiguous shares of (nearly) equal size, so that
            each sparsity is scored on its own share: one forward per image and candidate instead of one per image,
            candidate and sparsity. The images must be a random draw (as the ranking's are) for the shares to be
            alike. :meth:`embed` and :meth:`image_similarities` still use every image.
        image_size: Forward the images resized to this side (bilinear, antialiased; position embeddings
            interpolated), the teacher and every candidate alike; ``None``: as given. ``pixel_values`` keeps the
            images as given.
        token_fraction: Forward, of each image, this share of its patch tokens (a fixed random subset per image,
            the same for the teacher and every candidate, :class:`~.token_subset.TokenSubset`); 1: all.
        seed: Seeds the token subsets.
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
        precision: str | None = None,
        measure: str = "cosine",
        split_images: bool = False,
        image_size: int | None = None,
        token_fraction: float = 1.0,
        seed: int = 0,
    ) -> None:
        if measure not in MEASURES:
            raise ConfigError(f"EmbeddingFitness(measure={measure!r}): choose one of {MEASURES}.")
        if split_images and len(pixel_values) < 2 * len(sparsities):
            raise ConfigError(f"EmbeddingFitness(split_images=True) deals {len(pixel_values)} fitness images out among "
                              f"{len(sparsities)} sparsities; give at least {2 * len(sparsities)} (two per sparsity) "
                              "or split_images=False.")
        if not is_real(token_fraction) or not 0 < token_fraction <= 1:
            raise ConfigError(f"EmbeddingFitness(token_fraction={token_fraction!r}): give the share of each image's "
                              "patch tokens to forward, in (0, 1], e.g. 0.5, or 1 for all of them.")
        self.spec = get_spec(model)
        if token_fraction != 1 and not self.spec.token_subsets:
            raise ConfigError(f"EmbeddingFitness(token_fraction={token_fraction!r}): a {self.spec.model_type!r} "
                              "model's blocks cannot be given part of the tokens (positions enter inside them, or "
                              "its embeddings reorder or mask the patches); give token_fraction=1 "
                              "(SnapViTConfig.fitness_token_fraction=1.0) for this model.")
        self.measure = measure
        self._tokens = None if token_fraction == 1 else TokenSubset(
            self.spec.extra_tokens(model.config), float(token_fraction), seed, self.spec.model_type)
        self.precision = mixed_precision() if precision is None else precision
        spread = is_dispatched(model)  # placed by accelerate: no copy, no slicing, masked candidates
        self._bf16_copy = self.precision == "bf16" and not spread
        self.model = copy.deepcopy(model).to(torch.bfloat16) if self._bf16_copy else model
        # Candidates are scored at the widths a user loads (aligned by default), so the search optimises those models.
        self.width_multiple = width_multiple
        self.device = execution_device(model)
        self.pixel_values = pixel_values.to(self.device)
        # In the weights' dtype once (the same tensor in float32); pixel_values stays as given for other readers
        # (the CKA covariance runs the caller's float32 model on it).
        self._inputs = _resized(self.pixel_values, image_size, model).to(self.model.dtype)
        self.sparsities = tuple(sparsities)
        bounds = np.linspace(0, len(pixel_values), len(self.sparsities) + 1).round().astype(int)
        self.shares = ([slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])] if split_images
                       else [slice(None)] * len(self.sparsities))
        self.batch_size = batch_size
        self._clock = _ForwardClock(self.device)
        self.work = None if spread else copy.deepcopy(self.model)  # re-sliced from ``model`` for every evaluation
        teacher, blocks = self._forward(None)
        if blocks is not None:
            self.block_mean = blocks.mean(1, keepdim=True)
            self.block_target = blocks - self.block_mean
        self.mean = teacher.mean(0, keepdim=True)
        centred = teacher - self.mean
        k = min(pca_components, centred.shape[1], centred.shape[0])
        # Principal directions of the teacher embeddings: right singular vectors of the centred matrix.
        _, _, vh = torch.linalg.svd(centred, full_matrices=False)
        self.components = vh[:k]  # [k, D]
        self.target = self.project(teacher)

    @property
    def forward_seconds(self) -> float:
        """Seconds spent in forward passes so far (waits for the device to finish them)."""
        return self._clock.seconds()

    @forward_seconds.setter
    def forward_seconds(self, value: float) -> None:
        self._clock.reset(value)

    def embed(self, keep, rows: slice = slice(None)) -> torch.Tensor:
        """Embeddings ``[N, D]`` (float32) of the fitness images (or of ``rows`` of them) with only ``keep`` units
        active."""
        return self._forward(keep, rows)[0]

    @torch.no_grad()
    def _forward(self, keep, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The embeddings of ``rows``, and for the ``"blocks"`` measure every block's token-mean output
        ``[L, N, D]``."""
        mask = contextlib.nullcontext()
        if keep is None or self.work is None:
            model = self.model
            mask = mask if keep is None else masked(model, keep)
        else:
            model = slice_model_(self.work, self._on_device(keep), source=self.model)
        chunks = []
        cast = contextlib.nullcontext() if self._bf16_copy else autocast(self.device, precision=self.precision)
        # Every block's output, averaged over its tokens (float32): what the "blocks" measure compares.
        blocks = capture_block_outputs(model, self.spec, on_block=lambda hidden: hidden.float().mean(1)) \
            if self.measure == "blocks" else contextlib.nullcontext()
        inputs, images = self._inputs[rows], range(len(self._inputs))[rows]
        tokens = self._tokens
        subset = contextlib.nullcontext() if tokens is None else tokens.on(get_layers(model, self.spec)[0])
        with self._clock, cast, mask, blocks as captured, subset:
            for i in range(0, len(inputs), self.batch_size):
                batch = {"pixel_values": inputs[i:i + self.batch_size]}
                if tokens is not None:
                    tokens.images = images[i:i + self.batch_size]
                chunks.append(image_embedding(model, batch, self.spec).float())
        return torch.cat(chunks), (None if captured is None else torch.stack([torch.cat(c) for c in captured.blocks]))

    def _on_device(self, keep) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``keep``'s index arrays on the device, copied in one transfer that does not wait for queued work."""
        if self.device.type != "cuda":
            return keep
        sizes = [len(part) for pair in keep for part in pair]
        flat = torch.from_numpy(np.concatenate([np.asarray(part, dtype=np.int64) for pair in keep for part in pair]))
        parts = flat.pin_memory().to(self.device, non_blocking=True).split(sizes)
        return list(zip(parts[0::2], parts[1::2]))

    def project(self, embeddings: torch.Tensor) -> torch.Tensor:
        return (embeddings - self.mean) @ self.components.T

    def similarities(self, ranking: ElasticRanking, sparsity_index: int | None = None) -> torch.Tensor:
        """``[len(sparsities)]`` similarities in the fitness's measure (float32, on the device; nothing waits for
        them); with ``sparsity_index``, ``[1]``: that sparsity's alone (on its share of the images)."""
        limit = ranking.max_sparsity_for(self.width_multiple)
        pairs = list(zip(self.sparsities, self.shares))
        if sparsity_index is not None:
            pairs = [pairs[sparsity_index]]
        return torch.stack([self._similarity(ranking, min(s, limit), rows) for s, rows in pairs])

    def _similarity(self, ranking: ElasticRanking, sparsity: float, rows: slice = slice(None)) -> torch.Tensor:
        if self.measure == "cka":
            return linear_cka(self._pruned(ranking, sparsity, rows), self.target[rows])
        if self.measure == "blocks":
            _, blocks = self._forward(self._keep(ranking, sparsity), rows)
            return F.cosine_similarity(blocks - self.block_mean, self.block_target[:, rows], dim=2).mean()
        return self._image_similarities(ranking, sparsity, rows).mean()

    def _keep(self, ranking: ElasticRanking, sparsity: float):
        """The units ``ranking`` keeps at ``sparsity``, at the widths this fitness scores."""
        return ranking.keep_indices(ranking.keep_counts(sparsity, width_multiple=self.width_multiple))

    def _pruned(self, ranking: ElasticRanking, sparsity: float, rows: slice = slice(None)) -> torch.Tensor:
        return self.project(self.embed(self._keep(ranking, sparsity), rows))

    def _image_similarities(self, ranking: ElasticRanking, sparsity: float,
                            rows: slice = slice(None)) -> torch.Tensor:
        return F.cosine_similarity(self._pruned(ranking, sparsity, rows), self.target[rows], dim=1)

    def image_similarities(self, ranking: ElasticRanking) -> torch.Tensor:
        """``[len(sparsities), N]`` cosine similarity of every fitness image at each sparsity (float32, on the
        device), kept per image to measure the fitness's noise: what :meth:`similarities` averages, or with
        ``split_images`` each sparsity's share of it. The ``"cka"`` and ``"blocks"`` measures have no per-image
        value."""
        if self.measure != "cosine":
            raise ConfigError(f"image_similarities needs measure='cosine'; the {self.measure!r} measure is a "
                              "statistic of the whole image set.")
        limit = ranking.max_sparsity_for(self.width_multiple)
        return torch.stack([self._image_similarities(ranking, min(s, limit)) for s in self.sparsities])

    def similarity(self, ranking: ElasticRanking, sparsity: float) -> float:
        """The similarity at one sparsity, in the fitness's measure, over every fitness image."""
        limit = ranking.max_sparsity_for(self.width_multiple)
        return self._similarity(ranking, min(sparsity, limit)).item()

    def loss(self, ranking: ElasticRanking, sparsity_index: int | None = None) -> float:
        """``1 - mean over sparsities of the similarity`` (in the fitness's measure); lower is better. With
        ``sparsity_index``, at that one of the sparsities only."""
        return _loss(self.similarities(ranking, sparsity_index).cpu().numpy())

    def batch_loss(self, rankings: Callable[[np.ndarray], ElasticRanking], candidates: np.ndarray,
                   sparsity_index: int | None = None) -> np.ndarray:
        """Loss of every candidate vector (one row each), built into a ranking by ``rankings``; with
        ``sparsity_index``, at that one of the sparsities only (a rotating search's generation).

        The candidates are split across processes; every process returns the losses of all of them. On one process
        the similarities of all candidates come back from the device in one transfer.

        Args:
            rankings: Builds the ranking a candidate vector stands for.
            candidates: ``[n, d]`` candidate vectors, the same on every process.

        Returns:
            ``[n]`` losses, in the order of ``candidates``.
        """
        if process_state().num_processes > 1:
            return np.array(map_across_processes(lambda c: self.loss(rankings(c), sparsity_index), list(candidates)))
        similarities = torch.stack([self.similarities(rankings(c), sparsity_index) for c in candidates]).cpu().numpy()
        return np.array([_loss(row) for row in similarities])


def _resized(pixels: torch.Tensor, size: int | None, model: PreTrainedModel) -> torch.Tensor:
    """``pixels`` at ``size`` x ``size`` (``None``: as they are)."""
    if size is None or tuple(pixels.shape[-2:]) == (size, size):
        return pixels
    patch = getattr(vision_config(model.config), "patch_size", 1)
    patch = max(patch) if isinstance(patch, (tuple, list)) else patch
    if isinstance(size, bool) or not isinstance(size, int) or size < patch:
        raise ConfigError(f"EmbeddingFitness(image_size={size!r}): give a side of at least the model's patch size "
                          f"({patch} pixels), e.g. 128, or None for the images as given.")
    return F.interpolate(pixels.float(), size=(size, size), mode="bilinear", antialias=True,
                         align_corners=False).to(pixels.dtype)


def _loss(similarities: np.ndarray) -> float:
    # float64 mean of the float32 similarities, as when they were read one by one.
    return 1.0 - float(np.mean([float(s) for s in similarities]))


class _ForwardClock:
    """Accumulated time inside ``with clock:`` blocks: device events on CUDA (measuring the device's work without
    making the host wait), wall time elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.reset(0.0)

    def reset(self, seconds: float) -> None:
        self._seconds = seconds
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def __enter__(self) -> None:
        if self.cuda:
            self._events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self._events[-1][0].record()
        else:
            self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self._events[-1][1].record()
        else:
            self._seconds += time.perf_counter() - self._start

    def seconds(self) -> float:
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += sum(start.elapsed_time(end) for start, end in self._events) / 1000
            self._events.clear()
        return self._seconds
