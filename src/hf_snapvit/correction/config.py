"""Settings and reports of a weight correction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import CorrectionError
from ..utils.validation import Settings

DampingStrategy = Literal["mean", "max", "percentile"]
Propagation = Literal["dense", "sequential"]

_DAMPINGS = ("mean", "max", "percentile")
_PROPAGATIONS = ("dense", "sequential")


@dataclass(frozen=True)
class CorrectionConfig(Settings):
    """Settings of the post-pruning weight correction.

    Args:
        damping: How λ is derived from the Hessian's diagonal: ``"mean"`` (λ = fraction · mean), ``"max"`` (λ =
            fraction · max; more robust for models with outlier features, e.g. DINOv3 with ``damping_fraction=0.1``)
            or ``"percentile"`` (λ = fraction · the ``percentile`` quantile).
        damping_fraction: The fraction ``p`` above; > 0. 0.01 is SparseGPT's and the SnapViT reference's default.
        percentile: The quantile in (0, 1] used by ``damping="percentile"``.
        block_size: Removed columns are compensated in blocks of this many (lazy batched updates, as in SparseGPT);
            it changes speed and memory, not the result.
        num_samples: How many calibration images to draw (seeded); ``None`` uses all that are given.
        batch_size: Images per forward pass.
        propagation: ``"dense"`` (each block is fitted on the dense model's activations) or ``"sequential"`` (on
            the activations of the already corrected, pruned preceding blocks). On the shared ViT-Tiny
            (``benchmarks/correction_vit_tiny.py``) both recover about as much: dense had the higher top-1 at 30, 50
            and 60 % sparsity (by 0.2 to 1.8 points), sequential the higher k-NN (by 0.2 to 1.4), all within the
            noise of 500 validation images. ``"dense"`` is the default because it costs one pass per block instead
            of two and does not depend on the processing order.
        guard: Hold out ``held_out_fraction`` of the calibration batches and keep each block's corrections (its
            attention output and FFN output layers, each on its own) only where they bring the block's output on those
            held-out images closer to the dense model's, with the held-out images run through the pruned model as it
            will run: fitting on one set of activations can move a block away from the dense model on the inputs the
            pruned model really gives it, which lowered top-1 in some settings (``docs/correction.md``). The kept
            choice is recorded per layer (:attr:`LayerCorrection.kept`). ``False`` fits on every image and keeps every
            correction.
        held_out_fraction: The share of calibration batches held out by the guard, in (0, 1); at least one batch is
            held out and at least one fitted on.
        seed: Seed of the calibration draw.
    """

    damping: DampingStrategy = "mean"
    damping_fraction: float = 0.01
    percentile: float = 0.95
    block_size: int = 128
    num_samples: int | None = 1000
    batch_size: int = 16
    propagation: Propagation = "dense"
    guard: bool = True
    held_out_fraction: float = 0.25
    seed: int = 0

    error_class = CorrectionError

    def __post_init__(self) -> None:
        self._check_choice("damping", _DAMPINGS)
        self._check_choice("propagation", _PROPAGATIONS)
        self._check_real("damping_fraction", 0, low_open=True, hint="0.01 is the usual value; use 0.1 with "
                         "damping='max' for models with outlier features")
        self._check_real("percentile", 0, 1, low_open=True, hint="e.g. 0.95")
        self._check_bool("guard")
        self._check_real("held_out_fraction", 0, 1, low_open=True, high_open=True, hint="e.g. 0.25")
        self._check_int("block_size", 1)
        self._check_int("batch_size", 1)
        self._check_int("num_samples", 1, optional=True)  # None: every image given


@dataclass(frozen=True)
class LayerCorrection:
    """What the correction did to one layer.

    Args:
        name: The layer's module name in the model.
        block: Its block index.
        kind: ``"attention_output"`` (``o_proj``) or ``"ffn_output"`` (``fc2`` / ``down_proj``).
        in_features: Input columns before slicing.
        removed: Input columns removed (and compensated).
        damping: The λ actually added to the diagonal.
        error_before: Relative reconstruction error ``‖WX − W_K X_K‖² / ‖WX‖²`` on the calibration inputs when the
            columns are simply dropped.
        error_after: The same after correction.
        kept: Whether the correction was kept (always, without the guard); when it was not, the layer is only sliced.
        held_out_error_before: With the guard: the block's relative output error ``‖b(x̃) − b_dense(x)‖² /
            ‖b_dense(x)‖²`` on the held-out images (``x̃``: their inputs in the pruned model, ``x``: in the dense one)
            with neither of the block's layers corrected; ``None`` without the guard.
        held_out_error_after: The same with the corrections that were kept (equal to ``held_out_error_before`` when
            the whole-model check put every correction back).
    """

    name: str
    block: int
    kind: str
    in_features: int
    removed: int
    damping: float
    error_before: float
    error_after: float
    kept: bool = True
    held_out_error_before: float | None = None
    held_out_error_after: float | None = None


@dataclass
class CorrectionSummary:
    """Result of :func:`correct_model_`: per-layer errors, the calibration size and the settings."""

    layers: list[LayerCorrection]
    num_images: int
    num_tokens: int
    config: CorrectionConfig
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_removed(self) -> int:
        """Input columns removed over all corrected layers (0 when nothing was pruned)."""
        return sum(layer.removed for layer in self.layers)

    def mean_error(self, which: Literal["before", "after"]) -> float:
        """Mean relative reconstruction error over the layers that lost columns (0.0 if none did)."""
        values = [getattr(layer, f"error_{which}") for layer in self.layers if layer.removed]
        return float(np.mean(values)) if values else 0.0

    def guard_record(self) -> dict[str, Any]:
        """What the guard kept, for ``config.elastic_correction``: ``{}`` without the guard, else the held-out image
        count, per layer kind one flag per block (``True``: the correction was kept), and the whole-model check
        (``end_to_end``: the held-out embedding errors with and without the corrections, and whether they were
        kept)."""
        if not self.config.guard:
            return {}
        kept: dict[str, list[bool]] = {}
        for layer in self.layers:
            kept.setdefault(layer.kind, []).append(layer.kept)
        record = {"num_held_out_images": self.extra.get("num_held_out_images", 0), "kept": kept}
        if "end_to_end" in self.extra:
            record["end_to_end"] = self.extra["end_to_end"]
        return record

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.config.to_dict(),
            "num_images": self.num_images,
            "num_tokens": self.num_tokens,
            "seconds": self.seconds,
            "mean_error_before": self.mean_error("before"),
            "mean_error_after": self.mean_error("after"),
            "layers": [asdict(layer) for layer in self.layers],
            **self.extra,
        }
