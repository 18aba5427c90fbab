"""benchmarks/calibration_sources.py (issue 53): its logic on tiny settings."""

from __future__ import annotations

import json

import pytest

from helpers import SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION, load_benchmark, requires_shared

calibration_sources = load_benchmark("calibration_sources")
TINY = json.dumps({"num_gradient_images": 2, "num_fitness_images": 4, "max_generations": 1, "pca_components": 4,
                   "fitness_sparsities": [0.3]})


@pytest.mark.slow  # ranks the shared ViT-Tiny four times
@requires_shared(SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION)
def test_every_source_is_ranked_and_the_stream_ranks_as_map_style(tmp_path):
    output = tmp_path / "sources.json"
    # "sorted-stream" (read to the end of 100,000 rows) and "cli" (10,000 rows) are left out of the suite's time.
    assert calibration_sources.main(["--sources", "map", "stream", "--config", TINY,
                                     "--num-val", "20", "--num-bank", "20", "--repeats", "1", "--sparsities", "0.3",
                                     "--output", str(output)]) == 0
    record = json.loads(output.read_text())
    sources = record["sources"]
    assert set(sources) == {"map", "stream"} and record["num_val"] == 20
    assert sources["stream"]["same_ranking_as_map"] is True  # the same images, so the same ranking
    assert sources["stream"]["top1"] == sources["map"]["top1"] and set(sources["map"]["knn"]) == {"0.3"}
    assert sources["map"]["calibration"]["draw"]["method"] == "random access"
    assert sources["stream"]["calibration"]["draw"]["method"] == "stream prefix"

