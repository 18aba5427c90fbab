"""What every plot shares: a headless matplotlib figure and its atomic PNG write."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..utils.extras import require_extra
from ..utils.files import atomic_file

if TYPE_CHECKING:  # matplotlib is optional (hf-snapvit[plots]) and imported only to draw
    from matplotlib.figure import Figure


def new_figure(what: str, width: float, height: float) -> "Figure":
    """An empty ``width`` x ``height`` inch figure with a constrained layout.

    Args:
        what: What is drawn, for the error when matplotlib is missing (e.g. ``"plot_allocation (the heatmap)"``).
        width, height: The figure's size in inches.

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install "hf-snapvit[plots]"``).
    """
    require_extra("matplotlib", what)
    # A bare Figure on an Agg canvas: no pyplot, no global backend switch, works headless and in threads.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_png(figure: "Figure", path: str | os.PathLike, dpi: int = 150) -> None:
    """Write ``figure`` to ``path`` as a PNG, atomically (temp file + ``os.replace``): a failed write leaves what was
    there and no temp file."""
    with atomic_file(Path(path), "wb") as handle:
        figure.savefig(handle, format="png", dpi=dpi)
