"""benchmarks/switching_vit_b.py runs end to end on a 2-block toy ViT and records the invariants a switch must keep
(storage untouched, one copy of the dense weights); timings are recorded, never asserted. And plot_latency_table
on a hand-built table."""

from __future__ import annotations

import json
import math

import pytest

import hf_snapvit
from hf_snapvit.errors import ConfigError
from hf_snapvit.plotting import plot_latency_table
from helpers import load_benchmark


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    output = tmp_path_factory.mktemp("switching") / "switching.json"
    result = load_benchmark("switching_vit_b").main(
        ["--tiny", "--device", "cpu", "--batch-sizes", "2", "1", "--repeats", "2", "--warmup", "0", "--switches", "12",
         "--table-repeats", "1", "--output", str(output)])
    return output, result


def test_the_json_is_what_main_returned_and_the_plot_sits_beside_it(report):
    output, result = report
    assert json.loads(output.read_text()) == json.loads(json.dumps(result))
    assert output.with_suffix(".png").stat().st_size > 0 and result["plot"] == "switching.png"
    for key in ("command", "hardware", "versions", "model", "settings", "switch", "memory", "storage",
                "latency_at_50", "latency_tables", "criteria", "load_warnings", "budget_at_50"):
        assert key in result, key
    assert result["command"].startswith("python benchmarks/switching_vit_b.py --tiny")
    assert set(result["versions"]) >= {"torch", "transformers"} and result["hardware"]["device"] == "cpu"
    assert result["model"]["config"]["num_hidden_layers"] == 2


def test_storage_is_untouched_and_holds_one_copy_of_the_dense_weights(report):
    _, result = report
    storage = result["storage"]
    assert storage["unchanged"] is True and storage["changed"] == []
    assert storage["switchable_parameter_bytes"] == storage["dense_parameter_bytes"] > 0
    assert storage["shapes_equal_dense"] is True
    criteria = result["criteria"]
    assert criteria["data_pointers_and_sizes_unchanged"] is True
    assert criteria["one_copy_of_the_dense_weights"] is True
    assert criteria["outputs_equal_sliced"] is True and criteria["loading_warned_nothing"] is True
    assert result["load_warnings"] == []


def test_switch_times_memory_and_latencies_are_recorded_per_batch_size(report):
    _, result = report
    switch = result["switch"]
    assert switch["sequence"] == [0.3, 0.0, 0.5, 0.1, 0.5, 0.3]
    for part in ("set_budget", "raw_width_change"):
        assert switch[part]["count"] == len(switch[part]["runs_ms"]) == 12
        assert 0 <= switch[part]["min_ms"] <= switch[part]["median_ms"] <= switch[part]["p90_ms"] <= \
            switch[part]["max_ms"]
    assert set(switch["first_resolution_ms"]) == {"0.3", "0.0", "0.5", "0.1"}
    memory = result["memory"]
    assert memory["switches"] == 12 and "VmHWM" in memory["before"] and "VmHWM" in memory["after"]
    assert isinstance(memory["peak_rss_growth_bytes"], int)
    assert set(result["latency_at_50"]) == {"2", "1"}
    for row in result["latency_at_50"].values():
        assert len(row["runs_ms"]["switchable"]) == len(row["runs_ms"]["sliced"]) == 2
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0 and row["paired_ratio_median"] > 0
    assert set(result["criteria"]["latency_within_1.1x_of_sliced"]) == {"2", "1"}
    assert all(isinstance(v, bool) for v in result["criteria"]["latency_within_1.1x_of_sliced"].values())
    assert abs(result["budget_at_50"]["sparsity"] - 0.5) < 0.1


def test_one_latency_table_per_batch_size_with_gflops_per_size(report):
    _, result = report
    tables = [hf_snapvit.LatencyTable.from_dict(t) for t in result["latency_tables"]]
    assert [t.batch_size for t in tables] == [2, 1]
    for table in tables:
        assert table.sparsities[0] == 0.0 and len(table.gflops) == len(table.sparsities) >= 2
        assert list(table.gflops) == sorted(table.gflops, reverse=True)


def test_plot_latency_table_draws_a_labelled_line_per_table_with_gflops(tmp_path):
    tables = [hf_snapvit.LatencyTable(device="cpu: test (2 threads)", dtype="float32", batch_size=batch,
                                      width_multiple=64, sparsities=(0.0, 0.25, 0.5), gflops=(17.6, 13.1, 8.9),
                                      latency_ms=tuple(ms * batch for ms in (100.0, 80.0, 60.0)))
              for batch in (1, 8)]
    path = tmp_path / "plots" / "latency.png"
    path.parent.mkdir()
    figure = plot_latency_table(tables, path)
    latency = figure.axes[0]
    assert [line.get_label() for line in latency.lines] == ["cpu: test, float32, batch 1", "cpu: test, float32, batch 8"]
    assert list(latency.lines[1].get_ydata()) == [800.0, 640.0, 480.0]
    assert [t.get_text() for t in latency.texts] == ["17.6 GF", "13.1 GF", "8.9 GF"]
    assert latency.get_yscale() == "log"  # 60 ms to 800 ms
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_latency_table(tables[:1]).axes[0].get_yscale() == "linear"
    with pytest.raises(ConfigError):
        plot_latency_table([])
