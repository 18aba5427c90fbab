"""Discovery: the :class:`ArchitectureSpec` of a vision transformer no registry knows, read from its module tree and
one forward pass; and the spec of an unregistered model type, from its checkpoint's ``config.json`` or discovered.

A model whose forward takes no ``pixel_values`` is refused first. The stack of blocks is the ``nn.ModuleList`` (or
``nn.Sequential``: timm's) of same-class modules holding the most parameters; one whose blocks differ in width or in
structure (hierarchical stages: Swin, Hiera, Segformer) is refused as no plain ViT. In its first block, the order in
which one forward uses the ``nn.Linear`` weights (:mod:`.tracing`: through the layer or ``F.linear``) names them:
three projections from the hidden width to one attention width (query, key, value), or one fused projection to three
times that width (its rows the query, key and value blocks), one back (the output projection), then the FFN: one or
two projections out of the hidden width (a gated FFN has two; a packed one, value and gate in one, twice the neurons)
and one back. The attention and FFN modules are the closest common parents of their projections; the head count is
the config's or the attention module's, else the one the forward splits the query into
(:func:`~.structure.traced_heads`). A spec found here is a guess until :func:`hf_snapvit.surgery.proof.prove_spec`
shows that slicing with it equals masking (the last guess keeps every head, for attention that cannot run with
fewer); ``save_elastic`` proves it before it writes anything, then stores its data form
(:func:`~.stored.spec_to_dict`) in the checkpoint's ``config.json`` (``elastic_spec``), so loading needs no
registration. A stored spec is checked against the model it is applied to before it is used
(:func:`~.stored.check_stored_spec`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import torch.nn as nn
from transformers import PretrainedConfig

from ..errors import UnsupportedArchitectureError
from .inputs import takes_grid
from .registry import (SPEC_KEY, ArchitectureSpec, MlpSpec, on_unregistered, supported_model_types,
                       vision_config)
from .stored import check_stored_spec, spec_from_dict, spec_to_dict  # noqa: F401 (spec_to_dict: saving.py)
from .structure import by_role, head_attributes, patch_count, traced_heads, uneven_blocks
from .tracing import classifier_paths, trace_block

# Specs of unregistered models, by model type and structure (_structure_key): read from a checkpoint's config.json or
# discovered in a model. One model type can hold many structures (every timm model is a "timm_wrapper").
_DISCOVERED: dict[tuple[str, str], ArchitectureSpec] = {}
_STORED: dict[str, ArchitectureSpec] = {}  # parsed config.json specs, by their JSON: one object per stored spec
_CHECKED: set[tuple[str, tuple[str, str]]] = set()  # (a stored spec's JSON, a structure) held to a model of it
# Config entries that do not shape the modules discovery reads (hf_snapvit's own entries start with "elastic_").
_NOT_STRUCTURE = frozenset({"_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype",
                            "id2label", "label2id", "num_labels", "problem_type", "label_names", "num_classes"})


def _block_stack(root: nn.Module, model: nn.Module) -> tuple[str, nn.Module]:
    """The dotted path and the ``nn.ModuleList`` or ``nn.Sequential`` of same-class blocks holding the most
    parameters, refused where it is not the stack of a plain ViT (blocks of one width and structure)."""
    best: tuple[int, str, nn.Module] | None = None
    for name, module in root.named_modules():
        if (isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 0
                and len({type(m) for m in module}) == 1):
            size = sum(p.numel() for p in module.parameters())
            if size and (best is None or size > best[0]):
                best = (size, name, module)
    if best is None:
        raise _not_plain(model, "it has no repeated block stack (an nn.ModuleList or nn.Sequential of one class)")
    uneven = uneven_blocks(best[2]) if getattr(model.config, "elastic_layout", None) is None else ""
    if uneven:  # a model hf_snapvit sliced records its widths; only a model built this way is hierarchical
        raise _not_plain(model, f"the blocks of {best[1] or 'its top level'} ({len(best[2])} "
                                f"{type(best[2][0]).__name__}) {uneven}")
    return best[1], best[2]


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


def _parent(paths: list[str]) -> str:
    """The closest common parent of dotted paths (``""``: the block itself)."""
    parts = [p.split(".")[:-1] for p in paths]
    common = []
    for names in zip(*parts):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common)


def _relative(path: str, parent: str) -> str:
    return path[len(parent) + 1:] if parent else path


def discover_spec(model: nn.Module, *, any_size_name: bool = False) -> ArchitectureSpec:
    """The spec of ``model`` found in its module tree and one forward pass (not yet proven); ``any_size_name``: see
    :func:`head_attributes` (the second guess, when the first fails its proof).

    Raises:
        UnsupportedArchitectureError: naming what could not be matched (no block stack, no q/k/v/o projections, no
            FFN), with the fix: a registered :class:`ArchitectureSpec`.
    """
    _takes_images(model)
    config = vision_config(model.config)
    base = getattr(model, "base_model", model)
    # Embedding calls the backbone with pixel_values; timm's model inside TimmWrapper* takes x: use the wrapper.
    whole = base is not model and "pixel_values" not in inspect.signature(base.forward).parameters
    base = model if whole else base
    layers_path, layers = _block_stack(base, model)
    splits: list = []
    calls, tokens = trace_block(model, layers[0], splits)
    problem = "hf_snapvit could not match"
    fused = _is_fused(calls)
    if len(calls) < (3 if fused else 5):
        raise UnsupportedArchitectureError(
            f"{problem} attention and FFN projections in block 0 of {layers_path} ({type(layers[0]).__name__}): its "
            f"forward called {len(calls)} nn.Linear layers ({[n for n, _ in calls]}). Register an ArchitectureSpec.")
    hidden = calls[0][1].in_features
    q, k, v = (calls[0],) * 3 if fused else by_role(calls[:3])
    after = 1 if fused else 3  # the calls after the query, key and value projections
    width = q[1].out_features // (3 if fused else 1)
    if not fused and any(m.in_features != hidden or m.out_features != width for _, m in (q, k, v)):
        raise UnsupportedArchitectureError(
            f"{problem} query, key and value projections in block 0 of {layers_path}: the first three nn.Linear "
            f"calls are {[(n, m.in_features, m.out_features) for n, m in (q, k, v)]}, expected three {hidden} -> "
            f"{width}. Register an ArchitectureSpec naming them.")
    o = calls[after]
    rest = calls[after + 1:]
    ups = [(n, m) for n, m in rest if m.in_features == hidden and m.out_features != hidden]
    # A packed FFN (timm's GluMlp) computes value and gate in one projection of twice the neurons.
    downs = [(n, m) for n, m in rest if m.out_features == hidden and ups
             and ups[0][1].out_features in (m.in_features, 2 * m.in_features)]
    if o[1].in_features != width or o[1].out_features != hidden or not ups or not downs:
        raise UnsupportedArchitectureError(
            f"{problem} an output projection ({width} -> {hidden}) and an FFN ({hidden} -> n -> {hidden}) in block 0 "
            f"of {layers_path}; its nn.Linear calls after q/k/v: {[(n, m.in_features, m.out_features) for n, m in rest]}"
            ". Register an ArchitectureSpec naming them.")
    attention = _parent([q[0], k[0], v[0], o[0]])
    block = layers[0]
    # The head count the config or the attention module names, else the one its forward splits the query into.
    heads = _head_count(config, block.get_submodule(attention) if attention else block) or traced_heads(
        splits, q[1].out_features, width)
    if heads <= 0 or width % heads:
        raise UnsupportedArchitectureError(
            f"{problem} the head count of {type(model).__name__}: config.num_attention_heads is {heads or 'missing'} "
            f"for an attention width of {width}, the attention module keeps no num_heads, and its forward splits "
            "no query into heads. Set config.num_attention_heads, or register an ArchitectureSpec.")
    ups = ups[:2] if len(ups) > 1 and ups[1][1].out_features == ups[0][1].out_features else ups[:1]
    mlp = _parent([*(n for n, _ in ups), downs[0][0]])
    counts, sizes, head_width = head_attributes(block.get_submodule(attention) if attention else block, heads,
                                                 width // heads, any_size_name)
    patches = patch_count(model, tokens)
    extra = max(0, tokens - patches)
    return ArchitectureSpec(
        model_type=model.config.model_type, layers=layers_path, attention=attention,
        q_proj=_relative(q[0], attention), k_proj=_relative(k[0], attention), v_proj=_relative(v[0], attention),
        o_proj=_relative(o[0], attention), mlp=mlp,
        mlp_variants=(MlpSpec(tuple(_relative(n, mlp) for n, _ in ups), _relative(downs[0][0], mlp)),),
        embedding="pooled", extra_tokens=lambda c, e=extra: e, num_patches=lambda c, n=patches: n,
        head_count_attrs=counts, head_size_attrs=sizes, head_width=head_width, token_subsets=False,
        qkv_blocks=(0, 1, 2) if fused else (0, 0, 0), grid_inputs=takes_grid(model), backbone="" if whole else None,
        excluded_from_budget=classifier_paths(model) if whole else ())


def _head_count(config: PretrainedConfig, attention: nn.Module) -> int:
    """The head count the config names, else the attention module's own ``num_heads`` (a timm model's config keeps
    only the timm architecture's name)."""
    for owner, name in ((config, "num_attention_heads"), (config, "num_heads"), (attention, "num_heads"),
                        (attention, "num_attention_heads")):
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _is_fused(calls: list[tuple[str, nn.Linear]]) -> bool:
    """Whether the block's first projection is one fused qkv: three times as many outputs as the next projection
    (the output projection) takes and gives back, where separate ones would have called two more of its width."""
    if len(calls) < 2:
        return False
    first, second = calls[0][1], calls[1][1]
    return first.out_features == 3 * second.in_features and second.out_features == first.in_features


def discovery_guesses(model: nn.Module) -> list[ArchitectureSpec]:
    """The specs discovery proposes for ``model``, most likely first (distinct ones only); the last keeps every head,
    for an attention whose forward cannot run with fewer (timm's EVA reshapes its output to the model width), so
    its FFN neurons can still be pruned."""
    first = discover_spec(model)
    second = discover_spec(model, any_size_name=True)
    guesses = [first] if second.head_size_attrs == first.head_size_attrs else [first, second]
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
            f"model_type={model_type!r} is not supported by hf_snapvit. Supported: {', '.join(supported_model_types())}"
            ". Pass the model itself (hf_snapvit.rank(model, ...)) and its structure is discovered and proven; or "
            "describe where its blocks, q/k/v/o projections and FFN live with hf_snapvit.ArchitectureSpec and call "
            "hf_snapvit.register_architecture(spec); for a task model built on a supported backbone, describe where "
            "its encoder lives with hf_snapvit.TaskModelSpec and call hf_snapvit.register_task_model(spec)."
        )
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


on_unregistered(unregistered_spec, forget_discovered)
