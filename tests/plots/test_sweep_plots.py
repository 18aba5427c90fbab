"""A sweep's plots drawn from its plain rows (as sweep.json holds them), and the deprecated SweepResult adapters."""

from __future__ import annotations

import math

import pytest

from hf_snapvit import plots
from hf_snapvit.errors import ConfigError
from hf_snapvit.evaluation import SweepResult
from hf_snapvit.plots import sweep as sweep_plots

DENSE = {"method": "dense", "sparsity": 0.0, "gflops": 4.0, "top1": 0.8, "knn_top1": None, "linear_top1": None,
         "retention": 1.0, "num_eval": 20, "latency_ms": 10.0}
# Out of sparsity order, and one metric not measured at one size: lines are sorted, gaps are NaN.
ROWS = [
    {"method": "b", "sparsity": 0.5, "gflops": 2.0, "top1": 0.4, "retention": 0.7, "speedup": 1.8,
     "theoretical_speedup": 2.0, "latency_ms": 5.5},
    {"method": "a", "sparsity": 0.5, "gflops": 2.1, "top1": 0.5, "retention": None, "speedup": 1.7,
     "theoretical_speedup": 1.9, "latency_ms": 6.0},
    {"method": "a", "sparsity": 0.2, "gflops": 3.2, "top1": 0.7, "retention": 0.9, "speedup": 1.2,
     "theoretical_speedup": 1.25, "latency_ms": 8.0},
]


@pytest.fixture
def drawn(monkeypatch):
    """The figures the sweep plots would write, by file name (nothing is rendered to PNG)."""
    figures = {}
    monkeypatch.setattr(sweep_plots, "save_png", lambda figure, path, dpi: figures.__setitem__(path.name, figure))
    return figures


def test_accuracy_and_latency_are_drawn_from_plain_rows(drawn, tmp_path):
    assert plots.plot_accuracy(ROWS, tmp_path / "acc.png", dense=DENSE, model="vit") == ["top1", "retention"]
    top1, retention = drawn["acc.png"].axes[:2]
    lines = {line.get_label(): line for line in top1.lines}
    assert list(lines["a"].get_xdata()) == [0.0, 20.0, 50.0]  # from the dense model, in sparsity order
    assert list(lines["a"].get_ydata()) == pytest.approx([80.0, 70.0, 50.0])
    assert math.isnan(next(line for line in retention.lines if line.get_label() == "a").get_ydata()[2])
    assert drawn["acc.png"].get_suptitle() == "vit: 20 evaluation images"
    plots.plot_accuracy(ROWS, tmp_path / "flops.png", dense=DENSE, x="gflops")
    assert drawn["flops.png"].axes[0].xaxis_inverted()  # dense on the left
    with pytest.raises(ConfigError, match=r"x='params'.*\['sparsity', 'gflops'\]"):
        plots.plot_accuracy(ROWS, tmp_path / "bad.png", dense=DENSE, x="params")
    assert plots.plot_accuracy(ROWS, tmp_path / "none.png", dense={"sparsity": 0.0}) == []
    assert sorted(drawn) == ["acc.png", "flops.png"]  # nothing drawn for a bad axis or no metric

    plots.plot_latency(ROWS, tmp_path / "lat.png", dense=DENSE, batch_size=8, threads=1)
    latency, speedup = drawn["lat.png"].axes[:2]
    a = next(line for line in latency.lines if line.get_label() == "a")
    assert list(a.get_ydata()) == pytest.approx([10.0, 10.0 / 1.2, 10.0 / 1.7])  # dense median / pair's speedup
    assert sorted(line.get_label() for line in speedup.lines) == ["a (GFLOP ratio)", "a (measured)",
                                                                  "b (GFLOP ratio)", "b (measured)"]
    assert latency.get_title() == "forward latency, batch 8, 1 thread"
    with pytest.raises(ConfigError, match="latency=True"):
        plots.plot_latency([{**ROWS[0], "speedup": None}], tmp_path / "x.png", dense=DENSE, batch_size=8, threads=1)


def test_the_evaluation_names_are_deprecated_and_draw_the_same(drawn, tmp_path):
    from hf_snapvit import evaluation
    from hf_snapvit.evaluation import sweep_plots as old

    result = SweepResult(dense=DENSE, rows=ROWS, methods={"a": {}, "b": {}},
                         settings={"model": "vit", "sparsities": [0.2, 0.5], "latency": {"batch_size": 2,
                                                                                         "threads": 4}})
    with pytest.warns(FutureWarning, match=r"evaluation\.plot_accuracy.*hf_snapvit\.plots\.plot_accuracy"):
        assert evaluation.plot_accuracy(result, tmp_path / "acc.png", x="gflops") == ["top1", "retention"]
    with pytest.warns(FutureWarning, match=r"hf_snapvit\.plots\.plot_latency\(.*batch_size=2, threads=4"):
        evaluation.plot_latency(result, tmp_path / "lat.png")
    with pytest.warns(FutureWarning, match=r"write_plots.*hf_snapvit\.plots\.write_sweep_plots"):
        files = old.write_plots(result, {}, tmp_path)
    assert files == {name: f"{name}.png" for name in ("accuracy_vs_sparsity", "accuracy_vs_gflops",
                                                      "latency_vs_sparsity")}
    assert drawn["acc.png"].axes[0].xaxis_inverted() and drawn["acc.png"].get_suptitle().startswith("vit:")
    assert drawn["lat.png"].axes[0].get_title() == "forward latency, batch 2, 4 threads"
    assert evaluation.ACCURACY_METRICS is plots.ACCURACY_METRICS  # one list of metrics for tables and plots
