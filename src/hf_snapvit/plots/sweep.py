"""Plots of a sweep (:func:`hf_snapvit.evaluation.run_sweep`): accuracy against sparsity or GFLOPs, measured latency
and speedup, and each ranking's allocation heatmap.

They are drawn from plain rows, the mappings ``sweep.json`` holds (``dense``, ``rows``, ``settings``), so a sweep's
plots can be redrawn from its file without the evaluation harness::

    record = json.loads(Path("sweep/sweep.json").read_text())
    plot_accuracy(record["rows"], "accuracy.png", dense=record["dense"], x="gflops")
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .allocation import plot_allocation
from .figure import new_figure, save_png

if TYPE_CHECKING:
    from ..elastic.ranking import ElasticRanking

#: The accuracy metrics a sweep row may hold, with the title of each one's panel, in panel order.
ACCURACY_METRICS: tuple[tuple[str, str], ...] = (
    ("top1", "top-1 (model's head)"),
    ("knn_top1", "k-NN top-1"),
    ("linear_top1", "linear-probe top-1"),
    ("retention", "retention (cosine to dense)"),
)
_AXES = ("sparsity", "gflops")
_SPARSITY_LABEL = "sparsity (% of backbone parameters removed)"


def _panels(what: str, panels: int):
    """A figure of ``panels`` axes, two a row, and those axes."""
    columns = min(panels, 2)
    rows = math.ceil(panels / columns)
    figure = new_figure(what, 5.2 * columns, 3.8 * rows)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for extra in axes[panels:]:
        extra.set_visible(False)
    return figure, axes[:panels]


def _by_method(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["method"], []).append(row)
    return {name: sorted(group, key=lambda r: r["sparsity"]) for name, group in grouped.items()}


def plot_accuracy(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    dense: Mapping[str, Any],
    x: str = "sparsity",
    metrics: Sequence[tuple[str, str]] = ACCURACY_METRICS,
    model: str | None = None,
) -> list[str]:
    """Accuracy of every method against ``x``, one panel per metric the dense row has, one line per method.

    Args:
        rows: A sweep's rows, each with ``method``, ``sparsity``, ``gflops`` and the metrics (``None`` where a
            metric was not measured).
        path: Where to write the PNG (atomically).
        dense: The dense model's row: every line starts at it, and a metric is drawn when it has a value there. Its
            ``num_eval`` (the number of evaluation images) goes in the title.
        x: ``"sparsity"`` (percent of backbone parameters removed) or ``"gflops"`` (per image, dense on the left).
        metrics: ``(key, panel title)`` of each metric that may be drawn, in panel order.
        model: The model's name, for the title.

    Returns:
        The keys of the metrics drawn; empty when the dense row has none, and then nothing is written.

    Raises:
        ConfigError: ``x`` is neither ``"sparsity"`` nor ``"gflops"``.
        MissingExtraError: matplotlib is not installed (``pip install "hf-snapvit[plots]"``).
    """
    if x not in _AXES:
        raise ConfigError(f"x={x!r} is not an axis of plot_accuracy; use one of {list(_AXES)}.")
    present = [(key, label) for key, label in metrics if dense.get(key) is not None]
    if not present:
        return []
    figure, axes = _panels("plot_accuracy (accuracy against sparsity)", len(present))
    grouped = _by_method(rows)
    for axis, (key, label) in zip(axes, present):
        for method, group in grouped.items():
            points = [dense, *group]
            xs = [100 * p["sparsity"] if x == "sparsity" else p["gflops"] for p in points]
            axis.plot(xs, [100 * p[key] if p.get(key) is not None else float("nan") for p in points], marker="o",
                      markersize=3, label=method)
        axis.set_title(label, fontsize=10)
        axis.set_xlabel(_SPARSITY_LABEL if x == "sparsity" else "GFLOPs per image")
        axis.set_ylabel("%")
        axis.grid(alpha=0.3)
        if x == "gflops":
            axis.invert_xaxis()  # left to right: from the dense model to the smallest
    axes[0].legend(fontsize=8)
    images = dense.get("num_eval")
    figure.suptitle((model or "model") + (f": {images} evaluation images" if images is not None else ""), fontsize=10)
    save_png(figure, path, dpi=120)
    return [key for key, _ in present]


def plot_latency(
    rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, dense: Mapping[str, Any], batch_size: int,
    threads: int,
) -> None:
    """Measured latency (left) and realised vs theoretical speedup (right) against sparsity, one line per method.

    The latency of a sliced model is the dense median divided by its measured speedup: each sliced model was timed
    against its own dense run, and scaling by that pair's ratio removes the drift of a shared machine between pairs
    (the raw numbers stay in the rows).

    Args:
        rows: A sweep's rows, each with ``method``, ``sparsity``, ``speedup`` and ``theoretical_speedup``.
        path: Where to write the PNG (atomically).
        dense: The dense model's row, with its median ``latency_ms``.
        batch_size, threads: The measurement's batch size and CPU threads, for the title.

    Raises:
        ConfigError: no rows, or a row without a measured speedup, or a dense row without ``latency_ms`` (a sweep
            run with ``latency=False``).
        MissingExtraError: matplotlib is not installed (``pip install "hf-snapvit[plots]"``).
    """
    if not rows or dense.get("latency_ms") is None or any(r.get("speedup") is None for r in rows):
        raise ConfigError("plot_latency needs rows with a measured speedup and a dense row with its latency_ms; "
                          "run the sweep with latency=True.")
    figure, axes = _panels("plot_latency (latency against sparsity)", 2)
    dense_ms = dense["latency_ms"]
    for method, group in _by_method(rows).items():
        xs = [0.0, *(100 * r["sparsity"] for r in group)]
        line, = axes[0].plot(xs, [dense_ms, *(dense_ms / r["speedup"] for r in group)], marker="o", markersize=3,
                             label=method)
        color = line.get_color()
        axes[1].plot(xs, [1.0, *(r["speedup"] for r in group)], marker="o", markersize=3, color=color,
                     label=f"{method} (measured)")
        axes[1].plot(xs, [1.0, *(r["theoretical_speedup"] for r in group)], linestyle="--", color=color,
                     alpha=0.6, label=f"{method} (GFLOP ratio)")
    axes[0].set_title(f"forward latency, batch {batch_size}, {threads} thread" + ("s" if threads != 1 else ""),
                      fontsize=10)
    axes[0].set_ylabel("ms: dense median / measured speedup")
    axes[1].set_title("speedup over dense: measured vs theoretical", fontsize=10)
    axes[1].set_ylabel("x dense")
    for axis in axes:
        axis.set_xlabel(_SPARSITY_LABEL)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=7)
    save_png(figure, path, dpi=120)


def write_sweep_plots(
    output: str | os.PathLike,
    *,
    dense: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    rankings: Mapping[str, "ElasticRanking"],
) -> dict[str, str]:
    """Every plot a sweep's rows allow, written into ``output``.

    Args:
        output: The sweep's folder.
        dense, rows: As in :func:`plot_accuracy`.
        settings: The sweep's settings: its ``sparsities``, the ``model``'s name and the ``latency`` protocol
            (``batch_size``, ``threads``).
        rankings: Method name -> its ranking, for one allocation heatmap each (``allocation_<name>.png``).

    Returns:
        Plot name -> file name (in ``output``) of each plot written.
    """
    output, files = Path(output), {}
    model = settings.get("model")
    if plot_accuracy(rows, output / "accuracy_vs_sparsity.png", dense=dense, x="sparsity", model=model):
        files["accuracy_vs_sparsity"] = "accuracy_vs_sparsity.png"
        plot_accuracy(rows, output / "accuracy_vs_gflops.png", dense=dense, x="gflops", model=model)
        files["accuracy_vs_gflops"] = "accuracy_vs_gflops.png"
    if rows and all(r.get("latency_ms") is not None for r in rows):
        latency = settings["latency"]
        plot_latency(rows, output / "latency_vs_sparsity.png", dense=dense, batch_size=latency["batch_size"],
                     threads=latency["threads"])
        files["latency_vs_sparsity"] = "latency_vs_sparsity.png"
    for name, ranking in rankings.items():
        grid = [s for s in settings["sparsities"] if s <= ranking.max_sparsity]
        if grid:
            path = output / f"allocation_{name}.png"
            plot_allocation(ranking, path, sparsities=grid)
            files[f"allocation_{name}"] = path.name
    return files
