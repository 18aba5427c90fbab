"""The "cka" fitness measure: linear CKA of a pruned model's embeddings with the dense model's, checked against a
Gram-matrix formula of CKA, and wired through SnapViTConfig into the search."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.pruning.methods.snapvit.cka import linear_cka, linear_cka_matrix
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.data.views import MultiCropConfig
from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}


def gram_cka(x: np.ndarray, y: np.ndarray) -> float:
    """CKA from the centred Gram matrices (HSIC form), an independent route to the feature-space formula."""
    n = len(x)
    centre = np.eye(n) - 1.0 / n
    k, l = centre @ x @ x.T @ centre, centre @ y @ y.T @ centre
    return float(np.sum(k * l) / (np.linalg.norm(k) * np.linalg.norm(l)))


def test_linear_cka_is_one_for_rotations_and_scalings_and_matches_the_gram_formula():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=torch.float64))
    assert linear_cka(x, 3.0 * x @ rotation + 5.0).item() == pytest.approx(1.0, abs=1e-12)
    y = torch.randn(50, 4, generator=gen, dtype=torch.float64) + 0.5 * x[:, :4]
    assert linear_cka(x, y).item() == pytest.approx(gram_cka(x.numpy(), y.numpy()), abs=1e-12)
    assert linear_cka(x, y).item() == pytest.approx(linear_cka_matrix([x, y])[0, 1], abs=1e-12)
    assert 0 < linear_cka(x, y).item() < 1
    assert linear_cka(x, torch.ones(50, 3, dtype=torch.float64)).item() == 0.0  # constant: no geometry


def test_cka_fitness_scores_the_sliced_models_embeddings():
    model = CASE["dinov2"].build()
    pixels = torch.randn(12, 3, 32, 32)
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.3, 0.5), pca_components=4, measure="cka")
    ranking = hs.rank(model, method="random", seed=2)
    assert fitness.similarity(hs.rank(model), 0.0) == pytest.approx(1.0, abs=1e-5)  # the teacher itself
    expected = []
    for sparsity in (0.3, 0.5):
        sliced = slice_model_(copy.deepcopy(model), ranking.keep_indices(ranking.keep_counts(sparsity)))
        with torch.no_grad():
            pruned = fitness.project(image_embedding(sliced, {"pixel_values": pixels}))
        expected.append(gram_cka(pruned.double().numpy(), fitness.target.double().numpy()))
        assert fitness.similarity(ranking, sparsity) == pytest.approx(expected[-1], abs=1e-4)
    assert fitness.loss(ranking) == pytest.approx(1 - np.mean(expected), abs=1e-4)
    cosine = EmbeddingFitness(model, pixels, sparsities=(0.3, 0.5), pca_components=4)
    assert cosine.loss(ranking) != pytest.approx(fitness.loss(ranking), abs=1e-4)  # a different objective
    with pytest.raises(hs.SnapViTError, match="image_similarities needs measure='cosine'"):
        fitness.image_similarities(ranking)
    with pytest.raises(hs.SnapViTError, match=r"measure='l2'.*\('cosine', 'cka', 'blocks'\)"):
        EmbeddingFitness(model, pixels, measure="l2")


def test_blocks_fitness_compares_every_blocks_output_of_the_sliced_model():
    """Against the sliced model's hidden states (transformers' output_hidden_states), token-averaged per block."""
    model = CASE["dinov2"].build()
    pixels = torch.randn(10, 3, 32, 32)
    with torch.no_grad():
        dense = torch.stack(model(pixel_values=pixels, output_hidden_states=True).hidden_states[1:]).mean(2)
    hooks = [len(layer._forward_hooks) for layer in model.encoder.layer]  # transformers keeps its own
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.4,), pca_components=4, measure="blocks")
    mean = dense.mean(1, keepdim=True)
    assert fitness.similarity(hs.rank(model), 0.0) == pytest.approx(1.0, abs=1e-5)
    ranking = hs.rank(model, method="random", seed=3)
    sliced = slice_model_(copy.deepcopy(model), ranking.keep_indices(ranking.keep_counts(0.4)))
    with torch.no_grad():
        pruned = torch.stack(sliced(pixel_values=pixels, output_hidden_states=True).hidden_states[1:]).mean(2)
    expected = torch.nn.functional.cosine_similarity(pruned - mean, dense - mean, dim=2).mean().item()
    assert fitness.similarity(ranking, 0.4) == pytest.approx(expected, abs=1e-5)
    assert expected < 0.999  # a pruned model's blocks drift
    assert [len(layer._forward_hooks) for layer in model.encoder.layer] == hooks  # the fitness left none behind
    with pytest.raises(hs.SnapViTError, match="image_similarities needs measure='cosine'"):
        fitness.image_similarities(ranking)


def test_snapvit_searches_on_the_cka_measure_when_asked():
    model = CASE["vit"].build()
    config = hs.SnapViTConfig(num_gradient_images=3, num_fitness_images=6, pca_components=8,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), max_generations=2,
                              fitness_sparsities=(0.1, 0.3), fitness_measure="cka", seed=1)
    ranking = hs.SnapViTPruner(config).fit(model, images(12), processor=PROCESSOR, show_progress=False)
    assert ranking.provenance["settings"]["fitness_measure"] == "cka"
    from hf_snapvit.data.calibration import split_calibration

    split = split_calibration(images(12), 3, 6, seed=1)
    precision = {"fp32": "no", "bf16": "bf16"}[ranking.provenance["precision"]]
    pixels = PROCESSOR(images=split.fitness, return_tensors="pt")["pixel_values"]
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3), pca_components=8, precision=precision,
                               measure="cka")
    assert fitness.loss(ranking) == pytest.approx(ranking.provenance["search"]["loss"], abs=1e-6)
    with pytest.raises(hs.SnapViTError, match=r"fitness_measure='l2'.*'cosine', 'cka', 'blocks'"):
        hs.SnapViTConfig(fitness_measure="l2")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_blocks_fitness_reads_every_family(case):
    """Every supported family's blocks are hooked (whatever their layers return): the dense model scores 1, a random
    ranking less, and the embedding path is the one the other measures use."""
    model = case.build()
    fitness = EmbeddingFitness(model, case.pixels(6) if hasattr(case, "pixels") else torch.randn(6, 3, 32, 32),
                               sparsities=(0.4,), pca_components=4, measure="blocks")
    assert fitness.block_target.shape[:2] == (model_layers(model), 6)
    assert fitness.similarity(hs.rank(model), 0.0) == pytest.approx(1.0, abs=1e-4)
    assert fitness.similarity(hs.rank(model, method="random", seed=1), 0.4) < 0.99999  # BEiT: ~0.99996 (layer scale)


def model_layers(model) -> int:
    from hf_snapvit.architectures import get_layers

    return len(get_layers(model))
