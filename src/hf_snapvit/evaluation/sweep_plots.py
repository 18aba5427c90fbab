"""Plots of a sweep: accuracy against sparsity or GFLOPs, measured latency and speedup, and each ranking's
allocation heatmap."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..extras import require_extra
from ..files import atomic_file
from ..elastic.ranking import ElasticRanking
from .sweep_result import ACCURACY_METRICS, SweepResult


def _figure(panels: int):
    require_extra("matplotlib", "The sweep's plots (pass plots=False to skip them)")
    # A bare Figure on an Agg canvas: no pyplot state and no global backend switch, so it works headless.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(panels, 2)
    rows = math.ceil(panels / columns)
    figure = Figure(figsize=(5.2 * columns, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for extra in axes[panels:]:
        extra.set_visible(False)
    return figure, axes[:panels]


def _save_png(figure, path: Path) -> None:
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=120)


def _method_rows(result: SweepResult) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in result.rows:
        grouped.setdefault(row["method"], []).append(row)
    return {name: sorted(rows, key=lambda r: r["sparsity"]) for name, rows in grouped.items()}


def plot_accuracy(result: SweepResult, path: str | os.PathLike, x: str = "sparsity") -> list[str]:
    """Accuracy of every method against ``x`` (``"sparsity"`` or ``"gflops"``), one panel per metric present.

    Every line starts at the dense model. Returns the metrics drawn.
    """
    present = [(key, label) for key, label in ACCURACY_METRICS if result.dense.get(key) is not None]
    if not present:
        return []
    figure, axes = _figure(len(present))
    grouped = _method_rows(result)
    for axis, (key, label) in zip(axes, present):
        for method, rows in grouped.items():
            points = [result.dense, *rows]
            xs = [100 * p["sparsity"] if x == "sparsity" else p["gflops"] for p in points]
            axis.plot(xs, [100 * p[key] if p[key] is not None else float("nan") for p in points], marker="o",
                      markersize=3, label=method)
        axis.set_title(label, fontsize=10)
        axis.set_xlabel("sparsity (% of backbone parameters removed)" if x == "sparsity" else "GFLOPs per image")
        axis.set_ylabel("%")
        axis.grid(alpha=0.3)
        if x == "gflops":
            axis.invert_xaxis()  # left to right: from the dense model to the smallest
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{result.settings.get('model') or 'model'}: {result.dense['num_eval']} evaluation images",
                    fontsize=10)
    _save_png(figure, Path(path))
    return [key for key, _ in present]


def plot_latency(result: SweepResult, path: str | os.PathLike) -> None:
    """Measured latency (left; the dense median over the sweep divided by each pair's measured speedup) and realised
    vs theoretical speedup (right) against sparsity, one line per method."""
    figure, axes = _figure(2)
    grouped = _method_rows(result)
    colors = {}
    for method, rows in grouped.items():
        xs = [0.0, *(100 * r["sparsity"] for r in rows)]
        # Each sliced model was timed against its own dense run; scaling by that pair's ratio removes the drift of
        # a shared machine between pairs (the raw numbers are in sweep.json).
        dense_ms = result.dense["latency_ms"]
        line, = axes[0].plot(xs, [dense_ms, *(dense_ms / r["speedup"] for r in rows)], marker="o", markersize=3,
                             label=method)
        colors[method] = line.get_color()
        axes[1].plot(xs, [1.0, *(r["speedup"] for r in rows)], marker="o", markersize=3, color=colors[method],
                     label=f"{method} (measured)")
        axes[1].plot(xs, [1.0, *(r["theoretical_speedup"] for r in rows)], linestyle="--", color=colors[method],
                     alpha=0.6, label=f"{method} (GFLOP ratio)")
    latency = result.settings["latency"]
    threads = f"{latency['threads']} thread" + ("s" if latency["threads"] != 1 else "")
    axes[0].set_title(f"forward latency, batch {latency['batch_size']}, {threads}", fontsize=10)
    axes[0].set_ylabel("ms: dense median / measured speedup")
    axes[1].set_title("speedup over dense: measured vs theoretical", fontsize=10)
    axes[1].set_ylabel("x dense")
    for axis in axes:
        axis.set_xlabel("sparsity (% of backbone parameters removed)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=7)
    _save_png(figure, Path(path))


def write_plots(result: SweepResult, rankings: Mapping[str, ElasticRanking], output: Path) -> dict[str, str]:
    """Every plot the result allows, written into ``output``; returns name -> file name (in ``output``) of each."""
    files = {}
    if plot_accuracy(result, output / "accuracy_vs_sparsity.png", x="sparsity"):
        files["accuracy_vs_sparsity"] = "accuracy_vs_sparsity.png"
        plot_accuracy(result, output / "accuracy_vs_gflops.png", x="gflops")
        files["accuracy_vs_gflops"] = "accuracy_vs_gflops.png"
    if result.rows and all(r.get("latency_ms") is not None for r in result.rows):
        plot_latency(result, output / "latency_vs_sparsity.png")
        files["latency_vs_sparsity"] = "latency_vs_sparsity.png"
    from ..plotting import plot_allocation

    for name, ranking in rankings.items():
        grid = [s for s in result.settings["sparsities"] if s <= ranking.max_sparsity]
        if grid:
            path = output / f"allocation_{name}.png"
            plot_allocation(ranking, path, sparsities=grid)
            files[f"allocation_{name}"] = path.name
    return files


