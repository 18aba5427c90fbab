"""``split_fitness_images``: each fitness sparsity scored on its own share of the fitness images, checked against the
every-image fitness's per-image values, the CKA of the share, and the number of images forwarded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures import get_layers
from hf_snapvit.data.calibration import split_calibration
from hf_snapvit.pruning.methods.snapvit.cka import linear_cka
from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.data.views import MultiCropConfig
from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}
SPARSITIES = (0.1, 0.3, 0.5)


def test_each_sparsity_scores_its_own_contiguous_share_of_the_images():
    model = CASE["dinov2"].build()
    pixels = torch.randn(11, 3, 32, 32)
    every = EmbeddingFitness(model, pixels, sparsities=SPARSITIES, pca_components=4)
    split = EmbeddingFitness(model, pixels, sparsities=SPARSITIES, pca_components=4, split_images=True)
    assert [(s.start, s.stop) for s in split.shares] == [(0, 4), (4, 7), (7, 11)]  # 11 images, 3 sparsities
    ranking = hs.rank(model, method="random", seed=4)
    per_image = every.image_similarities(ranking)  # [sparsities, images]: every image at every sparsity
    expected = [per_image[j, rows].mean().item() for j, rows in enumerate(split.shares)]
    assert split.similarities(ranking).tolist() == pytest.approx(expected, abs=1e-5)
    assert split.loss(ranking) == pytest.approx(1 - np.mean(expected), abs=1e-5)
    assert split.loss(ranking) != pytest.approx(every.loss(ranking), abs=1e-5)  # not the every-image loss
    # The per-image values and the one-sparsity similarity still cover every image.
    torch.testing.assert_close(split.image_similarities(ranking), per_image)
    assert split.similarity(ranking, 0.3) == pytest.approx(per_image[1].mean().item(), abs=1e-5)


def test_split_cka_is_the_cka_of_each_share():
    model = CASE["vit"].build()
    pixels = torch.randn(12, 3, 32, 32)
    split = EmbeddingFitness(model, pixels, sparsities=(0.3, 0.5), pca_components=4, measure="cka",
                             split_images=True)
    ranking = hs.rank(model, method="random", seed=5)
    for j, (sparsity, rows) in enumerate(zip((0.3, 0.5), split.shares)):
        pruned = split.project(split.embed(ranking.keep_indices(ranking.keep_counts(sparsity))))
        expected = linear_cka(pruned[rows], split.target[rows]).item()
        assert split.similarities(ranking)[j].item() == pytest.approx(expected, abs=1e-5)


def test_split_blocks_measure_compares_each_shares_block_outputs():
    model = CASE["dinov2"].build()
    pixels = torch.randn(8, 3, 32, 32)
    every = EmbeddingFitness(model, pixels, sparsities=(0.4, 0.4), pca_components=4, measure="blocks")
    split = EmbeddingFitness(model, pixels, sparsities=(0.4, 0.4), pca_components=4, measure="blocks",
                             split_images=True)
    ranking = hs.rank(model, method="random", seed=6)
    # Both shares at one sparsity, equal halves: their mean is the every-image value.
    assert split.similarities(ranking).mean().item() == pytest.approx(every.similarity(ranking, 0.4), abs=1e-5)
    assert split.similarities(ranking)[0].item() != pytest.approx(split.similarities(ranking)[1].item(), abs=1e-6)


def test_split_forwards_each_image_once_per_candidate():
    model = CASE["vit"].build()
    pixels = torch.randn(10, 3, 32, 32)
    counts = {}
    for split_images in (False, True):
        fitness = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3, 0.5, 0.6), pca_components=4, batch_size=3,
                                   split_images=split_images)
        seen = []

        def count(module, args, kwargs, output) -> None:
            seen.append(len(args[0] if args else kwargs["hidden_states"]))

        handle = get_layers(fitness.work)[0].register_forward_hook(count, with_kwargs=True)
        fitness.loss(hs.rank(model, method="random", seed=1))
        handle.remove()
        counts[split_images] = sum(seen)
    assert counts == {False: 40, True: 10}


def test_split_needs_two_images_per_sparsity():
    model = CASE["vit"].build()
    with pytest.raises(hs.SnapViTError, match=r"deals 5 fitness images out among 3 sparsities; give at least 6"):
        EmbeddingFitness(model, torch.randn(5, 3, 32, 32), sparsities=SPARSITIES, split_images=True)
    with pytest.raises(hs.SnapViTError, match=r"num_fitness_images=7.*give num_fitness_images >= 8"):
        hs.SnapViTConfig(num_fitness_images=7, split_fitness_images=True)
    with pytest.raises(hs.SnapViTError, match=r"split_fitness_images='yes'.*True or False"):
        hs.SnapViTConfig(split_fitness_images="yes")


def test_snapvit_searches_on_split_images_and_records_it():
    model = CASE["vit"].build()
    config = hs.SnapViTConfig(num_gradient_images=3, num_fitness_images=8, pca_components=8,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), max_generations=2,
                              fitness_sparsities=(0.1, 0.3), split_fitness_images=True, seed=1)
    ranking = hs.SnapViTPruner(config).fit(model, images(11), processor=PROCESSOR, show_progress=False)
    assert ranking.provenance["settings"]["split_fitness_images"] is True
    assert ranking.provenance["preset"] is None  # no preset splits its images
    calibration = split_calibration(images(11), 3, 8, seed=1)
    precision = {"fp32": "no", "bf16": "bf16"}[ranking.provenance["precision"]]
    pixels = PROCESSOR(images=calibration.fitness, return_tensors="pt")["pixel_values"]
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3), pca_components=8, precision=precision,
                               split_images=True)
    assert fitness.loss(ranking) == pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
