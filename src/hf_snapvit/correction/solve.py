"""The linear algebra of a correction: damping, compensating removed input columns into kept ones (optimal brain
surgeon, as in SparseGPT), and the reconstruction error of a corrected layer."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..errors import CorrectionError
from .config import CorrectionConfig

# If the damped Hessian still fails to factorise (numerically singular), the damping grows 10x, at most this often.
_MAX_DAMPING_RETRIES = 6


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


def solve_dtype(device: torch.device) -> torch.dtype:
    """float64 where ``device`` has it (CPU, CUDA), else float32: the precision the solves run in."""
    return torch.float64 if device.type in ("cpu", "cuda") else torch.float32


def damped_cholesky(hessian: torch.Tensor, config: CorrectionConfig, shape: tuple[int, ...]
                    ) -> tuple[torch.Tensor, float]:
    """``(L, λ)``: the lower Cholesky factor (float64 on CPU and CUDA) of ``hessian + λI``, λ from ``config`` and
    grown tenfold while the factorisation fails; ``shape`` is the layer's, for the error message."""
    H = hessian.to(dtype=solve_dtype(hessian.device)).clone()
    diagonal = torch.diagonal(H)
    # An input that is zero on every calibration token carries no information; giving it a unit diagonal keeps H
    # invertible and, since its off-diagonal entries are zero, decouples it: its column is left as it was.
    dead = diagonal == 0
    damping = damping_value(diagonal, config)
    diagonal[dead] = 1.0
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    for attempt in range(_MAX_DAMPING_RETRIES + 1):
        L, info = torch.linalg.cholesky_ex(H + damping * eye)
        if int(info) == 0 or attempt == _MAX_DAMPING_RETRIES:
            break
        damping *= 10.0
    if int(info) != 0:
        raise CorrectionError(
            f"The Hessian of a {shape} layer could not be factorised even with damping {damping:.3g}; "
            "its calibration inputs are degenerate (check the images), or raise CorrectionConfig.damping_fraction."
        )
    return L, damping


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
    # Removed columns first: then every removed column's error is compensated into every kept column, and the
    # sequential OBS updates amount to the least-squares fit of the kept columns.
    order = torch.cat([removed, kept])
    # SparseGPT's update directions are the rows of U, the upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU). With J the
    # reversal and JHJ = LLᵀ, U = J L⁻¹ J: one Cholesky and one triangular inverse, without forming H⁻¹ (whose float64
    # cholesky_inverse is also very slow on some CPU builds).
    reverse = order.flip(0)
    L, damping = damped_cholesky(hessian.to(weight.device)[reverse][:, reverse], config, tuple(weight.shape))
    dtype = L.dtype
    eye = torch.eye(in_features, dtype=dtype, device=L.device)
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
    return reconstruction_errors(original, [new], hessian)[0]


def reconstruction_errors(original: torch.Tensor, candidates: Sequence[torch.Tensor],
                          hessian: torch.Tensor) -> list[float]:
    """:func:`reconstruction_error` of several candidate weights, sharing the reference output's norm."""
    dtype = solve_dtype(original.device)
    W = original.detach().to(dtype)
    H = hessian.to(device=W.device, dtype=dtype)
    total = float(((W @ H) * W).sum())
    errors = []
    for new in candidates:
        delta = W - new.detach().to(dtype)
        errors.append(float(((delta @ H) * delta).sum()) / total if total > 0 else 0.0)
    return errors
