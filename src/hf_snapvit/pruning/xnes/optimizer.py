"""The ask/tell optimiser :class:`XNES`: its distribution, the update of one generation, the budgeted driver and
its JSON state; the update rules it applies are :mod:`.rules`, the algorithm is described in
:mod:`hf_snapvit.pruning.xnes`."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Optional

import numpy as np
from numpy.typing import ArrayLike

from ...errors import XNESError
from .rules import (XNESResult, check_fitness, check_patience, default_learning_rate_cov, default_population_size,
                    expm_symmetric, generations_without_improvement, natural_gradients, utilities)
from .state import STATE_VERSION, decode_state, jsonable

__all__ = ["XNES"]


class XNES:
    """Ask/tell xNES optimiser over R^d.

    The search distribution is N(μ, A·Aᵀ) with A = sigma·cholesky(covariance) at the start, i.e. the initial
    covariance is sigma²·covariance.

    Args:
        mean: Initial mean μ, shape [d].
        covariance: Initial (shape) covariance, [d, d], symmetric positive definite; identity when ``None``.
        sigma: Global scale of the initial distribution (standard deviation per coordinate for identity covariance).
        population_size: λ, samples per generation (>= 2); default 4 + ⌊3 ln d⌋.
        learning_rate_mean: η_μ (default 1, as in the paper and the reference).
        learning_rate_cov: η_σ = η_B; default 0.6·(3 + ln d)/(d·√d).
        seed: Seed of the ``numpy.random.Generator(PCG64(seed))`` that draws every sample.
        minimize: Lower fitness is better when ``True`` (default), higher when ``False``.
    """

    def __init__(
        self,
        mean: ArrayLike,
        *,
        covariance: Optional[ArrayLike] = None,
        sigma: float = 1.0,
        population_size: Optional[int] = None,
        learning_rate_mean: float = 1.0,
        learning_rate_cov: Optional[float] = None,
        seed: int = 0,
        minimize: bool = True,
    ) -> None:
        mu = np.array(mean, dtype=np.float64)
        if mu.ndim != 1 or mu.size == 0:
            raise XNESError(f"mean must be a non-empty 1-D array, got shape {mu.shape}")
        if not np.all(np.isfinite(mu)):
            raise XNESError("mean must be finite")
        d = mu.size
        sigma = float(sigma)
        if not (math.isfinite(sigma) and sigma > 0):
            raise XNESError(f"sigma must be a positive finite number, got {sigma}")

        if covariance is None:
            factor = np.eye(d)
        else:
            cov = np.array(covariance, dtype=np.float64)
            if cov.shape != (d, d):
                raise XNESError(f"covariance must have shape {(d, d)}, got {cov.shape}")
            if not np.all(np.isfinite(cov)):
                raise XNESError("covariance must be finite")
            if not np.allclose(cov, cov.T, rtol=1e-10, atol=1e-12):
                raise XNESError("covariance must be symmetric")
            try:
                factor = np.linalg.cholesky(cov)
            except np.linalg.LinAlgError as exc:
                raise XNESError("covariance must be positive definite (its Cholesky factorisation failed)") from exc

        lam = default_population_size(d) if population_size is None else int(population_size)
        if lam < 2:
            # With one sample there is nothing to rank, and every utility would be zero.
            raise XNESError(f"population_size must be >= 2, got {lam}")
        eta_mu = float(learning_rate_mean)
        eta_cov = default_learning_rate_cov(d) if learning_rate_cov is None else float(learning_rate_cov)
        for name, value in (("learning_rate_mean", eta_mu), ("learning_rate_cov", eta_cov)):
            if not (math.isfinite(value) and value > 0):
                raise XNESError(f"{name} must be a positive finite number, got {value}")

        self._mu = mu
        self._A = sigma * factor
        self._lambda = lam
        self._eta_mu = eta_mu
        self._eta_cov = eta_cov
        self._seed = int(seed)
        self._minimize = bool(minimize)
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        self._utilities = utilities(lam)
        self._pending_z: Optional[np.ndarray] = None
        self._best_x: Optional[np.ndarray] = None
        self._best_fitness: Optional[float] = None
        self._evaluations = 0
        self._generations = 0
        self._history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ properties
    @property
    def dimension(self) -> int:
        """d, the number of search variables."""
        return int(self._mu.size)

    @property
    def population_size(self) -> int:
        """λ, the number of samples per generation."""
        return self._lambda

    @property
    def learning_rate_mean(self) -> float:
        """η_μ."""
        return self._eta_mu

    @property
    def learning_rate_cov(self) -> float:
        """η_σ = η_B."""
        return self._eta_cov

    @property
    def minimize(self) -> bool:
        """Whether lower fitness is better."""
        return self._minimize

    @property
    def mean(self) -> np.ndarray:
        """A copy of the current mean μ, [d]."""
        return self._mu.copy()

    @property
    def factor(self) -> np.ndarray:
        """A copy of the factor A, [d, d]; the covariance is A·Aᵀ."""
        return self._A.copy()

    @property
    def covariance(self) -> np.ndarray:
        """The current covariance A·Aᵀ, [d, d]."""
        return self._A @ self._A.T

    @property
    def sigma_proxy(self) -> float:
        """|det A|^(1/d): the geometric-mean standard deviation of the distribution."""
        # slogdet avoids the under/overflow that det() hits for large d or tiny step sizes.
        _, logabsdet = np.linalg.slogdet(self._A)
        return float(math.exp(logabsdet / self.dimension))

    @property
    def evaluations(self) -> int:
        """Fitness evaluations so far."""
        return self._evaluations

    @property
    def generations(self) -> int:
        """Distribution updates so far."""
        return self._generations

    @property
    def history(self) -> list[dict[str, Any]]:
        """A copy of the per-generation records."""
        return [dict(r) for r in self._history]

    @property
    def result(self) -> XNESResult:
        """The best sample so far and the search statistics."""
        return XNESResult(
            best_x=None if self._best_x is None else self._best_x.copy(),
            best_fitness=self._best_fitness,
            mean=self._mu.copy(),
            evaluations=self._evaluations,
            generations=self._generations,
            history=self.history,
        )

    # ------------------------------------------------------------------ ask / tell
    def ask(self) -> np.ndarray:
        """Draw a new generation x_k = μ + A·z_k, shape [λ, d].

        The standard-normal draws z are remembered so that :meth:`tell` uses them exactly. Calling ``ask`` again
        before ``tell`` discards the previous generation.
        """
        self._pending_z = self._rng.standard_normal((self._lambda, self.dimension))
        return self._samples(self._pending_z)

    def _samples(self, z: np.ndarray) -> np.ndarray:
        # One place computes x from z, so the x returned by ask() and the x recomputed after a resume are identical.
        return self._mu + z @ self._A.T

    def _order(self, f: np.ndarray) -> np.ndarray:
        """Indices from best to worst; a stable sort so ties keep a deterministic order."""
        return np.argsort(f if self._minimize else -f, kind="stable")

    def _record(self, x: np.ndarray, f: np.ndarray, *, partial: bool) -> dict[str, Any]:
        """Update best-so-far and counters and append a history record (no distribution update)."""
        order = self._order(f)
        i = int(order[0])
        gen_best = float(f[i])
        if self._best_fitness is None:
            better = True
        else:
            better = gen_best < self._best_fitness if self._minimize else gen_best > self._best_fitness
        if better:
            self._best_fitness = gen_best
            self._best_x = np.array(x[i], dtype=np.float64, copy=True)
        self._evaluations += int(f.size)
        record = {
            # For a partial generation the index is the one it would have had; `generations` is not advanced.
            "generation": self._generations + 1 if partial else self._generations,
            "evaluations": self._evaluations,
            "best_fitness": self._best_fitness,
            "generation_best": gen_best,
            "mean_fitness": float(np.mean(f)),
            "sigma_proxy": self.sigma_proxy,
            "partial": partial,
        }
        self._history.append(record)
        return record

    def tell(self, solutions: ArrayLike, fitness: ArrayLike) -> dict[str, Any]:
        """Update the distribution from one full generation.

        Args:
            solutions: The λ evaluated points, [λ, d]. When they are exactly the points of the last :meth:`ask`,
                the remembered z are used; otherwise z_k = A⁻¹(x_k − μ) (so repaired or injected points work).
            fitness: Their fitness, [λ]; NaN is rejected (±inf is allowed and ranks last / first).

        Returns:
            The history record appended for this generation: ``generation``, ``evaluations``, ``best_fitness``
            (best ever), ``generation_best``, ``mean_fitness``, ``sigma_proxy`` (|det A|^(1/d) after the update)
            and ``partial`` (always ``False`` here).
        """
        x = np.array(solutions, dtype=np.float64)
        d, lam = self.dimension, self._lambda
        if x.shape != (lam, d):
            raise XNESError(f"solutions must have shape ({lam}, {d}), got {x.shape}")
        f = check_fitness(fitness, lam)

        z = self._pending_z
        if z is None or not np.array_equal(x, self._samples(z)):
            if not np.all(np.isfinite(x)):
                raise XNESError("solutions must be finite")
            z = np.linalg.solve(self._A, (x - self._mu).T).T

        # Utilities by rank, scattered back to the samples.
        u = np.empty(lam)
        u[self._order(f)] = self._utilities

        grad_mu, grad_sigma, grad_b = natural_gradients(z, u)

        # Both updates use the A of this generation (the one z was sampled with).
        self._mu = self._mu + self._eta_mu * (self._A @ grad_mu)
        self._A = self._A @ expm_symmetric(0.5 * (self._eta_cov * grad_sigma * np.eye(d) + self._eta_cov * grad_b))
        self._generations += 1
        self._pending_z = None
        return self._record(x, f, partial=False)

    # ------------------------------------------------------------------ driver
    def optimize(
        self,
        fn: Callable[[np.ndarray], Any],
        *,
        max_generations: Optional[int] = None,
        max_evaluations: Optional[int] = None,
        batch: bool = True,
        callback: Optional[Callable[[dict[str, Any]], None]] = None,
        patience: Optional[int] = None,
        threshold: float = 0.0,
    ) -> XNESResult:
        """Run ask/tell until a budget is spent, or until the search stops improving.

        Budgets count from the start of the search (not from this call), so a resumed optimiser given the same
        budget stops where an uninterrupted run would.

        Args:
            fn: With ``batch=True``, maps an array [n, d] to n fitness values (called once per generation, so all
                candidates can be evaluated together); with ``batch=False``, maps one x [d] to a float.
            max_generations: Stop after this many distribution updates.
            max_evaluations: Stop after this many fitness evaluations. If it is not a multiple of λ, the last
                generation is evaluated only partly and **not** used for an update (pypop7's behaviour: the
                reference's "50 iterations" with λ = 19 are 2 updates plus 12 extra samples); its evaluations are
                counted and its best sample can still become the best-so-far.
            batch: See ``fn``.
            callback: Called with each generation's history record (e.g. for a progress bar).
            patience: Stop early once the best fitness has gone this many generations without improving by more
                than ``threshold`` (:func:`~hf_snapvit.pruning.xnes.rules.generations_without_improvement`); ``None``: run
                the whole budget.
            threshold: The smallest gain in fitness that counts as an improvement (>= 0, in the fitness's units).

        Returns:
            :attr:`result`, with ``stopped_early`` set when the patience ended the search.
        """
        if max_generations is None and max_evaluations is None:
            raise XNESError("optimize needs a budget: give max_generations and/or max_evaluations")
        for name, value in (("max_generations", max_generations), ("max_evaluations", max_evaluations)):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 0):
                raise XNESError(f"{name} must be a non-negative integer, got {value!r}")
        check_patience(patience, threshold)

        def patience_spent() -> bool:
            return patience is not None and (
                generations_without_improvement(self._history, threshold, self._minimize) >= patience)

        while max_generations is None or self._generations < max_generations:
            if patience_spent():  # checked first, so a resumed search that had stopped stays stopped
                return replace(self.result, stopped_early=True)
            n = self._lambda
            if max_evaluations is not None:
                n = min(n, int(max_evaluations) - self._evaluations)
                if n <= 0:
                    break
            x = self.ask()
            f = self._evaluate(fn, x[:n], batch)
            if n == self._lambda:
                record = self.tell(x, f)
            else:
                record = self._record(x[:n], f, partial=True)
            if callback is not None:
                callback(dict(record))
            if n < self._lambda:
                break  # a partial generation only happens when the evaluation budget is exhausted
        return self.result

    def _evaluate(self, fn: Callable[[np.ndarray], Any], x: np.ndarray, batch: bool) -> np.ndarray:
        if batch:
            values = fn(x.copy())  # a copy, so a careless fn cannot alter the samples we rank
        else:
            values = [float(fn(row.copy())) for row in x]
        try:
            return check_fitness(values, x.shape[0])
        except XNESError as exc:
            raise XNESError(f"objective returned bad fitness: {exc}") from exc

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The complete state as plain lists/floats/ints (``json.dumps``-able), random generator included.

        Note: a fitness of ±inf, if one was ever seen, is stored as a float and needs JSON's ``Infinity``
        extension (Python's ``json`` writes and reads it by default).
        """
        return {
            "state_version": STATE_VERSION,
            "mean": self._mu.tolist(),
            "factor": self._A.tolist(),
            "population_size": self._lambda,
            "learning_rate_mean": self._eta_mu,
            "learning_rate_cov": self._eta_cov,
            "seed": self._seed,
            "minimize": self._minimize,
            "rng_state": jsonable(self._rng.bit_generator.state),
            "pending_z": None if self._pending_z is None else self._pending_z.tolist(),
            "best_x": None if self._best_x is None else self._best_x.tolist(),
            "best_fitness": self._best_fitness,
            "evaluations": self._evaluations,
            "generations": self._generations,
            "history": self.history,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this optimiser's state by ``state`` (from :meth:`state_dict`, possibly through JSON)."""
        values = decode_state(state)
        self._mu, self._A, self._lambda = values["mean"], values["factor"], values["population_size"]
        self._eta_mu, self._eta_cov = values["learning_rate_mean"], values["learning_rate_cov"]
        self._seed, self._minimize, self._rng = values["seed"], values["minimize"], values["rng"]
        self._utilities = utilities(self._lambda)
        self._pending_z, self._best_x, self._best_fitness = values["pending_z"], values["best_x"], values["best_fitness"]
        self._evaluations, self._generations = values["evaluations"], values["generations"]
        self._history = values["history"]

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "XNES":
        """Build an optimiser from :meth:`state_dict` output; it continues exactly where the saved one stopped."""
        obj = cls.__new__(cls)
        obj.load_state_dict(state)
        return obj

    def __repr__(self) -> str:
        return (f"XNES(d={self.dimension}, population_size={self._lambda}, generations={self._generations}, "
                f"evaluations={self._evaluations}, best_fitness={self._best_fitness})")
