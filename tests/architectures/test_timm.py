"""timm models loaded through transformers (``TimmWrapper*``, model_type ``timm_wrapper``): ranked with SnapViT
through their own image processor, every timm architecture of one process keeping its own discovered spec, EVA-02
small sizes (fused qkv applied through F.linear, packed SwiGLU) pruned in their FFNs with every head kept, and
EVA-02 base sizes (an FFN norm over the hidden features) refused before anything is written.

The families' shared checks (sliced equals masked, the card, the Hub payload, stock loading, sparsity 0, switchable,
remote code) run in ``test_discovery.py`` and ``test_discovery_publishing.py`` (``FAMILIES["timm-*"]``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import hf_snapvit as hs
from hf_snapvit.architectures import get_spec
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery.proof import _output
from helpers import masked_copy
from support.discovered import FAMILIES, TIMM

pytest.importorskip("timm", reason="timm is part of the [test] extra")
_PRETRAINED = {"input_size": [3, 32, 32], "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center",
               "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def _classifier(architecture: str = "vit_tiny_patch16_224", **model_args) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.TimmWrapperConfig(architecture=architecture, model_args={**TIMM, **model_args},
                                            pretrained_cfg=_PRETRAINED, num_labels=5)
    return transformers.TimmWrapperForImageClassification(config).eval()


def test_snapvit_ranks_a_timm_model_through_its_own_processor_and_the_checkpoint_keeps_it(tmp_path):
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    model = _classifier()
    processor = transformers.TimmWrapperImageProcessor(pretrained_cfg=_PRETRAINED)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)) for _ in range(12)]
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=3, num_fitness_images=6, max_generations=1,
                                     scores=ScoreConfig(crops=MultiCropConfig(num_local=2)))
    ranking = hs.rank(model, method="snapvit", data=images, processor=processor, config=config, show_progress=False)
    assert ranking.provenance["method"] == "snapvit" and 0.2 < ranking.keep_counts(0.3).sparsity < 0.4
    hs.save_elastic(model, ranking, tmp_path, image_processor=processor, model_card=False)
    # A timm processor lives in config.json (pretrained_cfg): the checkpoint reloads it, and the sliced model runs
    # on what it makes of an image.
    reloaded = transformers.AutoImageProcessor.from_pretrained(tmp_path)
    assert isinstance(reloaded, transformers.TimmWrapperImageProcessor)
    pixels = reloaded(images[:2], return_tensors="pt")["pixel_values"]
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert isinstance(sliced, transformers.TimmWrapperForImageClassification)
    with torch.no_grad():
        assert sliced(pixel_values=pixels).logits.shape == (2, 5)


def test_every_timm_architecture_of_one_process_keeps_its_own_spec(tmp_path):
    # One model_type for every timm model: a class token or none changes the token count the budget reads, and the
    # spec found for one architecture must not be reused for the next, nor for a checkpoint of the first.
    with_cls, without = _classifier(), _classifier("vit_base_patch16_siglip_224", class_token=False,
                                                   global_pool="avg")
    rankings = {}
    for name, model in (("cls", with_cls), ("no-cls", without)):
        rankings[name] = hs.rank(model, method="magnitude", show_progress=False)
        hs.save_elastic(model, rankings[name], tmp_path / name, model_card=False)
    assert get_spec(with_cls).extra_tokens(with_cls.config) == 1
    assert get_spec(without).extra_tokens(without.config) == 0
    for name, model in (("cls", with_cls), ("no-cls", without)):
        stored = json.loads((tmp_path / name / "config.json").read_text())["elastic_spec"]
        assert stored["extra_tokens"] == (1 if name == "cls" else 0)
        sliced = hs.ElasticViTModel.from_pretrained(tmp_path / name, sparsity=0.3)
        counts = hs.ElasticRanking.from_dict(sliced.config.elastic_ranking).keep_counts(0.3)
        inputs = dummy_inputs(model, 2, seed=3)
        masked = masked_copy(model, rankings[name].keep_indices(counts))
        torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


def test_eva02_keeps_every_head_and_prunes_its_packed_swiglu_sliced_equal_to_masking(tmp_path):
    # Its attention reshapes to the model width (no head can go) and adds query and value biases of its own; its FFN
    # computes value and gate in one projection, so neuron j is row j of each half.
    model = _classifier("eva02_tiny_patch14_224")
    with torch.no_grad():
        for parameter in model.parameters():  # zero biases and a near-zero gate would hide a wrong slice
            parameter.add_(torch.randn_like(parameter) * 0.05)
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)) for _ in range(8)]
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=2, num_fitness_images=4, max_generations=1,
                                     population_size=4, scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    with pytest.warns(UserWarning, match="keeps every attention head and prunes FFN neurons only"):
        ranking = hs.rank(model, method="snapvit", data=images, config=config, show_progress=False,
                          processor=transformers.TimmWrapperImageProcessor(pretrained_cfg=_PRETRAINED))
    assert get_spec(model).prune_heads is False
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    counts = stored.keep_counts(0.3)
    assert counts.heads == [4, 4] and sum(counts.neurons) < 2 * 48
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert sum(p.numel() for p in sliced.parameters()) == counts.num_params + sum(
        p.numel() for p in sliced.timm_model.head.parameters())
    inputs = dummy_inputs(model, 2, seed=3)
    masked = masked_copy(model, ranking.keep_indices(counts))
    torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    switchable.set_budget(sparsity=0.3)
    torch.testing.assert_close(_output(switchable, inputs), _output(sliced, inputs), rtol=1e-4, atol=1e-5)


def test_eva02_whose_ffn_norms_its_hidden_features_is_refused_saying_why(tmp_path):
    # EVA-02 B/L: a LayerNorm over the FFN's hidden features, whose statistics change when a neuron goes.
    model = _classifier("eva02_base_patch14_224")
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        hs.save_elastic(model, None, tmp_path / "out")
    message = str(info.value)
    # The norm is named (not the shape error it causes), and no ArchitectureSpec is suggested: no spec fixes it.
    assert "timm_model.blocks.0.mlp.norm (LayerNorm)" in message and "fc1_g" in message
    assert "ArchitectureSpec" not in message and len(message.splitlines()) <= 3
    assert not (tmp_path / "out").exists()


def test_the_timm_families_are_in_the_shared_family_checks():
    assert {name for name in FAMILIES if name.startswith("timm-")} == {
        "timm-augreg", "timm-deit3", "timm-deit-distilled", "timm-qknorm-registers", "timm-eva02", "timm-rope"}


def test_a_timm_classifier_is_recovered_corrected_and_scored_top1_from_its_logits(tmp_path):
    # The whole wrapper is the backbone and returns logits only: its embedding is the token mean of its last block.
    from hf_snapvit.evaluation import Evaluator

    model = _classifier()
    processor = transformers.TimmWrapperImageProcessor(pretrained_cfg=_PRETRAINED)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(16)]
    hs.save_elastic(model, hs.rank(model, method="magnitude", show_progress=False), tmp_path,
                    image_processor=processor, model_card=False)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    student, summary = hs.recover(sliced, model, images, hs.RecoveryConfig(steps=2, batch_size=4, held_out_images=4),
                                  processor=processor, show_progress=False)
    assert len(summary.losses) == 2 and all(np.isfinite(summary.losses))
    assert hs.add_prefix_correction(tmp_path, images, config=hs.CorrectionConfig(guard=False),
                                    show_progress=False)["num_images"] == 16
    labels = [int(i) for i in rng.integers(0, 5, 16)]
    result = Evaluator(images[:8], bank_data=images[8:], eval_labels=labels[:8], bank_labels=labels[8:],
                       dense_model=model, processor=processor, show_progress=False).evaluate(student)
    with torch.no_grad():
        pixels = processor(images[:8], return_tensors="pt")["pixel_values"]
        expected = (student(pixel_values=pixels).logits.argmax(-1) == torch.tensor(labels[:8])).float().mean()
    assert result.top1 == pytest.approx(float(expected)) and 0.0 < result.retention <= 1.0
    # One forward gives logits and the embedding (its last block's tokens), the one image_embedding computes alone.
    from hf_snapvit.architectures.embedding import image_embedding
    from hf_snapvit.evaluation.features import extract_features

    features = extract_features(student, pixels, show_progress=False)
    with torch.no_grad():
        torch.testing.assert_close(features.embeddings, image_embedding(student, {"pixel_values": pixels}))
    assert features.logits.shape == (8, 5)
