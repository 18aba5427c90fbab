"""``fitness_token_fraction``: the search forwards a fixed random share of each fitness image's patch tokens, checked
against a hand-run ViT on the same tokens, the teacher and candidates seeing the same subsets, batch independence,
the architectures that cannot take it, and a fit's recorded loss."""

from __future__ import annotations

import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures import get_backbone, get_layers, get_spec
from hf_snapvit.calibration import split_calibration
from hf_snapvit.fitness import EmbeddingFitness
from hf_snapvit.scoring import ScoreConfig
from hf_snapvit.token_subset import TokenSubset
from hf_snapvit.views import MultiCropConfig
from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}


def test_the_blocks_see_the_kept_tokens_of_an_ordinary_input():
    model = CASE["vit"].build()  # 32 px, patch 8: 16 patches and the CLS token
    pixels = torch.randn(5, 3, 32, 32)
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=4, token_fraction=0.5, seed=7,
                               batch_size=2)
    subsets = TokenSubset(get_layers(model)[0], 1, 0.5, 7, "vit")
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
    assert not torch.equal(subsets.kept(0, 17), TokenSubset(None, 1, 0.5, 8, "vit").kept(0, 17))  # and seed


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


@pytest.mark.parametrize("case", ["beit", "data2vec-vision", "dinov3", "vit-mae"])
def test_architectures_whose_blocks_cannot_take_part_of_the_tokens_are_refused(case):
    model = CASE[case].build()
    with pytest.raises(hs.SnapViTError, match=r"token_fraction=0.5\): a '.+' model's blocks cannot.*token_fraction=1"):
        EmbeddingFitness(model, torch.randn(4, 3, 32, 32), token_fraction=0.5)


def test_a_registered_spec_whose_blocks_take_per_token_inputs_fails_clearly():
    layer = torch.nn.Identity()
    subset = TokenSubset(layer, 1, 0.5, 0, "my_vit")
    subset.images = range(2)
    with subset:
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


def test_snapvit_searches_on_the_token_subsets_and_records_it():
    model = CASE["vit"].build()
    config = hs.SnapViTConfig(num_gradient_images=3, num_fitness_images=6, pca_components=6,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), max_generations=2,
                              fitness_sparsities=(0.1, 0.3), fitness_token_fraction=0.5, seed=2)
    ranking = hs.SnapViTPruner(config).fit(model, images(9), processor=PROCESSOR, show_progress=False)
    assert ranking.provenance["settings"]["fitness_token_fraction"] == 0.5 and ranking.provenance["preset"] is None
    calibration = split_calibration(images(9), 3, 6, seed=2)
    precision = {"fp32": "no", "bf16": "bf16"}[ranking.provenance["precision"]]
    pixels = PROCESSOR(images=calibration.fitness, return_tensors="pt")["pixel_values"]
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3), pca_components=6, precision=precision,
                               token_fraction=0.5, seed=2)
    assert fitness.loss(ranking) == pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
    other_seed = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3), pca_components=6, precision=precision,
                                  token_fraction=0.5, seed=3)
    assert other_seed.loss(ranking) != pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
