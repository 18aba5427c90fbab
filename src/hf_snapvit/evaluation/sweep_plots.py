"""Deprecated: a sweep's plots are drawn by :mod:`hf_snapvit.plots` from the sweep's plain rows (as ``sweep.json``
holds them). These adapters take a :class:`~hf_snapvit.evaluation.SweepResult` as before and warn with a
``FutureWarning``; they go in a later release."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from .. import plots
from ..elastic.ranking import ElasticRanking
from .sweep_result import SweepResult


def _moved(old: str, new: str) -> None:
    warnings.warn(f"hf_snapvit.evaluation.{old} is deprecated and will be removed in a later release; call "
                  f"hf_snapvit.plots.{new}, which draws the same plot from the sweep's rows.", FutureWarning,
                  stacklevel=3)


def plot_accuracy(result: SweepResult, path: str | os.PathLike, x: str = "sparsity") -> list[str]:
    """Deprecated: ``hf_snapvit.plots.plot_accuracy(result.rows, path, dense=result.dense, x=x)``. Returns the
    metrics drawn."""
    _moved("plot_accuracy(result, path, x)", "plot_accuracy(result.rows, path, dense=result.dense, x=x)")
    return plots.plot_accuracy(result.rows, path, dense=result.dense, x=x, model=result.settings.get("model"))


def plot_latency(result: SweepResult, path: str | os.PathLike) -> None:
    """Deprecated: ``hf_snapvit.plots.plot_latency(result.rows, path, dense=result.dense, batch_size=...,
    threads=...)`` with the sweep's ``settings["latency"]``."""
    latency = result.settings["latency"]
    _moved("plot_latency(result, path)", "plot_latency(result.rows, path, dense=result.dense, "
           f"batch_size={latency['batch_size']}, threads={latency['threads']})")
    plots.plot_latency(result.rows, path, dense=result.dense, batch_size=latency["batch_size"],
                       threads=latency["threads"])


def write_plots(result: SweepResult, rankings: Mapping[str, ElasticRanking], output: Path) -> dict[str, str]:
    """Deprecated: ``hf_snapvit.plots.write_sweep_plots(output, dense=result.dense, rows=result.rows,
    settings=result.settings, rankings=rankings)``."""
    _moved("sweep_plots.write_plots(result, rankings, output)", "write_sweep_plots(output, dense=result.dense, "
           "rows=result.rows, settings=result.settings, rankings=rankings)")
    return plots.write_sweep_plots(output, dense=result.dense, rows=result.rows, settings=result.settings,
                                   rankings=rankings)
