"""``fitness_image_size``: the search forwards the fitness images at another side, the teacher and every candidate
alike, checked against embeddings of independently resized images, the tokens each block sees, and a fit's recorded
loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_snapvit as hs
from hf_snapvit.architectures import get_layers
from hf_snapvit.calibration import split_calibration
from hf_snapvit.embedding import image_embedding
from hf_snapvit.fitness import EmbeddingFitness
from hf_snapvit.scoring import ScoreConfig
from hf_snapvit.views import MultiCropConfig
from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}


def resized(pixels: torch.Tensor, side: int) -> torch.Tensor:
    return F.interpolate(pixels, size=(side, side), mode="bilinear", antialias=True, align_corners=False)


@pytest.mark.parametrize("case", ["vit", "dinov2"])
def test_the_teacher_and_the_candidates_see_the_images_at_the_given_side(case):
    model = CASE[case].build()
    pixels = torch.randn(6, 3, 32, 32)
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4, image_size=16)
    torch.testing.assert_close(fitness.pixel_values, pixels)  # kept as given for other readers
    with torch.no_grad():
        teacher = image_embedding(model, {"pixel_values": resized(pixels, 16)}).float()
    torch.testing.assert_close(fitness.embed(None), teacher)
    tokens = []
    handle = get_layers(fitness.work)[0].register_forward_hook(
        lambda module, args, kwargs, output: tokens.append((args[0] if args else kwargs["hidden_states"]).shape[1]),
        with_kwargs=True)
    ranking = hs.rank(model, method="random", seed=3)
    small = fitness.loss(ranking)
    handle.remove()
    assert tokens and set(tokens) == {(16 // 8) ** 2 + 1}  # 2 x 2 patches of 8 pixels and the CLS token
    full = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4)
    assert small != pytest.approx(full.loss(ranking), abs=1e-6)  # another fitness, not the full-size one


def test_the_given_side_of_the_images_changes_nothing():
    model = CASE["vit"].build()
    pixels = torch.randn(6, 3, 32, 32)
    ranking = hs.rank(model, method="random", seed=2)
    same = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.5), pca_components=4, image_size=32)
    plain = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.5), pca_components=4)
    assert same.loss(ranking) == plain.loss(ranking)


def test_a_side_below_the_patch_size_or_not_an_integer_is_refused():
    model = CASE["vit"].build()
    with pytest.raises(hs.SnapViTError, match=r"image_size=4.*patch size \(8 pixels\).*e\.g\. 128"):
        EmbeddingFitness(model, torch.randn(4, 3, 32, 32), image_size=4)
    for bad in (0, "128", 12.5, True):
        with pytest.raises(hs.SnapViTError, match=r"fitness_image_size=.*integer >= 1 or None"):
            hs.SnapViTConfig(fitness_image_size=bad)


def test_snapvit_searches_at_the_fitness_side_and_records_it():
    model = CASE["vit"].build()
    config = hs.SnapViTConfig(num_gradient_images=3, num_fitness_images=6, pca_components=6,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), max_generations=2,
                              fitness_sparsities=(0.1, 0.3), fitness_image_size=24, seed=1)
    ranking = hs.SnapViTPruner(config).fit(model, images(9), processor=PROCESSOR, show_progress=False)
    assert ranking.provenance["settings"]["fitness_image_size"] == 24
    assert ranking.provenance["preset"] is None
    calibration = split_calibration(images(9), 3, 6, seed=1)
    precision = {"fp32": "no", "bf16": "bf16"}[ranking.provenance["precision"]]
    pixels = PROCESSOR(images=calibration.fitness, return_tensors="pt")["pixel_values"]
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3), pca_components=6, precision=precision,
                               image_size=24)
    assert fitness.loss(ranking) == pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
    full = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3), pca_components=6, precision=precision)
    assert full.loss(ranking) != pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
