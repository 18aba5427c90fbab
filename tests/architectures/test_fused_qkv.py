"""Families whose attention computes query, key and value with one fused ``qkv`` projection: SAM's image encoder
(found by discovery alone) and BLIP-2's vision tower (a registered spec that keeps every head: its forward cannot run
with fewer). Each is ranked (data-free and SnapViT on images), saved elastic, loaded dense by stock transformers and
sliced by hf_snapvit equal to the masked model, switchable equal to sliced, and the sliced checkpoint loaded back by
path with ``trust_remote_code``."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.surgery import proof
from hf_snapvit.architectures import discovery, get_spec
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery.proof import _output
from helpers import masked_copy
from support.fused import FAMILIES, blip2, blip2_whole, blip2_whole_inputs, perturbed, qwen2_vl


@pytest.fixture(scope="module", params=list(FAMILIES))
def saved(request, tmp_path_factory):
    """``(name, model, ranking, stored ranking, folder)``: the tiny model ranked by magnitude and saved elastic."""
    torch.manual_seed(0)
    build, discovered, _, _ = FAMILIES[request.param]
    model = perturbed(build())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(discovery, "_DISCOVERED", {})
        patch.setattr(proof, "_PROVEN", set())
        assert (model.config.model_type in hs.supported_model_types()) is not discovered
        ranking = hs.rank(model, method="magnitude", show_progress=False)
        folder = tmp_path_factory.mktemp(f"elastic-{request.param}")
        stored = hs.save_elastic(model, ranking, folder, model_card=False)
        yield request.param, model, ranking, stored, folder


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def test_the_spec_names_one_fused_qkv_and_a_discovered_one_is_stored(saved):
    name, model, _, _, folder = saved
    spec = get_spec(model)
    assert spec.q_proj == spec.k_proj == spec.v_proj == "qkv" and spec.qkv_blocks == (0, 1, 2)
    config = json.loads((folder / "config.json").read_text())
    if FAMILIES[name][1]:
        assert config["elastic_spec"]["qkv_blocks"] == [0, 1, 2] and config["elastic_spec"]["q_proj"] == "qkv"
    else:
        assert "elastic_spec" not in config


def test_stock_transformers_loads_dense_and_sparsity_0_equals_it(saved):
    _, model, _, _, folder = saved
    inputs = dummy_inputs(model, 2, seed=3)
    reference = _output(model, inputs)
    stock = type(model).from_pretrained(folder).eval()
    torch.testing.assert_close(_output(stock, inputs), reference, rtol=1e-5, atol=1e-5)
    dense = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.0)
    torch.testing.assert_close(_output(dense, inputs), reference, rtol=1e-5, atol=1e-5)


def test_sliced_is_the_stock_class_smaller_equal_to_masking_and_switchable_equals_it(saved, tmp_path):
    name, model, ranking, stored, folder = saved
    inputs = dummy_inputs(model, 2, seed=3)
    sparsity = FAMILIES[name][3]
    counts = stored.keep_counts(sparsity)
    if FAMILIES[name][2]:  # heads go: the fused rows are cut
        assert sum(counts.heads) < ranking.shape.num_layers * ranking.shape.num_heads
    else:
        assert counts.heads == [ranking.shape.num_heads] * ranking.shape.num_layers
    sliced = hs.ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
    assert isinstance(sliced, type(model))
    assert sum(p.numel() for p in sliced.parameters()) < sum(p.numel() for p in model.parameters())
    masked = masked_copy(model, ranking.keep_indices(counts))
    expected = _output(sliced, inputs)
    torch.testing.assert_close(expected, _output(masked, inputs), rtol=1e-4, atol=1e-5)
    switchable = hs.ElasticViTModel.from_pretrained(folder, switchable=True)
    switchable.set_budget(sparsity=sparsity)
    torch.testing.assert_close(_output(switchable, inputs), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_output(switchable.to_sliced(), inputs), expected, rtol=1e-5, atol=1e-6)
    sliced.save_pretrained(tmp_path / "sliced")
    discovery._DISCOVERED.clear()  # the loading module carries the spec: no registry, no discovery
    if hasattr(transformers, type(model).__name__):
        again = transformers.AutoModel.from_pretrained(tmp_path / "sliced", trust_remote_code=True).eval()
    else:  # a class transformers does not export gets no loading module (as a user's own class)
        again = hs.ElasticViTModel.from_pretrained(tmp_path / "sliced")
    torch.testing.assert_close(_output(again, inputs), expected, rtol=0, atol=0)


def test_snapvit_ranks_from_images(saved):
    from hf_snapvit.pruning.scoring import ScoreConfig
    from hf_snapvit.data.views import MultiCropConfig

    name, model, _, _, _ = saved
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=2, num_fitness_images=4, max_generations=1,
                                     population_size=4, scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    ranking = hs.rank(model, method="snapvit", data=torch.randn(8, 3, 32, 32), config=config, show_progress=False)
    counts = ranking.keep_counts(FAMILIES[name][3])
    assert ranking.provenance["method"] == "snapvit"
    assert (counts.heads == [ranking.shape.num_heads] * ranking.shape.num_layers) is not FAMILIES[name][2]
    assert sum(counts.heads) + sum(counts.neurons) < ranking.shape.num_layers * (
        ranking.shape.num_heads + ranking.shape.intermediate_size)


def test_blip2_by_discovery_alone_keeps_every_head_as_its_registered_spec_does(monkeypatch, tmp_path):
    from hf_snapvit.architectures import registry

    monkeypatch.setattr(registry, "_REGISTRY", {k: v for k, v in registry._REGISTRY.items()
                                                if k != "blip_2_vision_model"})
    model = perturbed(blip2())
    with pytest.warns(UserWarning, match=r"keeps every attention head.*with fewer heads, slicing with it failed"):
        ranking = hs.rank(model, method="magnitude", show_progress=False)
    assert discovery.is_discovered(get_spec(model)) and not get_spec(model).prune_heads
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    counts = stored.keep_counts(0.15)
    assert counts.heads == [4, 4] and sum(counts.neurons) < 2 * 48
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.15)
    inputs = dummy_inputs(model, 2, seed=3)
    masked = masked_copy(model, ranking.keep_indices(counts))
    torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


def test_a_ranking_that_would_drop_blip2_heads_is_refused_before_writing(tmp_path):
    import dataclasses

    model = perturbed(blip2())
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    assert ranking.min_head_keep_ratio == 1.0  # rank() keeps every head of a spec that cannot prune them
    with pytest.raises(hs.ConfigError, match="keeps all of them"):
        hs.save_elastic(model, dataclasses.replace(ranking, min_head_keep_ratio=0.2), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _qwen2_vl_processor() -> transformers.Qwen2VLImageProcessorPil:
    """The tiny tower's processor: 8-px patches in 2x2 merge windows, every image at 32x32 px."""
    return transformers.Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2,
                                                 min_pixels=32 * 32, max_pixels=32 * 32)


def test_grid_inputs_are_laid_out_as_the_qwen2_vl_processor_lays_out_an_image():
    import numpy as np
    from PIL import Image

    from hf_snapvit.architectures.inputs import grid_patchify
    from hf_snapvit.data.views import processor_inputs

    model, processor = qwen2_vl(), _qwen2_vl_processor()
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    out = processor(images=[image], return_tensors="pt")
    mean, std = torch.tensor(processor.image_mean)[:, None, None], torch.tensor(processor.image_std)[:, None, None]
    pixels = ((torch.from_numpy(image).permute(2, 0, 1).float() / 255 - mean) / std)[None]  # no resize at 32 px
    ours = grid_patchify(pixels, model.config)
    assert ours["grid_thw"].tolist() == out["image_grid_thw"].tolist() == [[1, 4, 4]]
    torch.testing.assert_close(ours["hidden_states"], out["pixel_values"].float(), rtol=1e-4, atol=1e-4)
    # The processor's patches, turned back into images (what the search scores candidates on), are those pixels.
    torch.testing.assert_close(processor_inputs([Image.fromarray(image)], processor), pixels, rtol=1e-4, atol=1e-4)


def test_snapvit_ranks_qwen2_vl_from_images_through_its_own_processor():
    import numpy as np
    from PIL import Image

    from hf_snapvit.pruning.scoring import ScoreConfig
    from hf_snapvit.data.views import MultiCropConfig

    model = perturbed(qwen2_vl())
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(8)]
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=2, num_fitness_images=4, max_generations=1,
                                     population_size=4, scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    ranking = hs.rank(model, method="snapvit", data=images, processor=_qwen2_vl_processor(), config=config,
                      show_progress=False)
    assert ranking.provenance["method"] == "snapvit" and ranking.keep_counts(0.2).sparsity > 0.15


def test_blip2_whole_ranks_on_what_its_qformer_reads_keeps_every_head_and_generates(tmp_path):
    torch.manual_seed(0)
    model = perturbed(blip2_whole())
    inputs = blip2_whole_inputs(model)
    ids = inputs["input_ids"]
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    counts = stored.keep_counts(0.15)
    assert counts.heads == [4, 4] and sum(counts.neurons) < 2 * 48
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.15)
    assert isinstance(sliced, transformers.Blip2ForConditionalGeneration)
    with torch.no_grad():
        expected = sliced(**inputs).logits
        masked = masked_copy(model, ranking.keep_indices(counts))(**inputs).logits
        torch.testing.assert_close(expected, masked, rtol=1e-4, atol=1e-5)
        assert sliced.generate(**inputs, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2


def test_a_grid_tower_is_corrected_recovered_and_evaluated_on_images_of_any_shape(tmp_path):
    """Qwen2-VL's tower takes every image's patches in one sequence: the correction at load, the stored prefix
    correction, recovery and the evaluator read each image's part of it, whatever its grid."""
    import numpy as np
    from PIL import Image

    from hf_snapvit.evaluation import Evaluator
    from hf_snapvit.evaluation.features import extract_features

    torch.manual_seed(0)
    model = perturbed(qwen2_vl())
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(16)]
    processor = _qwen2_vl_processor()
    hs.save_elastic(model, hs.rank(model, method="magnitude", show_progress=False), tmp_path, model_card=False)
    processor.save_pretrained(tmp_path)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.2)
    corrected = hs.correct(tmp_path, sparsity=0.2, data=images, config=hs.CorrectionConfig(num_samples=8, guard=False))
    moved = [not torch.equal(a, b) for a, b in zip(sliced.state_dict().values(), corrected.state_dict().values())]
    assert any(moved)

    student, summary = hs.recover(sliced, model, images, hs.RecoveryConfig(steps=2, batch_size=4, held_out_images=4),
                                  processor=processor, show_progress=False)
    assert len(summary.losses) == 2 and all(np.isfinite(summary.losses))

    record = hs.add_prefix_correction(tmp_path, images, config=hs.CorrectionConfig(guard=False), show_progress=False)
    assert record["num_images"] == 16
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    switchable.set_budget(sparsity=0.2)
    served = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.2)
    grid = dummy_inputs(model, 2)
    torch.testing.assert_close(_output(switchable, grid), _output(served, grid), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(_output(served, grid), _output(sliced, grid))  # the stored correction applies

    # The processor keeps each image's aspect: three shapes, three grids in one batch, each image embedded alone.
    wide = transformers.Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2,
                                                 min_pixels=16 * 16, max_pixels=48 * 48)
    shaped = [Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8))
              for size in ((32, 64, 3), (48, 48, 3), (64, 32, 3))]
    assert len({tuple(g) for g in wide(images=shaped, return_tensors="pt")["image_grid_thw"].tolist()}) == 3
    together = extract_features(served, shaped, processor=wide, show_progress=False).embeddings
    alone = torch.cat([extract_features(served, [i], processor=wide, show_progress=False).embeddings
                       for i in shaped])
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)
    result = Evaluator(images[:8], bank_data=images[8:], eval_labels=[0, 1] * 4, bank_labels=[0, 1] * 4,
                       dense_model=model, processor=processor, show_progress=False).evaluate(served)
    assert 0.0 < result.retention <= 1.0 and result.linear_top1 is not None
