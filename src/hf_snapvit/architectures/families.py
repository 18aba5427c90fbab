"""The vision transformer families hf_snapvit supports, one :class:`ArchitectureSpec` each (data, not code)."""

from __future__ import annotations

from .registry import ArchitectureSpec, MlpSpec, register_architecture, vision_config


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
    ),
    _clip_like("siglip_vision_model", embedding="pooled", extra_tokens=lambda config: 0),
    _clip_like(
        "siglip2_vision_model",
        embedding="pooled",
        extra_tokens=lambda config: 0,
        num_patches=lambda c: c.num_patches,
        patch_inputs=True,
    ),
    _clip_like("clip_vision_model", embedding="pooled"),  # pooler_output is the post-layernorm CLS token
    # *ForImageClassification of the dual-tower families: only the vision tower is pruned.
    _clip_like(
        "siglip",
        backbone="vision_model",
        embedding="pooled",
        extra_tokens=lambda config: 0,
        num_patches=lambda c: (vision_config(c).image_size // vision_config(c).patch_size) ** 2,
    ),
    _clip_like(
        "siglip2",
        backbone="vision_model",
        embedding="pooled",
        extra_tokens=lambda config: 0,
        num_patches=lambda c: vision_config(c).num_patches,
        patch_inputs=True,
    ),
    _clip_like(
        "clip",
        backbone="vision_model",
        embedding="pooled",
        num_patches=lambda c: (vision_config(c).image_size // vision_config(c).patch_size) ** 2,
    ),
):
    register_architecture(_family)
