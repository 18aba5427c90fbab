"""Per-layer allocation heatmap of an elastic ranking (the paper's "normalized parameter allocation" figure).

For each sparsity of a grid the ranking is resolved to per-block keep counts; one panel shows the kept fraction of
attention heads per block, the other the kept fraction of FFN neurons. Rows are sparsities, columns are blocks.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..errors import BudgetError, ConfigError
from ..utils.extras import require_extra
from .figure import new_figure, save_png

if TYPE_CHECKING:  # matplotlib is optional (hf-snapvit[plots]) and imported only to draw
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..elastic.ranking import ElasticRanking

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
    what = "plot_allocation (the per-block allocation heatmap)"
    require_extra("matplotlib", what)
    if ax is None:
        figure = new_figure(what, max(6.0, 0.55 * ranking.shape.num_layers + 2.5), 2.0 + 0.9 * len(sparsities))
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
        save_png(figure, path)
    return figure
