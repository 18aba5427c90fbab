"""Task models whose vision encoder is a supported backbone or a tower discovery finds, one :class:`TaskModelSpec`
each (data, not code).

Only the encoder is pruned; the rest (depth neck and head, multimodal projector, language model) loads as it is. The
features each task reads decide what the ranking compares and which blocks it may leave at their floors.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from .registry import TaskModelSpec, num_blocks, register_task_model, vision_config


def _out_indices(config: PretrainedConfig) -> tuple[int, ...]:
    """The hidden states a transformers backbone returns as feature maps (its ``out_indices``; 0 is the stem)."""
    backbone = vision_config(config)
    return tuple(int(i) for i in (getattr(backbone, "out_indices", None) or [backbone.num_hidden_layers]))


def _last_layer(config: PretrainedConfig) -> tuple[int, ...]:
    return (int(num_blocks(vision_config(config))),)


def _vision_feature_layers(config: PretrainedConfig) -> tuple[int, ...]:
    """LLaVA's ``vision_feature_layer`` (one index or a list, negative ones counted from the end)."""
    layers = getattr(config, "vision_feature_layer", -2)
    return tuple(int(i) for i in (layers if isinstance(layers, (list, tuple)) else [layers]))


def _llava_skip(config: PretrainedConfig) -> int:
    """``vision_feature_select_strategy="default"`` drops the CLS token; ``"full"`` keeps every token."""
    return 1 if getattr(config, "vision_feature_select_strategy", "default") == "default" else 0


_DEPTH = dict(encoder="backbone", encoder_config="backbone_config", features="feature_maps",
              feature_layers=_out_indices)
_LLAVA = dict(encoder="model.vision_tower", encoder_config="vision_config", features="hidden_states",
              feature_layers=_vision_feature_layers, skip_tokens=_llava_skip, unused=("post_layernorm", "head"))
_LAST = dict(encoder="model.vision_tower", encoder_config="vision_config", features="last_hidden_state",
             feature_layers=_last_layer, unused=("head",))

# Towers no registry knows, discovered in the model (or read from the saved checkpoint's elastic_spec).
_IDEFICS3 = dict(encoder="model.vision_model", encoder_config="vision_config", features="last_hidden_state",
                 feature_layers=_last_layer)

for _task in (
    TaskModelSpec("depth_anything", **_DEPTH),  # Depth Anything v1 and v2 (one model_type)
    TaskModelSpec("dpt", **_DEPTH),  # DPT with a backbone_config (DINOv2); DPT's own ViT encoder is not a backbone
    TaskModelSpec("zoedepth", **_DEPTH),  # ZoeDepth on a BEiT backbone (its relative position tables go with the heads)
    TaskModelSpec("llava", **_LLAVA),
    TaskModelSpec("llava_next", **_LLAVA),
    TaskModelSpec("llava_onevision", **_LLAVA),  # a SigLIP tower; "full" keeps every token
    TaskModelSpec("vipllava", **{**_LLAVA, "skip_tokens": lambda config: 1}),  # always drops CLS, several layers
    TaskModelSpec("paligemma", **_LAST),
    TaskModelSpec("gemma3", **_LAST),
    # BLIP-2: the Q-Former reads the tower's last hidden state (its tower keeps every head, see its spec).
    TaskModelSpec("blip-2", encoder="vision_model", encoder_config="vision_config", features="last_hidden_state",
                  feature_layers=_last_layer),
    TaskModelSpec("idefics3", **_IDEFICS3),  # Idefics3 (SmolVLM 1): the connector reads the post-layernormed tokens
    TaskModelSpec("smolvlm", **_IDEFICS3),
    TaskModelSpec("internvl", **{**_LLAVA, "unused": ()}),  # InternVL: vision_feature_layer -1, CLS dropped
    # Qwen2-VL: a tower of every image's patches in one sequence (grid_inputs); the language model reads the merger's
    # tokens (pooler_output).
    TaskModelSpec("qwen2_vl", encoder="model.visual", encoder_config="vision_config", features="pooler_output",
                  feature_layers=_last_layer),
):
    register_task_model(_task)
