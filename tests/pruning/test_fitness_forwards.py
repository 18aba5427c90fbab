"""Cheaper search forwards: ``fitness_image_size`` (the fitness images at another side) and
``fitness_token_fraction`` (a fixed random share of each image's patch tokens), the teacher and every candidate alike.
Checked against embeddings of independently resized images and a hand-run ViT on the kept tokens, the tokens each
block sees, batch independence, the architectures that cannot take part of the tokens, and a fit's recorded loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hf_snapvit as hs
from hf_snapvit.architectures import get_backbone, get_layers, get_spec
from hf_snapvit.data.calibration import split_calibration
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.pruning.methods.snapvit.token_subset import TokenSubset
from hf_snapvit.data.views import MultiCropConfig
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

def test_the_blocks_see_the_kept_tokens_of_an_ordinary_input():
    model = CASE["vit"].build()  # 32 px, patch 8: 16 patches and the CLS token
    pixels = torch.randn(5, 3, 32, 32)
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4, token_fraction=0.5, seed=7,
                               batch_size=2)
    subsets = TokenSubset(1, 0.5, 7, "vit")
    backbone = get_backbone(model, get_spec(model))
    with torch.no_grad():  # by hand: embed, keep each image's tokens, run the blocks and the final norm
        hidden = backbone.embeddings(pixels)
        kept = torch.stack([hidden[i, subsets.kept(i, 17)] for i in range(5)])
        for layer in get_layers(model):
            kept = layer(kept)
            kept = kept[0] if isinstance(kept, tuple) else kept
        expected = backbone.layernorm(kept)[:, 0]
    torch.testing.assert_close(fitness.embed(None), expected)
    for i in range(5):
        index = subsets.kept(i, 17)
        assert len(index) == 1 + 8 and index[0] == 0 and torch.all(index[1:] > 0)  # the CLS token and 8 patches
        assert torch.equal(index, index.sort().values)
    assert not torch.equal(subsets.kept(0, 17), subsets.kept(1, 17))  # each image its own subset
    assert not torch.equal(subsets.kept(0, 17), TokenSubset(1, 0.5, 8, "vit").kept(0, 17))  # and seed


@pytest.mark.parametrize("case", ["vit", "deit", "dinov2-registers", "siglip-vision", "clip-vision"])
def test_the_teacher_and_each_candidate_see_the_same_tokens_whatever_the_batch(case):
    model = CASE[case].build()
    pixels = torch.randn(6, 3, 32, 32)
    ranking = hs.rank(model, method="random", seed=1)
    by_two = EmbeddingFitness(model, pixels, sparsities=(0.0, 0.4), pca_components=4, token_fraction=0.5,
                              batch_size=2)
    by_four = EmbeddingFitness(model, pixels, sparsities=(0.0, 0.4), pca_components=4, token_fraction=0.5,
                               batch_size=4)
    # At sparsity 0 a candidate is the dense model: on the same tokens it matches the teacher exactly.
    assert by_two.similarities(ranking)[0].item() == pytest.approx(1.0, abs=1e-5)
    torch.testing.assert_close(by_two.similarities(ranking), by_four.similarities(ranking))
    whole = EmbeddingFitness(model, pixels, sparsities=(0.0, 0.4), pca_components=4)
    assert by_two.loss(ranking) != pytest.approx(whole.loss(ranking), abs=1e-6)  # fewer tokens: another fitness
    every = EmbeddingFitness(model, pixels, sparsities=(0.0, 0.4), pca_components=4, token_fraction=1.0)
    assert every.loss(ranking) == whole.loss(ranking)


@pytest.mark.parametrize("case", ["beit", "data2vec-vision", "dinov3", "vit-mae", "siglip2-vision"])
def test_architectures_whose_blocks_cannot_take_part_of_the_tokens_are_refused(case):
    model = CASE[case].build()
    with pytest.raises(hs.SnapViTError, match=r"token_fraction=0.5\): a '.+' model's blocks cannot.*token_fraction=1"):
        EmbeddingFitness(model, torch.randn(4, 3, 32, 32), token_fraction=0.5)


def test_a_registered_spec_whose_blocks_take_per_token_inputs_fails_clearly():
    layer = torch.nn.Identity()
    subset = TokenSubset(1, 0.5, 0, "my_vit")
    subset.images = range(2)
    with subset.on(layer):
        with pytest.raises(hs.SnapViTError, match=r"'my_vit'.*per-token inputs.*fitness_token_fraction at 1.0"):
            layer(torch.randn(2, 17, 8), torch.zeros(2, 1, 17, 17))  # hidden states and an attention mask
    assert not layer._forward_pre_hooks  # the hook is removed on leaving


def test_bad_fractions_are_refused():
    model = CASE["vit"].build()
    for bad in (0, 1.5, -0.5, True, "0.5"):
        with pytest.raises(hs.SnapViTError, match=r"token_fraction=.*in \(0, 1\]"):
            EmbeddingFitness(model, torch.randn(4, 3, 32, 32), token_fraction=bad)
        with pytest.raises(hs.SnapViTError, match=r"fitness_token_fraction=.*in \(0, 1\]"):
            hs.SnapViTConfig(fitness_token_fraction=bad)


@pytest.mark.parametrize("setting, options", [("fitness_image_size", {"image_size": 24}),
                                              ("fitness_token_fraction", {"token_fraction": 0.5})])
def test_snapvit_searches_with_the_cheaper_forward_and_records_it(setting, options):
    model = CASE["vit"].build()
    value = next(iter(options.values()))
    config = hs.SnapViTConfig(num_gradient_images=3, num_fitness_images=6, pca_components=6,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), max_generations=2,
                              fitness_sparsities=(0.1, 0.3), seed=2, **{setting: value})
    ranking = hs.SnapViTPruner(config).fit(model, images(9), processor=PROCESSOR, show_progress=False)
    assert ranking.provenance["settings"][setting] == value and ranking.provenance["preset"] is None
    calibration = split_calibration(images(9), 3, 6, seed=2)
    precision = {"fp32": "no", "bf16": "bf16"}[ranking.provenance["precision"]]
    pixels = PROCESSOR(images=calibration.fitness, return_tensors="pt")["pixel_values"]
    common = dict(sparsities=(0.1, 0.3), pca_components=6, precision=precision)
    recorded = ranking.provenance["search"]["loss"]
    assert EmbeddingFitness(model, pixels, seed=2, **common, **options).loss(ranking) == pytest.approx(recorded,
                                                                                                       abs=1e-6)
    assert EmbeddingFitness(model, pixels, **common).loss(ranking) != pytest.approx(recorded, abs=1e-6)
