"""benchmarks/recovery_vit_tiny.py: presets and flags reach RecoveryConfig, and one run on a tiny random ViT records
every variant at every sparsity, with the settings it used, and plots them."""

from __future__ import annotations

import json
import warnings

import pytest

import hf_snapvit

from helpers import load_benchmark, recovery_benchmark_inputs


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("recovery_vit_tiny")


def test_presets_fill_in_only_what_is_not_given(bench):
    args = bench.parse_args(["--preset", "cpu", "--steps", "7", "--lr", "3e-4", "--logits-weight", "0",
                             "--crop-scale", "0.3", "0.9"])
    assert args.steps == 7 and args.batch_size == bench.PRESETS["cpu"]["batch_size"]
    config = bench.recovery_config(args, elastic=False)
    assert (config.steps, config.lr, config.logits_weight, config.crop_scale) == (7, 3e-4, 0.0, (0.3, 0.9))
    assert config.hidden_weight == hf_snapvit.RecoveryConfig().hidden_weight  # not given: the library default
    elastic = bench.recovery_config(args, elastic=True)
    assert elastic.elastic and elastic.steps == bench.PRESETS["cpu"]["elastic_steps"]
    assert elastic.elastic_range == (0.0, max(bench.PRESETS["cpu"]["sparsities"]))
    band = bench.parse_args(["--preset", "cpu", "--elastic-range", "0.3", "0.5"])
    assert bench.recovery_config(band, elastic=True).elastic_range == (0.3, 0.5)
    full = bench.parse_args(["--preset", "full"])
    assert full.steps > args.steps and full.num_calibration == 4000


@pytest.mark.slow  # several tiny trainings and evaluations
def test_one_run_records_every_variant_and_plots(bench, tmp_path):
    elastic, calibration, val, bank = recovery_benchmark_inputs(tmp_path, 12)
    args = bench.parse_args(["--model", str(elastic), "--sparsities", "0.2", "0.4", "--steps", "2",
                             "--elastic-steps", "3", "--batch-size", "4", "--num-correction", "8", "--k", "3",
                             "--tag", "t"])
    rows: list[dict] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the verbs, not the deprecated from_pretrained(recovery_data=)
        bench.run(args, str(elastic), calibration, val, bank, "cpu", rows.append)
    names = {(r["sparsity"], r["variant"]) for r in rows}
    assert names == {(0.0, "dense")} | {(s, v) for s in (0.2, 0.4)
                                         for v in ("none", "correction", "recovery-t", "correction+recovery-t",
                                                   "elastic-t")}
    for row in rows:
        assert 0.0 <= row["top1"] <= 1.0 and 0.0 <= row["knn_top1"] <= 1.0
    recovered = [r for r in rows if r["variant"] in ("recovery-t", "correction+recovery-t")]
    assert all(r["settings"]["steps"] == 2 and r["settings"]["batch_size"] == 4 for r in recovered)
    shared = {r["fit_seconds_shared_by_all_sizes"] for r in rows if r["variant"] == "elastic-t"}
    assert len(shared) == 1  # one elastic training serves every size
    by = {(r["sparsity"], r["variant"]): r for r in rows}
    assert all(by[(s, "correction+recovery-t")]["correction"]["num_images"] == 8 for s in (0.2, 0.4))
    assert all("correction" not in by[(s, "recovery-t")] for s in (0.2, 0.4))
    assert by[(0.4, "none")]["gflops"] == by[(0.4, "recovery-t")]["gflops"] == by[(0.4, "elastic-t")]["gflops"]

    out = tmp_path / "r.png"
    bench.plot({"rows": rows, "device": "cpu"}, out)
    assert out.stat().st_size > 1000
    json.dumps(rows, default=str)  # what main() writes


def test_a_stored_ranking_is_read_in_either_format(bench, tmp_path):
    # The defaults sweep's unsorted scores (no shape: the model gives it) and ElasticRanking.to_dict (with a shape).
    import numpy as np

    from helpers import CASES

    model = next(c for c in CASES if c.name == "vit").build()
    ranking = hf_snapvit.rank(model, method="magnitude", show_progress=False)
    sweep = {"head_scores": ranking.head_scores.tolist(), "neuron_scores": ranking.neuron_scores.tolist(),
             "mode": ranking.mode, "info": {"spec": "x"}}
    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    # The stored format holds scores in rank order, compactly: the expected values are its own round trip.
    stored = hf_snapvit.ElasticRanking.from_dict(ranking.sorted().to_dict())
    (tmp_path / "full.json").write_text(json.dumps(ranking.sorted().to_dict()))
    from_sweep = bench.stored_ranking(tmp_path / "sweep.json", model)
    from_dict = bench.stored_ranking(tmp_path / "full.json", model)
    for read, expected in ((from_sweep, ranking), (from_dict, stored)):
        np.testing.assert_array_equal(read.neuron_scores, expected.neuron_scores)
        np.testing.assert_array_equal(read.head_scores, expected.head_scores)
    assert from_sweep.provenance["stored_ranking"] == "sweep.json" and from_sweep.provenance["defaults_sweep"] == {
        "spec": "x"}
