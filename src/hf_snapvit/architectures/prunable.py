"""Which share of a model hf_snapvit prunes: the block stack its spec names, against the other stacks of repeated
blocks in the backbone, which stay dense (DepthPro's second encoder, CaiT's class-attention blocks, MobileViT's other
stages).

A stack here is an ``nn.ModuleList`` or ``nn.Sequential`` of children of one class (one is enough), each holding at
least four ``nn.Linear`` (as a transformer block does: q, k, v, o or a fused qkv and its output, and the FFN's; a
list of small MLPs does not), outside the pruned stack and not containing it. The
scan reads the module tree only; the shares of parameters and of the FLOPs one forward computes are measured only
for a model that has such a stack. :func:`note_partial` warns (once per model) and records the share in the ranking's
provenance, from which the model card says it.
"""

from __future__ import annotations

import numbers
import warnings
import weakref
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch.nn as nn

from . import get_backbone, get_layers, get_spec
from .budget import backbone_parameters
from .flops import ForwardFlops, forward_flops

_WARNED: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()  # the models warned about, once each


@dataclass(frozen=True)
class PrunableShare:
    """The pruned stack and what it holds.

    Args:
        blocks: Dotted path of the pruned stack (from the model, or from a task model's vision encoder).
        num_blocks: Blocks in it.
        params: Its share of the backbone's parameters (those budgets count).
        flops: Its share of the FLOPs one forward computes (``None``: the forward could not be counted).
        dense: The other stacks, each as ``(path, number of blocks)``.
    """

    blocks: str
    num_blocks: int
    params: float
    flops: float | None
    dense: tuple[tuple[str, int], ...]

    def sentence(self, code: str = "") -> str:
        """Which share of the model is prunable, in one sentence (paths quoted by ``code``: a card's backticks)."""
        flops = "" if self.flops is None else f" and {self.flops:.0%} of its FLOPs"
        dense = ", ".join(f"{code}{path}{code} ({count} blocks)" for path, count in self.dense)
        return (f"only the block stack {code}{self.blocks}{code} ({self.num_blocks} blocks) is prunable: it holds "
                f"{self.params:.0%} of the backbone's parameters{flops}; {dense} "
                f"{'stays' if len(self.dense) == 1 else 'stay'} dense")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dense": [list(stack) for stack in self.dense]}

    @classmethod
    def from_dict(cls, data: Any) -> "PrunableShare | None":
        """The share a ranking's provenance records, or ``None`` where it records none (or not in this form)."""
        try:
            share = cls(str(data["blocks"]), int(data["num_blocks"]), float(data["params"]),
                        None if data.get("flops") is None else float(data["flops"]),
                        tuple((str(path), int(count)) for path, count in data["dense"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        valid = [share.params, *([] if share.flops is None else [share.flops])]
        return share if share.dense and all(isinstance(v, numbers.Real) and 0 <= v <= 1 for v in valid) else None


def _counted_root(model: nn.Module) -> nn.Module:
    """The model whose forward the budgets count: a task model's vision encoder, else the model itself."""
    spec = get_spec(model)
    return model.get_submodule(spec.encoder) if spec.task is not None else model


def _repeats(module: nn.Module) -> bool:
    children = list(module.children())
    return (len(children) >= 1 and len({type(child) for child in children}) == 1
            and all(sum(isinstance(m, nn.Linear) for m in child.modules()) >= 4 for child in children))


def other_stacks(model: nn.Module) -> list[tuple[str, int]]:
    """``(path, number of blocks)`` of each stack of repeated blocks in ``model``'s backbone other than the one its
    spec prunes (paths from the model, or from a task model's vision encoder); outermost stacks only."""
    root, spec = _counted_root(model), get_spec(model)
    names = {id(m): name for name, m in root.named_modules()}
    pruned = get_layers(model, spec)
    inside = {id(m) for m in pruned.modules()}
    pruned_path = names.get(id(pruned), "")
    backbone = get_backbone(model, spec)
    found: list[tuple[str, int]] = []
    for name, module in backbone.named_modules(prefix=names.get(id(backbone), "")):
        if (id(module) in inside or pruned_path.startswith(f"{name}.") or not isinstance(
                module, (nn.ModuleList, nn.Sequential)) or any(name.startswith(f"{f}.") for f, _ in found)):
            continue
        if _repeats(module):
            found.append((name, len(module)))
    return found


def prunable_share(model: nn.Module, flops: ForwardFlops | None = None, *,
                   expected: float | None = None) -> PrunableShare | None:
    """The share of ``model`` that hf_snapvit prunes, where its backbone has other stacks of repeated blocks
    (:func:`other_stacks`); ``None`` where the pruned stack is the only one. ``flops``: the forward's count, if
    made (else counted here, for a model with other stacks only; ``expected``: its FLOPs by the budget)."""
    stacks = other_stacks(model)
    if not stacks:
        return None
    root, spec = _counted_root(model), get_spec(model)
    names = {id(m): name for name, m in root.named_modules()}
    pruned = get_layers(model, spec)
    path = names.get(id(pruned), spec.layers)
    params = sum(p.numel() for p in pruned.parameters()) / max(1, backbone_parameters(model))
    if flops is None:
        try:
            flops = forward_flops(root, expected=expected)
        except Exception:  # noqa: BLE001 - the parameters' share is still known
            flops = None
    flop_share = None
    if flops is not None:
        backbone = names.get(id(get_backbone(model, spec)), "")
        total = flops.modules.get(backbone, 0) if backbone else flops.total
        spent = flops.modules.get(path) or flops.under([f"{path}.{name}" for name, _ in pruned.named_children()])
        flop_share = min(1.0, spent / total) if total else None
    return PrunableShare(path, len(pruned), min(1.0, params), flop_share,
                         tuple(stacks))


def note_partial(model: nn.Module, ranking: Any, share: PrunableShare | None = None) -> Any:
    """``ranking`` with the share of ``model`` it prunes in its provenance (``"prunable"``), where that is only part
    of the backbone, and a warning saying so (once per model); else ``ranking`` as it is. A share already recorded
    is not measured again."""
    recorded = PrunableShare.from_dict(ranking.provenance.get("prunable"))
    share = share or recorded or prunable_share(model, expected=ranking.shape.flops())
    if share is None:
        return ranking
    if model not in _WARNED:
        _WARNED.add(model)
        warnings.warn(f"{type(model).__name__}: hf_snapvit prunes part of it; {share.sentence()}.", UserWarning,
                      stacklevel=3)
    if recorded == share:
        return ranking
    return replace(ranking, provenance={**ranking.provenance, "prunable": share.to_dict()})
