"""Torch-Pruning on Hugging Face ViTs: whole heads and FFN neurons only, to exact unit counts (for
``peer_torch_pruning.py``; needs torch, transformers and torch-pruning, not hf_snapvit).

How ``MetaPruner`` is driven, and why:

* Its head and width ratios are separate (no joint budget), so the caller counts heads and neurons to remove and each
  count becomes the ratio that removes exactly that many (:func:`_exact_ratio`).
* Heads are thresholded only inside a width pass, and the default scope would rank attention dimensions among FFN
  neurons: the FFN input layers form one scope, the q/k/v layers a second with a nominal ratio that only switches
  head pruning on; ``prune_head_dims=False`` removes whole heads.
* Global thresholds can empty a block: :class:`KeepFloor` ranks each block's best ``min_heads`` heads and
  ``min_neurons`` neurons above all else (hf_snapvit's floors); below them Torch-Pruning's ranking decides.

The hidden width is never pruned (the patch embedding is ignored, which fixes the residual group) and the classifier
is ignored, so the label space stays whole.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Callable

import torch
import torch.nn as nn
import torch_pruning as tp


def vit_blocks(model: nn.Module) -> list[tuple[nn.Module, nn.Module]]:
    """``(attention, mlp)`` of every transformer block, in depth order, found by layout rather than by name: an
    attention module owns ``q_proj``/``k_proj``/``v_proj``/``o_proj`` and a ``head_dim`` (transformers 5.x ViT, DeiT),
    an FFN owns ``fc1``/``fc2``."""
    attentions = [m for m in model.modules()
                  if all(isinstance(getattr(m, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
                  and hasattr(m, "head_dim")]
    mlps = [m for m in model.modules()
            if isinstance(getattr(m, "fc1", None), nn.Linear) and isinstance(getattr(m, "fc2", None), nn.Linear)]
    if not attentions or len(attentions) != len(mlps):
        raise ValueError(
            f"{type(model).__name__} does not look like a transformers ViT: found {len(attentions)} attention modules "
            f"with q_proj/k_proj/v_proj/o_proj and {len(mlps)} FFNs with fc1/fc2 (expected one of each per block)."
        )
    return list(zip(attentions, mlps))


def widths(model: nn.Module) -> tuple[list[int], list[int]]:
    """Current ``(heads per block, FFN neurons per block)``, read from the weight shapes."""
    heads, neurons = [], []
    for attention, mlp in vit_blocks(model):
        heads.append(attention.q_proj.out_features // attention.head_dim)
        neurons.append(mlp.fc1.out_features)
    return heads, neurons


def sync_head_counts_(model: nn.Module) -> None:
    """Make every attention module's head-count attributes agree with its pruned projections: the forward reshapes
    with ``-1`` heads and runs anyway, but the attention interfaces and FLOP counters read ``num_attention_heads``."""
    for attention, _ in vit_blocks(model):
        heads = attention.q_proj.out_features // attention.head_dim
        for name in ("num_attention_heads", "num_heads"):
            if hasattr(attention, name):
                setattr(attention, name, heads)
        if hasattr(attention, "all_head_size"):
            attention.all_head_size = heads * attention.head_dim


class KeepFloor:
    """Importance wrapper that ranks each block's best ``min_heads`` heads and ``min_neurons`` neurons first.

    ``heads`` maps each ``o_proj`` to ``(num_heads, head_dim)``: Torch-Pruning roots each attention group on the output
    projection's input channels; ``fc1s`` are the FFN input layers, the roots of the FFN groups.
    """

    def __init__(self, importance: Callable, heads: dict[nn.Module, tuple[int, int]], fc1s: set[nn.Module],
                 min_heads: int, min_neurons: int) -> None:
        self.importance, self.heads, self.fc1s = importance, heads, fc1s
        self.min_heads, self.min_neurons = min_heads, min_neurons

    def __call__(self, group: Any) -> torch.Tensor | None:
        imp = self.importance(group)
        if imp is None:
            return None
        root = group[0].dep.target.module
        if root in self.heads:
            num_heads, head_dim = self.heads[root]
            per_head = imp.view(num_heads, head_dim).mean(1)
            best = per_head.topk(min(self.min_heads, num_heads)).indices
            imp = imp.clone().view(num_heads, head_dim)
            imp[best] = float("inf")
            return imp.view(-1)
        if root in self.fc1s:
            imp = imp.clone()
            imp[imp.topk(min(self.min_neurons, len(imp))).indices] = float("inf")
        return imp


def _exact_ratio(remove: int, total: int) -> float:
    """The ratio for which Torch-Pruning's ``total - int(total * (1 - ratio))`` removes exactly ``remove`` units."""
    return 0.0 if remove <= 0 else (remove - 0.5) / total  # the half unit absorbs float error in int(...)


def prune_vit_(
    model: nn.Module,
    importance: Callable,
    example_inputs: dict[str, torch.Tensor],
    *,
    remove_heads: int,
    remove_neurons: int,
    min_heads: int = 1,
    min_neurons: int = 1,
) -> dict[str, Any]:
    """Remove ``remove_heads`` heads and ``remove_neurons`` FFN neurons from a HF ViT or DeiT in eval mode, in place,
    each kind ranked globally by ``importance`` (gradient-based ones need ``.grad`` on the weights), never below the
    per-block floors; ``example_inputs`` are keyword inputs for tracing. Returns the widths left and the seconds."""
    blocks = vit_blocks(model)
    heads_before, neurons_before = widths(model)
    max_heads = sum(h - min_heads for h in heads_before)
    max_neurons = sum(f - min_neurons for f in neurons_before)
    if not 0 <= remove_heads <= max_heads or not 0 <= remove_neurons <= max_neurons:
        raise ValueError(
            f"remove_heads={remove_heads} / remove_neurons={remove_neurons} are out of range: with floors of "
            f"{min_heads} heads and {min_neurons} neurons per block at most {max_heads} heads and {max_neurons} "
            "neurons can go. Ask for a smaller budget or lower the floors."
        )
    start = time.perf_counter()
    num_heads = {}
    for attention, _ in blocks:
        for name in ("q_proj", "k_proj", "v_proj"):
            num_heads[getattr(attention, name)] = attention.q_proj.out_features // attention.head_dim
    fc1s = {mlp.fc1 for _, mlp in blocks}
    ignored = [m for m in model.modules() if isinstance(m, nn.Conv2d)]  # the patch embedding fixes the hidden width
    ignored += [m for name, m in model.named_children()
                if name in ("classifier", "cls_classifier", "distillation_classifier")]
    unwrapped = [(p, p.dim() - 1) for name, p in model.named_parameters()
                 if name.endswith(("cls_token", "position_embeddings", "distillation_token", "mask_token"))]
    floor = KeepFloor(importance, {a.o_proj: (h, a.head_dim) for (a, _), h in zip(blocks, heads_before)}, fc1s,
                      min_heads, min_neurons)
    scopes = {tuple(mlp.fc1 for _, mlp in blocks): _exact_ratio(remove_neurons, sum(neurons_before))}
    if remove_heads:
        scopes[tuple(a.q_proj for a, _ in blocks)] = 1e-6  # switches head thresholding on; dims are never pruned
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracing warnings about ops it does not prune (softmax, sdpa)
        pruner = tp.pruner.MetaPruner(
            model,
            example_inputs=example_inputs,
            importance=floor,
            global_pruning=True,
            pruning_ratio=0.0,
            pruning_ratio_dict=scopes,
            ignored_layers=ignored,
            unwrapped_parameters=unwrapped,
            num_heads=num_heads,
            prune_num_heads=True,
            prune_head_dims=False,
            head_pruning_ratio=_exact_ratio(remove_heads, sum(heads_before)),
        )
        pruner.step()
    sync_head_counts_(model)
    seconds = time.perf_counter() - start
    heads, neurons = widths(model)
    at_floor = sum(1 for h, f in zip(heads, neurons) if (h == min_heads and remove_heads) or
                   (f == min_neurons and remove_neurons))
    # Wall time covers tracing, importance and surgery; a block at a floor means the floor bound the ranking there.
    return {"heads": heads, "neurons": neurons, "seconds": seconds, "floor_blocks": at_floor}
