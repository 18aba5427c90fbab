"""benchmarks/scale.py runs as is on a CPU with two tiny shapes: a ranking per shape and preset with its phases, the
sliced load, and the growth exponent of each measure against the parameters."""

from __future__ import annotations

import json
import math

import pytest

from helpers import load_benchmark


def test_the_scale_benchmark_ranks_loads_and_fits_growth_exponents(tmp_path):
    script = load_benchmark("scale")
    output = tmp_path / "scale.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "small", "--presets", "fast", "--images", "4",
                        "--generations", "1", "--floor-repeats", "1", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    tiny, small = report["rows"]
    assert small["parameters"] > tiny["parameters"]
    for row in (tiny, small):
        ranking = row["rankings"]["fast"]
        assert ranking["wall_seconds"] > 0 and ranking["num_fitness_images"] == 4
        assert row["load"]["loaded_parameters"] < row["parameters"] and row["load"]["load_seconds"] > 0
    points = [(row["parameters"], row["rankings"]["fast"]["wall_seconds"]) for row in (tiny, small)]
    expected = math.log(points[1][1] / points[0][1]) / math.log(points[1][0] / points[0][0])
    assert abs(report["growth_exponents"]["fast.wall_seconds"] - expected) < 1e-9
    assert report["growth_exponents"]["fast.peak_memory_bytes"] is None  # no GPU memory on a CPU
    assert script.exponent([(1.0, 2.0), (2.0, 8.0), (4.0, 32.0)]) == 2.0


@pytest.mark.slow  # two fresh child processes (the peak memory must be the ranking's own)
def test_the_cpu_mode_measures_each_ranking_with_and_without_a_budget_that_holds(tmp_path):
    script = load_benchmark("scale")
    output = tmp_path / "memory.json"
    assert script.main(["--cpu-memory", "--memory-shapes", "tiny", "--presets", "fast", "--memory-images", "4",
                        "--generations", "1", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    (row,) = report["memory_rows"]
    assert report["memory_checks"] == {"budgets_hold": True, "rankings_equal": True}
    assert row["same_ranking"] and row["max_relative_score_difference"] <= 1e-6
    free, budgeted = row["unbudgeted"], row["budgeted"]
    assert 0 < budgeted["peak_bytes"] <= 1.1 * row["budget_bytes"] and free["peak_bytes"] > 0
    # The budget split the gradient steps; every phase was timed and its peak sampled.
    assert budgeted["micro_batches"]["gradient"] < free["micro_batches"]["gradient"]
    assert set(free["phases"]) >= {"data", "gradients", "search"} and free["phase_peak_bytes"]["gradients"] > 0
