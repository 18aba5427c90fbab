"""The latency tables of a switchable model against sparsity, beside the GFLOP ratio they promise."""

from __future__ import annotations

import pytest

import hf_snapvit as hs
from hf_snapvit.plots import plot_latency_table


def test_the_latency_plot_draws_one_line_per_table_and_the_gflop_promise(tmp_path):
    tables = [hs.LatencyTable(device="cpu: test (2 threads)", dtype=dtype, batch_size=4, width_multiple=1,
                              sparsities=(0.0, 0.3, 0.6), gflops=(3.0, 2.1, 1.2), latency_ms=(9.0, 7.0, 5.0))
              for dtype in ("float32", "bfloat16")]
    figure = plot_latency_table(tables, tmp_path / "latency.png")
    latency, speed = figure.axes
    assert len(latency.lines) == 2 and len(speed.lines) == 3
    assert list(speed.lines[-1].get_ydata()) == pytest.approx([1.0, 3.0 / 2.1, 2.5])
    assert (tmp_path / "latency.png").stat().st_size > 0
    with pytest.raises(hs.ConfigError, match="at least one LatencyTable"):
        plot_latency_table([])
