"""Per-layer allocation heatmap of an elastic ranking (the paper's "normalized parameter allocation" figure).

For each sparsity of a grid the ranking is resolved to per-block keep counts; one panel shows the kept fraction of
attention heads per block, the other the kept fraction of FFN neurons. Rows are sparsities, columns are blocks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import BudgetError, ConfigError
from .extras import require_extra
from .files import atomic_file

if TYPE_CHECKING:  # matplotlib is optional (hf-snapvit[plots]) and imported only to draw
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from .elastic.latency_file import LatencyTable
    from .elastic.ranking import ElasticRanking

DEFAULT_SPARSITIES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)


def allocation_table(
    ranking: "ElasticRanking", sparsities: Sequence[float] = DEFAULT_SPARSITIES, width_multiple: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Kept fractions behind the heatmap.

    Args:
        ranking: The elastic ranking to resolve.
        sparsities: Fractions of backbone parameters removed, each in ``[0, ranking.max_sparsity]``.
        width_multiple: As in :meth:`~hf_snapvit.ElasticRanking.keep_counts`.

    Returns:
        ``(heads, neurons)``, two ``[len(sparsities), num_layers]`` arrays: the fraction of each block's heads
        (FFN neurons) kept at each sparsity.
    """
    sparsities = list(sparsities)
    if not sparsities:
        raise BudgetError("sparsities is empty; give at least one sparsity, e.g. sparsities=(0.1, 0.3, 0.5).")
    shape = ranking.shape
    heads = np.empty((len(sparsities), shape.num_layers))
    neurons = np.empty((len(sparsities), shape.num_layers))
    for row, sparsity in enumerate(sparsities):
        # raises BudgetError naming the valid range
        counts = ranking.keep_counts(sparsity=sparsity, width_multiple=width_multiple)
        heads[row] = np.asarray(counts.heads) / shape.num_heads
        neurons[row] = np.asarray(counts.neurons) / shape.intermediate_size
    return heads, neurons


def plot_allocation(
    ranking: "ElasticRanking",
    path: str | os.PathLike | None = None,
    sparsities: Sequence[float] = DEFAULT_SPARSITIES,
    ax: "Sequence[Axes] | None" = None,
    width_multiple: int | None = None,
) -> "Figure":
    """Draw the per-layer allocation heatmap: kept fraction of heads and of FFN neurons per block and sparsity.

    Args:
        ranking: The elastic ranking to draw.
        path: Where to write a PNG (atomically: temp file + ``os.replace``); ``None`` writes nothing.
        sparsities: Sparsities (rows), each in ``[0, ranking.max_sparsity]``; the paper's grid by default.
        ax: Two matplotlib axes to draw into (heads, neurons); by default a new figure with two panels.
        width_multiple: As in :meth:`~hf_snapvit.ElasticRanking.keep_counts`.

    Returns:
        The matplotlib figure holding the two panels.

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install "hf-snapvit[plots]"``).
    """
    require_extra("matplotlib", "plot_allocation (the per-block allocation heatmap)")
    if ax is None:
        # A bare Figure on an Agg canvas: no pyplot, no global backend switch, works headless and in threads.
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(max(6.0, 0.55 * ranking.shape.num_layers + 2.5), 2.0 + 0.9 * len(sparsities)),
                        layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(2, 1, sharex=True)
    else:
        axes = list(ax)
        if len(axes) != 2:
            raise ConfigError(f"ax must hold exactly two axes (heads, neurons); got {len(axes)}.")
        figure = axes[0].get_figure()

    heads, neurons = allocation_table(ranking, sparsities, width_multiple)
    shape = ranking.shape
    labels = [f"{s:.0%}" for s in sparsities]
    blocks = np.arange(shape.num_layers)
    image = None
    panels = (
        (axes[0], heads, f"Attention heads kept (of {shape.num_heads} per block)"),
        (axes[1], neurons, f"FFN neurons kept (of {shape.intermediate_size} per block)"),
    )
    for axis, table, title in panels:
        image = axis.imshow(table, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto", interpolation="nearest")
        axis.set_title(title, fontsize=10)
        axis.set_yticks(range(len(labels)), labels)
        axis.set_ylabel("sparsity")
        if table.size <= 400:  # annotate small grids only; big ones would be unreadable
            for (r, c), value in np.ndenumerate(table):
                axis.text(c, r, f"{value:.0%}", ha="center", va="center", fontsize=6,
                          color="white" if value < 0.6 else "black")
    axes[1].set_xticks(blocks, [str(b) for b in blocks])  # from 0, as the cards' tables and the modules count
    axes[1].set_xlabel("block")
    figure.colorbar(image, ax=list(axes), label="kept fraction", shrink=0.9)
    method = ranking.provenance.get("method")
    figure.suptitle(f"Per-block allocation ({shape.model_type}" + (f", {method} ranking)" if method else ")"),
                    fontsize=11)

    if path is not None:
        _save_atomic(figure, Path(path))
    return figure


def _save_atomic(figure: "Figure", path: Path) -> None:
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=150)


def plot_latency_table(tables: "Sequence[LatencyTable]", path: str | os.PathLike | None = None) -> "Figure":
    """Measured latency against sparsity, one line per latency table (device, dtype, batch size), with each size's
    theoretical GFLOPs as a second panel, so the realised and the promised speedup read side by side.

    The latency panel's points of the first table are annotated with the GFLOPs of one image at that size; its axis
    is logarithmic when the tables' dense latencies differ more than 4x (batch sizes far apart).

    Args:
        tables: Latency tables (:func:`hf_snapvit.measure_latency`), at least one.
        path: Where to write a PNG (atomically); ``None`` writes nothing.

    Returns:
        The matplotlib figure: the latency panel, then the speedup panel.

    Raises:
        ConfigError: no table was given.
        MissingExtraError: matplotlib is not installed (``pip install "hf-snapvit[plots]"``).
    """
    require_extra("matplotlib", "plot_latency_table (latency against sparsity)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    tables = list(tables)
    if not tables:
        raise ConfigError("plot_latency_table needs at least one LatencyTable (hf_snapvit.measure_latency).")
    figure = Figure(figsize=(9.0, 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    latency, speed = figure.subplots(1, 2)
    for table in tables:
        label = f"{table.device.split(' (')[0]}, {table.dtype}, batch {table.batch_size}"
        latency.plot(table.sparsities, table.latency_ms, marker="o", label=label)
        speed.plot(table.sparsities, [table.latency_ms[0] / ms for ms in table.latency_ms], marker="o", label=label)
    speed.plot(tables[0].sparsities, [tables[0].gflops[0] / g for g in tables[0].gflops], "k--",
               label="GFLOP ratio (the promise)")
    for s, ms, g in zip(tables[0].sparsities, tables[0].latency_ms, tables[0].gflops):  # GFLOPs of one image
        latency.annotate(f"{g:.3g} GF", (s, ms), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=6)
    dense = [t.latency_ms[0] for t in tables]
    if min(dense) > 0 and max(dense) / min(dense) > 4:  # batch sizes far apart: a log axis keeps every line readable
        from matplotlib.ticker import LogFormatter

        latency.set_yscale("log")
        latency.yaxis.set_major_formatter(LogFormatter())
        latency.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))
    latency.margins(y=0.12)  # room for the annotations above the top point
    latency.set(xlabel="sparsity", ylabel="latency per forward pass (ms)", title="Measured latency")
    speed.set(xlabel="sparsity", ylabel="speedup over dense (x)", title="Measured speedup vs GFLOP ratio")
    for axis in (latency, speed):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    if path is not None:
        _save_atomic(figure, Path(path))
    return figure
