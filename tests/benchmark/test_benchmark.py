"""hf_snapvit.benchmark returns complete, consistent structures (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.benchmark import (
    add_load_ratios,
    compare_latency,
    device_slug,
    format_latency_table,
    hardware_info,
    latency_vs_sparsity,
    load_child_main,
    measure_latency,
)
from hf_snapvit.errors import BenchmarkError, ConfigError
from helpers import CASES

CASE = {c.name: c for c in CASES}


def test_compare_latency_interleaves_every_model():
    models = {"a": CASE["vit"].build(), "b": CASE["vit-cls"].build()}
    calls = []
    for name, model in models.items():
        model.register_forward_hook(lambda module, args, output, name=name: calls.append(name))
    result = compare_latency(models, [1, 3], repeats=3, warmup=1)
    assert set(result) == {"a", "b"}
    for name in models:
        for batch in (1, 3):
            entry = result[name][str(batch)]
            assert len(entry["runs_ms"]) == 3 and entry["min_ms"] <= entry["median_ms"]
            assert entry["throughput"] == pytest.approx(batch / (entry["median_ms"] / 1e3))
    # Per batch size: one warm-up each, then rounds in rotating order a b, b a, a b.
    assert calls[:8] == ["a", "b", "a", "b", "b", "a", "a", "b"]
    with pytest.raises(BenchmarkError, match="repeats >= 1"):
        compare_latency(models, [1], repeats=0)
    # The old name still works for one release, saying the new one.
    calls.clear()
    with pytest.warns(FutureWarning, match="compare_latency"):
        old = measure_latency(models, [2], repeats=2, warmup=0)
    assert calls == ["a", "b", "b", "a"] and len(old["b"]["2"]["runs_ms"]) == 2


def test_latency_vs_sparsity_reports_realised_and_theoretical_speedups():
    model = CASE["vit-cls"].build()
    ranking = hs.rank(model, method="magnitude")
    result = latency_vs_sparsity(model, ranking, [0.2, 0.5], batch_sizes=[2], repeats=2, show_progress=False)
    assert result["dense"]["theoretical_speedup"] == 1.0 and result["dense"]["speedup"]["2"] == 1.0
    previous = result["dense"]
    for row, sparsity in zip(result["rows"], (0.2, 0.5)):
        counts = ranking.keep_counts(sparsity)
        assert row["sparsity"] == counts.sparsity and row["heads"] == counts.heads
        assert row["theoretical_speedup"] == pytest.approx(result["dense"]["gflops"] / row["gflops"])
        assert row["gflops"] < previous["gflops"]
        assert row["efficiency"]["2"] == pytest.approx(row["speedup"]["2"] / row["theoretical_speedup"])
        previous = row
    assert len(format_latency_table(result).splitlines()) == 2 + 3
    with pytest.raises(BenchmarkError, match="out of range"):
        latency_vs_sparsity(model, ranking, [0.99], batch_sizes=[1], repeats=1, show_progress=False)


def test_rank_records_wall_time_and_snapvit_phases():
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    model = CASE["vit"].build()
    ranking = hs.rank(model, "magnitude", show_progress=False)
    timing = ranking.provenance["timings"]
    assert ranking.provenance["method"] == "magnitude" and timing["wall_seconds"] >= 0 and timing["phases"] == {}
    assert ranking.provenance["method"] == "magnitude"
    config = hs.SnapViTConfig(num_gradient_images=2, num_fitness_images=4, max_generations=1, max_evaluations=None,
                              fitness_sparsities=(0.3,), pca_components=4,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    ranking = hs.rank(model, "snapvit", torch.randn(6, 3, 32, 32), config=config, show_progress=False)
    timing = ranking.provenance["timings"]
    assert {"data", "gradients", "search"} <= set(timing["phases"])
    assert sum(timing["phases"][k] for k in ("data", "gradients", "search")) <= timing["wall_seconds"]
    # A full config and a preset at once is ambiguous (timed_rank raised BenchmarkError here; rank() ConfigError).
    with pytest.raises(ConfigError, match="Give either config=SnapViTConfig"):
        hs.rank(model, "snapvit", torch.randn(6, 3, 32, 32), config=config, preset="fast")


def test_load_child_measures_one_configuration(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path / "elastic")
    spec = {"checkpoint": str(tmp_path / "elastic"), "kind": "elastic", "sparsity": 0.4, "threads": 1,
            "batch_sizes": [1, 2], "repeats": 2, "warmup": 0, "warm_loads": 1, "poll_ms": 1.0, "seed": 0,
            "forward": True, "result_path": str(tmp_path / "result.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert load_child_main(str(tmp_path / "spec.json")) == 0  # in-process here; benchmarks run it in a child
    result = json.loads((tmp_path / "result.json").read_text())
    loaded = hs.ElasticViTModel.from_pretrained(tmp_path / "elastic", sparsity=0.4)
    assert result["model"]["backbone_params"] == hs.backbone_parameters(loaded)
    assert result["model"]["heads_per_block"] == layer_widths(loaded)[0]
    assert result["load_s"] > 0 and len(result["warm_load_s_runs"]) == 1
    assert set(result["latency"]) == {"1", "2"} and "anon_growth" in result["memory"]
    dense = {**result, "model": {**result["model"], "backbone_params": 2 * result["model"]["backbone_params"]}}
    rows = [dense, result]
    add_load_ratios(rows, dense, [1, 2])
    assert result["actual_sparsity"] == pytest.approx(0.5)
    assert result["ratios_to_elastic_dense"]["latency_b2"] == pytest.approx(1.0)


def test_hardware_info_names_the_machine():
    info = hardware_info(3)
    assert info["torch_threads"] == 3 and info["torch"] == torch.__version__
    assert info["cpu_count"] >= 1 and info["device"] == "cpu"


def test_results_are_named_for_the_gpu_else_the_device():
    assert device_slug(hardware_info(device="cpu")) == "cpu"
    assert device_slug({"device": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3"
    assert device_slug({"device": "cuda:1"}) == "cuda:1"
