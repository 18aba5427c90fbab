"""The elastic ranking: an importance order over every attention head and FFN neuron, and its on-disk format.

A ranking holds one importance score per head and per FFN neuron (larger = more important). Resolving a budget is a
walk down one removal order: units are removed from least to most important, never below the per-block floors,
until the backbone fits the requested sparsity, parameter count or GFLOPs. Two modes define that order:

* ``"global"`` (the paper's text): heads and neurons compete in one order by score per parameter they cost;
* ``"paired"`` (the reference code): neurons and heads are ordered separately and removed in lockstep, the head
  ratio being ``max(0, neuron ratio - paired_head_offset)``.

Stored in ``config.json["elastic_ranking"]`` (see :meth:`ElasticRanking.to_dict`), a ranking always describes a
checkpoint whose weights were permuted into rank order, so each block keeps a prefix of its heads and neurons.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from .._version import __version__
from ..architectures.budget import KeepCounts, ModelShape, budget_number, resolve_width_multiple
from .budget_path import budget_path, removal_order
from .score_curves import decode_scores, encode_scores
from ..errors import BudgetError, RankingFormatError

FORMAT_VERSION = 1
RankingMode = Literal["global", "paired"]

@dataclass(frozen=True)
class Floors:
    """The least every block keeps, whatever the budget, and the paired mode's head offset.

    Args:
        min_head_keep_ratio: Each block keeps at least ``max(1, int(num_heads * ratio))`` heads (1: all of them).
        min_neuron_keep_ratio: Each block keeps at least ``max(1, int(intermediate_size * ratio))`` neurons.
        paired_head_offset: In ``"paired"`` mode, head ratio = ``max(0, neuron ratio - offset)``.
    """

    min_head_keep_ratio: float = 0.2
    min_neuron_keep_ratio: float = 0.05
    paired_head_offset: float = 0.15

    def to_dict(self) -> dict[str, float]:
        """The floors as the ``elastic_ranking`` entry of ``config.json`` stores them."""
        return {"min_head_keep_ratio": self.min_head_keep_ratio, "min_neuron_keep_ratio": self.min_neuron_keep_ratio,
                "paired_head_offset": self.paired_head_offset}


@dataclass(frozen=True, eq=False)
class ElasticRanking:
    """Importance scores of every head and FFN neuron of one backbone, and how budgets map onto them.

    Args:
        head_scores: ``[num_layers, num_heads]`` non-negative scores, in the model's current head order.
        neuron_scores: ``[num_layers, intermediate_size]`` non-negative scores, in the model's current neuron order.
        shape: The dense architecture the scores belong to (unit costs, token counts).
        mode: ``"global"`` or ``"paired"`` (see the module docstring).
        min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset: See :class:`Floors`.
        provenance: How the ranking was made: method, settings, seed, calibration data, base model, library version.
    """

    head_scores: np.ndarray
    neuron_scores: np.ndarray
    shape: ModelShape
    mode: RankingMode = "global"
    min_head_keep_ratio: float = Floors.min_head_keep_ratio
    min_neuron_keep_ratio: float = Floors.min_neuron_keep_ratio
    paired_head_offset: float = Floors.paired_head_offset
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        heads = np.asarray(self.head_scores, dtype=np.float64)
        neurons = np.asarray(self.neuron_scores, dtype=np.float64)
        expected = {"head_scores": (self.shape.num_layers, self.shape.num_heads),
                    "neuron_scores": (self.shape.num_layers, self.shape.intermediate_size)}
        for name, array in (("head_scores", heads), ("neuron_scores", neurons)):
            if array.shape != expected[name]:
                raise RankingFormatError(f"{name} has shape {array.shape}, expected {expected[name]} for this model.")
            if not np.all(np.isfinite(array)) or np.any(array < 0):
                raise RankingFormatError(f"{name} must be finite and non-negative (larger = more important).")
        if self.mode not in ("global", "paired"):
            raise RankingFormatError(f"mode={self.mode!r} is not one of 'global', 'paired'.")
        for name in ("min_head_keep_ratio", "min_neuron_keep_ratio", "paired_head_offset"):
            value = getattr(self, name)
            closed = name != "paired_head_offset"  # a keep ratio of 1 keeps every unit (BLIP-2's heads)
            if not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
                raise RankingFormatError(f"{name}={value} must be in [0, {'1]' if closed else '1)'}.")
        object.__setattr__(self, "head_scores", heads)
        object.__setattr__(self, "neuron_scores", neurons)
        object.__setattr__(self, "_cache", {})

    # ----------------------------------------------------------------------------------------------- orders
    def orders(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per block, ``(head order, neuron order)``: unit indices from most to least important (ties keep index
        order). A ranking that keeps every head (``min_head_keep_ratio=1``) leaves them in place: their companions outside
        the projections (timm EVA's query and value biases) need not follow."""
        return [
            (np.arange(len(h)) if self._heads_stay() else np.argsort(-h, kind="stable"), np.argsort(-f, kind="stable"))
            for h, f in zip(self.head_scores, self.neuron_scores)
        ]

    def _heads_stay(self) -> bool:
        return self.min_head_keep_ratio >= 1.0

    def is_sorted(self) -> bool:
        """True when every block's units are already in rank order (the layout of an elastic checkpoint)."""
        return bool((self._heads_stay() or np.all(np.diff(self.head_scores, axis=1) <= 0))
                    and np.all(np.diff(self.neuron_scores, axis=1) <= 0))

    def sorted(self) -> "ElasticRanking":
        """The same ranking for a model whose heads and neurons were permuted by :meth:`orders`."""
        orders = self.orders()
        heads = np.stack([h[o] for h, (o, _) in zip(self.head_scores, orders)])
        neurons = np.stack([f[o] for f, (_, o) in zip(self.neuron_scores, orders)])
        return replace(self, head_scores=heads, neuron_scores=neurons)

    def floors(self, width_multiple: int | None = None) -> tuple[int, int]:
        """``(heads, neurons)`` every block keeps at least; the neuron floor is rounded up to ``width_multiple``."""
        F = self.shape.intermediate_size
        m = resolve_width_multiple(width_multiple, F)
        neurons = max(1, int(F * self.min_neuron_keep_ratio))
        return max(1, int(self.shape.num_heads * self.min_head_keep_ratio)), min(F, -(-neurons // m) * m)

    # ----------------------------------------------------------------------------------------------- budgets
    def _counts_at(self, t: int, multiple: int = 1) -> tuple[list[int], list[int]]:
        heads, neurons = budget_path(self, multiple)
        return (
            (self.shape.num_heads - heads[t]).tolist(),
            (self.shape.intermediate_size - neurons[t]).tolist(),
        )

    def _result(self, heads: list[int], neurons: list[int]) -> KeepCounts:
        params = self.shape.num_params(heads, neurons)
        return KeepCounts(
            heads=heads,
            neurons=neurons,
            num_params=params,
            gflops=self.shape.gflops(heads, neurons),
            sparsity=1.0 - params / self.shape.num_params(),
        )

    @property
    def max_sparsity(self) -> float:
        """The largest sparsity the per-block floors allow, at the default width multiple."""
        return self.max_sparsity_for()

    def max_sparsity_for(self, width_multiple: int | None = None) -> float:
        """The largest sparsity the per-block floors allow when FFN widths are multiples of ``width_multiple``."""
        m = resolve_width_multiple(width_multiple, self.shape.intermediate_size)
        heads, _ = budget_path(self, m)
        return self._result(*self._counts_at(len(heads) - 1, m)).sparsity

    def keep_counts(
        self,
        sparsity: float | None = None,
        *,
        target_params: int | None = None,
        target_gflops: float | None = None,
        width_multiple: int | None = None,
    ) -> KeepCounts:
        """Resolve exactly one budget to per-block keep counts.

        Args:
            sparsity: Fraction of the dense backbone's parameters to remove (embeddings included, task heads
                excluded), in ``[0, max_sparsity_for(width_multiple)]``.
            target_params: Backbone parameters to keep.
            target_gflops: Theoretical GFLOPs (one image) to stay at.
            width_multiple: Kept FFN widths are multiples of this (or the full width); ``None``: the default of
                :func:`resolve_width_multiple` (64 for ViT-S/B/L), ``1``: exact widths.

        Returns:
            The keep counts whose parameter count (or GFLOPs) is closest to the budget. Units leave in aligned groups
            (one head, or the neurons between two aligned widths), in the ranking's order, so the result lands within
            one group of the budget.
        """
        m = resolve_width_multiple(width_multiple, self.shape.intermediate_size)
        given = {k: budget_number(k, v) for k, v in (("sparsity", sparsity), ("target_params", target_params),
                                                     ("target_gflops", target_gflops)) if v is not None}
        if len(given) != 1:
            raise BudgetError(
                f"Give exactly one of sparsity, target_params or target_gflops; got {sorted(given) or 'none'}."
            )
        heads_path, _ = budget_path(self, m)
        last = len(heads_path) - 1
        dense = self._result(*self._counts_at(0, m))
        smallest = self._result(*self._counts_at(last, m))
        floors = (
            f"(the per-block floors keep >= {self.min_head_keep_ratio:.0%} of heads and >= "
            f"{self.min_neuron_keep_ratio:.0%} of neurons; re-rank with smaller min_head_keep_ratio / "
            "min_neuron_keep_ratio to go further)"
        )
        if sparsity is not None:
            if not 0.0 <= sparsity <= smallest.sparsity + 1e-12:
                raise BudgetError(
                    f"sparsity={sparsity!r} is out of range: this ranking supports 0 <= sparsity <= "
                    f"{smallest.sparsity:.4f} {floors}."
                )
            target, metric = (1.0 - sparsity) * dense.num_params, "num_params"
        elif target_params is not None:
            if not smallest.num_params <= target_params <= dense.num_params:
                raise BudgetError(
                    f"target_params={target_params!r} is out of range: this ranking supports "
                    f"{smallest.num_params} <= target_params <= {dense.num_params} {floors}."
                )
            target, metric = float(target_params), "num_params"
        else:
            if not smallest.gflops <= target_gflops <= dense.gflops:
                raise BudgetError(
                    f"target_gflops={target_gflops!r} is out of range: this ranking supports "
                    f"{smallest.gflops:.4f} <= target_gflops <= {dense.gflops:.4f} {floors}."
                )
            target, metric = float(target_gflops), "gflops"

        def value(t: int) -> float:
            return getattr(self._result(*self._counts_at(t, m)), metric)

        # Smallest t whose model fits the budget; the budget path is monotone, so bisect.
        lo, hi = 0, last
        while lo < hi:
            mid = (lo + hi) // 2
            if value(mid) <= target:
                hi = mid
            else:
                lo = mid + 1
        # Any budget below dense drops the unused blocks (step 1) even when dense is nearer to it.
        first = int(self.shape.used_layers < self.shape.num_layers and lo > 0)
        if lo > first and abs(value(lo - 1) - target) < abs(value(lo) - target):
            lo -= 1
        return self._result(*self._counts_at(lo, m))

    def keep_counts_for_ratios(self, neuron_ratio: float, head_ratio: float) -> KeepCounts:
        """The reference code's budget: remove ``int(L·F·neuron_ratio)`` neurons and ``int(L·H·head_ratio)`` heads.

        Units are ranked within their kind across blocks (no parameter normalisation), whatever :attr:`mode` is.
        """
        results = []
        for kind, ratio in ((0, budget_number("head_ratio", head_ratio)),
                            (1, budget_number("neuron_ratio", neuron_ratio))):
            width = (self.shape.num_heads, self.shape.intermediate_size)[kind]
            total = self.shape.num_layers * width
            remove = int(total * ratio)
            layers, _, _ = removal_order(self, kind)
            if not 0.0 <= ratio < 1.0 or remove > len(layers):
                raise BudgetError(
                    f"{('head', 'neuron')[kind]}_ratio={ratio} is out of range: at most {len(layers)} of {total} "
                    f"{('heads', 'neurons')[kind]} can be removed above the per-block floors "
                    f"(ratio <= {len(layers) / total:.4f})."
                )
            results.append((width - np.bincount(layers[:remove], minlength=self.shape.num_layers)).tolist())
        if head_ratio > 0 or neuron_ratio > 0:  # blocks no task reads keep only their floors, as on the budget path
            for kept, floor in zip(results, self.floors(1)):
                kept[self.shape.used_layers:] = [floor] * (self.shape.num_layers - self.shape.used_layers)
        return self._result(results[0], results[1])

    def keep_indices(self, counts: KeepCounts) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per block, the ``(head, neuron)`` indices to keep, most important first (the orders sorted once)."""
        orders = self._cache["orders"] = self._cache.get("orders") or self.orders()
        return [(ho[:h].copy(), no[:f].copy()) for (ho, no), h, f in zip(orders, counts.heads, counts.neurons)]

    # ----------------------------------------------------------------------------------------------- format
    def to_dict(self) -> dict[str, Any]:
        """The ``config.json["elastic_ranking"]`` form (format version :data:`FORMAT_VERSION`).

        Layout::

            format_version   int; readers refuse versions newer than their own
            mode             "global" | "paired"
            min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset   floats
            shape            ModelShape fields: dense widths, unit parameter costs, token counts
            scores.encoding  "log10-sorted": per block, log10 scores in rank order (non-increasing); the
                             checkpoint's weights are permuted the same way, so block l keeps a prefix
            scores.heads     [L][H] floats
            scores.neurons   [L] of {"index": [...], "log10": [...]}: knots of a piecewise-linear curve over
                             neuron positions 0..F-1, within scores.neuron_tolerance decades of every
                             score (0.0005, doubled until the curves fit in 12,000 knots)
            provenance       method, settings, seed, calibration data, base model, library and version

        Only a ranking in rank order (:meth:`is_sorted`) describes an elastic checkpoint; :func:`save_elastic`
        permutes the weights and calls ``ranking.sorted().to_dict()``.
        """
        if not self.is_sorted():
            raise RankingFormatError(
                "Only a ranking in rank order can be stored: call ranking.sorted() and permute the model's heads and "
                "neurons the same way (hf_snapvit.save_elastic does both)."
            )
        return {
            "format_version": FORMAT_VERSION,
            "mode": self.mode,
            "min_head_keep_ratio": self.min_head_keep_ratio,
            "min_neuron_keep_ratio": self.min_neuron_keep_ratio,
            "paired_head_offset": self.paired_head_offset,
            "shape": self.shape.to_dict(),
            "scores": encode_scores(self.head_scores, self.neuron_scores),
            "provenance": {"library": "hf_snapvit", "library_version": __version__, **self.provenance},
        }

    @classmethod
    def from_dict(cls, data: Any) -> "ElasticRanking":
        """Parse and validate a stored ranking; every problem raises :class:`RankingFormatError` naming the field."""
        if not isinstance(data, dict):
            raise RankingFormatError(
                f"elastic_ranking must be a JSON object, got {type(data).__name__}. Re-create it with "
                "hf_snapvit.save_elastic(model, ranking, save_directory)."
            )
        version = data.get("format_version")
        if not isinstance(version, int) or version < 1:
            raise RankingFormatError(
                f"elastic_ranking.format_version={version!r} is invalid (expected an integer >= 1). The ranking is "
                "corrupt; re-create it with hf_snapvit.save_elastic(...)."
            )
        if version > FORMAT_VERSION:
            raise RankingFormatError(
                f"elastic_ranking.format_version={version} was written by a newer hf_snapvit; this version "
                f"({__version__}) reads format_version <= {FORMAT_VERSION}. Please upgrade hf_snapvit: "
                "pip install -U hf-snapvit."
            )
        try:
            shape = ModelShape.from_dict(data["shape"])
            heads, neurons = decode_scores(data["scores"], shape)
            if not isinstance(data.get("provenance", {}), dict):
                raise RankingFormatError(f"provenance must be a JSON object, got {type(data['provenance']).__name__}.")
            floors = {name: data.get(name, default) for name, default in Floors().to_dict().items()}
            if bad := [f"{k}={v!r}" for k, v in floors.items() if type(v) not in (int, float)]:  # JSON numbers
                raise RankingFormatError(f"{', '.join(bad)} must be numbers in [0, 1).")
            ranking = cls(
                head_scores=heads,
                neuron_scores=neurons,
                shape=shape,
                mode=data.get("mode", "global"),
                **{name: float(value) for name, value in floors.items()},
                provenance=dict(data.get("provenance", {})),
            )
        except RankingFormatError as error:
            raise RankingFormatError(f"elastic_ranking is corrupt: {error} Re-create it with "
                                     "hf_snapvit.save_elastic(model, ranking, save_directory).") from None
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise RankingFormatError(
                f"elastic_ranking is corrupt ({type(error).__name__}: {error}). Re-create it with "
                "hf_snapvit.save_elastic(model, ranking, save_directory)."
            ) from None
        if not ranking.is_sorted():
            raise RankingFormatError("elastic_ranking is corrupt: scores are not in rank order (non-increasing).")
        return ranking

    def check_matches(self, shape: ModelShape) -> None:
        """Raise :class:`RankingFormatError` unless this ranking was made for a model of ``shape``: the same dense
        widths and the same cost model (unit parameter costs, tokens, patches, FFN matrices, head FLOPs)."""
        if problems := self.shape.mismatch(shape):
            raise RankingFormatError(f"The elastic_ranking does not match this model: {problems}. Rank this model "
                                     "with hf_snapvit.rank(...) and save it with save_elastic.")
