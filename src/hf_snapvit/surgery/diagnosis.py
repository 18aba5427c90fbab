"""Why a slice a spec describes cannot run: a parameter inside the attention or the FFN, of none of the projections
the spec slices nor of any other ``nn.Linear`` (those are the spec's to name), that holds the width slicing changes:
a norm over the FFN's hidden features (timm's ``scale_mlp_norm`` ViTs, EVA-02 CLIP, BEiT-3), a norm or bias over every
head's features, a per-head gate no spec names. The proof (:mod:`.proof`) names it instead of the shape error the
slice's forward raised."""

from __future__ import annotations

import torch.nn as nn

from ..architectures import (ArchitectureSpec, get_attention, get_layers, get_mlp, get_projection, head_rows,
                             head_tables, num_heads)


def _holders(owner: nn.Module, avoid: set[int], skip: set[int], width: int) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of each parameter inside ``owner``, outside the modules in ``avoid`` and of no
    ``nn.Linear``, that is not in ``skip`` and has a dimension of ``width`` (the path names its module, or the
    parameter where ``owner`` holds it itself)."""
    avoided: list[str] = []
    found = []
    for name, module in owner.named_modules():
        if id(module) in avoid:
            avoided.append(name)
            continue
        if isinstance(module, nn.Linear) or any(name.startswith(f"{a}.") for a in avoided):
            continue
        for key, parameter in module.named_parameters(recurse=False):
            if id(parameter) not in skip and width in parameter.shape:  # a module by its name, else the parameter
                found.append((name or key, module))
    return found


def unsliced_width(model: nn.Module, spec: ArchitectureSpec) -> str:
    """Why no slice of ``model`` with ``spec`` can run (see the module docstring), in a clause; ``""`` if no
    parameter shows it."""
    layer = get_layers(model, spec)[0]
    attention = get_attention(layer, spec)
    mlp, variant = get_mlp(layer, spec)
    where = ".".join(filter(None, (spec.layers, "0")))
    tables = {id(getattr(owner, name)) for owner, name in head_tables(layer, spec)}
    tables |= {id(p) for m in head_rows(layer, spec) for p in m.parameters()}
    neurons = get_projection(mlp, variant.out_proj).in_features
    # The FFN's parameters, not the attention's (an FFN that is the block itself holds the attention too).
    for name, module in _holders(mlp, {id(attention)}, set(), neurons):
        return (f"its FFN's {neurons} hidden features pass through {where}.{_join(spec.mlp, name)} "
                f"({type(module).__name__}), whose statistics change when a neuron goes")
    width = get_projection(attention, spec.o_proj).in_features
    for name, module in _holders(attention, set(), tables, width):
        return (f"{where}.{_join(spec.attention, name)} (of {type(module).__name__}) holds all {width} features of "
                "its heads together, which slicing its heads cannot follow")
    heads = num_heads(attention, spec)
    for name, module in _holders(attention, set(), tables, heads) if spec.prune_heads else ():
        return (f"{where}.{_join(spec.attention, name)} (of {type(module).__name__}) holds one value per head that "
                "no slice of its heads follows")
    return ""


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
