"""Post-pruning weight correction: fold the removed heads' and neurons' contribution into the kept weights.

Removing an attention head deletes ``head_dim`` input columns of the attention output projection (``o_proj``);
removing an FFN neuron deletes one input column of the FFN output projection (``fc2`` / ``down_proj``). The rows
removed from q/k/v and ``fc1`` are simply gone, so only those two column-pruned layers can be corrected. For each of
them, with ``X`` the layer's inputs on unlabelled calibration images and ``H = XXᵀ/n + λI``, the kept columns ``K``
are re-fitted so that the layer reproduces its dense output ``WX`` from the kept inputs alone (optimal brain surgeon,
as in SparseGPT). Every removed column is processed before any kept one, so each removed column's error reaches
every kept column, and the result equals the least-squares solution ``W_K' = W H[:, K] H[K, K]⁻¹`` on the damped
Hessian. The bias is unchanged.

Propagation decides which inputs ``X`` a block sees:

* ``"dense"``: every block is fitted on the dense model's activations (collected before any correction);
* ``"sequential"``: as in SparseGPT, block ``l`` is fitted on the activations of the already corrected and pruned
  blocks ``0 … l-1``.

Both fit each layer to reproduce the dense layer's output on the inputs it is given; see
:attr:`CorrectionConfig.propagation` for the measurements behind the default.

Memory stays bounded for large models: the calibration set goes through the network one block at a time (its
hidden states are kept: ``N × tokens × width``, twice while a block runs), only the current block's two Hessians exist at once, and they are
accumulated batch by batch in float32. The solve runs in float64 (on CPU and CUDA), which costs little at these
sizes and keeps the Cholesky factorisation of large, badly conditioned Hessians (ViT-L ``fc2``: 4096²) stable.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from .architectures import get_attention, get_layers, get_mlp, get_spec, head_dim, image_embedding
from .calibration import calibration_batches
from .views import model_inputs, processor_inputs
from .errors import CorrectionError
from .slicing import slice_model_

DampingStrategy = Literal["mean", "max", "percentile"]
Propagation = Literal["dense", "sequential"]

_DAMPINGS = ("mean", "max", "percentile")
_PROPAGATIONS = ("dense", "sequential")
# If the damped Hessian still fails to factorise (numerically singular), the damping grows 10x, at most this often.
_MAX_DAMPING_RETRIES = 6



@dataclass(frozen=True)
class CorrectionConfig:
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
        seed: Seed of the calibration draw.
    """

    damping: DampingStrategy = "mean"
    damping_fraction: float = 0.01
    percentile: float = 0.95
    block_size: int = 128
    num_samples: int | None = 1000
    batch_size: int = 16
    propagation: Propagation = "dense"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.damping not in _DAMPINGS:
            raise CorrectionError(f"damping={self.damping!r} is not one of {list(_DAMPINGS)}.")
        if self.propagation not in _PROPAGATIONS:
            raise CorrectionError(f"propagation={self.propagation!r} is not one of {list(_PROPAGATIONS)}.")
        if not (isinstance(self.damping_fraction, (int, float)) and np.isfinite(self.damping_fraction)
                and self.damping_fraction > 0):
            raise CorrectionError(
                f"damping_fraction={self.damping_fraction!r} must be a finite number > 0 (0.01 is the usual value; "
                "use 0.1 with damping='max' for models with outlier features)."
            )
        if not (isinstance(self.percentile, (int, float)) and 0.0 < self.percentile <= 1.0):
            raise CorrectionError(f"percentile={self.percentile!r} must be in (0, 1], e.g. 0.95.")
        for name in ("block_size", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CorrectionError(f"{name}={value!r} must be a positive integer.")
        if self.num_samples is not None and (isinstance(self.num_samples, bool) or not isinstance(self.num_samples, int)
                                             or self.num_samples < 1):
            raise CorrectionError(
                f"num_samples={self.num_samples!r} must be a positive integer, or None to use every image given."
            )

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-serialisable dict (stored in ``config.elastic_correction["settings"]``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CorrectionConfig":
        """Inverse of :meth:`to_dict`; unknown keys raise."""
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise CorrectionError(f"Unknown correction settings {sorted(unknown)}; valid: "
                                  f"{sorted(cls.__dataclass_fields__)}.")
        return cls(**data)


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
    """

    name: str
    block: int
    kind: str
    in_features: int
    removed: int
    damping: float
    error_before: float
    error_after: float


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


# ------------------------------------------------------------------------------------------------ linear algebra
def damping_value(diagonal: torch.Tensor, config: CorrectionConfig) -> float:
    """λ for a Hessian with this diagonal, following ``config.damping``; dead (all-zero) inputs are ignored."""
    live = diagonal[diagonal > 0].double()
    if live.numel() == 0:
        return float(config.damping_fraction)
    if config.damping == "mean":
        reference = live.mean()
    elif config.damping == "max":
        reference = live.max()
    else:
        reference = torch.quantile(live, config.percentile)
    return float(config.damping_fraction * reference)


def _solve_dtype(device: torch.device) -> torch.dtype:
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def compensate_removed_columns(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    keep: torch.Tensor | Sequence[int],
    config: CorrectionConfig | None = None,
) -> tuple[torch.Tensor, float]:
    """Remove the input columns not in ``keep`` from ``weight`` and compensate them into the kept ones.

    Args:
        weight: ``[out, in]`` weight of a linear layer.
        hessian: ``[in, in]`` undamped ``XXᵀ/n`` of the layer's inputs.
        keep: Indices of the input columns that stay.
        config: Damping and block size.

    Returns:
        ``(new_weight, damping)``: ``new_weight`` has ``weight``'s shape and dtype, the corrected kept columns and
        zeros in the removed ones; ``damping`` is the λ used. With nothing removed, ``weight`` is returned unchanged.
    """
    config = config or CorrectionConfig()
    in_features = weight.shape[1]
    keep = torch.as_tensor(np.asarray(keep, dtype=np.int64), device=weight.device)
    is_kept = torch.zeros(in_features, dtype=torch.bool, device=weight.device)
    is_kept[keep] = True
    removed = torch.nonzero(~is_kept).flatten()
    if removed.numel() == 0:
        return weight.clone(), 0.0
    kept = torch.nonzero(is_kept).flatten()
    dtype = _solve_dtype(weight.device)
    H = hessian.to(device=weight.device, dtype=dtype).clone()
    diagonal = torch.diagonal(H)
    # An input that is zero on every calibration token carries no information; giving it a unit diagonal keeps H
    # invertible and, since its off-diagonal entries are zero, decouples it: its column is left as it was.
    dead = diagonal == 0
    damping = damping_value(diagonal, config)
    diagonal[dead] = 1.0

    # Removed columns first: then every removed column's error is compensated into every kept column, and the
    # sequential OBS updates amount to the least-squares fit of the kept columns.
    order = torch.cat([removed, kept])
    # SparseGPT's update directions are the rows of U, the upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU). With J the
    # reversal and JHJ = LLᵀ, U = J L⁻¹ J: one Cholesky and one triangular inverse, without forming H⁻¹ (whose float64
    # cholesky_inverse is also very slow on some CPU builds).
    reverse = order.flip(0)
    H = H[reverse][:, reverse]
    eye = torch.eye(in_features, dtype=dtype, device=H.device)
    for attempt in range(_MAX_DAMPING_RETRIES + 1):
        L, info = torch.linalg.cholesky_ex(H + damping * eye)
        if int(info) == 0 or attempt == _MAX_DAMPING_RETRIES:
            break
        damping *= 10.0
    if int(info) != 0:
        raise CorrectionError(
            f"The Hessian of a {tuple(weight.shape)} layer could not be factorised even with damping {damping:.3g}; "
            "its calibration inputs are degenerate (check the images), or raise CorrectionConfig.damping_fraction."
        )

    U = torch.linalg.solve_triangular(L, eye, upper=False).flip(0, 1)
    W = weight.detach().to(dtype)[:, order].clone()
    num_removed = removed.numel()
    for start in range(0, num_removed, config.block_size):
        end = min(start + config.block_size, num_removed)
        # Within a block whose columns are all removed, SparseGPT's column-by-column recursion
        # err_c = (w_c − Σ_{c'<c} err_c' U[c', c]) / U[c, c] is exactly a triangular solve.
        errors = torch.linalg.solve_triangular(U[start:end, start:end], W[:, start:end], upper=True, left=False)
        W[:, start:end] = 0.0
        W[:, end:] -= errors @ U[start:end, end:]
    result = torch.zeros_like(W)
    result[:, order] = W
    return result.to(weight.dtype), damping


def reconstruction_error(original: torch.Tensor, new: torch.Tensor, hessian: torch.Tensor) -> float:
    """``‖(W − W')X‖² / ‖WX‖²`` computed from ``H = XXᵀ/n`` (0.0 when the output is identically zero)."""
    return _reconstruction_errors(original, [new], hessian)[0]


def _reconstruction_errors(original: torch.Tensor, candidates: Sequence[torch.Tensor],
                           hessian: torch.Tensor) -> list[float]:
    dtype = _solve_dtype(original.device)
    W = original.detach().to(dtype)
    H = hessian.to(device=W.device, dtype=dtype)
    total = float(((W @ H) * W).sum())
    errors = []
    for new in candidates:
        delta = W - new.detach().to(dtype)
        errors.append(float(((delta @ H) * delta).sum()) / total if total > 0 else 0.0)
    return errors


# ------------------------------------------------------------------------------------------------ the model pass
def _model_inputs(batch: Any, processor: Any, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    # Images become [B, C, H, W] pixels as the scorer sees them (SigLIP2 grids made square), not the processor's dict.
    if not isinstance(batch, dict):
        batch = processor_inputs(batch, processor, batch_size=len(batch))
    return model_inputs(batch, None, device, dtype)


class _StopForward(Exception):
    """Raised by the hook that captures the first block's inputs, so the rest of the network is not run."""


@dataclass
class _BlockInputs:
    hidden: torch.Tensor
    args: tuple
    kwargs: dict
    hidden_in_kwargs: bool

    def call(self, layer: nn.Module, hidden: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.hidden if hidden is None else hidden
        if self.hidden_in_kwargs:
            out = layer(*self.args, **{**self.kwargs, "hidden_states": hidden})
        else:
            out = layer(hidden, *self.args, **self.kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out


def _capture_first_block_inputs(model: nn.Module, spec, batches: Sequence[Any], processor: Any,
                                show_progress: bool) -> list[_BlockInputs]:
    first = get_layers(model, spec)[0]
    parameter = next(model.parameters())
    captured: list[_BlockInputs] = []

    def hook(module, args, kwargs):
        if args:
            captured.append(_BlockInputs(args[0], tuple(args[1:]), dict(kwargs), False))
        else:
            rest = dict(kwargs)
            captured.append(_BlockInputs(rest.pop("hidden_states"), (), rest, True))
        raise _StopForward

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in tqdm(batches, desc="correction: embed calibration images", disable=not show_progress):
            try:
                # The backbone's own embedding path (patchifying, position-embedding interpolation) up to block 0.
                image_embedding(model, _model_inputs(batch, processor, parameter.device, parameter.dtype), spec)
            except _StopForward:
                pass
    finally:
        handle.remove()
    if len(captured) != len(batches):
        raise CorrectionError("The first transformer block was not reached by the forward pass; the architecture "
                              "spec's 'layers' path does not match how the model runs.")
    return captured


class _HessianHook:
    """Accumulates ``Σ xxᵀ`` (float32) over every token a linear layer sees."""

    def __init__(self, linear: nn.Linear) -> None:
        self.sum = torch.zeros(linear.in_features, linear.in_features, dtype=torch.float32,
                               device=linear.weight.device)
        self.count = 0
        self.handle = linear.register_forward_hook(self)

    def __call__(self, module, args, output) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        self.sum.addmm_(x.T, x)
        self.count += x.shape[0]

    def hessian(self) -> torch.Tensor:
        return self.sum / max(self.count, 1)


def _layer_targets(layer: nn.Module, spec, heads: np.ndarray, neurons: np.ndarray):
    attention = get_attention(layer, spec)
    hd = head_dim(attention, spec)
    columns = (np.asarray(heads, dtype=np.int64)[:, None] * hd + np.arange(hd)).reshape(-1)
    mlp, variant = get_mlp(layer, spec)
    return [
        ("attention_output", getattr(attention, spec.o_proj), columns),
        ("ffn_output", getattr(mlp, variant.out_proj), np.asarray(neurons, dtype=np.int64)),
    ]


def _check_keep(model: nn.Module, spec, keep: Sequence[tuple[Any, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = get_layers(model, spec)
    if len(keep) != len(layers):
        raise CorrectionError(f"keep has {len(keep)} entries but the model has {len(layers)} blocks; pass "
                              "ranking.keep_indices(ranking.keep_counts(sparsity)).")
    checked = []
    for index, (layer, (heads, neurons)) in enumerate(zip(layers, keep)):
        attention = get_attention(layer, spec)
        num_heads = getattr(attention, spec.q_proj).out_features // head_dim(attention, spec)
        mlp, variant = get_mlp(layer, spec)
        width = getattr(mlp, variant.out_proj).in_features
        heads, neurons = np.asarray(heads, dtype=np.int64), np.asarray(neurons, dtype=np.int64)
        for what, values, limit in (("head", heads, num_heads), ("neuron", neurons, width)):
            if values.ndim != 1 or values.size == 0 or values.min() < 0 or values.max() >= limit or \
                    len(np.unique(values)) != values.size:
                raise CorrectionError(
                    f"Block {index}: the {what} indices to keep must be distinct integers in [0, {limit}) and at "
                    f"least one; got {values.tolist()}."
                )
        checked.append((heads, neurons))
    return checked


@torch.no_grad()
def correct_model_(
    model: PreTrainedModel,
    keep: Sequence[tuple[Any, Any]],
    images_or_pixels: Any,
    processor: Any = None,
    config: CorrectionConfig | None = None,
    *,
    show_progress: bool = True,
) -> CorrectionSummary:
    """Correct the weights of ``model`` for removing the units not in ``keep``, then slice them away (in place).

    Args:
        model: A supported model, normally dense, in eval mode, on the device to compute on.
        keep: Per block ``(head indices, neuron indices)`` to keep, e.g.
            ``ranking.keep_indices(ranking.keep_counts(sparsity))``.
        images_or_pixels: Unlabelled calibration images: PIL images, a ``datasets`` Dataset, a ``[N, C, H, W]``
            tensor of preprocessed pixel values, or a dict of preprocessed input tensors.
        processor: The model's image processor (needed for PIL / dataset images).
        config: :class:`CorrectionConfig`; defaults apply when ``None``.
        show_progress: Show progress bars.

    Returns:
        A :class:`CorrectionSummary` with the per-layer reconstruction error on the calibration inputs before and
        after correction. ``model`` is corrected and sliced to ``keep``; its function then equals the corrected
        model with the removed units zeroed.
    """
    config = config or CorrectionConfig()
    if not isinstance(config, CorrectionConfig):
        raise CorrectionError(f"config must be a CorrectionConfig, got {type(config).__name__}.")
    start_time = time.perf_counter()
    spec = get_spec(model)
    keep = _check_keep(model, spec, keep)
    was_training = model.training
    model.eval()
    batches, num_images = calibration_batches(images_or_pixels, processor, num_samples=config.num_samples,
                                              batch_size=config.batch_size, seed=config.seed)
    inputs = _capture_first_block_inputs(model, spec, batches, processor, show_progress)
    num_tokens = sum(int(np.prod(item.hidden.shape[:-1])) for item in inputs)

    layers = get_layers(model, spec)
    prefix = {id(module): name for name, module in model.named_modules()}
    report: list[LayerCorrection] = []
    for block, (layer, (heads, neurons)) in enumerate(
        tqdm(list(zip(layers, keep)), desc=f"correction ({config.propagation})", unit="block",
             disable=not show_progress)
    ):
        targets = _layer_targets(layer, spec, heads, neurons)
        hooks = [_HessianHook(linear) for _, linear, _ in targets]
        last = block == len(layers) - 1
        try:
            outputs = []
            for item in inputs:
                out = item.call(layer)
                if config.propagation == "dense" and not last:
                    outputs.append(out)
        finally:
            for hook in hooks:
                hook.handle.remove()
        for (kind, linear, columns), hook in zip(targets, hooks):
            H = hook.hessian()
            original = linear.weight.data
            new, damping = compensate_removed_columns(original, H, columns, config)
            dropped = original.clone()
            dropped[:, np.setdiff1d(np.arange(original.shape[1]), columns)] = 0
            before, after = _reconstruction_errors(original, [dropped, new], H)
            report.append(LayerCorrection(
                name=prefix.get(id(linear), ""), block=block, kind=kind, in_features=original.shape[1],
                removed=original.shape[1] - len(columns), damping=damping, error_before=before, error_after=after,
            ))
            linear.weight.data.copy_(new)
            del hook.sum
        if config.propagation == "sequential" and not last:
            # The corrected block with its removed columns zeroed computes what the sliced block will.
            outputs = [item.call(layer) for item in inputs]
        if not last:
            for item, out in zip(inputs, outputs):
                item.hidden = out
    del inputs
    slice_model_(model, keep)
    model.train(was_training)
    return CorrectionSummary(report, num_images, num_tokens, config, seconds=time.perf_counter() - start_time)
