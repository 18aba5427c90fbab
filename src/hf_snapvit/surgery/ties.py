"""Parameters that a prunable projection shares with another module: slicing one of them would cut the other too.

A tensor can be shared three ways: one parameter (or storage) held by two modules, as ``module.weight =
other.weight`` leaves it; one module reached as two units (a block listed twice in the stack, one projection named
query and key); or a tie a transformers class declares (``_tied_weights_keys``), which ``save_pretrained`` writes
once and loading re-ties. None of them can be sliced per unit, so :func:`shared_parameters` names them and the
proof refuses the model before anything is ranked or written. This check reads the module tree only (no forward), so
it runs for registered specs too.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn as nn

from ..architectures import ArchitectureSpec, get_attention, get_layers, get_mlp, get_projection, head_tables

Holder = tuple[int, str]  # (id of the owning module, attribute name)


def _prunable(model: nn.Module, spec: ArchitectureSpec) -> dict[Holder, list[str]]:
    """Each prunable tensor's holder, with the units it serves (``"block 0 to_q"``): one, unless one module serves
    two (a block listed twice, a projection named both query and key)."""
    units: dict[Holder, list[str]] = defaultdict(list)
    for index, layer in enumerate(get_layers(model, spec)):
        attention = get_attention(layer, spec)
        mlp, variant = get_mlp(layer, spec)
        paths = [*dict.fromkeys((spec.q_proj, spec.k_proj, spec.v_proj, spec.o_proj))]  # a fused qkv: one unit
        modules = [(get_projection(attention, path), path) for path in paths]
        modules += [(get_projection(mlp, path), path) for path in (*variant.in_proj, variant.out_proj)]
        holders = [((id(m), name), path) for m, path in modules for name in ("weight", "bias")
                   if getattr(m, name, None) is not None]
        holders += [((id(owner), name), name) for owner, name in head_tables(layer, spec)]
        for holder, path in holders:
            units[holder].append(f"block {index} {path}")
    return units


def _memory(tensor: torch.Tensor) -> tuple[str, int, int]:
    """The device and the byte range ``[start, end)`` a tensor reads (a meta tensor has no memory: the tensor
    object stands for it, so only the same object overlaps)."""
    if tensor.device.type == "meta":
        return "meta", id(tensor), id(tensor) + 1
    span = 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    return str(tensor.device), tensor.data_ptr(), tensor.data_ptr() + span * tensor.element_size()


def _overlapping(ranges: list[tuple[tuple[str, int, int], Holder]]) -> list[set[Holder]]:
    """Groups of holders whose tensors share memory (the same tensor, or views of one); tensors packed side by side
    in one buffer (a memory-mapped checkpoint) do not overlap."""
    groups: list[set[Holder]] = []
    end, device = -1, None
    for (where, start, stop), holder in sorted(ranges, key=lambda item: item[0]):
        if where == device and start < end:
            groups[-1].add(holder)
            end = max(end, stop)
        else:
            groups.append({holder})
            end, device = stop, where
    return [group for group in groups if len(group) > 1]


def _declared(model: nn.Module) -> dict[str, str]:
    """The ties the model's classes declare and its config turns on (``{target: source}``), as loading re-ties them."""
    expand = getattr(model, "get_expanded_tied_weights_keys", None)
    try:
        return dict(expand(all_submodels=True)) if callable(expand) else {}
    except (ValueError, AttributeError):  # a declaration transformers itself cannot expand: it ties nothing either
        return dict(getattr(model, "all_tied_weights_keys", None) or {})


def shared_parameters(model: nn.Module, spec: ArchitectureSpec) -> list[str]:
    """Each prunable tensor of ``model`` (q/k/v/o and FFN projections, per-head tables) that is not its unit's
    alone, as one line naming every path that reaches it; empty when every one is."""
    units = _prunable(model, spec)
    names: dict[Holder, list[str]] = defaultdict(list)  # every path that reaches a holder (a module has aliases)
    ranges: list[tuple[tuple[str, int, int], Holder]] = []
    for path, module in model.named_modules(remove_duplicate=False):
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(module, kind).items():
                if tensor is None or tensor.numel() == 0:  # an empty tensor has no memory to share
                    continue
                holder = (id(module), name)
                names[holder].append(f"{path}.{name}" if path else name)
                if len(names[holder]) == 1:  # a module reached by two paths holds its tensors once
                    ranges.append((_memory(tensor), holder))
    prunable_names = {name for holder in units for name in names[holder]}
    # Declared ties first (the ones a user removes from _tied_weights_keys), then tensors held twice, then modules
    # serving two units; a tensor two declared names share is named once.
    declared: list[set[str]] = []
    found: dict[str, None] = {}
    for target, source in _declared(model).items():
        if target in prunable_names or source in prunable_names:
            declared.append({target, source})
            found[f"{target} = {source} (declared in _tied_weights_keys)"] = None
    for holders in _overlapping(ranges):
        group = {names[h][0] for h in holders}
        if any(h in units for h in holders) and group not in declared:
            found[f"{' = '.join(sorted(group))} (one tensor)"] = None
    for holder, served in units.items():
        if len(served) > 1:
            found[f"{names[holder][0] if names[holder] else '?'} serves {' and '.join(served)}"] = None
    return list(found)
