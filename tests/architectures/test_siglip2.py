"""SigLIP2 takes patch sequences; images are patchified exactly like its processor, so it can be scored and searched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as T

import hf_snapvit as hs
from hf_snapvit.architectures.embedding import image_embedding, input_size, patchify, unpatchify
from hf_snapvit.data.views import MultiCropConfig, model_inputs, processor_inputs
from hf_snapvit.errors import DataError, SnapViTError
from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores
from helpers import CASES, images

CASE = {c.name: c for c in CASES}


def processor():
    # The PIL backend is the one transformers falls back to without torchvision; name it to keep the log quiet.
    cls = getattr(T, "Siglip2ImageProcessorPil", T.Siglip2ImageProcessor)
    return cls(max_num_patches=16, patch_size=8)


def test_patchify_matches_the_processor_and_unpatchify_inverts_it():
    proc = processor()
    pictures = [im.resize((32, 32)) for im in images(3)]
    expected = proc(images=pictures, return_tensors="pt")
    pixels = processor_inputs(pictures, proc)
    assert pixels.shape == (3, 3, 32, 32)
    patched = patchify(pixels, 8)
    assert torch.allclose(patched["pixel_values"], expected["pixel_values"], atol=1e-6)
    assert torch.equal(patched["spatial_shapes"], expected["spatial_shapes"])
    assert torch.equal(patched["pixel_attention_mask"].bool(), expected["pixel_attention_mask"].bool())
    assert torch.equal(unpatchify(patched["pixel_values"], 8), pixels)
    # model_inputs passes the processor's outputs on; as_pixels gives the rankers' [B, C, H, W] view (the correction's)
    assert set(model_inputs(pictures, proc, "cpu", torch.float32)) == set(expected)
    assert torch.equal(model_inputs(pictures, proc, "cpu", torch.float32, as_pixels=True)["pixel_values"], pixels)
    as_float = model_inputs(torch.zeros(1, 3, 32, 32, dtype=torch.uint8), None, "cpu", torch.float32, as_pixels=True)
    assert as_float["pixel_values"].dtype == torch.float32
    with pytest.raises(DataError, match="processor"):
        model_inputs(pictures, None, "cpu", torch.float32, as_pixels=True)


def test_images_and_patch_sequences_give_the_same_embedding():
    case = CASE["siglip2-vision"]
    model = case.build()
    assert input_size(model.config) == 32
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        from_images = image_embedding(model, {"pixel_values": pixels})
        from_patches = image_embedding(model, patchify(pixels, 8))
    assert torch.allclose(from_images, from_patches, atol=1e-6)


def test_non_multiple_sizes_are_refused_with_the_patch_size():
    with pytest.raises(SnapViTError, match="multiple of 8"):
        patchify(torch.zeros(1, 3, 30, 32), 8)


def test_siglip2_is_scored_searched_and_sliced(tmp_path):
    model = CASE["siglip2-vision"].build()
    heads, neurons = gradient_scores(model, images(2), processor(), ScoreConfig(crops=MultiCropConfig(num_local=2)),
                                     show_progress=False)
    assert np.all(np.isfinite(heads)) and heads.min() >= 0 and heads.max() > 0
    assert np.all(np.isfinite(neurons)) and neurons.max() > 0
    config = hs.SnapViTConfig(num_gradient_images=2, num_fitness_images=4, max_generations=1, max_evaluations=None,
                              scores=ScoreConfig(crops=MultiCropConfig(num_local=2)), pca_components=4,
                              fitness_sparsities=(0.2,))
    ranking = hs.SnapViTPruner(config).fit(model, images(8), processor=processor(), show_progress=False)
    hs.save_elastic(model, ranking, tmp_path / "e")
    small = hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.5 * ranking.max_sparsity)
    with torch.no_grad():
        out = image_embedding(small, {"pixel_values": processor_inputs(images(2), processor())})
    assert out.shape == (2, model.config.hidden_size) and torch.isfinite(out).all()
