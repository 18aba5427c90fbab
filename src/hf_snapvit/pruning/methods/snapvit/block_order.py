"""Which units of a block to keep, from the calibration covariance: second-order orders across a block's units.

The gradient scores (:mod:`hf_snapvit.pruning.scoring`) rate each head and neuron alone. Removing several units of a block
at once costs more or less than the sum of their single costs, because their outputs are correlated. Removing a set
``S`` of input columns from an output projection ``W`` (the attention output projection for heads, ``head_dim``
columns each; the FFN output projection for neurons) changes the layer's output on calibration inputs ``X`` by
``W_S X_S``; with ``H = XXᵀ/n`` its mean squared size is

* ``"output"``: ``tr(W_S H_SS W_Sᵀ)`` when the kept columns stay as they are (the plain slice), cross terms included;
* ``"obs"``: the Schur-complement error ``tr(W (H - H_:K H_KK⁻¹ H_K:) Wᵀ)`` when the kept columns ``K`` are re-fitted
  by least squares (optimal brain surgeon; what :mod:`hf_snapvit.correction.prefix` does at every size).

An elastic model keeps a prefix of each block's rank order, so the order is built by greedy backward elimination:
repeatedly remove the unit whose removal adds least error given the units already removed (for ``"obs"``, with the
kept weights and the inverse Hessian updated after each removal, and a wide layer's cheapest few units removed per
step: :data:`OBS_STEPS`); the order is the reverse of the removals, so every prefix is the set the elimination kept.
:func:`reorder_scores` then hands a block's gradient scores out in that order: the gradient scores (and the search)
still decide how many units each block keeps, the covariance decides which.
The layer-local errors are not comparable across blocks, so they are not used as scores themselves.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import numpy as np
import torch
import torch.nn as nn

from ....architectures import get_attention, get_spec, head_dim
from ....data.calibration import calibration_batches
from ....correction.config import CorrectionConfig
from ....correction.inputs import capture_first_block_inputs, dense_block_hessians
from ....correction.solve import damped_cholesky, solve_dtype
from ....errors import ConfigError
from ....architectures.placement import onloaded

UnitOrder = Literal["scores", "output", "obs"]
#: ``"scores"``: the gradient scores' own order; the others order each block's units by greedy elimination.
UNIT_ORDERS: tuple[str, ...] = ("scores", "output", "obs")
#: The most elimination steps an ``"obs"`` order takes per layer. Each step downdates the ``n x n`` inverse Hessian,
#: so a layer with more units removes ``ceil(units / OBS_STEPS)`` per step, those of least single cost.
OBS_STEPS = 256


def _grouped(matrix: torch.Tensor, group: int) -> torch.Tensor:
    """``[n, n]`` -> ``[n/group, n/group]``: the sum of every ``group x group`` block."""
    units = matrix.shape[0] // group
    return matrix.reshape(units, group, units, group).sum((1, 3))


def _output_removals(weight: torch.Tensor, hessian: torch.Tensor, group: int) -> list[int]:
    # G[i, j] = E[(W_i x_i)·(W_j x_j)] between units; removing S costs the sum of G over S x S.
    gram = _grouped((weight.T @ weight) * hessian, group).cpu().numpy()
    # One step per unit, each too small for an accelerator: on a GPU every step's argmin would wait on the device
    # (seconds for a ViT-B's FFNs), in NumPy it is microseconds, with the same float64 sums.
    added = np.diagonal(gram).copy()  # the cost of removing each unit next: G_jj + 2 Σ_{i removed} G_ij
    removals = []
    for _ in range(gram.shape[0]):
        unit = int(added.argmin())
        removals.append(unit)
        added += 2 * gram[unit]
        added[unit] = np.inf  # removed: never chosen again
    return removals


def _obs_removals(weight: torch.Tensor, hessian: torch.Tensor, group: int, config: CorrectionConfig,
                  max_steps: int) -> list[int]:
    L, _ = damped_cholesky(hessian, config, shape=tuple(weight.shape))
    inverse = torch.cholesky_inverse(L)
    weight = weight.to(inverse.dtype).clone()
    units = weight.shape[1] // group
    per_step = -(-units // max_steps)
    removed = torch.zeros(units, dtype=torch.bool, device=inverse.device)
    removals: list[int] = []
    while len(removals) < units - 1:
        blocks = inverse.view(units, group, units, group).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # [u, g, g]
        kept = weight.view(-1, units, group).permute(1, 2, 0)  # [u, g, out]
        solved = kept / blocks if group == 1 else torch.linalg.solve(blocks, kept)
        # The error a unit's removal adds when the others are re-fitted: tr(W_g (H⁻¹_gg)⁻¹ W_gᵀ).
        cost = (kept * solved).sum((1, 2)).masked_fill(removed, torch.inf)
        picks = torch.topk(cost, min(per_step, units - 1 - len(removals)), largest=False).indices  # cheapest first
        removals += picks.tolist()
        removed[picks] = True
        columns = (picks[:, None] * group + torch.arange(group, device=picks.device)).flatten()
        step = torch.linalg.solve(inverse[columns[:, None], columns], inverse[columns])  # (H⁻¹_CC)⁻¹ H⁻¹_C:
        weight -= weight[:, columns] @ step
        inverse -= inverse[:, columns] @ step
        # The update zeroes the removed columns' rows and columns; an identity block keeps later solves well posed.
        inverse[columns[:, None], columns] = torch.eye(len(columns), dtype=inverse.dtype, device=inverse.device)
    removals.append(int(torch.nonzero(~removed).flatten()[0]))
    return removals


def elimination_order(weight: torch.Tensor, hessian: torch.Tensor, *, group: int = 1, order: UnitOrder = "output",
                      config: CorrectionConfig | None = None, max_steps: int = OBS_STEPS) -> np.ndarray:
    """A layer's units, most important first, by greedy backward elimination of its input columns.

    Args:
        weight: ``[out, in]``: the output projection whose input columns the units own.
        hessian: ``[in, in]``: the mean ``xxᵀ`` of the layer's inputs on calibration images.
        group: Columns per unit (``head_dim`` for heads, 1 for neurons); units own consecutive columns.
        order: ``"output"`` (kept columns unchanged) or ``"obs"`` (kept columns re-fitted; the Hessian is damped
            as ``config`` says, as for the correction).
        config: The damping of ``"obs"`` (default :class:`~hf_snapvit.correction.CorrectionConfig`).
        max_steps: The most ``"obs"`` elimination steps (see :data:`OBS_STEPS`); with at least as many steps as
            units, one unit is removed per step.
    """
    if not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError(f"max_steps={max_steps!r}: give the most elimination steps, an int >= 1, e.g. {OBS_STEPS}.")
    if order not in UNIT_ORDERS[1:]:
        raise ConfigError(f"order={order!r} is not an elimination order; use one of {UNIT_ORDERS[1:]}.")
    columns = weight.shape[1]
    if hessian.shape != (columns, columns) or group < 1 or columns % group:
        raise ConfigError(f"A [{weight.shape[0]}, {columns}] weight needs a [{columns}, {columns}] Hessian and a "
                          f"group that divides {columns}; got a {list(hessian.shape)} Hessian and group {group}.")
    # The correction's solve precision: the inverse Hessian is downdated once per removed unit.
    dtype = solve_dtype(hessian.device)
    weight, hessian = weight.detach().to(hessian.device, dtype), hessian.detach().to(dtype)
    if order == "output":
        removals = _output_removals(weight, hessian, group)
    else:
        removals = _obs_removals(weight, hessian, group, config or CorrectionConfig(), max_steps)
    return np.asarray(removals[::-1], dtype=np.int64)


@torch.no_grad()
def block_orders(model: nn.Module, images_or_pixels: Any, processor: Any = None, *, order: UnitOrder = "output",
                 config: CorrectionConfig | None = None, show_progress: bool = True) -> list[tuple[np.ndarray, ...]]:
    """Per block, ``(head order, neuron order)``, most important first, by :func:`elimination_order` on the dense
    ``model``'s calibration activations (``config``: how many images, batch size, seed and damping)."""
    config = config or CorrectionConfig()
    spec = get_spec(model)
    was_training = model.training
    model.eval()
    try:
        batches, _ = calibration_batches(images_or_pixels, processor, num_samples=config.num_samples,
                                         batch_size=config.batch_size, seed=config.seed, model=model)
        inputs = capture_first_block_inputs(model, spec, batches, processor, show_progress)
        orders = []
        for _, layer, ((attention, h_attention), (ffn, h_ffn)) in dense_block_hessians(model, spec, inputs,
                                                                                       "unit order", show_progress):
            width = head_dim(get_attention(layer, spec), spec)
            with onloaded(model, layer):  # weights accelerate offloaded, loaded for this block only
                orders.append((elimination_order(attention.weight, h_attention.hessian(), group=width, order=order,
                                                 config=config),
                               elimination_order(ffn.weight, h_ffn.hessian(), order=order, config=config)))
    finally:
        model.train(was_training)
    return orders


def reorder_scores(scores: np.ndarray, orders: Sequence[np.ndarray]) -> np.ndarray:
    """``scores`` ``[blocks, units]`` with each block's values handed out in that block's order: the unit first in
    the order gets the block's largest score, and so on. Each block keeps the same values, so a ranking keeps as many
    units per block as before; which ones follows the orders."""
    scores = np.asarray(scores)
    if len(orders) != scores.shape[0]:
        raise ConfigError(f"{len(orders)} orders for {scores.shape[0]} blocks of scores; give one per block.")
    out = np.empty_like(scores)
    for block, order in enumerate(orders):
        order = np.asarray(order)
        if sorted(order.tolist()) != list(range(scores.shape[1])):
            raise ConfigError(f"Block {block}: the order must list each of its {scores.shape[1]} units once.")
        out[block, order] = np.sort(scores[block])[::-1]
    return out
