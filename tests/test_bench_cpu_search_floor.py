"""benchmarks/cpu_search_floor.py: a recorded search's GFLOPs against this CPU's matrix-multiply rate, on a tiny ViT."""

from __future__ import annotations

import json

import numpy as np
import pytest
import transformers

import hf_snapvit
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.budget import estimate_gflops, model_shape

from helpers import load_benchmark, tiny_vit_classifier

floor = load_benchmark("cpu_search_floor")

TIMINGS = {"data": 1.0, "unit_order": 2.0, "gradients": 3.0, "search": 10.0, "search_forward": 8.0}


def _backbone() -> transformers.ViTModel:
    return transformers.ViTModel(tiny_vit_classifier().config, add_pooling_layer=False)


def _inputs(tmp_path, cpu_model=None, **settings):
    model = tiny_vit_classifier()
    model.save_pretrained(tmp_path / "model")
    rng = np.random.default_rng(0)
    # The search forwards the backbone: its GFLOPs leave the classifier out.
    ranking = hf_snapvit.ElasticRanking(head_scores=rng.random((2, 4)), neuron_scores=rng.random((2, 37)),
                                        shape=model_shape(_backbone()))
    stored = {"head_scores": ranking.head_scores.tolist(), "neuron_scores": ranking.neuron_scores.tolist(),
              "mode": ranking.mode, "min_head_keep_ratio": ranking.min_head_keep_ratio,
              "min_neuron_keep_ratio": ranking.min_neuron_keep_ratio,
              "paired_head_offset": ranking.paired_head_offset}
    (tmp_path / "ranking.json").write_text(json.dumps(stored))
    fit = {"settings": {"num_fitness_images": 8, "fitness_sparsities": [0.1, 0.3], "fitness_batch_size": 4,
                        **settings},
           "history": [{"evaluations": 3}, {"evaluations": 6}], "timings": TIMINGS, "wall_seconds": 20.0,
           "hardware": {"cpu_model": cpu_model or hardware_info()["cpu_model"]}}
    (tmp_path / "fit.json").write_text(json.dumps(fit))
    args = ["--fit", str(tmp_path / "fit.json"), "--ranking", str(tmp_path / "ranking.json"), "--model",
            str(tmp_path / "model"), "--sizes", "16", "32", "--repeats", "1", "--output", str(tmp_path / "out.json")]
    return args, ranking


def test_the_floor_is_the_searchs_gflops_at_the_best_matrix_multiply_rate(tmp_path):
    args, ranking = _inputs(tmp_path)
    assert floor.main(args) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    backbone = _backbone()
    # The teacher's dense pass over the 8 fitness images, then 6 evaluations at 10 and 30 %.
    gflops = 8 * (estimate_gflops(backbone) + 6 * (ranking.keep_counts(0.1).gflops + ranking.keep_counts(0.3).gflops))
    search = report["search"]
    assert search["images_forwarded"] == 8 * (1 + 6 * 2) and search["gflops"] == pytest.approx(gflops)
    peak = max(report["matmul_gflops_per_second"].values())
    assert set(report["matmul_gflops_per_second"]) == {"16", "32"} and peak > 0
    assert search["gflops_per_second"] == pytest.approx(gflops / 8.0)
    assert search["of_matmul_peak"] == pytest.approx(gflops / 8.0 / peak)
    assert search["forward_floor_seconds"] == pytest.approx(gflops / peak)
    # The search's own overhead (2 s) and the other phases (6 s) stay as the fit measured them.
    assert report["ranking_floor_seconds"] == pytest.approx(gflops / peak + 2.0 + 6.0)
    dense = report["dense_forward"]
    assert dense["batch_size"] == 4 and dense["images_per_second"] > 0
    assert dense["gflops_per_second"] == pytest.approx(dense["images_per_second"] * estimate_gflops(backbone))


@pytest.mark.parametrize("settings, message", [
    ({"split_fitness_images": True}, "whole forwards"),
    ({"fitness_token_fraction": 0.5}, "whole forwards"),
    ({"cpu_model": "Another CPU"}, "measure the floor where the fit ran"),
])
def test_refuses_a_fit_it_cannot_count_or_one_from_another_cpu(tmp_path, settings, message):
    args, _ = _inputs(tmp_path, **settings)
    with pytest.raises(SystemExit, match=message):
        floor.main(args)
    assert not (tmp_path / "out.json").exists()
