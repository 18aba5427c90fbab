"""One correction for every size: the least-squares fit of each prefix of rank-ordered columns, from one factorisation.

An elastic model keeps, at every size, a *prefix* of each block's units in rank order, so the attention and FFN
output projections keep a prefix ``K = 0 … k-1`` of their input columns (heads contribute ``head_dim`` columns each).
The per-size correction (:func:`~hf_snapvit.correction.correct_model_`, dense propagation) re-fits those columns as
``W_K' = W H[:, K] H[K, K]⁻¹`` with ``H`` the damped Hessian of the layer's inputs on the *dense* model, which does not
depend on the size. With ``H = LLᵀ`` its Cholesky factor in rank order, a prefix block of a lower-triangular factor
is the factor of the prefix block (``H[K, K] = L[K, K] L[K, K]ᵀ`` and ``H[:, K] = L[:, K] L[K, K]ᵀ``), so

    W_K' = (W L)[:, K] · L[K, K]⁻¹

for *every* prefix at once: one pass over the calibration images, one factorisation per layer, and a triangular solve
per size. At full size ``W' = W L L⁻¹ = W``: the dense model is untouched. The price is memory: ``L`` (lower triangle)
and ``WL`` take about 1.1× the float32 weights of a ViT's blocks (FFN 4× wide), stored as
:mod:`hf_snapvit.elastic.prefix_file` describes (which applies it at load).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn as nn
from transformers import PreTrainedModel

from ..architectures import get_attention, get_layers, get_spec, head_dim
from ..data.calibration import calibration_batches
from ..data.views import model_inputs
from ..errors import CorrectionError
from ..elastic.prefix_file import KINDS, applies_at, correct_widths_, first_band
from .config import CorrectionConfig
from .guard import held_out_count
from .inputs import (HessianHook, capture_first_block_inputs, dense_block_hessians, halve, output_columns,
                     output_projections)
from .solve import damped_cholesky

#: The fewest calibration images the size check can work with: one to fit on, one held out to check.
MIN_CHECKED_IMAGES = 2


@dataclass
class PrefixFactors:
    """One layer's factors, its columns in rank order: ``L`` (lower Cholesky factor of the damped Hessian) and
    ``WL``; ``order`` maps rank positions to the layer's own columns; ``damping`` is the λ used; ``column0`` the
    weight's first column in rank order (which every size keeps), to recognise the weights the factors belong to."""

    L: torch.Tensor
    WL: torch.Tensor
    order: torch.Tensor
    damping: float
    column0: torch.Tensor

    def weight(self, kept: int) -> torch.Tensor:
        """``[out, kept]`` float64: the least-squares weight of the first ``kept`` columns in rank order."""
        if not 1 <= kept <= self.L.shape[0]:
            raise CorrectionError(f"kept={kept} columns is out of range: a layer with {self.L.shape[0]} input "
                                  f"columns keeps between 1 and {self.L.shape[0]}.")
        L = self.L[:kept, :kept].double()
        return torch.linalg.solve_triangular(L, self.WL[:, :kept].double(), upper=False, left=False)


def _factorise(linear: nn.Linear, hook: HessianHook, order: np.ndarray, config: CorrectionConfig) -> PrefixFactors:
    if sorted(order.tolist()) != list(range(linear.in_features)):
        raise CorrectionError(f"A rank order must list each of the layer's {linear.in_features} input columns once; "
                              f"got {len(order)} entries. Pass orders from ranking.orders().")
    index = torch.as_tensor(order, device=hook.sum.device)
    H = hook.hessian()[index][:, index]
    del hook.sum
    L, damping = damped_cholesky(H, config, shape=tuple(linear.weight.shape))
    W = linear.weight.detach().to(L.dtype)[:, index.to(linear.weight.device)]
    return PrefixFactors(L=L.float().cpu(), WL=(W @ L).float().cpu(), order=index.cpu(), damping=damping,
                         column0=W[:, 0].float().cpu())


class PrefixCorrection:
    """Least-squares corrections of every block's attention and FFN output projections, valid at every size.

    Built once with :meth:`fit` on the dense model; :meth:`correct_` then corrects a dense copy for any set of kept
    units that is a prefix of the rank order (what every size of an elastic model keeps), exactly as
    ``correct_model_(..., CorrectionConfig(guard=False))`` would for that size, without another pass over images.
    """

    def __init__(self, factors: list[tuple[PrefixFactors, PrefixFactors]], head_dims: list[int], num_images: int,
                 num_tokens: int, config: CorrectionConfig, seconds: float, held_out: list[dict] | None = None
                 ) -> None:
        self.factors, self.head_dims = factors, head_dims
        self.num_images, self.num_tokens, self.config, self.seconds = num_images, num_tokens, config, seconds
        #: With ``config.guard``: the held-out calibration batches (model inputs), which the factors were not fitted
        #: on; :func:`~hf_snapvit.correction.prefix_sizes.check_sizes` decides on them where the correction helps.
        self.held_out = held_out or []
        #: Per checked size, what the check measured (``None``: not checked, the correction applies at every size).
        self.sizes: list[dict[str, Any]] | None = None

    @classmethod
    @torch.no_grad()
    def fit(cls, model: PreTrainedModel, images_or_pixels: Any, processor: Any = None,
            config: CorrectionConfig | None = None, *, orders: Sequence[tuple[Any, Any]] | None = None,
            show_progress: bool = True) -> "PrefixCorrection":
        """Accumulate every output projection's Hessian on the dense ``model`` and factorise it in rank order.

        Args:
            model: The dense model (not changed).
            images_or_pixels: Unlabelled calibration images, as for :func:`~hf_snapvit.correction.correct_model_`.
            processor: The model's image processor (for PIL / dataset images).
            config: Damping, number of images, batch size and seed. With ``guard`` (the default) the last
                ``held_out_fraction`` of the batches is not fitted on but kept in :attr:`held_out` for the size check;
                ``propagation`` does not apply (the fit is on the dense model's activations, whatever the size).
            orders: Per block ``(head order, neuron order)``, most important first (``ranking.orders()``); ``None``
                for a model whose units are already in rank order (an elastic checkpoint loaded whole).
            show_progress: Show a progress bar over the blocks.
        """
        config = config or CorrectionConfig()
        if not isinstance(config, CorrectionConfig):
            raise CorrectionError(f"config must be a CorrectionConfig, got {type(config).__name__}.")
        start = time.perf_counter()
        spec = get_spec(model)
        layers = get_layers(model, spec)
        if orders is not None and len(orders) != len(layers):
            raise CorrectionError(f"orders has {len(orders)} entries but the model has {len(layers)} blocks; pass "
                                  "ranking.orders().")
        was_training = model.training
        model.eval()
        try:
            batches, num_images = calibration_batches(images_or_pixels, processor, num_samples=config.num_samples,
                                                      batch_size=config.batch_size, seed=config.seed, model=model)
            if config.guard and len(batches) == 1:
                batches = halve(batches[0])  # the check still needs images the factors were not fitted on
            num_held = held_out_count(config, len(batches))
            parameter = next(model.parameters())
            held_out = [model_inputs(batch, processor, parameter.device, parameter.dtype, as_pixels=True)
                        for batch in batches[len(batches) - num_held:]] if num_held else []
            inputs = capture_first_block_inputs(model, spec, batches[:len(batches) - num_held], processor,
                                                show_progress)
            num_tokens = sum(int(np.prod(item.hidden.shape[:-1])) for item in inputs)
            factors, head_dims = [], []
            for block, layer, hooked in dense_block_hessians(model, spec, inputs, "elastic correction", show_progress):
                head_dims.append(head_dim(get_attention(layer, spec), spec))
                columns = output_columns(layer, spec, None if orders is None else orders[block])
                factors.append(tuple(_factorise(linear, hook, order, config)
                                     for (linear, hook), order in zip(hooked, columns)))
        finally:
            model.train(was_training)
        return cls(factors, head_dims, num_images, num_tokens, config, time.perf_counter() - start, held_out)

    def width(self, block: int, kind: str) -> int:
        """The number of input columns of a block's projection (``kind`` in :data:`KINDS`) when dense."""
        return int(self.factors[block][KINDS.index(kind)].L.shape[0])

    def weight(self, block: int, kind: str, kept: int, dense: torch.Tensor | None = None) -> torch.Tensor:
        """``[out, kept]`` float64: the corrected first ``kept`` columns of a block's projection (``dense`` is not
        needed here; :class:`~hf_snapvit.elastic.prefix_file.PrefixFile` checks it)."""
        return self.factors[block][KINDS.index(kind)].weight(kept)

    def record(self) -> dict[str, Any]:
        """What the correction was fitted with, for the file's metadata and a loaded model's config."""
        return {"method": "prefix", "settings": self.config.to_dict(), "num_images": self.num_images,
                "num_tokens": self.num_tokens, "fit_seconds": round(self.seconds, 3),
                "damping": [[round(f.damping, 9) for f in pair] for pair in self.factors],
                **({} if self.sizes is None else {
                    "num_held_out_images": sum(int(b["pixel_values"].shape[0]) for b in self.held_out),
                    "sizes": self.sizes})}

    def applies_at(self, sparsity: float) -> bool:
        """Whether a model of this sparsity is corrected (see :func:`applies_at`)."""
        return applies_at(self.record(), sparsity)

    def check_keep(self, keep: Sequence[tuple[Any, Any]]) -> list[tuple[int, int]]:
        """``(heads, neurons)`` kept per block, after checking that ``keep`` is a prefix of the rank order."""
        if len(keep) != len(self.factors):
            raise CorrectionError(f"keep has {len(keep)} entries but the correction has {len(self.factors)} blocks.")
        counts = []
        for block, ((heads, neurons), (attention, ffn), width) in enumerate(zip(keep, self.factors, self.head_dims)):
            heads, neurons = np.asarray(heads, dtype=np.int64), np.asarray(neurons, dtype=np.int64)
            head_rank = attention.order.numpy()[::width] // width
            for what, kept, order in (("head", heads, head_rank), ("neuron", neurons, ffn.order.numpy())):
                if kept.ndim != 1 or kept.size == 0 or set(kept.tolist()) != set(order[:kept.size].tolist()):
                    raise CorrectionError(
                        f"Block {block}: the kept {what}s {kept.tolist()[:8]}... are not the first {kept.size} of the "
                        f"rank order the correction was fitted with ({order[:8].tolist()}...); an elastic correction "
                        "serves prefixes of that order only. Pass ranking.keep_indices(ranking.keep_counts(s)).")
            counts.append((int(heads.size), int(neurons.size)))
        return counts

    @torch.no_grad()
    def correct_(self, model: PreTrainedModel, keep: Sequence[tuple[Any, Any]], kinds: Sequence[str] = KINDS
                 ) -> None:
        """Write the corrected weights for ``keep`` into the dense ``model`` (in place; the removed columns become
        zero), ready to be sliced to ``keep``. ``model`` must be the one the correction was fitted on, or a copy;
        ``kinds`` names the projections to correct (the others are left as they are)."""
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise CorrectionError(f"Unknown kinds {unknown}; choose from {list(KINDS)}.")
        spec = get_spec(model)
        counts = self.check_keep(keep)
        for layer, (heads, neurons), pair, width in zip(get_layers(model, spec), counts, self.factors,
                                                        self.head_dims):
            for kind, linear, factors, kept in zip(KINDS, output_projections(layer, spec), pair,
                                                   (heads * width, neurons)):
                if kind not in kinds:
                    continue
                if linear.in_features != factors.L.shape[0]:
                    raise CorrectionError(f"A layer has {linear.in_features} input columns but the correction was "
                                          f"fitted on {factors.L.shape[0]}; correct the dense model it was fitted on.")
                new = torch.zeros_like(linear.weight)
                columns = factors.order[:kept].to(linear.weight.device)
                new[:, columns] = factors.weight(kept).to(device=new.device, dtype=new.dtype)
                linear.weight.copy_(new)


__all__ = ["KINDS", "PrefixCorrection", "PrefixFactors", "applies_at", "correct_widths_", "first_band",
           "output_projections"]
