"""The proof a discovered architecture spec must pass before a model is ranked or saved with it.

A spec found in a module tree (:mod:`hf_snapvit.architectures.discovery`) is a guess. Three forwards on seeded
inputs test it against references that do not use the slicing code: keeping every unit, reordered, equals the
untouched model; and at two sizes, the model sliced with the spec equals the dense model with the dropped heads'
output-projection columns and the dropped neurons' FFN-output columns zeroed (masking), while having fewer
parameters. A spec that fails is forgotten and the model refused, naming the modules the spec used.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from ..architectures import (ArchitectureSpec, get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim,
                            num_heads)
from ..architectures.discovery import adopt_discovered, discovery_guesses, forget_discovered, is_discovered
from ..architectures.embedding import dummy_inputs
from ..errors import UnsupportedArchitectureError
from .slicing import slice_model_

KEEP_FRACTIONS = (0.75, 0.4)
_PROVEN: set[int] = set()


def _output(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Every floating-point tensor of one forward's output, flattened into one (hidden states, logits, feature maps,
    heatmaps: whatever the model returns)."""
    # The same random draws in every forward (ViTMAE shuffles its patches by random noise), without touching the
    # caller's random state.
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out = model(**inputs)
    found: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found.append(value.detach().float().flatten())
        elif isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, (tuple, list)):
            for item in value:
                collect(item)

    collect(out)
    return torch.cat(found)


def _masked(model: PreTrainedModel, spec: ArchitectureSpec, keep: list[tuple[np.ndarray, np.ndarray]]):
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


def prove_spec(model: PreTrainedModel, spec: ArchitectureSpec | None = None, *, atol: float = 1e-4,
               seed: int = 0) -> dict[str, Any]:
    """Check ``spec`` (default: the model's) on ``model``, which is left unchanged; the largest differences found.

    Raises:
        UnsupportedArchitectureError: a slice that differs from masking, a reordering that changes the outputs, or
            a slice the model cannot run, naming the spec's modules and the fix.
    """
    spec = spec or get_spec(model)
    if get_spec(model) is not spec:
        raise ValueError("prove_spec proves the spec get_spec(model) returns, which slicing uses; register or adopt "
                         "the spec to prove first.")
    base = copy.deepcopy(model).eval().float()
    rng = np.random.default_rng(seed)
    try:
        inputs = dummy_inputs(base, 2, seed=seed)
        reference = _output(base, inputs)
        widths = []
        for layer in get_layers(base, spec):
            mlp, variant = get_mlp(layer, spec)
            widths.append((num_heads(get_attention(layer, spec), spec),
                           get_projection(mlp, variant.out_proj).in_features))
        # A spec that keeps every head never reorders them (rankings of such models leave them in place).
        reordered = slice_model_(copy.deepcopy(base), [(np.arange(h)[::-1].copy() if spec.prune_heads else
                                                        np.arange(h), np.arange(n)[::-1].copy()) for h, n in widths])
        differences = {"reordered": float((_output(reordered, inputs) - reference).abs().max())}
        params = sum(p.numel() for p in base.parameters())
        for fraction in KEEP_FRACTIONS:
            keep = [(np.sort(rng.choice(h, max(1, round(fraction * h)) if spec.prune_heads else h, replace=False)),
                     np.sort(rng.choice(n, max(1, round(fraction * n)), replace=False))) for h, n in widths]
            sliced = slice_model_(copy.deepcopy(base), keep)
            if sum(p.numel() for p in sliced.parameters()) >= params:
                raise AssertionError(f"slicing to {fraction:.0%} of the units removed no parameter")
            differences[f"keep {fraction:g}"] = float((_output(sliced, inputs) - _output(_masked(base, spec, keep),
                                                                                          inputs)).abs().max())
    except Exception as error:  # noqa: BLE001 - any failure of a guessed spec is a refusal, with its cause
        raise _refusal(spec, f"slicing with it failed ({type(error).__name__}: {error})") from error
    scale = float(reference.abs().max()) or 1.0
    bad = {name: value for name, value in differences.items() if value > atol * max(1.0, scale)}
    if bad:
        raise _refusal(spec, f"the sliced model differs from the masked one by {bad} (max |output| {scale:.3g})")
    return differences


def _refusal(spec: ArchitectureSpec, why: str) -> UnsupportedArchitectureError:
    found = {name: getattr(spec, name) for name in ("layers", "attention", "q_proj", "k_proj", "v_proj", "o_proj",
                                                    "mlp", "head_width", "qkv_blocks")}
    variant = spec.mlp_variants[0]
    error = UnsupportedArchitectureError(
        f"hf_snapvit discovered the structure of this {spec.model_type!r} model as {found}, FFN "
        f"{list(variant.in_proj)} -> {variant.out_proj!r}, but {why}. Describe it yourself with "
        "hf_snapvit.ArchitectureSpec (these fields, with the paths that are right) and call "
        "hf_snapvit.register_architecture(spec).")
    error.why = why
    return error


def ensure_proven(model: PreTrainedModel) -> ArchitectureSpec:
    """The model's spec, proven first if it was discovered rather than registered (once per spec and process): the
    first of discovery's guesses that passes is kept (the last keeps every head, with a warning); if none does, the
    first one's failure is raised, with why keeping every head did not help."""
    spec = get_spec(model)
    if spec.task is not None:  # a task model: its encoder's spec is the one discovered (or registered)
        ensure_proven(model.get_submodule(spec.encoder))
        return get_spec(model)
    if not is_discovered(spec) or id(spec) in _PROVEN:
        return spec
    try:
        prove_spec(model, spec)
    except UnsupportedArchitectureError as first:
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
        if last is not None and getattr(last, "why", None):
            raise UnsupportedArchitectureError(f"{first} Keeping every head does not help: {last.why}.") from first
        raise first
    _PROVEN.add(id(spec))
    return spec
