"""The compact JSON encoding of a ranking's scores (``elastic_ranking.scores``, encoding ``"log10-sorted"``).

Scores span many decades, so they are stored as log10. Head scores are few and stored as they are; the neuron
scores of a block, in rank order, form a smooth non-increasing curve that is stored as the knots of a
piecewise-linear interpolant, which keeps the ranking of a ViT-L in about 150 kB of ``config.json``.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ..errors import RankingFormatError

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


def decode_scores(scores: Any, shape: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(head scores [L, H], neuron scores [L, F])`` of a stored ``scores`` object, for a
    :class:`~hf_snapvit.architectures.budget.ModelShape` ``shape`` (already checked: nothing larger than it is built).

    Raises:
        RankingFormatError: A field is missing, of the wrong type or length, or not a finite log10 score; the message
            names it (``scores.heads[0][2]``).
    """
    if not isinstance(scores, dict):
        raise RankingFormatError(f"scores must be a JSON object, got {type(scores).__name__}.")
    if scores.get("encoding") != "log10-sorted":
        raise RankingFormatError(f"unknown scores.encoding {scores.get('encoding')!r} (expected 'log10-sorted').")
    L, F = shape.num_layers, shape.intermediate_size
    heads = [_numbers(f"scores.heads[{block}]", row, shape.num_heads)
             for block, row in enumerate(_blocks(scores, "heads", L))]
    neurons = []
    for block, row in enumerate(_blocks(scores, "neurons", L)):
        name = f"scores.neurons[{block}]"
        if not isinstance(row, dict):
            raise RankingFormatError(f"{name} must be a JSON object with 'index' and 'log10' lists, got "
                                     f"{type(row).__name__}.")
        index = _numbers(f"{name}.index", row.get("index"), None, integer=True)
        values = _numbers(f"{name}.log10", row.get("log10"), None)
        if len(index) != len(values) or len(index) == 0 or index[0] != 0 or index[-1] != F - 1 \
                or np.any(np.diff(index) <= 0):
            raise RankingFormatError(f"{name} knots must have matching index/log10 lists with indices increasing "
                                     f"from 0 to intermediate_size-1 = {F - 1}.")
        neurons.append(10.0 ** np.interp(np.arange(F), index, values))
    return 10.0 ** np.array(heads, dtype=np.float64).reshape(L, -1), np.array(neurons).reshape(L, F)


def _blocks(scores: dict, key: str, num_layers: int) -> list:
    rows = scores.get(key)
    if not isinstance(rows, list) or len(rows) != num_layers:
        found = f"{len(rows)} blocks" if isinstance(rows, list) else f"a {type(rows).__name__}"
        raise RankingFormatError(f"scores.{key} has {found}, expected a list of {num_layers} blocks (num_layers).")
    return rows


def _numbers(name: str, values: Any, length: int | None, integer: bool = False) -> np.ndarray:
    """``values`` as an array, if it is a list of ``length`` finite log10 scores (or integers)."""
    if not isinstance(values, list) or (length is not None and len(values) != length):
        found = f"{len(values)} scores" if isinstance(values, list) else f"a {type(values).__name__}"
        raise RankingFormatError(f"{name} has {found}, expected a list of {length or 'knot'} numbers.")
    kind = numbers.Integral if integer else numbers.Real
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, kind):
            raise RankingFormatError(f"{name}[{i}]={value!r} must be {'an integer' if integer else 'a number'}, "
                                     f"got {type(value).__name__}.")
        if not integer and not LOG10_FLOOR <= value <= -LOG10_FLOOR:
            raise RankingFormatError(f"{name}[{i}]={value!r} must be a finite log10 score in [{LOG10_FLOOR}, "
                                     f"{-LOG10_FLOOR}].")
    return np.asarray(values, dtype=np.int64 if integer else np.float64)


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
