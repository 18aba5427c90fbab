"""From the float64 gradient sums of a ranking's scored weights to one score per head and FFN neuron.

fisher and obd arrive as per-row sums (a unit's score is a sum over its rows); accumulated, snip and taylor need each
weight's whole gradient sum (the square, or the product with ``w``, of a sum is not a sum of parts), so their sums
stay per weight until :func:`weight_statistics` reduces them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..architectures import get_attention, get_layers, head_dim
from ..architectures.placement import onloaded


def weight_statistics(definition: str, model: nn.Module, layers: list[nn.Linear], sums: list[torch.Tensor],
                      num_images: int) -> dict[int, torch.Tensor]:
    """Each weight row's sum of the definition's per-weight statistic, from the float64 gradient sums (keyed by
    ``id(layer)``); obd's ``w²`` was applied every step, except for offloaded weights, whose sums stay per weight
    and take it here. The weights are read a layer at a time, loaded by accelerate's hooks where they are
    offloaded."""
    def weight(layer: nn.Linear) -> torch.Tensor:
        with onloaded(model, layer):
            return layer.weight.detach().to(torch.float64, copy=True)

    if definition in ("fisher", "obd"):
        stats = {id(m): value / num_images for m, value in zip(layers, sums)}
        if definition == "obd" and any(value.dim() == 2 for value in stats.values()):  # offloaded: per weight
            stats = {id(m): (stats[id(m)] * weight(m).to(stats[id(m)].device) ** 2).sum(1) for m in layers}
        return stats
    total = {id(m): value for m, value in zip(layers, sums)}
    if definition == "accumulated":
        return {key: (g**2).sum(1) for key, g in total.items()}
    if definition == "snip":
        return {id(m): (total[id(m)] * weight(m).to(total[id(m)].device)).abs().sum(1) for m in layers}
    return {id(m): (total[id(m)] * weight(m).to(total[id(m)].device)).sum(1) for m in layers}


def unit_scores(model: nn.Module, spec: Any, definition: str, stats: dict[int, torch.Tensor],
                head_layers: list, neuron_layers: list) -> tuple[np.ndarray, np.ndarray]:
    """``(heads [L, H], neurons [L, F])``: each unit's mean over its weight rows' statistics."""
    hd = head_dim(get_attention(get_layers(model, spec)[0], spec), spec)
    squared_sum = definition == "taylor"
    return tuple(reduce_rows([[(stats[id(m)][rows], m.in_features) for m, rows in group] for group in groups],
                             unit_rows, squared_sum) for groups, unit_rows in ((head_layers, hd), (neuron_layers, 1)))


def reduce_rows(stats: list[list[tuple[torch.Tensor, int]]], unit_rows: int, squared_sum: bool) -> np.ndarray:
    """One score per unit (``unit_rows`` consecutive rows of every matrix) from each matrix's per-row sums of the
    per-weight statistic and its input width: the statistic's mean over the unit's weights, or with
    ``squared_sum`` the square of its sum (a unit-level Taylor estimate)."""
    rows = []
    for matrices in stats:
        total = sum(row_sums for row_sums, _ in matrices).view(-1, unit_rows).sum(1)  # [units]
        if squared_sum:
            rows.append((total**2).cpu().numpy())
        else:
            rows.append((total / (sum(width for _, width in matrices) * unit_rows)).cpu().numpy())
    return np.stack(rows)
