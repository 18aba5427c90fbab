"""Task models built on a supported vision encoder (:data:`TASKS`): Depth Anything, DPT with a DINOv2 backbone,
ZoeDepth on BEiT, LLaVA, LLaVA-NeXT, PaliGemma and other VLMs, tiny, with the inputs each takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import transformers as T


IMAGE_TOKEN = 100


def _vision(layers: int = 3, heads: int = 4, head_width: int = 8, ffn: int = 64, **extra) -> dict:
    return dict(hidden_size=heads * head_width, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=ffn, image_size=32, patch_size=8, **extra)


def _text() -> T.LlamaConfig:
    return dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=37, vocab_size=128, head_dim=8)


def _depth_anything(**vision):
    backbone = T.Dinov2Config(**{**_vision(**vision), "mlp_ratio": 2}, out_indices=[1, 2, 3][:vision.get("layers", 3)],
                              reshape_hidden_states=False)
    return T.DepthAnythingForDepthEstimation(T.DepthAnythingConfig(
        backbone_config=backbone, neck_hidden_sizes=[8, 16, 32], fusion_hidden_size=16, reassemble_factors=[4, 2, 1],
        head_hidden_size=8, patch_size=8, reassemble_hidden_size=backbone.hidden_size))


def _dpt(**vision):
    backbone = T.Dinov2Config(**{**_vision(**vision), "mlp_ratio": 2}, out_indices=[1, 2, 3][:vision.get("layers", 3)],
                              reshape_hidden_states=False)
    return T.DPTForDepthEstimation(T.DPTConfig(
        backbone_config=backbone, is_hybrid=False, neck_hidden_sizes=[8, 16, 32], fusion_hidden_size=16,
        reassemble_factors=[4, 2, 1], head_in_index=-1, hidden_size=backbone.hidden_size))


def _zoedepth(**vision):
    # BEiT with per-block relative position tables (sliced with the heads); two feature maps: the neck takes one per
    # out_index.
    backbone = T.BeitConfig(**_vision(**vision), out_indices=[1, vision.get("layers", 3)], reshape_hidden_states=False,
                            use_relative_position_bias=True)
    return T.ZoeDepthForDepthEstimation(T.ZoeDepthConfig(
        backbone_config=backbone, backbone_hidden_size=backbone.hidden_size, bottleneck_features=16,
        fusion_hidden_size=16, neck_hidden_sizes=[16, 16], reassemble_factors=[1, 1]))


def _llava(**vision):
    return T.LlavaForConditionalGeneration(T.LlavaConfig(
        vision_config=T.CLIPVisionConfig(**_vision(**vision)), text_config=T.LlamaConfig(**_text()),
        image_token_index=IMAGE_TOKEN))


def _llava_next(**vision):
    return T.LlavaNextForConditionalGeneration(T.LlavaNextConfig(
        vision_config=T.CLIPVisionConfig(**_vision(**vision)), text_config=T.LlamaConfig(**_text()),
        image_token_index=IMAGE_TOKEN, image_grid_pinpoints=[[32, 32], [32, 64]]))


def _paligemma(**vision):
    return T.PaliGemmaForConditionalGeneration(T.PaliGemmaConfig(
        vision_config=T.SiglipVisionConfig(**_vision(**vision)), text_config=T.GemmaConfig(**_text()),
        image_token_index=IMAGE_TOKEN, projection_dim=32))


def _llava_onevision(**vision):
    return T.LlavaOnevisionForConditionalGeneration(T.LlavaOnevisionConfig(
        vision_config=T.SiglipVisionConfig(**_vision(**vision)), text_config=T.Qwen2Config(**_text()),
        image_token_index=IMAGE_TOKEN, image_grid_pinpoints=[[32, 32]]))


def _vipllava(**vision):
    return T.VipLlavaForConditionalGeneration(T.VipLlavaConfig(
        vision_config=T.CLIPVisionConfig(**_vision(**vision)), text_config=T.LlamaConfig(**_text()),
        image_token_index=IMAGE_TOKEN, vision_feature_layers=[-2, 1]))


def _gemma3(**vision):
    return T.Gemma3ForConditionalGeneration(T.Gemma3Config(
        vision_config=T.SiglipVisionConfig(**_vision(**vision)), text_config=T.Gemma3TextConfig(**_text()),
        image_token_index=IMAGE_TOKEN, mm_tokens_per_image=4))


def task_pixels(batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def _depth_inputs(model) -> dict:
    return {"pixel_values": task_pixels()}


def vlm_inputs(model, image_tokens: int | None = None) -> dict:
    tokens = image_tokens or (32 // 8) ** 2  # one token per patch (LLaVA drops CLS; SigLIP has none)
    text = torch.tensor([[1, 5, 9]] * 2)
    ids = torch.cat([torch.full((2, tokens), IMAGE_TOKEN), text], 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": task_pixels()}


def next_inputs(model) -> dict:
    inputs = vlm_inputs(model, image_tokens=52)  # 3 tiles of 4x4 patches at 32x64, packed with newline tokens
    inputs["pixel_values"] = torch.randn(2, 3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    inputs["image_sizes"] = torch.tensor([[32, 64], [32, 64]])
    return inputs


def _onevision_inputs(model) -> dict:
    inputs = vlm_inputs(model, image_tokens=36)  # 2 tiles of 4x4 patches, pooled and packed with newline tokens
    inputs["pixel_values"] = torch.randn(2, 2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    inputs["image_sizes"] = torch.tensor([[32, 32], [32, 32]])
    return inputs


@dataclass
class TaskCase:
    name: str
    build: Callable[..., T.PreTrainedModel]
    inputs: Callable[[T.PreTrainedModel], dict]
    generates: bool = False

    def __repr__(self) -> str:
        return self.name

    def model(self, seed: int = 0, **vision) -> T.PreTrainedModel:
        torch.manual_seed(seed)
        model = self.build(**vision)
        with torch.no_grad():  # move every weight off its init, so that each one shows in comparisons
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        return model.eval()


TASKS = [
    TaskCase("depth_anything", _depth_anything, _depth_inputs),
    TaskCase("dpt-dinov2", _dpt, _depth_inputs),
    TaskCase("llava", _llava, vlm_inputs, generates=True),
    TaskCase("llava_next", _llava_next, next_inputs, generates=True),
    TaskCase("paligemma", _paligemma, vlm_inputs, generates=True),
    TaskCase("llava_onevision", _llava_onevision, _onevision_inputs, generates=True),
    TaskCase("vipllava", _vipllava, vlm_inputs, generates=True),
    TaskCase("gemma3", _gemma3, lambda model: vlm_inputs(model, image_tokens=4), generates=True),
    TaskCase("zoedepth-beit", _zoedepth, _depth_inputs),
]


def task_output(model, inputs) -> torch.Tensor:
    """What the task model gives its user: the depth map, or the language model's logits."""
    with torch.no_grad():
        out = model(**inputs)
    return out.predicted_depth if hasattr(out, "predicted_depth") else out.logits
