"""Determinism on the real ViT-Tiny: two independent SnapViT runs with one seed give the same ranking, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import load_dataset
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit as hs
from hf_snapvit.data.views import MultiCropConfig
from hf_snapvit.pruning.scoring import ScoreConfig
from helpers import SHARED, SHARED_MODEL, SHARED_TRAIN, requires_shared

MODEL = SHARED / "models" / "vit-tiny-tinyimagenet"
TRAIN = SHARED / "data" / "tiny-imagenet-200" / "train.parquet"


def run(seed: int) -> tuple[hs.ElasticRanking, list]:
    # A fresh load per run: nothing may leak from one run into the next through the model object.
    model = AutoModelForImageClassification.from_pretrained(MODEL).eval()
    processor = AutoImageProcessor.from_pretrained(MODEL)
    data = load_dataset("parquet", data_files={"train": str(TRAIN)}, split="train")
    config = hs.SnapViTConfig.preset(
        "fast", seed=seed, num_gradient_images=3, num_fitness_images=4, max_generations=None, max_evaluations=3,
        scores=ScoreConfig(definition="obd", crops=MultiCropConfig(num_local=2, local_size=96)),
        fitness_sparsities=(0.3,),
    )
    pruner = hs.SnapViTPruner(config)
    return pruner.fit(model, data, processor=processor, show_progress=False), pruner.history_


@requires_shared(SHARED_MODEL, SHARED_TRAIN)
@pytest.mark.slow
def test_same_seed_same_ranking_on_the_real_model():
    (a, history_a), (b, history_b) = run(0), run(0)
    assert np.array_equal(a.head_scores, b.head_scores) and np.array_equal(a.neuron_scores, b.neuron_scores)
    assert history_a == history_b
    assert a.sorted().to_dict() == b.sorted().to_dict()
    c, _ = run(1)
    assert not np.array_equal(a.neuron_scores, c.neuron_scores)
