"""The architecture registry: what a spec says and where specs are kept (a model's parts are reached through
:mod:`~hf_snapvit.architectures.parts`).

:class:`ArchitectureSpec` describes one vision transformer family (``model_type``): where its blocks, attention
projections and FFN live. :class:`TaskModelSpec` describes a task model (a depth estimator, a vision-language model)
by where its vision encoder lives and which of its features the task reads. Every other module reaches heads and
neurons only through :func:`get_spec` and the accessors of :mod:`.parts`; the specs themselves are data, in
:mod:`~hf_snapvit.architectures.families` and :mod:`~hf_snapvit.architectures.task_models`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Literal

from transformers import PretrainedConfig, PreTrainedModel

from ..errors import UnsupportedArchitectureError

EmbeddingKind = Literal["cls", "pooled", "cls_dist_mean"]


@dataclass(frozen=True)
class MlpSpec:
    """Names of an FFN's projections inside its module.

    Args:
        in_proj: The row-sliced projections (``fc1``; ``gate_proj`` and ``up_proj`` for a gated/SwiGLU FFN). Keeping
            neuron ``j`` keeps row ``j`` of each.
        out_proj: The column-sliced projection (``fc2`` / ``down_proj``).

    Names are dotted paths (``"intermediate.dense"`` of a block whose FFN is split over two modules).
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
        q_proj, k_proj, v_proj, o_proj: Dotted paths of the projections inside the attention module
            (``"attention.query"``, ``"output.dense"`` of the older BERT-style layout).
        mlp: Dotted path from a block to its FFN module (``""``: the block itself holds the FFN's projections).
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
        head_count_attrs: Dotted paths of attention-module attributes that hold the number of heads; slicing updates
            every one present.
        head_size_attrs: The same for attributes that hold heads × head width (``all_head_size``).
        head_width: Dotted path of the attention-module attribute that holds one head's width (``""``: the module
            keeps none, and the width is the query rows over the first of ``head_count_attrs`` it has, as in SAM),
            or the width itself (an ``int``) where the module keeps neither and its forward splits the query into
            heads of that constant width (``unflatten(-1, (-1, 64))``).
        qkv_blocks: The row block of its projection that query, key and value each take: ``(0, 1, 2)`` where
            ``q_proj``, ``k_proj`` and ``v_proj`` name one fused projection whose rows are [query heads | key heads |
            value heads] (SAM, BLIP-2, timm); ``(0, 0, 0)`` for three separate projections. A projection named by
            ``n`` of the three holds ``n`` equal blocks, each cut with the heads.
        prune_heads: ``False`` where the stock forward cannot run with fewer heads (BLIP-2's vision attention splits
            the hidden width, not the attention width, into heads): every block keeps all its heads (the ranking's
            head floor is all of them) and only FFN neurons are pruned.
        head_tables: Dotted paths from a block to parameters whose last dimension has one entry per head (BEiT's
            relative position bias table): sliced and reordered with the heads, and counted in each head's cost.
        head_rows: Dotted paths from a block to ``nn.Linear`` layers with one output row per head (the last layer of
            timm's relative-position MLP, ``attn.rel_pos.mlp.fc2``, which computes each head's position bias): their
            rows and bias entries are sliced and reordered with the heads, and counted in each head's cost.
        unsupported_config: ``(attribute, value, reason and fix)`` of config settings hf_snapvit cannot prune;
            :func:`get_layers` refuses a model that has one.
        patch_inputs: The backbone takes flattened patch sequences with a mask and the patch grid (SigLIP2's
            variable-resolution inputs) instead of ``[B, C, H, W]`` images; :func:`image_embedding` patchifies images.
        frames_in_batch: The backbone takes video clips of this many frames flattened into the batch,
            ``[B·T, C, H, W]`` (X-CLIP's vision tower), where ``pixel_values`` of the config's shape are
            ``[B, T, C, H, W]`` clips: hf_snapvit's clips are flattened at the call, and a clip's embedding is the
            mean of its frames'. ``0``: it takes what :func:`~hf_snapvit.architectures.inputs.pixel_shape` says.
        image_size: The input side in pixels discovery inferred from the position embedding of a model whose config
            names none (``0``: the config names it, or the model takes any size).
        grid_inputs: The backbone takes every image's patches in one sequence, flattened in merge-window order, with
            each image's ``grid_thw`` (Qwen2-VL's vision tower: ``forward(hidden_states, grid_thw)``) instead of
            ``[B, C, H, W]`` images; :func:`~hf_snapvit.architectures.inputs.grid_patchify` turns images into that.
        token_subsets: The blocks can be given part of an image's tokens (``SnapViTConfig.fitness_token_fraction``):
            ``False`` where positions enter inside the blocks (BEiT's relative position bias, DINOv3's rotary
            embeddings), where the embeddings shuffle the patches (ViTMAE) or where the inputs are masked patch
            sequences (SigLIP2).
        inference_config: ``(attribute, value)`` pairs set on the vision config while the backbone embeds images
            for ranking and evaluation, then restored (ViTMAE: ``mask_ratio`` 0, every patch seen, as in inference).
        encoder: Dotted path from the top-level model to the vision model that ``backbone`` is found in: ``""``,
            except in the specs :func:`get_spec` derives for task models (``"model.vision_tower"`` of LLaVA).
        task: The :class:`TaskModelSpec` of a task model whose vision encoder this spec describes, else ``None``.
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
        default=lambda config: square_patches(config)
    )
    head_count_attrs: tuple[str, ...] = ("num_heads", "num_attention_heads")
    head_size_attrs: tuple[str, ...] = ("all_head_size",)
    head_width: str | int = "head_dim"
    qkv_blocks: tuple[int, int, int] = (0, 0, 0)
    prune_heads: bool = True
    head_tables: tuple[str, ...] = ()
    head_rows: tuple[str, ...] = ()
    unsupported_config: tuple[tuple[str, object, str], ...] = ()
    patch_inputs: bool = False
    frames_in_batch: int = 0
    image_size: int = 0
    grid_inputs: bool = False
    token_subsets: bool = True
    inference_config: tuple[tuple[str, object], ...] = ()
    encoder: str = ""
    task: TaskModelSpec | None = None


FeatureKind = Literal["feature_maps", "hidden_states", "last_hidden_state", "pooler_output"]


@dataclass(frozen=True)
class TaskModelSpec:
    """Where a task model (a depth estimator, a vision-language model) keeps its vision encoder, and which of the
    encoder's features it reads. Only the encoder is pruned; neck, head, projector and language model stay as they are.

    Args:
        model_type: The task model's ``config.model_type`` (``"llava"``).
        encoder: Dotted path from the task model to its vision model (``"model.vision_tower"``).
        encoder_config: The config attribute holding the vision model's config (``"vision_config"``,
            ``"backbone_config"``); its ``model_type`` must be a registered architecture.
        features: What the task reads from the vision model's output: ``"feature_maps"`` (a transformers backbone's
            ``out_features``), ``"hidden_states"`` (the hidden states at :attr:`feature_layers`, as LLaVA's
            ``vision_feature_layer``), ``"last_hidden_state"`` or ``"pooler_output"`` (Qwen2-VL's merged tokens).
        feature_layers: Given the task model's config, the indices into ``hidden_states`` the task reads (``0`` is the
            embeddings' output, ``l`` the output of block ``l``). Blocks after the last of them are never used: they
            keep only the ranking's floors at any sparsity above 0 and cost the budget nothing.
        skip_tokens: Given the config, how many leading tokens the task drops from each feature (LLaVA's
            ``vision_feature_select_strategy="default"`` drops the CLS token).
        unused: Dotted paths, relative to the vision model, of modules the task never reads (CLIP's
            ``post_layernorm`` under LLaVA, SigLIP's pooling ``head`` under PaliGemma): not counted in the budget.
    """

    model_type: str
    encoder: str
    encoder_config: str
    features: FeatureKind
    feature_layers: Callable[[PretrainedConfig], tuple[int, ...]]
    skip_tokens: Callable[[PretrainedConfig], int] = field(default=lambda config: 0)
    unused: tuple[str, ...] = ()


_REGISTRY: dict[str, ArchitectureSpec] = {}
_TASKS: dict[str, TaskModelSpec] = {}
#: Where a checkpoint's config.json stores the proven spec of a model type no registry knows (written on saving).
SPEC_KEY = "elastic_spec"
# (task model_type, encoder model_type) -> (the encoder's spec, the task model's spec derived from it)
_DERIVED: dict[tuple[str, str], tuple[ArchitectureSpec, ArchitectureSpec]] = {}


# What :mod:`.discovery` installs when it is imported (it builds on this module, which therefore cannot import it):
# "resolve" finds the spec of a model type no registry holds, "forget" drops one when a spec is registered.
_UNREGISTERED: dict[str, Callable] = {}


def on_unregistered(resolve: Callable[[object, PretrainedConfig | None, str | None], "ArchitectureSpec"],
                    forget: Callable[[str], None]) -> None:
    """Install discovery: how :func:`get_spec` finds an unregistered model type's spec, and how registering a spec
    drops the one found before."""
    _UNREGISTERED.update(resolve=resolve, forget=forget)


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
    if "forget" in _UNREGISTERED:
        _UNREGISTERED["forget"](spec.model_type)  # a registered spec replaces a discovered one


def register_task_model(task: TaskModelSpec, *, exist_ok: bool = False) -> None:
    """Add (or with ``exist_ok=True`` replace) the :class:`TaskModelSpec` for ``task.model_type``.

    Example (a VLM whose SigLIP tower sits where PaliGemma's does):
        >>> import dataclasses
        >>> from hf_snapvit.architectures import register_task_model, task_model_spec
        >>> register_task_model(dataclasses.replace(task_model_spec("paligemma"), model_type="my_vlm"))
    """
    if (task.model_type in _TASKS or task.model_type in _REGISTRY) and not exist_ok:
        raise ValueError(f"model_type {task.model_type!r} is already registered; pass exist_ok=True to replace it.")
    _TASKS[task.model_type] = task
    for key in [key for key in _DERIVED if key[0] == task.model_type]:
        del _DERIVED[key]


def task_model_spec(model_type: str) -> TaskModelSpec | None:
    """The :class:`TaskModelSpec` registered for ``model_type``, or ``None`` (a bare backbone, or unsupported)."""
    return _TASKS.get(model_type)


def supported_model_types() -> list[str]:
    """The ``model_type`` values hf_snapvit can rank and slice: vision backbones and the task models built on them."""
    return sorted({*_REGISTRY, *_TASKS})


def get_spec(model_or_config: PreTrainedModel | PretrainedConfig | str) -> ArchitectureSpec:
    """Look up the spec for a model, a config or a ``model_type`` string.

    For a task model (given as a model or a config) the spec is its vision encoder's, reached through the task
    model (``encoder``) and carrying the :class:`TaskModelSpec` (``task``).
    """
    config = None
    if isinstance(model_or_config, str):
        model_type = model_or_config
    else:
        config = getattr(model_or_config, "config", model_or_config)
        model_type = getattr(config, "model_type", None)
    if model_type in _TASKS:
        if config is None:
            raise UnsupportedArchitectureError(
                f"{model_type!r} is a task model whose vision encoder its config names; pass the model or its config "
                f"to get_spec, not the model_type string.")
        return _task_spec(_TASKS[model_type], config, model_or_config)
    if model_type not in _REGISTRY:
        return _UNREGISTERED["resolve"](model_or_config, config, model_type)
    return _REGISTRY[model_type]


def _task_spec(task: TaskModelSpec, config: PretrainedConfig, model: object = None) -> ArchitectureSpec:
    """The spec of ``task``'s vision encoder as found inside the task model (derived once per encoder spec). An
    encoder no registry knows (Idefics3's, InternVL's tower) is discovered in ``model``, or read from the spec a saved
    checkpoint's ``config.json`` stores."""
    encoder_config = getattr(config, task.encoder_config, None)
    encoder_type = getattr(encoder_config, "model_type", None)
    encoder = _submodule(model, task.encoder)
    if encoder_type in _REGISTRY:
        base = _REGISTRY[encoder_type]
    elif encoder_type is not None and (encoder is not None or getattr(config, SPEC_KEY, None) is not None):
        base = _UNREGISTERED["resolve"](encoder if encoder is not None else encoder_config, config, encoder_type)
    else:
        towers = ", ".join(sorted(t for t in _REGISTRY if not t.startswith(("clip", "siglip")) or "vision" in t))
        raise UnsupportedArchitectureError(
            f"This {task.model_type} model's vision encoder (config.{task.encoder_config}) is "
            f"{encoder_type if encoder_config is not None else 'missing'}, which no registry knows. Pass the model "
            f"itself, so that its encoder is discovered and proven; or register a spec for it; registered towers: "
            f"{towers}.")
    key = (task.model_type, encoder_type)
    if key not in _DERIVED or _DERIVED[key][0] is not base:  # a discovered encoder's spec may be replaced
        _DERIVED[key] = (base, replace(
            base, model_type=task.model_type, encoder=task.encoder, task=task,
            excluded_from_budget=(*base.excluded_from_budget, *task.unused),
            extra_tokens=lambda c: base.extra_tokens(vision_config(c)),
            num_patches=lambda c: base.num_patches(vision_config(c))))
    return _DERIVED[key][1]


def _submodule(model: object, path: str) -> object:
    """``model``'s module at ``path``, or ``None`` when ``model`` is a config or has none there."""
    try:
        return model.get_submodule(path) if hasattr(model, "get_submodule") else None
    except AttributeError:
        return None


def used_layers(config: PretrainedConfig, spec: ArchitectureSpec | None = None) -> int:
    """How many blocks, counted from the first, produce what the model's task reads: all of them, except in a task
    model that reads an earlier block's output (LLaVA's default ``vision_feature_layer=-2``)."""
    spec = spec or get_spec(config)
    if spec.task is None:  # every block (a discovered model's config need not count them)
        return int(num_blocks(vision_config(config)) or 2**31 - 1)
    total = int(num_blocks(vision_config(config)))
    return max(1, max(index if index >= 0 else total + 1 + index for index in spec.task.feature_layers(config)))


def num_blocks(config: PretrainedConfig) -> int | None:
    """The number of blocks a vision config gives: ``num_hidden_layers``, else ``depth`` (Qwen2-VL's vision config
    names only ``depth`` before transformers 5.23 maps one to the other); ``None`` if it gives neither."""
    count = getattr(config, "num_hidden_layers", None)
    return count if count is not None else getattr(config, "depth", None)


def vision_config(config: PretrainedConfig) -> PretrainedConfig:
    """The config of the vision backbone: the encoder's config of a task model (``backbone_config`` of Depth
    Anything), ``config.vision_config`` of dual-tower models (SigLIP, CLIP), else ``config`` itself."""
    task = _TASKS.get(getattr(config, "model_type", None))
    if task is not None:
        return getattr(config, task.encoder_config, None) or config
    return getattr(config, "vision_config", None) or getattr(config, "backbone_config", None) or config


def square_side(value: object, name: str) -> object:
    """``value`` (a config's ``name``: ``image_size``, ``patch_size``) as one side: a pair of equal sides is that
    side, other values are returned as they are. A rectangle is refused: hf_snapvit draws, embeds and counts square
    images."""
    if isinstance(value, (list, tuple)) and value:
        if len(set(value)) > 1:
            raise UnsupportedArchitectureError(
                f"This model's config has {name}={list(value)}, which is not square: hf_snapvit ranks, embeds and "
                "counts square images only. Use a checkpoint configured for square inputs.")
        return value[0]
    return value


def square_patches(config: PretrainedConfig) -> int:
    """The patches of one image of the configured size (``image_size`` and ``patch_size`` as sides or square
    pairs)."""
    return (square_side(config.image_size, "image_size") // square_side(config.patch_size, "patch_size")) ** 2


def model_class(config: PretrainedConfig) -> type:
    """The transformers class a checkpoint's config names: the first of ``config.architectures`` that transformers
    exports (``ViTForImageClassification``, ``Dinov2Model``, ...) or that the modeling module beside the config's
    class defines (a vision tower transformers does not export, Qwen2-VL's); else
    ``AutoModelForImageClassification`` for a classifier of a class transformers lacks, else ``AutoModel``."""
    import importlib

    import transformers

    names = list(getattr(config, "architectures", None) or [])
    module = type(config).__module__
    beside = module.replace(".configuration_", ".modeling_") if module.startswith("transformers.models.") else None
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is None and beside is not None:
            try:
                cls = getattr(importlib.import_module(beside), name, None)
            except ImportError:
                cls = None
        if isinstance(cls, type):
            return cls
    if any("ForImageClassification" in name for name in names):
        return transformers.AutoModelForImageClassification
    return transformers.AutoModel




def auto_class_table(mapping: str) -> dict[str, str | tuple[str, ...]]:
    """transformers' ``{model_type: class name(s)}`` table of one auto class, by its name in
    ``transformers.models.auto.modeling_auto`` (``"MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"``), or ``{}`` where
    this transformers has no such table: that module is outside transformers' documented API, so every caller falls
    back on the class name (``...ForImageClassification``) rather than fail."""
    try:
        import transformers.models.auto.modeling_auto as modeling_auto
    except ImportError:
        return {}
    table = getattr(modeling_auto, mapping, None)
    return dict(table) if isinstance(table, dict) else {}


def auto_class_names(mapping: str) -> set[str]:
    """Every class name in :func:`auto_class_table` ``(mapping)`` (a model type may list several)."""
    return {name for value in auto_class_table(mapping).values()
            for name in (value if isinstance(value, tuple) else (value,))}
