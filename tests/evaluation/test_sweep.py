"""run_sweep on a tiny random ViT classifier: files, rows, and agreement with direct evaluation."""

from __future__ import annotations

import csv
import json
import warnings

import datasets
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.errors import SweepError
from hf_snapvit.evaluation import CSV_COLUMNS, Evaluator, LinearProbeConfig, run_sweep, sweep_from_paths
from hf_snapvit.plots import plot_accuracy
from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: extra threads only add contention on a shared machine
    try:
        yield _run(tmp_path_factory)
    finally:
        torch.set_num_threads(threads)


def _run(tmp_path_factory):
    model = CASE["vit-cls"].build()
    magnitude = hs.rank(model, method="magnitude")
    checkpoint = tmp_path_factory.mktemp("ckpt") / "elastic-magnitude"
    hs.save_elastic(model, magnitude, checkpoint)
    generator = torch.Generator().manual_seed(0)
    data = dict(eval_data=torch.randn(20, 3, 32, 32, generator=generator), eval_labels=torch.arange(20) % 5,
                bank_data=torch.randn(30, 3, 32, 32, generator=generator), bank_labels=torch.arange(30) % 5)
    output = tmp_path_factory.mktemp("sweep")
    rankings = {"magnitude": magnitude, "random": hs.rank(model, method="random"), "saved": str(checkpoint)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_sweep(model, rankings, [0.2, 0.5, 0.95], output_dir=output, k=5,
                           probe=LinearProbeConfig(epochs=2), latency_repeats=1, latency_batch_size=2,
                           ranking_info={"random": {"wall_seconds": 1.5, "phases": {}}}, show_progress=False, **data)
    return model, rankings, data, output, result, caught


def test_sweep_writes_every_file_with_the_right_rows(sweep, tmp_path):
    model, rankings, _, output, result, caught = sweep
    names = ["sweep.json", "sweep.csv", "accuracy_vs_sparsity.png", "accuracy_vs_gflops.png",
             "latency_vs_sparsity.png", "allocation_magnitude.png", "allocation_random.png", "allocation_saved.png"]
    for name in names:
        assert (output / name).stat().st_size > 0, name
    for name in names[2:]:
        assert (output / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # 0.95 is beyond what the per-block floors allow: skipped with a warning, for every method.
    assert any("exceeds the ranking's maximum" in str(w.message) for w in caught)
    assert all(info["skipped"] == [0.95] for info in result.methods.values())
    with open(output / "sweep.csv") as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == list(CSV_COLUMNS)
    assert [(r["method"], float(r["requested_sparsity"])) for r in table] == [("dense", 0.0)] + [
        (m, s) for m in rankings for s in (0.2, 0.5)]
    saved = json.loads((output / "sweep.json").read_text())
    assert len(saved["rows"]) == 6 and saved["dense"]["retention"] == pytest.approx(1.0, abs=1e-6)
    assert saved["methods"]["random"]["ranking_seconds"] == 1.5
    assert saved["hardware"]["torch_threads"] == saved["settings"]["latency"]["threads"] >= 1
    # The rows in sweep.json are all the plots need: they redraw without the evaluation harness.
    assert plot_accuracy(saved["rows"], tmp_path / "again.png", dense=saved["dense"]) == [
        "top1", "knn_top1", "linear_top1", "retention"]
    assert (tmp_path / "again.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for row in result.rows:
        assert row["sparsity"] == pytest.approx(row["requested_sparsity"], abs=0.05)
        assert row["gflops"] < result.dense["gflops"] and row["theoretical_speedup"] > 1.0
        assert row["retention"] < 1.0 and row["latency_ms"] > 0 and row["speedup"] > 0
        assert {row["top1"], row["knn_top1"], row["linear_top1"]} <= {i / 20 for i in range(21)}


def test_sweep_rows_equal_direct_evaluation(sweep):
    model, rankings, data, _, result, _ = sweep
    evaluator = Evaluator(data["eval_data"], eval_labels=data["eval_labels"], bank_data=data["bank_data"],
                          bank_labels=data["bank_labels"], dense_model=model, k=5, probe=LinearProbeConfig(epochs=2),
                          show_progress=False)
    ranking = rankings["random"]
    sliced = slice_model_(CASE["vit-cls"].build(), ranking.keep_indices(ranking.keep_counts(0.5)))
    direct = evaluator.evaluate(sliced)
    row = next(r for r in result.rows if r["method"] == "random" and r["requested_sparsity"] == 0.5)
    for key in ("top1", "knn_top1", "linear_top1", "retention", "num_params", "gflops"):
        assert row[key] == pytest.approx(getattr(direct, key), abs=1e-6), key
    # The saved checkpoint holds the magnitude ranking: same models, same numbers, through the checkpoint path.
    for sparsity in (0.2, 0.5):
        a, b = (next(r for r in result.rows if r["method"] == m and r["requested_sparsity"] == sparsity)
                for m in ("magnitude", "saved"))
        for key in ("top1", "knn_top1", "num_params", "gflops", "heads", "neurons"):
            assert a[key] == b[key], key
        assert a["retention"] == pytest.approx(b["retention"], abs=1e-5)
    assert "magnitude" in result.to_markdown()


def test_sweep_rejects_bad_grids(tmp_path):
    model = CASE["vit-cls"].build()
    data = torch.randn(4, 3, 32, 32)
    with pytest.raises(SweepError, match=r"in \(0, 1\)"):
        run_sweep(model, {"m": hs.rank(model)}, [0.0, 1.2], data, output_dir=tmp_path)
    with pytest.raises(SweepError, match="rankings is empty"):
        run_sweep(model, {}, [0.3], data, output_dir=tmp_path)
    with pytest.raises(SweepError, match="does not fit the model"):
        run_sweep(model, {"other": hs.rank(CASE["deit"].build())}, [0.3], data, output_dir=tmp_path)
    with pytest.raises(SweepError, match="file names"):
        run_sweep(model, {"a/b": hs.rank(model)}, [0.3], data, output_dir=tmp_path)


def test_sweep_from_paths_ranks_and_records_the_ranking_time(tmp_path):
    model = CASE["vit-cls"].build()
    model.save_pretrained(tmp_path / "dense")
    PROCESSOR.save_pretrained(tmp_path / "dense")
    for split, n in (("train", 12), ("validation", 8)):
        dataset = datasets.Dataset.from_dict({"image": images(n, seed=n), "label": [i % 5 for i in range(n)]})
        dataset.cast_column("image", datasets.Image()).to_parquet(str(tmp_path / f"{split}.parquet"))
    result = sweep_from_paths(tmp_path / "dense", tmp_path, output_dir=tmp_path / "sweep", methods=["magnitude"],
                              sparsities=[0.3], num_eval=6, num_bank=10, k=3, probe=LinearProbeConfig(epochs=1),
                              latency=False, plots=False, show_progress=False)
    info = result.methods["magnitude"]
    # The wall time comes from the ranking's provenance["timings"], recorded by hf_snapvit.rank.
    assert info["method"] == "magnitude" and info["phases"] == {}
    assert info["ranking_seconds"] == info["wall_seconds"] == info["provenance"]["timings"]["wall_seconds"] > 0
    assert [row["requested_sparsity"] for row in result.rows] == [0.3] and result.dense["num_eval"] == 6
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert saved["methods"]["magnitude"]["ranking_seconds"] == info["ranking_seconds"]
    with pytest.raises(SweepError, match="at least one ranking"):
        sweep_from_paths(model, tmp_path, output_dir=tmp_path / "none")
