"""Early stopping of the xNES search: the stale-generation count, when optimize stops, and that a stop or a resume
changes nothing else about the search."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_snapvit.pruning.xnes import XNES, XNESError
from hf_snapvit.pruning.xnes.rules import generations_without_improvement


def records(bests: list[float], partial_at: int | None = None) -> list[dict]:
    return [{"best_fitness": b, "partial": i == partial_at} for i, b in enumerate(bests)]


def test_count_resets_only_on_a_gain_above_the_threshold():
    bests = [1.0, 1.0, 0.95, 0.949, 0.948, 0.9]
    counts = [generations_without_improvement(records(bests[:n]), 0.0) for n in range(1, 7)]
    assert counts == [0, 1, 0, 0, 0, 0]
    counts = [generations_without_improvement(records(bests[:n]), 0.01) for n in range(1, 7)]
    assert counts == [0, 1, 0, 1, 2, 0]
    # gains of 0.004 each do not count one by one, but add up against the last counted best
    creeping = [1.0, 0.996, 0.992, 0.988, 0.984]
    assert [generations_without_improvement(records(creeping[:n]), 0.01) for n in range(1, 6)] == [0, 1, 2, 0, 1]


def test_count_skips_partial_generations_and_follows_the_direction():
    assert generations_without_improvement(records([1.0, 1.0, 1.0], partial_at=2), 0.0) == 1
    assert generations_without_improvement(records([1.0, 2.0, 2.0]), 0.0, minimize=False) == 1
    assert generations_without_improvement(records([1.0, 2.0, 2.0]), 0.0, minimize=True) == 2
    assert generations_without_improvement([], 0.0) == 0


def plateau_after(generations: int):
    """A fitness that improves for ``generations`` generations, then stays flat."""
    calls = []

    def fn(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return np.full(len(x), float(max(generations - len(calls), 0))) + 1e-3 * np.arange(len(x))

    return fn


def test_stops_patience_generations_after_the_last_improvement():
    search = XNES(np.zeros(4), population_size=6, seed=0)
    result = search.optimize(plateau_after(5), max_generations=50, patience=3)
    # generation 5 reaches 0 (the last gain), 6-8 do not improve: stop before a ninth
    assert result.generations == 8 and result.evaluations == 48 and result.stopped_early
    assert result.best_fitness == 0.0


def test_stopped_search_is_the_prefix_of_the_full_one():
    full = XNES(np.ones(5), seed=3).optimize(plateau_after(4), max_generations=20)
    stopped = XNES(np.ones(5), seed=3).optimize(plateau_after(4), max_generations=20, patience=2)
    assert not full.stopped_early and stopped.stopped_early
    assert stopped.history == full.history[:stopped.generations]
    assert np.array_equal(stopped.best_x, full.best_x)  # nothing after the plateau beat it


def test_budget_end_is_not_an_early_stop():
    result = XNES(np.zeros(3), seed=0).optimize(plateau_after(2), max_generations=5, patience=3)
    assert result.generations == 5 and not result.stopped_early
    sphere = XNES(np.ones(3), seed=0).optimize(lambda x: np.sum(x**2, axis=1), max_generations=5, patience=100)
    assert sphere.generations == 5 and not sphere.stopped_early


@pytest.mark.parametrize("saved_at", [3, 7])
def test_resumed_search_stops_where_an_uninterrupted_one_does(saved_at: int):
    whole = XNES(np.ones(4), seed=9).optimize(plateau_after(4), max_generations=30, patience=3)
    fn = plateau_after(4)
    first = XNES(np.ones(4), seed=9)
    first.optimize(fn, max_generations=saved_at, patience=3)
    resumed = XNES.from_state_dict(json.loads(json.dumps(first.state_dict())))
    result = resumed.optimize(fn, max_generations=30, patience=3)  # fn keeps its call count, as a real run's data
    assert result.stopped_early and result.generations == whole.generations == 7
    assert result.history == whole.history


def test_bad_patience_or_threshold_names_the_value():
    search = XNES(np.zeros(2))
    for patience in (0, -1, 1.5, True, "3"):
        with pytest.raises(XNESError, match=f"patience must be a positive integer.*{patience!r}"):
            search.optimize(plateau_after(1), max_generations=3, patience=patience)
    for threshold in (-0.1, math.nan, math.inf, "0.1", None):
        with pytest.raises(XNESError, match=r"threshold must be a finite number >= 0"):
            search.optimize(plateau_after(1), max_generations=3, patience=2, threshold=threshold)
    assert search.generations == 0  # nothing ran
