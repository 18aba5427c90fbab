"""The budget path of a ranking: the order in which heads and FFN neurons leave, least important first.

Step ``t`` of the path is a model; step 0 is dense, and each step removes one head or one aligned group of neurons,
never below the per-block floors. Resolving a budget (:meth:`ElasticRanking.keep_counts`) is a bisection along it.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np

from ..architectures.budget import ModelShape
from .score_curves import log10_scores


class RankedUnits(Protocol):
    """What the path reads of a ranking (an :class:`~hf_snapvit.elastic.ranking.ElasticRanking`); a protocol, so
    this module needs no import of the ranking that imports it."""

    head_scores: np.ndarray
    neuron_scores: np.ndarray
    shape: ModelShape
    mode: str
    paired_head_offset: float
    _cache: dict[Any, Any]

    def floors(self, width_multiple: int | None = None) -> tuple[int, int]: ...


def removal_order(ranking: RankedUnits, kind: int, multiple: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Removable groups of one kind (0 heads, 1 neurons), least important first: ``(layers, priorities, sizes)``.

    A group is one head, or the neurons between two kept widths that are multiples of ``multiple`` (the first
    group of a block whose width is not a multiple is smaller). Its priority is its mean score per parameter;
    within a block, groups are removed from the last-ranked end.
    """
    scores = (ranking.head_scores, ranking.neuron_scores)[kind]
    width = scores.shape[1]
    floor = ranking.floors(multiple)[kind]
    step = multiple if kind else 1
    # Kept widths along the path: the full width, then every multiple of `step` below it down to the floor.
    kept = np.array([width] + list(range(((width - 1) // step) * step, floor - 1, -step)), dtype=np.int64)
    kept = kept[kept >= floor]
    starts, ends = kept[1:], kept[:-1]
    cost = (ranking.shape.params_per_head, ranking.shape.params_per_neuron)[kind]
    ranked = -np.sort(-scores, axis=1, kind="stable")  # per block, most to least important
    prefix = np.concatenate([np.zeros((scores.shape[0], 1)), np.cumsum(ranked, axis=1)], axis=1)
    sizes = ends - starts
    means = (prefix[:, ends] - prefix[:, starts]) / sizes  # [L, groups]
    layers = np.repeat(np.arange(scores.shape[0]), len(sizes))
    positions = np.tile(starts, scores.shape[0])
    priority = log10_scores(means.ravel()) - math.log10(cost)
    # Ties go to the later position within a block, so each block always loses its last-ranked group first.
    order = np.lexsort((-positions, layers, priority))
    order = order[layers[order] < ranking.shape.used_layers]  # unused blocks go to their floors in one first step
    return layers[order], priority[order], np.tile(sizes, scores.shape[0])[order]

def budget_path(ranking: RankedUnits, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative removals along the budget path: ``(heads removed [T+1, L], neurons removed [T+1, L])``."""
    if ("schedule", multiple) in ranking._cache:
        return ranking._cache[("schedule", multiple)]
    L = ranking.shape.num_layers
    head_layers, head_priority, _ = removal_order(ranking, 0)
    neuron_layers, neuron_priority, neuron_sizes = removal_order(ranking, 1, multiple)
    if ranking.mode == "global":
        kinds = np.concatenate([np.zeros(len(head_layers), int), np.ones(len(neuron_layers), int)])
        layers = np.concatenate([head_layers, neuron_layers])
        priority = np.concatenate([head_priority, neuron_priority])
        step = np.arange(len(layers))
        order = np.lexsort((step, priority))  # stable: keeps each kind's own order on ties
        kinds, layers = kinds[order], layers[order]
        heads = np.zeros((len(layers) + 1, L), dtype=np.int32)
        neurons = np.zeros((len(layers) + 1, L), dtype=np.int32)
        sizes = np.concatenate([np.ones(len(head_layers), int), neuron_sizes])[order]
        heads[1:][np.arange(len(layers))[kinds == 0], layers[kinds == 0]] = 1
        neurons[1:][np.arange(len(layers))[kinds == 1], layers[kinds == 1]] = sizes[kinds == 1]
        heads, neurons = np.cumsum(heads, axis=0), np.cumsum(neurons, axis=0)
    else:
        total_neurons = L * ranking.shape.intermediate_size
        total_heads = L * ranking.shape.num_heads
        n = np.concatenate([[0], np.cumsum(neuron_sizes)])
        ratio = np.maximum(0.0, n / total_neurons - ranking.paired_head_offset)
        h = np.minimum(np.floor(total_heads * ratio + 1e-9).astype(np.int32), len(head_layers))
        neuron_steps = np.zeros((len(neuron_layers) + 1, L), dtype=np.int32)
        neuron_steps[np.arange(1, len(neuron_layers) + 1), neuron_layers] = neuron_sizes
        head_steps = np.zeros((len(head_layers) + 1, L), dtype=np.int32)
        head_steps[np.arange(1, len(head_layers) + 1), head_layers] = 1
        neurons = np.cumsum(neuron_steps, axis=0)
        heads = np.cumsum(head_steps, axis=0)[h]
    heads, neurons = _unused_first(ranking, heads, neurons, multiple)
    ranking._cache[("schedule", multiple)] = (heads, neurons)
    return heads, neurons

def _unused_first(ranking: RankedUnits, heads: np.ndarray, neurons: np.ndarray, multiple: int) -> tuple[np.ndarray, np.ndarray]:
    """The budget path with one first step that takes the blocks no task reads (after ``shape.used_layers``)
    to their floors, which every later step keeps: they cost no output, so no budget is spent on them."""
    unused = slice(ranking.shape.used_layers, ranking.shape.num_layers)
    if unused.start >= unused.stop:
        return heads, neurons
    floor_heads, floor_neurons = ranking.floors(multiple)
    out = []
    for path, width, floor in ((heads, ranking.shape.num_heads, floor_heads),
                               (neurons, ranking.shape.intermediate_size, floor_neurons)):
        path = np.concatenate([path[:1], path])
        path[1:, unused] = width - floor
        out.append(path)
    return out[0], out[1]
