"""Measured latency against sparsity: the latency tables of a switchable model (:func:`hf_snapvit.measure_latency`)
beside the GFLOP ratio they promise."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

from ..errors import ConfigError
from ..utils.extras import require_extra
from .figure import new_figure, save_png

if TYPE_CHECKING:  # matplotlib is optional (hf-snapvit[plots]) and imported only to draw
    from matplotlib.figure import Figure

    from ..elastic.latency_file import LatencyTable


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
    what = "plot_latency_table (latency against sparsity)"
    require_extra("matplotlib", what)
    tables = list(tables)
    if not tables:
        raise ConfigError("plot_latency_table needs at least one LatencyTable (hf_snapvit.measure_latency).")
    figure = new_figure(what, 9.0, 3.6)
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
        save_png(figure, path)
    return figure
