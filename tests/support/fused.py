"""Families whose attention computes query, key and value with one fused ``qkv`` projection: SAM's image encoder,
BLIP-2's vision tower (and BLIP-2 whole) and Qwen2-VL's vision tower, tiny."""

from __future__ import annotations

import torch
import transformers


def sam() -> transformers.PreTrainedModel:
    """SAM's image encoder: windowed and global attention, relative-position tables shared by the heads, a neck."""
    config = transformers.SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=2,
                                          num_attention_heads=4, mlp_dim=48, image_size=32, patch_size=8,
                                          window_size=2, global_attn_indexes=[1], num_pos_feats=8)
    return transformers.SamVisionModel(config)


def blip2() -> transformers.PreTrainedModel:
    """BLIP-2's vision tower: a fused qkv with a bias, registered with every head kept (see its spec)."""
    config = transformers.Blip2VisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                            num_attention_heads=4, image_size=32, patch_size=8)
    return transformers.Blip2VisionModel(config)


def qwen2_vl() -> transformers.PreTrainedModel:
    """Qwen2-VL's vision tower: 2-D rotary positions, a patch merger, and one sequence of every image's patches with
    their grids as input (``forward(hidden_states, grid_thw)``), a class transformers does not export."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    config = transformers.Qwen2VLVisionConfig(depth=2, embed_dim=32, hidden_size=48, num_heads=4, mlp_ratio=2,
                                              patch_size=8, spatial_merge_size=2, temporal_patch_size=2,
                                              image_size=32)
    return Qwen2VisionTransformerPretrainedModel(config)


# name -> (tiny model, found by discovery, heads pruned, a sparsity its floors allow: FFN neurons alone go in BLIP-2,
# Qwen2-VL's patch merger is a large share of its tiny tower)
FAMILIES = {"sam": (sam, True, True, 0.3), "blip-2": (blip2, False, False, 0.2),
            "qwen2-vl": (qwen2_vl, True, True, 0.2)}


def perturbed(model: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """Weights moved off their initial values (zero biases and tables would hide a wrong slice)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def blip2_whole() -> transformers.Blip2ForConditionalGeneration:
    """BLIP-2 whole: its vision tower, Q-Former and a one-block OPT."""
    config = transformers.Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8),
        qformer_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
                            encoder_hidden_size=32),
        text_config=dict(model_type="opt", hidden_size=32, num_hidden_layers=1, num_attention_heads=4, ffn_dim=37,
                         vocab_size=128, word_embed_proj_dim=32, max_position_embeddings=64),
        num_query_tokens=4, image_token_index=100)
    return transformers.Blip2ForConditionalGeneration(config)


def blip2_whole_inputs(model: transformers.PreTrainedModel) -> dict:
    """Four image tokens (the Q-Former's queries) and four text tokens, one image."""
    ids = torch.cat([torch.full((1, 4), 100), torch.tensor([[2, 5, 6, 7]])], 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))}
