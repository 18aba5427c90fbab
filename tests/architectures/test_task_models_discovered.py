"""VLMs whose vision tower no registry knows (Idefics3, SmolVLM, InternVL, Qwen2-VL): the task model is a registered task spec
(data), its tower is discovered inside it and proven, and the proven spec travels in config.json, so a fresh process
loads any size. The language model and connector load as they are; ``generate()`` runs on the sliced model."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as T

import hf_snapvit as hs
from hf_snapvit.architectures import discovery, get_spec
from hf_snapvit.surgery import proof
from helpers import masked_copy

TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=37,
            vocab_size=128, head_dim=8)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, image_size=32,
              patch_size=8)
IMAGE_TOKEN = 100


def _idefics3():
    return T.Idefics3ForConditionalGeneration(T.Idefics3Config(
        vision_config=VISION, text_config=TEXT, scale_factor=2, image_token_id=IMAGE_TOKEN))


def _smolvlm():
    return T.SmolVLMForConditionalGeneration(T.SmolVLMConfig(
        vision_config=VISION, text_config=TEXT, scale_factor=2, image_token_id=IMAGE_TOKEN))


def _internvl():
    return T.InternVLForConditionalGeneration(T.InternVLConfig(
        vision_config=VISION, text_config={**TEXT, "model_type": "qwen2"}, image_token_id=IMAGE_TOKEN,
        downsample_ratio=0.5, image_seq_length=4))


def _qwen2_vl():
    text = {**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [1, 1, 2]}}
    return T.Qwen2VLForConditionalGeneration(T.Qwen2VLConfig(
        vision_config=dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, mlp_ratio=2, patch_size=8,
                           spatial_merge_size=2, temporal_patch_size=2, image_size=32),
        text_config=text, image_token_id=IMAGE_TOKEN))


def _text_with_image(tokens: int = 4) -> dict:
    ids = torch.cat([torch.tensor([[1]]), torch.full((1, tokens), IMAGE_TOKEN), torch.tensor([[5, 6, 7]])], 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _pixels(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(1))


def _grid_inputs(model) -> dict:
    """Qwen2-VL's inputs as its processor gives them: one sequence of the image's patches, its grid, and which tokens
    are the image's (for the multimodal rotary positions)."""
    from hf_snapvit.architectures.inputs import grid_patchify

    grid = grid_patchify(_pixels(1, 3, 32, 32), model.config)
    text = _text_with_image()
    return {**text, "pixel_values": grid["hidden_states"], "image_grid_thw": grid["grid_thw"],
            "mm_token_type_ids": (text["input_ids"] == IMAGE_TOKEN).long()}


# name -> (tiny model, its inputs: one image of 32 px, 4 image tokens after the tower's merge)
CASES = {"idefics3": (_idefics3, lambda model: {**_text_with_image(), "pixel_values": _pixels(1, 1, 3, 32, 32)}),
         "smolvlm": (_smolvlm, lambda model: {**_text_with_image(), "pixel_values": _pixels(1, 1, 3, 32, 32)}),
         "internvl": (_internvl, lambda model: {**_text_with_image(), "pixel_values": _pixels(1, 3, 32, 32)}),
         "qwen2_vl": (_qwen2_vl, _grid_inputs)}


def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.fixture(autouse=True)
def fresh_discoveries(monkeypatch):
    monkeypatch.setattr(discovery, "_DISCOVERED", {})
    monkeypatch.setattr(proof, "_PROVEN", set())


@pytest.mark.parametrize("name", list(CASES))
def test_a_vlm_with_a_discovered_tower_is_ranked_saved_and_loaded_at_any_size(name, tmp_path):
    torch.manual_seed(0)
    model = CASES[name][0]().eval()
    tower_type = model.config.vision_config.model_type
    assert tower_type not in hs.supported_model_types() and model.config.model_type in hs.supported_model_types()
    inputs = CASES[name][1](model)
    reference = _logits(model, inputs)
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored_ranking = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    assert json.loads((tmp_path / "config.json").read_text())["elastic_spec"]["layers"]  # the tower's proven spec
    discovery._DISCOVERED.clear()  # a fresh process: the spec comes from config.json
    torch.testing.assert_close(_logits(hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.0), inputs), reference,
                               rtol=1e-4, atol=1e-5)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.2)
    spec = get_spec(sliced)
    tower = sliced.get_submodule(spec.encoder)
    assert isinstance(sliced, type(model)) and sum(p.numel() for p in tower.parameters()) < sum(
        p.numel() for p in model.get_submodule(spec.encoder).parameters())
    masked = masked_copy(model, ranking.keep_indices(stored_ranking.keep_counts(0.2)))
    expected = _logits(sliced, inputs)
    torch.testing.assert_close(expected, _logits(masked, inputs), rtol=1e-4, atol=1e-5)
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    switchable.set_budget(sparsity=0.2)
    torch.testing.assert_close(_logits(switchable, inputs), expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        generated = sliced.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 2


@pytest.mark.parametrize("name", list(CASES))
def test_snapvit_ranks_a_vlm_with_a_discovered_tower_on_the_tokens_its_connector_reads(name):
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    torch.manual_seed(0)
    model = CASES[name][0]().eval()
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=2, num_fitness_images=4, max_generations=1,
                                     population_size=4, scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    ranking = hs.rank(model, method="snapvit", data=torch.randn(8, 3, 32, 32), config=config, show_progress=False)
    assert ranking.provenance["method"] == "snapvit" and 0.15 < ranking.keep_counts(0.2).sparsity < 0.25
