"""The vision transformer families hf_snapvit supports, one :class:`ArchitectureSpec` each (data, not code)."""

from __future__ import annotations

from .registry import ArchitectureSpec, MlpSpec, register_architecture, square_patches, vision_config


def _spec(model_type: str, layers: str, attention: str, o_proj: str, **overrides) -> ArchitectureSpec:
    fields = dict(
        model_type=model_type,
        layers=layers,
        attention=attention,
        q_proj="q_proj",
        k_proj="k_proj",
        v_proj="v_proj",
        o_proj=o_proj,
        mlp="mlp",
        mlp_variants=(MlpSpec(("fc1",), "fc2"),),
    )
    fields.update(overrides)
    return ArchitectureSpec(**fields)


def _vit_like(model_type: str, layers: str, **overrides) -> ArchitectureSpec:
    return _spec(model_type, layers, "attention", "o_proj", **overrides)


def _clip_like(model_type: str, **overrides) -> ArchitectureSpec:
    return _spec(model_type, "encoder.layers", "self_attn", "out_proj", **overrides)


_GATED_OR_PLAIN = (MlpSpec(("gate_proj", "up_proj"), "down_proj"), MlpSpec(("fc1",), "fc2"))
# BEiT and Data2Vec-vision: one relative position bias table for all blocks cannot follow each block's heads.
_SHARED_BIAS = (("use_shared_relative_position_bias", True,
                 "one relative position bias table, shared by every block, cannot keep different heads in different "
                 "blocks. To prune it, add the shared relative_position_bias_table to every block's own one (a copy "
                 "where a block has none), set use_relative_position_bias=True and "
                 "use_shared_relative_position_bias=False (the outputs stay the same), and rank that model."),)

for _family in (
    _vit_like("vit", "layers", excluded_from_budget=("pooler",)),
    _vit_like(
        "deit",
        "layers",
        excluded_from_budget=("pooler",),
        embedding="cls_dist_mean",
        extra_tokens=lambda config: 2,
    ),
    _vit_like("dinov2", "encoder.layer", mlp_variants=_GATED_OR_PLAIN),
    _vit_like(
        "dinov2_with_registers",
        "encoder.layer",
        mlp_variants=_GATED_OR_PLAIN,
        extra_tokens=lambda config: 1 + config.num_register_tokens,
    ),
    _vit_like(
        "dinov3_vit",
        "model.layer",
        backbone="",  # its base_model_prefix points at the encoder, not the whole backbone
        mlp_variants=(
            MlpSpec(("gate_proj", "up_proj"), "down_proj"),
            MlpSpec(("up_proj",), "down_proj"),
        ),
        extra_tokens=lambda config: 1 + config.num_register_tokens,
        token_subsets=False,
    ),
    _vit_like("vit_mae", "layers", inference_config=(("mask_ratio", 0.0),),  # inference sees every patch
              token_subsets=False),
    _vit_like("vit_msn", "layers"),
    _vit_like(  # pooler_output: the layer-normed patch-token mean (use_mean_pooling), as its classifier reads
        "beit",
        "layers",
        embedding="pooled",
        head_tables=("relative_position_bias.relative_position_bias_table",),
        unsupported_config=_SHARED_BIAS,
        token_subsets=False,
    ),
    _spec(  # the BERT-style layout: q/k/v in attention.attention, the FFN split over intermediate and output
        "data2vec-vision",
        "encoder.layer",
        "attention",
        "output.dense",
        q_proj="attention.query",
        k_proj="attention.key",
        v_proj="attention.value",
        mlp="",
        mlp_variants=(MlpSpec(("intermediate.dense",), "output.dense"),),
        head_width="attention.attention_head_size",
        head_count_attrs=("attention.num_attention_heads",),
        head_size_attrs=("attention.all_head_size",),
        head_tables=("attention.attention.relative_position_bias.relative_position_bias_table",),
        embedding="pooled",
        unsupported_config=_SHARED_BIAS,
        token_subsets=False,
    ),
    _clip_like("siglip_vision_model", embedding="pooled", extra_tokens=lambda config: 0),
    _clip_like(
        "siglip2_vision_model",
        embedding="pooled",
        extra_tokens=lambda config: 0,
        num_patches=lambda c: c.num_patches,
        patch_inputs=True,
        token_subsets=False,
    ),
    _clip_like("clip_vision_model", embedding="pooled"),  # pooler_output is the post-layernorm CLS token
    _spec(  # one fused qkv; its forward splits the hidden width (not the heads' rows) into heads
        "blip_2_vision_model",
        "encoder.layers",
        "self_attn",
        "projection",
        q_proj="qkv",
        k_proj="qkv",
        v_proj="qkv",
        qkv_blocks=(0, 1, 2),
        embedding="pooled",
        prune_heads=False,
    ),
    _spec(  # EoMT (whole: the segmentation queries join the last blocks); its forward expands the query mask to
        # config.num_attention_heads in every block, so blocks cannot differ in heads: only FFN neurons go
        "eomt",
        "layers",
        "attention",
        "out_proj",
        embedding="pooled",
        extra_tokens=lambda config: 1 + config.num_register_tokens,
        prune_heads=False,
        token_subsets=False,
    ),
    # *ForImageClassification of the dual-tower families: only the vision tower is pruned.
    _clip_like(
        "siglip",
        backbone="vision_model",
        embedding="pooled",
        extra_tokens=lambda config: 0,
        num_patches=lambda c: square_patches(vision_config(c)),
    ),
    _clip_like(
        "siglip2",
        backbone="vision_model",
        embedding="pooled",
        extra_tokens=lambda config: 0,
        num_patches=lambda c: vision_config(c).num_patches,
        patch_inputs=True,
        token_subsets=False,
    ),
    _clip_like(
        "clip",
        backbone="vision_model",
        embedding="pooled",
        num_patches=lambda c: square_patches(vision_config(c)),
    ),
):
    register_architecture(_family)
