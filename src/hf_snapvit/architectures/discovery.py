"""Discovery: the :class:`ArchitectureSpec` of a vision transformer no registry knows, read from its module tree and
one forward pass; and the spec of an unregistered model type, from its checkpoint's ``config.json`` or discovered.

A model whose forward takes no ``pixel_values`` is refused first. The stack of blocks is the ``nn.ModuleList`` (or
``nn.Sequential``: timm's) of same-class modules holding the most parameters among those the forward runs; one whose
blocks differ in width, structure or head count (hierarchical stages: Swin, Hiera, Segformer) is refused as no plain
ViT. The blank input is the config's (:func:`~.inputs.pixel_shape`), at the side the position embedding fixes where
the config names none, and for a video tower whose ``[B, T, C, H, W]`` clips fail, each clip's frames in the batch
(``frames_in_batch``, X-CLIP). Which of the first block's ``nn.Linear`` calls are the query, key, value and output
projections and the FFN's is :mod:`.matching`'s to tell (:mod:`.tracing` records them); the head count is the
config's or the attention module's, else the one the forward splits the query into (:func:`~.structure.traced_heads`),
and the head width an attribute named for it, else the width that split shows. A spec found here is a guess until
:func:`hf_snapvit.surgery.proof.prove_spec` shows that slicing with it equals masking (the last guess keeps every
head, for attention that cannot run with fewer); ``save_elastic`` proves it before it writes anything, then stores its
data form (:func:`~.stored.spec_to_dict`) in the checkpoint's ``config.json`` (``elastic_spec``), so loading needs no
registration. A stored spec is checked against the model it is applied to before it is used
(:func:`~.stored.check_stored_spec`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import torch.nn as nn
from transformers import PretrainedConfig

from ..errors import DataError, UnsupportedArchitectureError
from .inputs import names_size, on_inferred_side, patch_side, pixel_shape, position_side, takes_grid
from .matching import match_block, under
from .parts import find_attribute
from .registry import (SPEC_KEY, ArchitectureSpec, MlpSpec, on_unregistered, supported_model_types,
                       vision_config)
from .stored import check_stored_spec, spec_from_dict, spec_to_dict  # noqa: F401 (spec_to_dict: saving.py)
from .structure import head_attributes, patch_count, shape_attributes, traced_heads, uneven_blocks
from .tracing import Trace, classifier_paths, trace

# Specs of unregistered models, by model type and structure (_structure_key): read from a checkpoint's config.json or
# discovered in a model. One model type can hold many structures (every timm model is a "timm_wrapper").
_DISCOVERED: dict[tuple[str, str], ArchitectureSpec] = {}
_STORED: dict[str, ArchitectureSpec] = {}  # parsed config.json specs, by their JSON: one object per stored spec
_CHECKED: set[tuple[str, tuple[str, str]]] = set()  # (a stored spec's JSON, a structure) held to a model of it
# Config entries that do not shape the modules discovery reads (hf_snapvit's own entries start with "elastic_").
_NOT_STRUCTURE = frozenset({"_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype",
                            "id2label", "label2id", "num_labels", "problem_type", "label_names", "num_classes"})


def _stacks(root: nn.Module, blocks_only: bool = False) -> list[tuple[str, nn.Module]]:
    """Every ``nn.ModuleList`` or ``nn.Sequential`` of same-class modules holding parameters: first those whose
    modules hold at least four ``nn.Linear`` each, as a transformer block's attention and FFN do (patch embeddings
    and lists of small MLPs do not; ``blocks_only``: only those), each group largest first."""
    found = []
    for name, module in root.named_modules():
        if (isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0
                and len({type(m) for m in module}) == 1):
            size = sum(p.numel() for p in module.parameters())
            blocks = sum(isinstance(m, nn.Linear) for m in module[0].modules()) >= 4
            if size and (blocks or not blocks_only):
                found.append((not blocks, -size, name, module))
    return [(name, module) for *_, name, module in sorted(found, key=lambda item: item[:2])]


def _block_stack(model: nn.Module, stacks: list[tuple[str, nn.Module]],
                 shape: tuple[int, ...]) -> tuple[str, nn.Module, Trace]:
    """The stack of blocks: of the stacks whose first block the forward runs, the one holding the most parameters
    (a larger stack the forward never runs holds no computation to prune), refused where it is not a plain ViT's
    (blocks of one width and structure); with the trace of its first block."""
    if not stacks:
        raise _not_plain(model, "it has no repeated block stack (an nn.ModuleList or nn.Sequential of one class)")
    found, ran = trace(model, stacks[0][1][0], shape, watch=tuple(stack[0] for _, stack in stacks))
    name, layers = stacks[0]
    if isinstance(layers[0], nn.ModuleList) and (uneven := uneven_blocks(layers)):  # a list of stages' lists
        raise _not_plain(model, f"the stages of {name} ({len(layers)} lists of blocks) {uneven}")
    if id(stacks[0][1][0]) not in ran:  # its first block did not run: the largest stack that did
        used = [(name, stack) for name, stack in stacks[1:] if id(stack[0]) in ran]
        if not used:
            raise _not_plain(model, f"its forward runs none of its block stacks ({', '.join(n for n, _ in stacks[:3])}"
                                    ")")
        stacks = used
        found, _ = trace(model, stacks[0][1][0], shape)
    name, layers = stacks[0]
    uneven = uneven_blocks(layers) if getattr(model.config, "elastic_layout", None) is None else ""
    if uneven:  # a model hf_snapvit sliced records its widths; only a model built this way is hierarchical
        raise _not_plain(model, f"the blocks of {name or 'its top level'} ({len(layers)} "
                                f"{type(layers[0]).__name__}) {uneven}")
    if inner := [path for path, _ in _stacks(layers[0], blocks_only=True)]:  # CrossViT's: each branch's blocks
        raise _not_plain(model, f"block 0 of {name or 'its top level'} ({type(layers[0]).__name__}) holds stacks of "
                                f"blocks of its own ({', '.join(inner[:2])}): branches or stages, not one block")
    return name, layers, found


def _input_shape(model: nn.Module) -> tuple[tuple[int, ...], int]:
    """The blank input discovery traces with, and the side it inferred from the position embedding where the config
    names none (0 otherwise)."""
    shape = pixel_shape(model.config, 1)
    if names_size(vision_config(model.config)):
        return shape, 0
    try:
        side = position_side(model, patch_side(model))
    except DataError:  # no patch size anywhere: the model takes any size, or the trace refuses it
        side = 0
    return (*shape[:-2], side, side) if side else shape, side


def _not_plain(model: nn.Module, why: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"This {type(model).__name__} ({model.config.model_type}) is not a plain ViT: {why}. hf_snapvit prunes "
        "vision transformers whose blocks repeat at one width; prune a plain ViT backbone instead.")


def _takes_images(model: nn.Module) -> None:
    """Refuse a model whose forward takes no ``pixel_values`` (nor a tower's patch sequences with their grid)."""
    parameters = [n for n, p in inspect.signature(model.forward).parameters.items() if p.kind not in (
        inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if "pixel_values" not in parameters and not takes_grid(model):
        raise UnsupportedArchitectureError(
            f"This {type(model).__name__} ({model.config.model_type}) takes no images: its forward takes "
            f"{parameters[:3]}, not pixel_values, so it is not a vision transformer hf_snapvit can prune.")


def _relative(path: str, parent: str) -> str:
    return path[len(parent) + 1:] if parent else path


def _traced_stack(model: nn.Module, stacks: list[tuple[str, nn.Module]]) -> tuple[str, nn.Module, Trace, int, int]:
    """The block stack and its first block's trace (:func:`_block_stack`), the input side inferred (0: the config's)
    and the frames per clip a video tower takes in its batch (0: it takes ``[B, T, C, H, W]`` clips, or images)."""
    shape, side = _input_shape(model)
    try:
        return (*_block_stack(model, stacks, shape), side, 0)
    except UnsupportedArchitectureError as error:
        if len(shape) != 5 or not isinstance(error.__cause__, Exception):
            raise
        try:  # a video tower that takes each clip's frames in the batch (X-CLIP's [B·T, C, H, W])
            return (*_block_stack(model, stacks, shape[1:]), side, shape[1])
        except UnsupportedArchitectureError:
            raise error from error.__cause__


def discover_spec(model: nn.Module, *, any_size_name: bool = False, rows: bool = True) -> ArchitectureSpec:
    """The spec of ``model`` found in its module tree and one forward pass (not yet proven); ``any_size_name``: see
    :func:`head_attributes` (the second guess, when the first fails its proof); ``rows``: whether layers of one
    output row per head (``head_rows``) are sliced with the heads (a guess without them follows, when the first
    fails).

    Raises:
        UnsupportedArchitectureError: naming what could not be matched (no block stack, no q/k/v/o projections, no
            FFN, no head count) and the fix.
    """
    _takes_images(model)
    config = vision_config(model.config)
    base = getattr(model, "base_model", model)
    # Embedding calls the backbone with pixel_values; timm's model inside TimmWrapper* takes x: use the wrapper.
    whole = base is not model and "pixel_values" not in inspect.signature(base.forward).parameters
    base = model if whole else base
    layers_path, layers, found, side, frames = _traced_stack(model, _stacks(base))
    block = layers[0]
    match = match_block(found, f"{type(model).__name__} ({model.config.model_type})",
                        f"{layers_path or 'the model'} ({type(block).__name__})")
    attention, width = match.attention, match.width
    owner = block.get_submodule(attention) if attention else block
    q = match.qkv[0]
    # The head count the config or the attention module names, else the one its forward splits the query into.
    traced = traced_heads(found.splits, q[1].out_features, width)
    heads = _head_count(config, owner) or traced
    if heads <= 0 or width % heads:
        raise UnsupportedArchitectureError(
            f"hf_snapvit found no head count for {type(model).__name__}: config.num_attention_heads is "
            f"{heads or 'missing'} for an attention width of {width}, {attention or 'the block'} keeps no num_heads, "
            "and its forward splits no query into heads. Set config.num_attention_heads.")
    counts, sizes, head_width = head_attributes(owner, heads, width // heads, any_size_name)
    if getattr(model.config, "elastic_layout", None) is None:  # a sliced model's blocks differ by design
        _one_head_shape(model, layers, attention, [*counts, *([head_width] if isinstance(head_width, str) else [])])
    if not counts and not head_width:
        if traced != heads:  # nothing to follow the heads by: no attribute, no split of q seen
            raise UnsupportedArchitectureError(
                f"{type(owner).__name__} of {type(model).__name__} keeps no attribute naming one head's width "
                f"({width // heads}) or the head count ({heads}), and its forward splits no query into heads, so "
                "hf_snapvit cannot follow its heads. Register an ArchitectureSpec whose head_width names the width.")
        head_width = width // heads  # the forward splits by this constant: one head's width, whatever their count
    # Layers of one output row per head inside the attention: what computes each head's position bias.
    per_head = [n for n, m in match.side if under(n, attention) and m.out_features == heads] if rows else []
    inside = [_relative(n, attention).split(".") for n in per_head]  # the modules that compute the biases
    counts += shape_attributes(owner, [".".join(parts[:i]) for parts in inside for i in range(1, len(parts))], heads)
    tokens = found.tokens  # per image: a clip's frames in the batch are counted by ModelShape.frames
    patches = patch_count(model, tokens, found.patches // max(1, frames))
    extra = max(0, tokens - patches)
    mlp = match.mlp
    return ArchitectureSpec(
        model_type=model.config.model_type, layers=layers_path, attention=attention,
        q_proj=_relative(match.qkv[0][0], attention), k_proj=_relative(match.qkv[1][0], attention),
        v_proj=_relative(match.qkv[2][0], attention), o_proj=_relative(match.o[0], attention), mlp=mlp,
        mlp_variants=(MlpSpec(tuple(_relative(n, mlp) for n, _ in match.ups), _relative(match.down[0], mlp)),),
        embedding="pooled", extra_tokens=lambda c, e=extra: e, num_patches=lambda c, n=patches: n,
        head_count_attrs=tuple(dict.fromkeys(counts)), head_size_attrs=sizes, head_width=head_width,
        token_subsets=False, qkv_blocks=(0, 1, 2) if match.fused else (0, 0, 0), grid_inputs=takes_grid(model),
        backbone="" if whole else None, excluded_from_budget=classifier_paths(model) if whole else (),
        head_rows=tuple(per_head), frames_in_batch=frames, image_size=side)


def _one_head_shape(model: nn.Module, layers: nn.Module, attention: str, paths: list[str]) -> None:
    """Refuse blocks of one width whose attentions keep different head counts or widths (``paths``): not one
    repeated block."""
    for path in filter(None, paths):
        values = list(dict.fromkeys(find_attribute(b.get_submodule(attention) if attention else b, path)
                                    for b in layers))
        if len(values) > 1:
            raise _not_plain(model, f"its blocks' attentions differ in {path} ({', '.join(map(str, values))})")


def _head_count(config: PretrainedConfig, attention: nn.Module) -> int:
    """The head count the config names, else the attention module's own ``num_heads`` (a timm model's config keeps
    only the timm architecture's name)."""
    for owner, name in ((config, "num_attention_heads"), (config, "num_heads"), (attention, "num_heads"),
                        (attention, "num_attention_heads")):
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def discovery_guesses(model: nn.Module) -> list[ArchitectureSpec]:
    """The specs discovery proposes for ``model``, most likely first (distinct ones only); the last keeps every head,
    for an attention whose forward cannot run with fewer (timm's EVA reshapes its output to the model width), so
    its FFN neurons can still be pruned."""
    first = discover_spec(model)
    second = discover_spec(model, any_size_name=True)
    guesses = [first] if second.head_size_attrs == first.head_size_attrs else [first, second]
    if first.head_rows:  # a layer that merely has one output per head need not be each head's own
        guesses.append(discover_spec(model, rows=False))
    return [*guesses, dataclasses.replace(first, prune_heads=False)]


def _structure_key(model_or_config: object, model_type: str | None) -> tuple[str, str]:
    """The model type and the config entries that shape its modules: models of one key have one spec."""
    config = getattr(model_or_config, "config", model_or_config)
    if not isinstance(config, PretrainedConfig):
        return str(model_type), ""
    # vars, not to_dict: to_dict would copy a dense checkpoint's whole ranking on every spec lookup.
    kept = {k: v for k, v in vars(config).items() if k not in _NOT_STRUCTURE and not k.startswith(("elastic_", "_"))}
    return str(model_type), json.dumps(kept, sort_keys=True, default=str)


def unregistered_spec(model_or_config: object, config: PretrainedConfig | None,
                       model_type: str | None) -> ArchitectureSpec:
    """The spec of a model no registry holds: stored in its config (``elastic_spec``), else discovered in the model
    itself; kept for the process by model type and structure."""
    key = _structure_key(model_or_config, model_type)
    stored = getattr(config, SPEC_KEY, None) if config is not None else None
    if stored is not None:  # proven when it was saved, and what the checkpoint's weights were sliced with
        text = json.dumps(stored, sort_keys=True, default=str)
        if text not in _STORED:
            _STORED[text] = spec_from_dict(str(model_type), stored, getattr(config, "_name_or_path", None))
        if isinstance(model_or_config, nn.Module) and (text, key) not in _CHECKED:
            check_stored_spec(model_or_config, _STORED[text])  # but data from outside: held to the model first
            _CHECKED.add((text, key))
        _DISCOVERED[key] = _STORED[text]
        return _STORED[text]
    if key in _DISCOVERED:
        return _DISCOVERED[key]
    same_type = [spec for (kind, _), spec in _DISCOVERED.items() if kind == key[0]]
    if isinstance(model_or_config, nn.Module) and model_type:
        spec = discover_spec(model_or_config)
    elif len(same_type) == 1:  # a config alone, edited after discovery (labels, dtype): the one structure known
        return same_type[0]
    else:
        raise UnsupportedArchitectureError(
            f"model_type={model_type!r} is not registered with hf_snapvit, and a config alone shows no structure to "
            "discover: pass the model itself (hf_snapvit.rank(model, ...)), or register_architecture / "
            f"register_task_model a spec for it. Supported: {', '.join(supported_model_types())}.")
    _DISCOVERED[key] = spec
    return spec


def is_discovered(spec: ArchitectureSpec) -> bool:
    """Whether ``spec`` was discovered or read from a checkpoint rather than registered."""
    return any(known is spec for known in _DISCOVERED.values())


def discovered_spec(model: nn.Module) -> ArchitectureSpec | None:
    """The spec kept for ``model``'s type and structure, if any."""
    return _DISCOVERED.get(_structure_key(model, model.config.model_type))


def adopt_discovered(spec: ArchitectureSpec, model: nn.Module) -> None:
    """Keep ``spec`` (a proven guess) as the spec of ``model``'s type and structure for the process."""
    _DISCOVERED[_structure_key(model, spec.model_type)] = spec


def forget_discovered(model_type: str, model: nn.Module | None = None) -> None:
    """Drop the spec kept for ``model``'s structure (one whose proof failed), or every one of ``model_type`` (a spec
    was registered for it)."""
    for key in [k for k in _DISCOVERED if k[0] == model_type]:
        if model is None or key == _structure_key(model, model_type):
            del _DISCOVERED[key]


def _inferred_side(config: PretrainedConfig) -> int | None:
    """The side discovery inferred for a model of ``config`` (or of its vision config) whose config names none."""
    vision = vision_config(config)
    for owner in (config,) if vision is config else (config, vision):
        spec = _DISCOVERED.get(_structure_key(owner, getattr(owner, "model_type", None)))
        if spec is not None and spec.image_size:
            return spec.image_size
    return None


on_unregistered(unregistered_spec, forget_discovered)
on_inferred_side(_inferred_side)
