"""Tests of the model-agnostic xNES optimiser (hf_snapvit.pruning.xnes)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_snapvit.pruning.xnes import XNES, XNESError, XNESResult, default_learning_rate_cov, default_population_size

# Budgets below were measured over 200 seeds (1000 for Rosenbrock) with the default λ and learning rates and then
# given a margin: sphere needs 179-219 generations (budget 300, set by the spec), the ellipsoid 190-239 (budget
# 600), and 2-D Rosenbrock from (0, 0) a median of ~88 with a long tail (max 2196 in 1000 seeds; budget 3000).
SEEDS = (0, 1, 2)


def sphere(x: np.ndarray) -> np.ndarray:
    return np.sum(x**2, axis=1)


def ellipsoid(x: np.ndarray) -> np.ndarray:
    """Axis-parallel ellipsoid with condition number 1e4."""
    d = x.shape[1]
    return (x**2) @ (10.0 ** (4.0 * np.arange(d) / (d - 1)))


def rosenbrock(x: np.ndarray) -> np.ndarray:
    return 100.0 * (x[:, 1] - x[:, 0] ** 2) ** 2 + (1.0 - x[:, 0]) ** 2


def first_generation(history: list[dict], predicate) -> int | None:
    return next((r["generation"] for r in history if predicate(r)), None)


# ---------------------------------------------------------------------------------------------------- defaults
def test_defaults_match_reference():
    assert default_population_size(156) == 19
    assert default_population_size(84) == 17
    assert XNES(np.zeros(156)).population_size == 19
    assert XNES(np.zeros(84)).population_size == 17
    assert XNES(np.zeros(408)).population_size == 22
    lr = XNES(np.zeros(156)).learning_rate_cov
    assert lr == default_learning_rate_cov(156)
    assert float(f"{lr:.3g}") == 0.00248
    assert float(f"{default_learning_rate_cov(408):.2g}") == 0.00066
    assert XNES(np.zeros(3)).learning_rate_mean == 1.0


def test_initial_distribution_and_utilities():
    cov = np.array([[2.0, 0.5], [0.5, 1.0]])
    opt = XNES([1.0, -1.0], covariance=cov, sigma=0.5, population_size=40000, seed=3)
    np.testing.assert_allclose(opt.covariance, 0.25 * cov, rtol=1e-12)
    x = opt.ask()
    assert x.shape == (40000, 2) and x.dtype == np.float64
    np.testing.assert_allclose(x.mean(0), [1.0, -1.0], atol=0.02)
    np.testing.assert_allclose(np.cov(x.T), 0.25 * cov, atol=0.02)
    u = opt._utilities
    assert abs(u.sum()) < 1e-12 and np.all(np.diff(u) <= 0)
    assert u[-1] == pytest.approx(-1.0 / 40000)


# ---------------------------------------------------------------------------------------------------- convergence
@pytest.mark.parametrize("seed", SEEDS)
def test_sphere_converges(seed):
    opt = XNES(3.0 * np.ones(5), seed=seed)
    res = opt.optimize(sphere, max_generations=300)
    assert isinstance(res, XNESResult)
    assert res.generations == 300 and res.evaluations == 300 * opt.population_size
    assert res.best_fitness < 1e-8
    reached = first_generation(res.history, lambda r: r["best_fitness"] < 1e-8)
    assert reached is not None and reached <= 250  # measured: 179-219 over 200 seeds
    np.testing.assert_allclose(res.mean, 0.0, atol=1e-4)
    # The step size shrinks while converging (sigma_proxy starts at 1).
    assert res.history[-1]["sigma_proxy"] < 1e-3


@pytest.mark.parametrize("seed", SEEDS)
def test_ellipsoid_converges(seed):
    opt = XNES(3.0 * np.ones(5), seed=seed)
    res = opt.optimize(ellipsoid, max_generations=600)
    assert res.best_fitness < 1e-6
    reached = first_generation(res.history, lambda r: r["best_fitness"] < 1e-6)
    assert reached is not None and reached <= 300  # measured: 190-239 over 200 seeds
    # The adapted covariance follows the inverse Hessian: the flattest axis gets the widest spread.
    c = np.diag(opt.covariance)
    assert c[0] > 10.0 * c[-1]


@pytest.mark.parametrize("seed", SEEDS)
def test_rosenbrock_converges(seed):
    opt = XNES(np.zeros(2), seed=seed)
    res = opt.optimize(rosenbrock, max_generations=3000, batch=True)
    assert np.max(np.abs(res.best_x - 1.0)) < 1e-3
    assert res.best_fitness < 1e-6


def test_maximize_negated_sphere():
    opt = XNES(3.0 * np.ones(5), seed=0, minimize=False)
    res = opt.optimize(lambda x: -sphere(x), max_generations=300)
    assert res.best_fitness > -1e-8
    assert res.best_fitness <= 0.0
    best = [r["best_fitness"] for r in res.history]
    assert all(b2 >= b1 for b1, b2 in zip(best, best[1:]))  # best-so-far never gets worse
    np.testing.assert_allclose(res.best_x, 0.0, atol=1e-4)


def test_non_batch_objective_equals_batch():
    a = XNES(np.ones(3), seed=5).optimize(sphere, max_generations=20)
    calls = []

    def one(x):
        calls.append(x.shape)
        return float(np.sum(x**2))

    b = XNES(np.ones(3), seed=5).optimize(one, max_generations=20, batch=False)
    assert calls == [(3,)] * (20 * default_population_size(3))
    assert np.array_equal(a.mean, b.mean) and a.best_fitness == b.best_fitness


# ---------------------------------------------------------------------------------------------------- determinism
def test_same_seed_same_trajectory_different_seed_differs():
    runs = [XNES(np.ones(4), seed=s).optimize(sphere, max_generations=30) for s in (7, 7, 8)]
    assert runs[0].history == runs[1].history
    assert np.array_equal(runs[0].best_x, runs[1].best_x) and np.array_equal(runs[0].mean, runs[1].mean)
    assert not np.array_equal(runs[0].mean, runs[2].mean)
    assert runs[0].history != runs[2].history
    assert not np.array_equal(XNES(np.ones(4), seed=7).ask(), XNES(np.ones(4), seed=8).ask())


def test_save_resume_is_bit_identical():
    full = XNES(2.0 * np.ones(6), seed=11)
    full_res = full.optimize(ellipsoid, max_generations=60)

    first = XNES(2.0 * np.ones(6), seed=11)
    first.optimize(ellipsoid, max_generations=25)
    text = json.dumps(first.state_dict())
    resumed = XNES.from_state_dict(json.loads(text))
    res = resumed.optimize(ellipsoid, max_generations=60)  # budgets count from the start of the search

    assert np.array_equal(res.best_x, full_res.best_x)
    assert res.best_fitness == full_res.best_fitness
    assert np.array_equal(res.mean, full_res.mean)
    assert np.array_equal(resumed.factor, full.factor)
    assert res.history == full_res.history
    assert (res.evaluations, res.generations) == (full_res.evaluations, full_res.generations)
    assert resumed.state_dict() == full.state_dict()


def test_save_between_ask_and_tell_and_load_state_dict():
    a = XNES(np.ones(3), seed=2)
    x = a.ask()
    b = XNES(np.zeros(3), seed=99)  # different state, replaced wholesale
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    a.tell(x, sphere(x))
    b.tell(x, sphere(x))  # the pending samples were saved, so b uses the very same z
    assert np.array_equal(a.mean, b.mean) and np.array_equal(a.factor, b.factor)
    assert np.array_equal(a.ask(), b.ask())


def test_tell_with_points_not_from_ask_uses_inverse_transform():
    a = XNES(np.ones(3), seed=4, sigma=0.7)
    saved = a.state_dict()
    x = a.ask()
    a.tell(x, sphere(x))
    b = XNES.from_state_dict(saved)  # never asked: z must be recovered as A^-1 (x - mu)
    b.tell(x, sphere(x))
    np.testing.assert_allclose(b.mean, a.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b.factor, a.factor, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------------- budgets
def test_evaluation_budget_partial_generation():
    d = 156
    opt = XNES(np.linspace(1.2, 0.8, d), seed=42)
    assert opt.population_size == 19
    means, sizes, records = [], [], []
    planted = {}

    def fn(x):
        means.append(opt.mean)  # the mean each generation was sampled from
        sizes.append(x.shape[0])
        f = np.sum((x - 1.0) ** 2, axis=1)
        if len(sizes) == 3:  # make a sample of the partial generation the best ever
            f[5] = -1.0
            planted["x"] = x[5].copy()
        return f

    res = opt.optimize(fn, max_evaluations=50, callback=records.append)
    assert sizes == [19, 19, 12]
    assert res.evaluations == 50 and res.generations == 2
    final = opt.mean
    sequence = [means[0], means[1], means[2], final]
    changes = sum(not np.array_equal(m1, m2) for m1, m2 in zip(sequence, sequence[1:]))
    assert changes == 2
    assert np.array_equal(means[2], final)  # the partial generation did not move the mean
    assert res.best_fitness == -1.0 and np.array_equal(res.best_x, planted["x"])
    assert [r["evaluations"] for r in records] == [19, 38, 50]
    assert [r["partial"] for r in records] == [False, False, True]
    assert [r["generation"] for r in res.history] == [1, 2, 3]
    # The budget is spent: calling again evaluates nothing more.
    assert opt.optimize(fn, max_evaluations=50).evaluations == 50 and len(sizes) == 3


def test_evaluation_budget_non_batch_and_both_budgets():
    calls = []
    opt = XNES(np.zeros(4), population_size=6, seed=0)
    res = opt.optimize(lambda x: calls.append(1) or float(x @ x), max_evaluations=15, batch=False)
    assert len(calls) == 15 and res.evaluations == 15 and res.generations == 2
    # Whichever budget is hit first stops the search.
    res = XNES(np.zeros(4), population_size=6).optimize(sphere, max_generations=3, max_evaluations=100)
    assert res.generations == 3 and res.evaluations == 18
    res = XNES(np.zeros(4), population_size=6).optimize(sphere, max_generations=30, max_evaluations=24)
    assert res.generations == 4 and res.evaluations == 24


# ---------------------------------------------------------------------------------------------------- errors
def test_bad_input_errors():
    opt = XNES(np.zeros(3), population_size=5)
    x = opt.ask()
    with pytest.raises(ValueError, match=r"solutions must have shape \(5, 3\)"):
        opt.tell(x[:4], sphere(x[:4]))
    with pytest.raises(ValueError, match=r"solutions must have shape"):
        opt.tell(x[:, :2], sphere(x))
    with pytest.raises(ValueError, match=r"fitness must have shape \(5,\)"):
        opt.tell(x, sphere(x)[:3])
    f = sphere(x)
    f[2] = np.nan
    with pytest.raises(XNESError, match=r"NaN at index 2"):
        opt.tell(x, f)
    assert opt.generations == 0 and opt.evaluations == 0  # rejected input changes nothing
    with pytest.raises(ValueError, match="budget"):
        opt.optimize(sphere)
    with pytest.raises(ValueError, match="NaN"):
        opt.optimize(lambda x: np.full(len(x), math.nan), max_generations=1)
    with pytest.raises(ValueError, match="max_generations"):
        opt.optimize(sphere, max_generations=-1)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="1-D"):
        XNES(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="shape"):
        XNES(np.zeros(3), covariance=np.eye(2))
    with pytest.raises(ValueError, match="positive definite"):
        XNES(np.zeros(2), covariance=[[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="sigma"):
        XNES(np.zeros(2), sigma=0.0)
    with pytest.raises(ValueError, match="population_size"):
        XNES(np.zeros(2), population_size=1)
    with pytest.raises(ValueError, match="state_version"):
        XNES.from_state_dict({"state_version": 0})
