"""VLMs whose vision tower no registry knows (Idefics3, SmolVLM, InternVL, Qwen2-VL), tiny, each with its inputs
(:data:`VLMS`)."""

from __future__ import annotations

import torch
import transformers as T


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
VLMS = {"idefics3": (_idefics3, lambda model: {**_text_with_image(), "pixel_values": _pixels(1, 1, 3, 32, 32)}),
         "smolvlm": (_smolvlm, lambda model: {**_text_with_image(), "pixel_values": _pixels(1, 1, 3, 32, 32)}),
         "internvl": (_internvl, lambda model: {**_text_with_image(), "pixel_values": _pixels(1, 3, 32, 32)}),
         "qwen2_vl": (_qwen2_vl, _grid_inputs)}
