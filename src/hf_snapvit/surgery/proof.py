"""The proof a discovered architecture spec must pass before a model is ranked or saved with it.

A spec found in a module tree (:mod:`hf_snapvit.architectures.discovery`) is a guess. It is tested on a copy of the
model whose every parameter carries seeded noise (zero biases, unit norms and untrained tables would hide a wrong
slice), on seeded inputs, against references that do not use the slicing code: keeping every unit, reordered, equals
the untouched copy; and at two sizes (75 % of the heads and 40 % of the neurons, then the reverse), the copy sliced
with the spec equals the copy with the dropped heads' output-projection columns and the dropped neurons' FFN-output
columns zeroed (masking). Only finite outputs prove anything: a reference with infinite or NaN values, or without
any floating-point output, is refused. The sliced copies must also have the parameters the budget counts
(:class:`~hf_snapvit.architectures.budget.ModelShape`), and what their forwards compute (counted by
``torch.utils.flop_counter``) must match its GFLOP formula per unit: each neuron's cost within 15 % (more: a block or
FFN runs more than once; less: the blocks see fewer tokens than the image has patches), each head's at least its
q/k/v/o rows' over the tokens the FFN sees (5 % under: some projections see fewer tokens, as in cross-attention to a
small memory) and at most 15 % over its full attention (attention run twice); the dense forward at least a third of
the formula's. What the forward computes beyond the blocks (a stem, a neck) is no reason to refuse: budgets measure it
(``ModelShape.other_flops``). A spec that fails is forgotten and the model refused in a few lines: the model, the
modules found, the reason, the fix. Parameters that a prunable projection shares with another module (:mod:`.ties`)
are refused for every spec, registered ones included.
"""

from __future__ import annotations

import copy
import statistics
import warnings
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from ..architectures import (ArchitectureSpec, get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim,
                             num_heads)
from ..architectures.budget import backbone_parameters, model_shape
from ..architectures.discovery import adopt_discovered, discovery_guesses, forget_discovered, is_discovered
from ..architectures.embedding import dummy_inputs
from ..architectures.flops import counting
from ..architectures.given import check_blocks, check_given
from ..architectures.placement import is_dispatched
from ..errors import UnsupportedArchitectureError
from .diagnosis import unsliced_width
from .slicing import slice_model_
from .ties import shared_parameters

#: The two proof slices: (fraction of heads kept, fraction of FFN neurons kept). Crossed, so that the FLOPs they
#: remove tell a head's cost from a neuron's.
SLICES = ((0.75, 0.4), (0.4, 0.75))
NOISE = 0.1  # the proof copy's noise, relative to each parameter's root mean square
# How far a unit's measured cost may stray from the formula's: the formula's errors of this size (EoMT's last blocks
# also attend over its queries) are tolerated; a block or FFN run twice is 100 % off.
_TOLERANCE = 0.15
# How far under its q/k/v/o rows' cost a head may save: keys and values from an 8-token memory save 14 % less.
_HEAD_TOLERANCE = 0.05
_BATCH = 1  # FLOPs per input: a batch of several can cost more per input (Pixtral attends over all its images)
_PROVEN: set[int] = set()
_SPEC_FIX = "Wrong modules? Register the right ones: hf_snapvit.register_architecture(ArchitectureSpec(...))."
_FEWER = "its blocks see fewer tokens than the image has patches (hierarchical stages or a downsampling stem)"
_FEWER_FIX = "hf_snapvit prunes plain ViTs."
_NO_SLICE_FIX = "hf_snapvit prunes heads and neurons whose outputs go straight to their output projections."
_ONCE_FIX = "hf_snapvit budgets blocks, attentions and FFNs that run once per input."


class _Unprovable(Exception):
    """Why no spec can be proven on this model (``final``: no other guess would change that), and the fix."""

    def __init__(self, why: str, fix: str, final: bool = True) -> None:
        super().__init__(why)
        self.why, self.fix, self.final = why, fix, final


def _collect(value: Any, found: list[torch.Tensor]) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            found.append(value.detach().float().flatten())
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, found)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, found)
    return found


def float_output(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every floating-point tensor of one forward's output, flattened into one (hidden states, logits, feature maps,
    heatmaps: whatever the model returns)."""
    # The same random draws in every forward (ViTMAE shuffles its patches by random noise), without touching the
    # caller's random state.
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out = model(**inputs)
    found = _collect(out, [])
    if not sum(t.numel() for t in found):
        raise _Unprovable(f"its forward returns no floating-point tensor (it returned {type(out).__name__}), so no "
                          "output can show that a slice is right",
                          "Return the model's features (a tensor or a ModelOutput) from its forward.")
    return torch.cat(found)


_output = float_output  # the name the tests compare outputs with


def _counted(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, float]:
    """:func:`float_output` and the FLOPs its forward computed per input (matrix products and convolutions)."""
    with counting() as counter:
        output = _output(model, inputs)
    return output, counter.get_total_flops() / _BATCH


def _perturbed(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """A float32 copy of ``model`` in eval mode whose every parameter carries seeded Gaussian noise of ``NOISE``
    times its root mean square (a parameter that is all zeros: the median one's), without gradients; the caller's
    model and random state are untouched."""
    base = copy.deepcopy(model).eval().float().requires_grad_(False)
    parameters = [p for p in base.parameters() if p.is_floating_point() and p.numel()]
    scales = [float(p.detach().float().square().mean().sqrt()) for p in parameters]
    typical = statistics.median([s for s in scales if s > 0] or [1.0])
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter, scale in zip(parameters, scales):
            noise = torch.randn(parameter.shape, generator=generator).to(parameter.device)
            parameter.add_(noise * (NOISE * (scale if scale > 0 else typical)))
    return base


def masked_copy(model: PreTrainedModel, spec: ArchitectureSpec,
                keep: list[tuple[np.ndarray, np.ndarray]]) -> PreTrainedModel:
    """A copy of ``model`` whose heads and FFN neurons outside ``keep`` (per block) are zeroed out: their
    output-projection columns, so they add nothing. What a slice must equal."""
    masked = copy.deepcopy(model)
    with torch.no_grad():
        for layer, (heads, neurons) in zip(get_layers(masked, spec), keep):
            attention = get_attention(layer, spec)
            width = head_dim(attention, spec)
            o_proj = get_projection(attention, spec.o_proj)
            for head in np.setdiff1d(np.arange(o_proj.in_features // width), heads):
                o_proj.weight[:, head * width:(head + 1) * width] = 0
            mlp, variant = get_mlp(layer, spec)
            out_proj = get_projection(mlp, variant.out_proj)
            out_proj.weight[:, np.setdiff1d(np.arange(out_proj.in_features), neurons)] = 0
    return masked


def _difference(output: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest absolute difference; a value that is not finite where the (finite) reference is counts as
    infinitely far."""
    if output.shape != reference.shape:
        return float("inf")
    difference = (output - reference).abs()
    return float(difference.nan_to_num(nan=float("inf")).max()) if difference.numel() else 0.0


def _finite(reference: torch.Tensor) -> None:
    bad = int((~torch.isfinite(reference)).sum())
    if bad:
        raise _Unprovable(f"{bad} of its {reference.numel()} output values on seeded random inputs are infinite or "
                          "NaN, and only finite outputs can show that a slice is right",
                          "Make the model's forward return finite values (check its weights and its configured "
                          "input size).")


def _check_counts(base: PreTrainedModel, widths: list[tuple[int, int]], dense_flops: float,
                  slices: list[tuple[list[tuple[int, int]], int, float]]) -> None:
    """Refuse where the sliced copies' parameters (``slices``: kept widths, parameters, FLOPs per input) or the
    FLOPs one head or neuron saves disagree with the model's :class:`ModelShape`, which budgets are resolved with."""
    shape = model_shape(base, dense=(max(h for h, _ in widths), max(f for _, f in widths)))
    excluded = sum(p.numel() for p in base.parameters()) - backbone_parameters(base)
    for kept, params, _ in slices:
        expected = shape.num_params([h for h, _ in kept], [f for _, f in kept]) + excluded
        if params != expected:
            raise _Unprovable(f"sliced to {kept[0][0]} heads and {kept[0][1]} neurons per block, it has {params} "
                              f"parameters where the budget counts {expected}", _SPEC_FIX, final=False)
    heads, neurons = [h for h, _ in widths], [f for _, f in widths]
    n = shape.num_tokens
    predicted = shape.flops(heads, neurons) - shape.softmax_flops(heads)
    if dense_flops < predicted / 3:  # far fewer: the blocks see fewer tokens (more: a stem or neck, measured)
        raise _Unprovable(f"its forward computes {dense_flops:.4g} FLOPs per input where hf_snapvit's formula for "
                          f"{len(widths)} blocks of {n} tokens counts {predicted:.4g}: {_FEWER}", _FEWER_FIX)
    removed = np.array([[sum(heads) - sum(h for h, _ in kept), sum(neurons) - sum(f for _, f in kept)]
                        for kept, _, _ in slices], dtype=float)
    saved = np.array([dense_flops - flops for _, _, flops in slices])
    proj, attention, neuron = shape.unit_flops()
    if np.linalg.matrix_rank(removed) == 2:
        head, per_neuron = np.linalg.solve(removed, saved)
    else:  # every head kept: what the slices save is the neurons'
        head, per_neuron = None, saved.sum() / max(removed[:, 1].sum(), 1.0)
    one_neuron = (f"removing one FFN neuron saves {per_neuron:.4g} FLOPs per input where hf_snapvit's formula counts "
                  f"{neuron} for {n} tokens")
    if per_neuron > (1 + _TOLERANCE) * neuron:
        raise _Unprovable(f"{one_neuron}: its forward runs a block or an FFN more than once (on several crops or "
                          "windows of one input, or in a loop)", _ONCE_FIX)
    if per_neuron < (1 - _TOLERANCE) * neuron:
        raise _Unprovable(f"{one_neuron}: {_FEWER}", _FEWER_FIX)
    if head is None:
        return
    if head > (1 + _TOLERANCE) * (proj + attention):
        raise _Unprovable(f"removing one head saves {head:.4g} FLOPs per input where hf_snapvit's formula counts at "
                          f"most {proj + attention}: its forward runs attention more than once", _ONCE_FIX,
                          final=False)
    rows = proj * per_neuron / neuron  # its q/k/v/o rows over the tokens the FFN sees
    if head < (1 - _HEAD_TOLERANCE) * rows:
        raise _Unprovable(f"removing one head saves {head:.4g} FLOPs per input where its q/k/v/o rows alone cost "
                          f"{rows:.4g}: some see fewer tokens (keys and values from a memory: cross-attention)",
                          "hf_snapvit budgets the heads of self-attention, whose projections see every token.",
                          final=False)


def prove_spec(model: PreTrainedModel, spec: ArchitectureSpec | None = None, *, atol: float = 1e-4,
               seed: int = 0) -> dict[str, Any]:
    """Check ``spec`` (default: the model's) on a perturbed copy of ``model``, which is left unchanged (its random
    state too); the largest differences found.

    Raises:
        UnsupportedArchitectureError: a slice that differs from masking, a reordering that changes the outputs, a
            slice the model cannot run, parameter or FLOP counts the budget formulas do not predict, shared
            parameters, or outputs that are not finite: in a few lines naming the model, the spec's modules, the
            reason and the fix.
    """
    spec = spec or get_spec(model)
    if get_spec(model) is not spec:
        raise ValueError("prove_spec proves the spec get_spec(model) returns, which slicing uses; register or adopt "
                         "the spec to prove first.")
    check_shared(model, spec)
    rng = np.random.default_rng(seed)
    try:
        base = _perturbed(model, seed)
        device = next(iter(base.parameters())).device
        inputs = {name: value.to(device) for name, value in dummy_inputs(base, _BATCH, seed=seed).items()}
        reference, dense_flops = _counted(base, inputs)
        _finite(reference)
        widths = []
        for layer in get_layers(base, spec):
            mlp, variant = get_mlp(layer, spec)
            widths.append((num_heads(get_attention(layer, spec), spec),
                           get_projection(mlp, variant.out_proj).in_features))
        # A spec that keeps every head never reorders them (rankings of such models leave them in place).
        reordered = slice_model_(copy.deepcopy(base), [(np.arange(h)[::-1].copy() if spec.prune_heads else
                                                        np.arange(h), np.arange(n)[::-1].copy()) for h, n in widths])
        differences = {"reordered": _difference(_output(reordered, inputs), reference)}
        slices = []
        for head_fraction, neuron_fraction in SLICES:
            keep = [(np.sort(rng.choice(h, max(1, round(head_fraction * h)) if spec.prune_heads else h,
                                        replace=False)),
                     np.sort(rng.choice(n, max(1, round(neuron_fraction * n)), replace=False))) for h, n in widths]
            sliced = slice_model_(copy.deepcopy(base), keep)
            output, flops = _counted(sliced, inputs)
            name = f"heads {head_fraction:g}, neurons {neuron_fraction:g}"
            differences[name] = _difference(output, _output(masked_copy(base, spec, keep), inputs))
            slices.append(([(len(h), len(n)) for h, n in keep], sum(p.numel() for p in sliced.parameters()), flops))
    except _Unprovable as error:
        raise _refusal(model, spec, error.why, error.fix, final=error.final) from None
    except Exception as error:  # noqa: BLE001 - any failure of a guessed spec is a refusal, with its cause
        cause = str(error).strip().splitlines()[0] if str(error).strip() else ""
        named = _unsliced(model, spec)  # the module that holds the width, rather than the shape error it caused
        refusal = _refusal(model, spec, named or f"slicing with it failed ({type(error).__name__}: {_cut(cause)})",
                           _NO_SLICE_FIX if named else _SPEC_FIX)
        refusal.short = named or f"slicing with it failed ({_cut(cause, 60)})"  # as the first of two reasons
        raise refusal from error
    scale = float(reference.abs().max()) if reference.numel() else 0.0
    bad = {name: value for name, value in differences.items() if not value <= atol * max(1.0, scale)}
    if bad:
        name, value = max(bad.items(), key=lambda item: item[1])
        what = "reordering every unit changes its outputs" if name == "reordered" else (
            f"the model sliced to {name} differs from the masked one")
        raise _refusal(model, spec, f"{what} by up to {value:.3g} (its outputs reach {scale:.3g})")
    try:
        _check_counts(base, widths, dense_flops, slices)
    except _Unprovable as error:
        raise _refusal(model, spec, error.why, error.fix, final=error.final) from None
    return differences


def _unsliced(model: PreTrainedModel, spec: ArchitectureSpec) -> str:
    try:
        return unsliced_width(model, spec)
    except Exception:  # noqa: BLE001 - a spec whose modules cannot be read names nothing
        return ""


def _cut(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def found_modules(spec: ArchitectureSpec) -> str:
    """The modules ``spec`` names, in one line: ``blocks layers.*, attention attn (q, k, v, o), FFN mlp (fc1 ->
    fc2)``."""
    variant = spec.mlp_variants[0]
    attention = ", ".join([*dict.fromkeys((spec.q_proj, spec.k_proj, spec.v_proj)), spec.o_proj])
    return (f"blocks {spec.layers}.*, attention {spec.attention or '(the block)'} ({attention}), "
            f"FFN {spec.mlp or '(the block)'} ({', '.join(variant.in_proj)} -> {variant.out_proj})")


def _refusal(model: PreTrainedModel, spec: ArchitectureSpec, why: str, fix: str = _SPEC_FIX, *,
             final: bool = False) -> UnsupportedArchitectureError:
    """The refusal of ``model`` with ``spec`` in three lines: the model and the one reason, the modules found, the
    fix."""
    error = UnsupportedArchitectureError(
        f"hf_snapvit cannot prune this {type(model).__name__} ({spec.model_type!r}): {why}.\n"
        f"Found {_cut(found_modules(spec), 140)}.\n{fix}")
    error.why, error.final = why, final
    return error


def check_shared(model: PreTrainedModel, spec: ArchitectureSpec | None = None) -> None:
    """Refuse ``model`` if a prunable projection of ``spec`` (default: the model's) shares a parameter with another
    module (:func:`~hf_snapvit.surgery.ties.shared_parameters`): slicing one unit would cut another."""
    spec = spec or get_spec(model)
    shared = shared_parameters(model, spec)
    if shared:
        named = shared[:2] if len(shared[0]) + len(shared[1:2] and shared[1]) <= 120 else shared[:1]
        listed = "; ".join(named) + (f"; {len(shared) - len(named)} more" if len(shared) > len(named) else "")
        raise _refusal(model, spec, f"its prunable weights are tied or shared with other modules ({listed}): "
                       "slicing one unit would cut another",
                       "Untie them first: give each module its own copy (nn.Parameter(weight.detach().clone())) and "
                       "drop them from _tied_weights_keys.", final=True)


def _placed_unregistered(model: PreTrainedModel) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{type(model).__name__} ({model.config.model_type}) is no registered architecture: hf_snapvit discovers and "
        "proves the structure of such a model on copies of the whole model, which this model placed by accelerate "
        "(device_map, cpu_offload) cannot give. Register its ArchitectureSpec (hf_snapvit.register_architecture), "
        "which needs neither, or rank the model loaded on one device.")


def ensure_proven(model: PreTrainedModel) -> ArchitectureSpec:
    """The model's spec, after checking that no prunable projection shares its parameters (every spec), and proven
    first if it was discovered rather than registered (once per spec and process): the first of discovery's
    guesses that passes is kept (the last keeps every head, with a warning); if none does, the first one's failure
    is raised, with why keeping every head did not help."""
    check_given(model)
    try:
        spec = get_spec(model)
    except UnsupportedArchitectureError as error:
        if is_dispatched(model):  # discovery traces the whole model, which a placed one cannot give
            raise _placed_unregistered(model) from error
        raise
    if spec.task is None:
        check_blocks(model, get_layers(model, spec), spec.layers)
    check_shared(model, spec)
    if spec.task is not None:  # a task model: its encoder's spec is the one discovered (or registered)
        ensure_proven(model.get_submodule(spec.encoder))
        return get_spec(model)
    if not is_discovered(spec) or id(spec) in _PROVEN:
        return spec
    if is_dispatched(model):  # the proof runs copies of the whole model, which a placed model may not fit
        raise _placed_unregistered(model)
    try:
        prove_spec(model, spec)
    except UnsupportedArchitectureError as first:
        if getattr(first, "final", False):  # no other guess changes why (outputs, ties, the FFN's cost)
            forget_discovered(spec.model_type, model)
            raise
        # Only a failed first guess pays for discovering the others (one traced forward each).
        last = None
        for guess in (g for g in discovery_guesses(model) if g != spec):
            adopt_discovered(guess, model)  # slicing reads the model's spec from the registry
            try:
                prove_spec(model, guess)
            except UnsupportedArchitectureError as error:
                last = error
                continue
            _PROVEN.add(id(guess))
            if spec.prune_heads and not guess.prune_heads:
                warnings.warn(f"{type(model).__name__}: hf_snapvit keeps every attention head and prunes FFN neurons "
                              f"only; with fewer heads, {getattr(first, 'why', first)}.", UserWarning, stacklevel=3)
            return guess
        forget_discovered(spec.model_type, model)
        why = getattr(last, "why", None)
        if why and _FEWER in why:  # the blocks see fewer tokens: no plain ViT, whatever its heads
            raise last from first
        if why and why != getattr(first, "why", None):
            # The second reason is the one that stops the model: the first, why heads cannot go, is cut short.
            first_why = getattr(first, "short", first.why)
            raise _refusal(model, spec, f"{first_why}. Keeping every head does not help: {why}") from first
        raise first
    _PROVEN.add(id(spec))
    return spec
