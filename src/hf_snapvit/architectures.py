"""Where each supported transformers architecture keeps its attention heads and FFN neurons.

Architecture knowledge is data: one :class:`ArchitectureSpec` per ``model_type``, looked up in a registry. Every other
module reaches heads and neurons only through :func:`get_spec` and the accessors here, so supporting a new vision
transformer means registering one spec with :func:`register_architecture`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch.nn as nn
from transformers import PretrainedConfig, PreTrainedModel

from .errors import UnsupportedArchitectureError

EmbeddingKind = Literal["cls", "pooled", "cls_dist_mean"]


@dataclass(frozen=True)
class MlpSpec:
    """Names of an FFN's projections inside its module.

    Args:
        in_proj: The row-sliced projections (``fc1``; ``gate_proj`` and ``up_proj`` for a gated/SwiGLU FFN). Keeping
            neuron ``j`` keeps row ``j`` of each.
        out_proj: The column-sliced projection (``fc2`` / ``down_proj``).
    """

    in_proj: tuple[str, ...]
    out_proj: str


@dataclass(frozen=True)
class ArchitectureSpec:
    """How to find the prunable structures of one ``model_type``.

    Args:
        model_type: The ``config.model_type`` this spec serves.
        layers: Dotted path from the backbone to the ``nn.ModuleList`` of transformer blocks.
        attention: Dotted path from a block to its attention module.
        q_proj, k_proj, v_proj, o_proj: Names of the projections inside the attention module.
        mlp: Dotted path from a block to its FFN module.
        mlp_variants: The FFN layouts this architecture can have; the first whose projections all exist is used
            (DINOv2 and DINOv3 switch between a plain and a gated FFN through their config).
        embedding: Which output represents an image: ``"cls"`` (final-norm CLS token, ``last_hidden_state[:, 0]``),
            ``"pooled"`` (``pooler_output``: SigLIP's attention pooling, CLIP's post-layernorm CLS; the token mean when
            a tower has no pooling head) or ``"cls_dist_mean"`` (mean of the CLS and distillation tokens, DeiT).
        backbone: Dotted path from the top-level model to the vision backbone (``""`` for the model itself), or
            ``None`` for the model's own ``base_model``.
        excluded_from_budget: Dotted paths, relative to the backbone, of modules that are not counted as backbone
            parameters (task-style poolers that do not produce the image embedding).
        extra_tokens: Number of non-patch tokens (CLS, distillation, registers) given the config; used for GFLOPs.
        num_patches: Number of patch tokens given the config; used for GFLOPs.
        head_count_attrs: Attention-module attributes that hold the number of heads; slicing updates every one present.
        patch_inputs: The backbone takes flattened patch sequences with a mask and the patch grid (SigLIP2's
            variable-resolution inputs) instead of ``[B, C, H, W]`` images; :func:`image_embedding` patchifies images.
    """

    model_type: str
    layers: str
    attention: str
    q_proj: str
    k_proj: str
    v_proj: str
    o_proj: str
    mlp: str
    mlp_variants: tuple[MlpSpec, ...]
    embedding: EmbeddingKind = "cls"
    backbone: str | None = None
    excluded_from_budget: tuple[str, ...] = ()
    extra_tokens: Callable[[PretrainedConfig], int] = field(default=lambda config: 1)
    num_patches: Callable[[PretrainedConfig], int] = field(
        default=lambda config: (config.image_size // config.patch_size) ** 2
    )
    head_count_attrs: tuple[str, ...] = ("num_heads", "num_attention_heads")
    patch_inputs: bool = False


_REGISTRY: dict[str, ArchitectureSpec] = {}


def register_architecture(spec: ArchitectureSpec, *, exist_ok: bool = False) -> None:
    """Add (or with ``exist_ok=True`` replace) the spec for ``spec.model_type``.

    Example:
        >>> import dataclasses
        >>> from hf_snapvit.architectures import get_spec, register_architecture
        >>> register_architecture(dataclasses.replace(get_spec("vit"), model_type="my_vit"))
    """
    if spec.model_type in _REGISTRY and not exist_ok:
        raise ValueError(
            f"model_type {spec.model_type!r} is already registered; pass exist_ok=True to replace its spec."
        )
    _REGISTRY[spec.model_type] = spec


def supported_model_types() -> list[str]:
    """The ``model_type`` values hf_snapvit can rank and slice."""
    return sorted(_REGISTRY)


def get_spec(model_or_config: PreTrainedModel | PretrainedConfig | str) -> ArchitectureSpec:
    """Look up the spec for a model, a config or a ``model_type`` string."""
    if isinstance(model_or_config, str):
        model_type = model_or_config
    else:
        config = getattr(model_or_config, "config", model_or_config)
        model_type = getattr(config, "model_type", None)
    if model_type not in _REGISTRY:
        raise UnsupportedArchitectureError(
            f"model_type={model_type!r} is not supported by hf_snapvit. Supported: {', '.join(supported_model_types())}. "
            "To add an architecture, describe where its blocks, q/k/v/o projections and FFN live with "
            "hf_snapvit.ArchitectureSpec and call hf_snapvit.register_architecture(spec)."
        )
    return _REGISTRY[model_type]


def _get(module: nn.Module, path: str) -> nn.Module:
    return module.get_submodule(path) if path else module


def get_backbone(model: nn.Module, spec: ArchitectureSpec | None = None) -> nn.Module:
    """The vision backbone of ``model`` (the model itself for a bare backbone, e.g. ``vit`` of a classifier)."""
    spec = spec or get_spec(model)
    if spec.backbone is not None:
        return _get(model, spec.backbone)
    return getattr(model, "base_model", model)


def get_layers(model: nn.Module, spec: ArchitectureSpec | None = None) -> nn.ModuleList:
    """The transformer blocks of ``model``, in depth order."""
    spec = spec or get_spec(model)
    return _get(get_backbone(model, spec), spec.layers)


def get_attention(layer: nn.Module, spec: ArchitectureSpec) -> nn.Module:
    return _get(layer, spec.attention)


def get_mlp(layer: nn.Module, spec: ArchitectureSpec) -> tuple[nn.Module, MlpSpec]:
    """The FFN module of a block and the variant of :class:`MlpSpec` that describes it."""
    mlp = _get(layer, spec.mlp)
    for variant in spec.mlp_variants:
        names = (*variant.in_proj, variant.out_proj)
        if all(isinstance(getattr(mlp, name, None), nn.Linear) for name in names):
            return mlp, variant
    raise UnsupportedArchitectureError(
        f"The FFN of this {spec.model_type!r} block ({type(mlp).__name__}) matches none of the registered layouts "
        f"{[(*v.in_proj, v.out_proj) for v in spec.mlp_variants]}; register an MlpSpec for it."
    )


def head_dim(attention: nn.Module, spec: ArchitectureSpec) -> int:
    """Width of one head. Read from the module, so it stays right after heads are removed."""
    return int(attention.head_dim)


def num_heads(attention: nn.Module, spec: ArchitectureSpec) -> int:
    """Current number of heads, derived from the q projection so it is right for sliced modules."""
    return getattr(attention, spec.q_proj).out_features // head_dim(attention, spec)


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


def vision_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the vision backbone: ``config.vision_config`` of dual-tower models (SigLIP, CLIP), else
    ``config`` itself."""
    return getattr(config, "vision_config", None) or config


def model_class(config: PretrainedConfig) -> type:
    """The transformers class a checkpoint's config names: the first of ``config.architectures`` that transformers
    exports (``ViTForImageClassification``, ``Dinov2Model``, ...); else ``AutoModelForImageClassification`` for a
    classifier of a class transformers lacks, else ``AutoModel``."""
    import transformers

    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type):
            return cls
    if any("ForImageClassification" in name for name in names):
        return transformers.AutoModelForImageClassification
    return transformers.AutoModel


_GATED_OR_PLAIN = (MlpSpec(("gate_proj", "up_proj"), "down_proj"), MlpSpec(("fc1",), "fc2"))

for _spec in (
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
    register_architecture(_spec)
