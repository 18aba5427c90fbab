"""Every plot hf_snapvit draws, headless (a bare matplotlib figure on an Agg canvas) and written atomically.

* :mod:`.allocation`: the per-block allocation heatmap of a ranking (:func:`plot_allocation`, also
  ``hf_snapvit.plot_allocation``; the kept fractions behind it, :func:`allocation_table`);
* :mod:`.latency`: the latency tables of a switchable model against sparsity (:func:`plot_latency_table`);
* :mod:`.sweep`: a sweep's accuracy and latency against sparsity, drawn from its plain rows (:func:`plot_accuracy`,
  :func:`plot_latency`, :func:`write_sweep_plots`);
* :mod:`.figure`: the figure and PNG write they share.

matplotlib is optional (``pip install "hf-snapvit[plots]"``) and imported only to draw, so importing this package
costs nothing. ``hf_snapvit.plotting`` and ``hf_snapvit.evaluation.plot_accuracy`` / ``plot_latency`` are the
deprecated names of these functions (a ``FutureWarning``).

May import the shared modules and the elastic format (for type hints of rankings and latency tables); never
loading, the pruner, evaluation, publishing or the CLI. Loading a model never imports it.
"""

from __future__ import annotations

from .allocation import DEFAULT_SPARSITIES, allocation_table, plot_allocation
from .latency import plot_latency_table
from .sweep import ACCURACY_METRICS, plot_accuracy, plot_latency, write_sweep_plots

__all__ = [
    "ACCURACY_METRICS",
    "DEFAULT_SPARSITIES",
    "allocation_table",
    "plot_accuracy",
    "plot_allocation",
    "plot_latency",
    "plot_latency_table",
    "write_sweep_plots",
]
