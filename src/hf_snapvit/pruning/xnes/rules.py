"""The xNES update rules as pure functions: defaults, rank utilities, natural gradients, the matrix exponential,
the early-stopping count; and the result record of a search."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike

from ...errors import XNESError


def default_population_size(dimension: int) -> int:
    """λ = 4 + ⌊3 ln d⌋, the usual ES default (also pypop7's)."""
    if dimension < 1:
        raise XNESError(f"dimension must be >= 1, got {dimension}")
    return 4 + int(math.floor(3.0 * math.log(dimension)))


def default_learning_rate_cov(dimension: int) -> float:
    """η_σ = η_B = 0.6·(3 + ln d)/(d·√d), the default of Glasmachers et al. (2010)."""
    if dimension < 1:
        raise XNESError(f"dimension must be >= 1, got {dimension}")
    return 0.6 * (3.0 + math.log(dimension)) / (dimension * math.sqrt(dimension))


def utilities(population_size: int) -> np.ndarray:
    """Utility of each rank (index 0 = best): zero-sum, so below-median samples push the distribution away."""
    ranks = np.arange(1, population_size + 1, dtype=np.float64)
    w = np.maximum(0.0, math.log(population_size / 2.0 + 1.0) - np.log(ranks))
    return w / w.sum() - 1.0 / population_size


def expm_symmetric(m: np.ndarray) -> np.ndarray:
    """expm of a symmetric matrix through its eigendecomposition (exact for symmetric input, no scipy needed)."""
    # Symmetrise first: G_M is symmetric in exact arithmetic, but rounding could make eigh see a tiny skew part.
    m = 0.5 * (m + m.T)
    eigenvalues, eigenvectors = np.linalg.eigh(m)
    return (eigenvectors * np.exp(eigenvalues)) @ eigenvectors.T


def natural_gradients(z: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """``(d_mu, G_sigma, G_B)`` of a generation from its standard-normal draws ``z`` [λ, d] and utilities ``u`` [λ]."""
    d = z.shape[1]
    grad_mu = u @ z
    grad_m = (z.T * u) @ z - u.sum() * np.eye(d)  # u sums to 0 up to rounding; keep the term for exactness
    grad_sigma = np.trace(grad_m) / d
    return grad_mu, grad_sigma, grad_m - grad_sigma * np.eye(d)


def check_fitness(fitness: ArrayLike, n: int) -> np.ndarray:
    """The fitness of ``n`` samples as a float64 vector; a column vector is accepted, NaN is rejected."""
    f = np.array(fitness, dtype=np.float64)
    if f.ndim == 2 and f.shape[1] == 1:
        f = f[:, 0]  # accept a column vector, e.g. a model returning [λ, 1]
    if f.shape != (n,):
        raise XNESError(f"fitness must have shape ({n},), got {f.shape}")
    bad = np.flatnonzero(np.isnan(f))
    if bad.size:
        raise XNESError(f"fitness contains NaN at index {int(bad[0])} (value {f[bad[0]]!r}); "
                        f"{bad.size} NaN value(s) in total")
    return f


@dataclass
class XNESResult:
    """Outcome of a search.

    Attributes:
        best_x: The best single sample ever evaluated (not the distribution mean); ``None`` before any evaluation.
        best_fitness: Its fitness; ``None`` before any evaluation.
        mean: The current distribution mean μ.
        evaluations: Number of fitness evaluations so far (partial generations included).
        generations: Number of distribution updates so far.
        history: One dict per evaluated generation, see :meth:`XNES.tell`.
        stopped_early: Whether :meth:`XNES.optimize` stopped on its patience rather than on a budget.
    """

    best_x: Optional[np.ndarray]
    best_fitness: Optional[float]
    mean: np.ndarray
    evaluations: int
    generations: int
    history: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: bool = False


def check_patience(patience: Any, threshold: Any) -> None:
    """Raise :class:`XNESError` unless ``patience`` is a positive integer or ``None`` and ``threshold`` a finite gain
    >= 0."""
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, numbers.Integral)
                                 or patience < 1):
        raise XNESError(f"patience must be a positive integer (generations) or None, got {patience!r}")
    if not (isinstance(threshold, numbers.Real) and not isinstance(threshold, bool) and math.isfinite(threshold)
            and threshold >= 0):
        raise XNESError(f"threshold must be a finite number >= 0 (a fitness gain), got {threshold!r}")


def generations_without_improvement(history: list[dict[str, Any]], threshold: float, minimize: bool = True) -> int:
    """Full generations since the best-so-far fitness last beat the best of the previous improvement by more than
    ``threshold``. Gains of at most ``threshold`` do not reset the count, so a run of small gains adds up to one
    that does. Read off the history alone, so a resumed search counts as an uninterrupted one."""
    reference, stale = None, 0
    for record in history:
        if record["partial"]:
            continue
        best = record["best_fitness"]
        gain = None if reference is None else (reference - best if minimize else best - reference)
        if gain is None or gain > threshold:
            reference, stale = best, 0
        else:
            stale += 1
    return stale
