"""The compact JSON encoding of a ranking's scores (``elastic_ranking.scores``, encoding ``"log10-sorted"``).

Scores span many decades, so they are stored as log10. Head scores are few and stored as they are; the neuron
scores of a block, in rank order, form a smooth non-increasing curve that is stored as the knots of a
piecewise-linear interpolant, which keeps the ranking of a ViT-L in about 150 kB of ``config.json``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# log10 of the smallest score kept; a score of 0 (e.g. a dead neuron) ranks last instead of becoming -inf.
LOG10_FLOOR = -300.0
# Neuron curves are stored as knots of a piecewise-linear log10 curve within this error (about 0.1 % of a score).
_KNOT_TOLERANCE = 0.0005
_DECIMALS = 4
# At most this many knots in all (about 150 kB of JSON); beyond it the tolerance doubles until the curves fit.
_MAX_KNOTS = 12_000


def log10_scores(scores: np.ndarray) -> np.ndarray:
    """log10 of non-negative scores, a score of 0 becoming :data:`LOG10_FLOOR`."""
    return np.log10(np.maximum(scores, 10.0**LOG10_FLOOR))


def encode_scores(head_scores: np.ndarray, neuron_scores: np.ndarray) -> dict[str, Any]:
    """The ``scores`` object of a stored ranking whose blocks are in rank order."""
    log_heads = log10_scores(head_scores)
    log_neurons = log10_scores(neuron_scores)
    tolerance = _KNOT_TOLERANCE
    knots = [_knots(row, tolerance) for row in log_neurons]
    while sum(map(len, knots)) > _MAX_KNOTS:  # very noisy curves: coarser, to keep config.json small
        tolerance *= 2
        knots = [_knots(row, tolerance) for row in log_neurons]
    neurons = [
        {"index": index.tolist(), "log10": np.round(row[index], _DECIMALS).tolist()}
        for row, index in zip(log_neurons, knots)
    ]
    return {
        "encoding": "log10-sorted",
        "neuron_tolerance": tolerance,
        "heads": np.round(log_heads, _DECIMALS).tolist(),
        "neurons": neurons,
    }


def decode_scores(scores: Any, intermediate_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(head scores [L, H], neuron scores [L, F])`` of a stored ``scores`` object.

    Raises ``ValueError``, ``KeyError`` or ``TypeError`` naming the bad field; the ranking's reader turns them into
    a :class:`~hf_snapvit.errors.RankingFormatError`.
    """
    if scores.get("encoding") != "log10-sorted":
        raise ValueError(f"unknown scores.encoding {scores.get('encoding')!r}")
    heads = 10.0 ** np.asarray(scores["heads"], dtype=np.float64)
    for block, row in enumerate(scores["neurons"]):
        index = np.asarray(row["index"])
        if len(index) != len(row["log10"]) or len(index) == 0 or index[0] != 0 \
                or index[-1] != intermediate_size - 1 or np.any(np.diff(index) <= 0):
            raise ValueError(
                f"scores.neurons[{block}] knots must have matching index/log10 lists with indices increasing "
                f"from 0 to intermediate_size-1 = {intermediate_size - 1}"
            )
    neurons = np.stack([
        10.0 ** np.interp(np.arange(intermediate_size), knots["index"], knots["log10"])
        for knots in scores["neurons"]
    ]) if scores["neurons"] else np.zeros((0, intermediate_size))
    return heads, neurons


def _knots(y: np.ndarray, tolerance: float) -> np.ndarray:
    """Indices of a piecewise-linear interpolant of ``y`` within ``tolerance`` everywhere (Douglas-Peucker)."""
    n = len(y)
    if n <= 2:
        return np.arange(n)
    keep = {0, n - 1}
    stack = [(0, n - 1)]
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        x = np.arange(a + 1, b)
        error = np.abs(y[a + 1:b] - (y[a] + (y[b] - y[a]) * (x - a) / (b - a)))
        i = int(np.argmax(error))
        if error[i] > tolerance:
            m = a + 1 + i
            keep.add(m)
            stack.extend(((a, m), (m, b)))
    return np.array(sorted(keep))
