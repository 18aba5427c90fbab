"""Micro-batch sizes for every phase of a SnapViT ranking, planned from the model's shape and a memory budget.

A ranking's peak memory is set by its batch sizes (every crop of a gradient step's images is forwarded with
gradients at once), not by the model, so it grows with resolution and crops until it does not fit. Before anything
runs, :func:`plan_memory` estimates, from the shapes alone (tokens of every crop, width, depth, heads, FFN width,
weight and activation dtypes, the score definition), what each phase holds whatever its batch (weights and their
copies, score sums, pixels, captured activations) and what each image adds, and picks the largest micro-batch of
each phase that fits the budget:

* ``gradient``: images per part of a gradient step (:func:`~hf_snapvit.pruning.scoring.gradient_scores`); the
  per-image sums and the batch-mean gradients are linear in the images, so the parts add up to the step;
* ``search``: images per forward of the xNES search (:class:`~.methods.snapvit.fitness.EmbeddingFitness`);
* ``correction``: images per forward of the per-block unit order and of the prefix correction;
* ``evaluation``: images per forward of the dense model's embeddings (the calibration coverage check's).

Each changes the results only by float addition order. A budget below what one image needs is refused with the
figure. The activation coefficients were fitted to the peak resident memory of float32 gradient steps of narrow
ViTs on a CPU (``docs/scale.md``) and rounded up; bf16 activations are counted at 3 bytes a value, between bf16's
2 and the float32 that norms and softmax keep under autocast. The plan works on a model on the meta device, so a
7 B model's budget can be planned without its weights.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from ..architectures import ffn_rows, get_attention, get_layers, get_mlp, get_spec, qkv_rows, vision_config
from ..architectures.budget import layer_widths
from ..architectures.embedding import input_size as architecture_input_size
from ..architectures.inputs import patch_side
from ..errors import ConfigError
from ..utils.logs import get_logger

logger = get_logger(__name__)

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
#: The share of the host's available memory a CPU ranking plans for when no budget is given.
CPU_SHARE = 0.5
#: The share of the device's free memory a CUDA ranking plans for when no budget is given (the allocator's cache,
#: the CUDA context's own buffers and fragmentation take the rest).
CUDA_SHARE = 0.9
# Values each token holds per block, ``a·hidden + b·(FFN input rows)`` (fitted on a CPU, float32, rounded up):
# a gradient step with per-image squared gradients (the recorded layer outputs and their gradients included), a
# batch-mean gradient step, and a forward without gradients (one block's tensors alive at a time).
_GRADIENT_PER_SAMPLE = (11.0, 4.75)
_GRADIENT_BATCHED = (10.0, 3.5)
_FORWARD = (8.0, 3.0)
# Values each token keeps per checkpointed block (its input, and what the recorder of the backward pass holds).
_CHECKPOINTED = 2.0
# Eager attention keeps each head's [tokens, tokens] probabilities (and their dropout mask) for the backward pass.
_EAGER_ATTENTION = 2.5
# The largest per-sample gradient block of SquaredSampleGradients (elements) and the bytes each costs at once.
_SAMPLE_BLOCK = 128 * 1024 * 1024 * 20


def parse_memory(value: Any, name: str = "max_memory") -> int:
    """Bytes from ``value``: an int (bytes) or a string such as ``"40GiB"``, ``"512MB"``, ``"1.5 GB"``, ``"3e9"``.

    Decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) powers of 1024.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{name}={value!r}: give a number of bytes or a string such as '40GiB' or '512MB'.")
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        unit = match and match.group(2).lower()
        if not match or unit not in _UNITS:
            raise ConfigError(f"{name}={value!r} is not a memory size: give bytes or a number with a unit of "
                              f"{sorted({u for u in _UNITS if u})} (case-insensitive), e.g. '40GiB' or '512MB'.")
        value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ConfigError(f"{name}={value!r}: a memory budget must be a positive size, e.g. '40GiB'.")
    return int(value)


def default_budget(device: torch.device | str) -> int:
    """The budget of one process's ranking that names none: on CUDA :data:`CUDA_SHARE` of its device's free memory,
    elsewhere :data:`CPU_SHARE` of the host's available memory (``/proc/meminfo``, else ``os.sysconf``) shared by
    the processes ``accelerate launch`` started on the host (``LOCAL_WORLD_SIZE``)."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_SHARE)
    processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return int(_available_host_memory() * CPU_SHARE / processes)


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as status:
            fields = dict(line.split(":", 1) for line in status)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ModelDims:
    """The shapes a plan reads from a model (of any device, the meta device included).

    Args:
        num_layers, hidden_size, num_heads, intermediate_size: The blocks' widths.
        ffn_rows: Rows of a block's FFN input projections (``2 * intermediate_size`` for a gated FFN).
        scored_rows: Rows of the attention projections that hold the scored value (or q, k, v) rows.
        scored_weights: Weights of every scored linear layer (the per-weight score sums' size).
        num_params: Every parameter of the model.
        param_bytes: Bytes of one parameter.
        input_size, patch_size, extra_tokens: The input's side, one patch's side and the non-patch tokens.
        eager_attention: Whether attention materialises its probabilities (``attn_implementation="eager"``).
        tubelets: Patch grids per input (a video model's ``num_frames // tubelet_size``; 1 for images).
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    ffn_rows: int
    scored_rows: int
    scored_weights: int
    num_params: int
    param_bytes: int
    input_size: int
    patch_size: int
    extra_tokens: int
    eager_attention: bool
    tubelets: int = 1

    @classmethod
    def from_model(cls, model: nn.Module, head_rows: str = "v") -> "ModelDims":
        """The dims of ``model``, whose scored layers are those of ``head_rows`` (``"v"`` or ``"qkv"``)."""
        spec = get_spec(model)
        layers = get_layers(model, spec)
        attention = get_attention(layers[0], spec)
        scored = {id(m): m for role in ((2,) if head_rows == "v" else (0, 1, 2))
                  for m in [qkv_rows(attention, spec, role)[0]]}
        mlp, variant = get_mlp(layers[0], spec)
        ffn = {id(m): m for m, _ in ffn_rows(mlp, variant)}
        per_block = sum(m.weight.numel() for m in {**scored, **ffn}.values())
        parameters = list(model.parameters())
        heads, neurons = layer_widths(model)
        vision = vision_config(model.config)
        frames, tubelet = getattr(vision, "num_frames", None), getattr(vision, "tubelet_size", None)
        return cls(
            num_layers=len(layers), hidden_size=qkv_rows(attention, spec, 2)[0].in_features,
            num_heads=max(heads), intermediate_size=max(neurons),
            ffn_rows=sum(m.out_features for m in ffn.values()),
            scored_rows=sum(m.out_features for m in scored.values()),
            scored_weights=per_block * len(layers), num_params=sum(p.numel() for p in parameters),
            param_bytes=parameters[0].element_size(), input_size=architecture_input_size(model.config),
            patch_size=patch_side(model), extra_tokens=int(spec.extra_tokens(model.config)),
            eager_attention=getattr(model.config, "_attn_implementation", "eager") == "eager",
            tubelets=frames // tubelet if isinstance(frames, int) and isinstance(tubelet, int) and tubelet > 0 else 1)

    def tokens(self, side: int) -> int:
        """Tokens of a square crop of ``side`` pixels (of every frame of a clip)."""
        return (side // self.patch_size) ** 2 * self.tubelets + self.extra_tokens

    def per_token(self, coefficients: tuple[float, float], value_bytes: float, tokens: int) -> float:
        """Bytes one token holds in one block: the width terms plus eager attention's probabilities."""
        a, b = coefficients
        attention = _EAGER_ATTENTION * self.num_heads * tokens if self.eager_attention else 0.0
        return value_bytes * (a * self.hidden_size + b * self.ffn_rows + attention)


@dataclass(frozen=True)
class PhasePlan:
    """One phase's micro-batch (``wanted`` without a budget) and its estimate: ``fixed + n * per_image`` bytes at
    its peak, ``n`` the micro-batch or, when fewer, the ``images`` the phase has; ``checkpoint``: the gradient
    phase recomputes every block's activations in the backward pass (:mod:`hf_snapvit.pruning.checkpointing`)."""

    batch: int
    wanted: int
    fixed: int
    per_image: int
    images: int | None = None
    checkpoint: bool = False

    @property
    def peak(self) -> int:
        return self.fixed + min(self.batch, self.images or self.batch) * self.per_image


@dataclass(frozen=True)
class MemoryPlan:
    """The micro-batches of a ranking under ``budget`` bytes, and how they were estimated.

    ``gradient``, ``search``, ``correction`` and ``evaluation`` are :class:`PhasePlan` s; ``source`` says where the
    budget came from (``"given"`` or the default's device). :meth:`to_dict` is what the provenance records.
    """

    budget: int
    source: str
    gradient: PhasePlan
    search: PhasePlan
    correction: PhasePlan
    evaluation: PhasePlan

    @property
    def peak(self) -> int:
        """The largest phase estimate."""
        return max(p.peak for p in (self.gradient, self.search, self.correction, self.evaluation))

    def to_dict(self) -> dict[str, Any]:
        """The provenance's record. A default budget's bytes (the memory free when the run started) are left out, so
        that two runs of the same ranking write the same config.json."""
        phases = ("gradient", "search", "correction", "evaluation")
        budget = self.budget if self.source == "given" else None
        return {"budget_bytes": budget, "budget": self.source, "estimated_peak_bytes": self.peak,
                **{name: {**asdict(getattr(self, name)), "peak": getattr(self, name).peak} for name in phases}}


def _crop_tokens(dims: ModelDims, crops: Any) -> list[tuple[int, int]]:
    """``(crops, tokens of each)`` of a gradient step's image: the global views, then the local ones."""
    side = dims.input_size
    return [(crops.num_global, dims.tokens(crops.global_size or side)),
            (crops.num_local, dims.tokens(crops.local_size or side))]


def _gradient_phase(dims: ModelDims, scores: Any, activation_bytes: float, budget: int,
                    num_images: int | None = None, held: int = 0) -> PhasePlan:
    """The gradient steps' plan; ``held``: bytes the phase finds allocated (the fitness pixels).

    Activation checkpointing is planned only where one image would not fit without it, and only for the batched
    definitions: fisher and obd record every scored layer's input and output for the per-sample products, which
    is most of what a block keeps, so recomputing the rest saved nothing on a CPU (``docs/scale.md``)."""
    per_sample = scores.definition in ("fisher", "obd")
    coefficients = _GRADIENT_PER_SAMPLE if per_sample else _GRADIENT_BATCHED
    crops = _crop_tokens(dims, scores.crops)
    per_image = sum(count * tokens * dims.num_layers * dims.per_token(coefficients, activation_bytes, tokens)
                    for count, tokens in crops)
    # Checkpointed: each block's input, and one block's activations at a time while it is recomputed.
    checkpointed = sum(count * tokens * (dims.num_layers * _CHECKPOINTED * dims.hidden_size * activation_bytes
                                         + dims.per_token(coefficients, activation_bytes, tokens))
                       for count, tokens in crops)
    side = dims.input_size
    # The crops' pixels (float32): more than the tokens' share of the fitted coefficients when they are wide.
    pixels = 4 * 3 * sum(count * (size or side) ** 2 for count, size in (
        (scores.crops.num_global, scores.crops.global_size), (scores.crops.num_local, scores.crops.local_size)))
    per_image += pixels
    if per_sample:  # one layer's per-sample gradients at a time, float32 and float64 (at most _SAMPLE_BLOCK bytes)
        per_image += min(_SAMPLE_BLOCK, dims.hidden_size * max(dims.ffn_rows, dims.scored_rows) * 20)
    weights = dims.num_params * dims.param_bytes
    # Autocast keeps a low-precision copy of every float32 weight it casts, for the backward pass.
    cast = dims.num_params * 2 if activation_bytes < 4 and dims.param_bytes > 2 else 0
    # fisher/obd reduce each step's squared gradients to one float64 sum per row; the others keep a float64 sum and
    # a gradient per scored weight.
    sums = dims.num_layers * (dims.scored_rows + dims.ffn_rows) * 8 if per_sample else \
        dims.scored_weights * (8 + dims.param_bytes)
    plan = _fit_batch(budget, scores.batch_size, held + weights + cast + sums, per_image, num_images)
    if plan.batch >= 1 or per_sample:
        return plan
    return replace(_fit_batch(budget, scores.batch_size, plan.fixed, checkpointed + pixels, num_images),
                   checkpoint=True)


def plan_gradient_steps(model: nn.Module, scores: Any, *, max_memory: Any = None,
                        device: torch.device | str | None = None, precision: str = "no") -> PhasePlan:
    """The gradient phase's plan alone (the gradient baselines' one phase): ``scores`` is their
    :class:`~hf_snapvit.pruning.scoring.ScoreConfig`; the other arguments as for :func:`plan_memory`."""
    device = torch.device(device or next(model.parameters()).device)
    given = max_memory is not None
    budget = parse_memory(max_memory) if given else default_budget(device)
    phase = _gradient_phase(ModelDims.from_model(model, scores.head_rows), scores,
                            3.0 if precision in ("bf16", "fp16", "fp8") else 4.0, budget)
    empty = PhasePlan(1, 1, 0, 0)
    plan = _check_fits(MemoryPlan(budget, "given" if given else f"default ({device.type})", phase, empty, empty,
                                  empty), given)
    return plan.gradient


def _forward_fixed(dims: ModelDims, pixels: int, activation_bytes: float) -> int:
    """What the search holds whatever its batch: the weights and their two working copies (bf16: a bf16 copy
    and the sliced candidate; else the candidate) and the fitness pixels (``pixels`` bytes) with room for two more
    copies (their bf16 copy, or the image processor's intermediates when they were made)."""
    weights = dims.num_params * dims.param_bytes
    copies = 2 * dims.num_params * 2 if activation_bytes < 4 else weights
    return weights + copies + 3 * pixels


def _forward_per_image(dims: ModelDims, activation_bytes: float, side: int) -> int:
    tokens = dims.tokens(side)
    return int(tokens * dims.per_token(_FORWARD, activation_bytes, tokens))


def _fit_batch(budget: int, wanted: int, fixed: float, per_image: float, images: int | None = None) -> PhasePlan:
    fixed, per_image = int(math.ceil(fixed)), max(1, int(math.ceil(per_image)))
    return PhasePlan(batch=max(0, min(wanted, (budget - fixed) // per_image)), wanted=wanted, fixed=fixed,
                     per_image=per_image, images=images)


def plan_memory(model: nn.Module, config: Any, *, max_memory: Any = None, device: torch.device | str | None = None,
                precision: str = "no", search_batch: int = 64, evaluation_batch: int = 64) -> MemoryPlan:
    """The micro-batches of a SnapViT ranking of ``model`` with ``config`` that fit ``max_memory``.

    Args:
        model: The dense model (on any device, the meta device included: only shapes are read).
        config: Its :class:`~hf_snapvit.SnapViTConfig`.
        max_memory: The budget (see :func:`parse_memory`); ``None``: :func:`default_budget` of ``device``.
        device: Where the ranking runs (default: the model's device); it only sets the default budget, so a model
            on the meta device is planned with a given ``max_memory`` and the run's ``precision``.
        precision: The resolved forward precision (``"no"``, ``"bf16"``, ...).
        search_batch: Images per search forward wanted (the configured or the device's default).
        evaluation_batch: Images per evaluation forward wanted.

    Raises:
        ConfigError: a given budget below what one image of some phase needs (the figure and the fix named).
    """
    device = torch.device(device or next(model.parameters()).device)
    given = max_memory is not None
    budget = parse_memory(max_memory) if given else default_budget(device)
    dims = ModelDims.from_model(model, config.scores.head_rows)
    value_bytes = 3.0 if precision in ("bf16", "fp16", "fp8") else 4.0
    side = config.fitness_image_size or dims.input_size
    pixels = config.num_fitness_images * 3 * dims.input_size ** 2 * 4  # float32, held from the data phase on
    search_fixed = _forward_fixed(dims, pixels, value_bytes)
    tokens = dims.tokens(side)
    # The unit order captures every fitness image's block inputs and outputs (float32) and one block's Hessians.
    captured = 2 * config.num_fitness_images * tokens * dims.hidden_size * 4 if config.unit_order != "scores" else 0
    hessians = 4 * (dims.hidden_size ** 2 + dims.intermediate_size ** 2) * 8
    per_image = _forward_per_image(dims, value_bytes, side)
    plan = MemoryPlan(
        budget=budget, source="given" if given else f"default ({device.type})",
        gradient=_gradient_phase(dims, config.scores, value_bytes, budget, config.num_gradient_images, pixels),
        search=_fit_batch(budget, search_batch, search_fixed, per_image, config.num_fitness_images),
        correction=_fit_batch(budget, config.scores.batch_size,
                              pixels + dims.num_params * dims.param_bytes + captured + hessians, per_image,
                              config.num_fitness_images),
        evaluation=_fit_batch(budget, evaluation_batch, dims.num_params * dims.param_bytes,
                              _forward_per_image(dims, value_bytes, dims.input_size),
                              config.num_gradient_images + config.num_fitness_images))
    return _check_fits(plan, given)


def _check_fits(plan: MemoryPlan, given: bool) -> MemoryPlan:
    """``plan``, or (a given budget) a clear refusal when one image of some phase does not fit; the default budget
    only warns and plans one image there (the device may still hold it: the estimates are rounded up)."""
    names = ("gradient", "search", "correction", "evaluation")
    short = {name: phase for name in names if (phase := getattr(plan, name)).batch < 1}
    if not short:
        return plan
    name, phase = max(short.items(), key=lambda item: item[1].fixed + item[1].per_image)
    needed = phase.fixed + phase.per_image
    message = (f"max_memory={_size(plan.budget)} is below what one image of the {name} phase needs: about "
               f"{_size(needed)} ({_size(phase.fixed)} whatever the batch, {_size(phase.per_image)} per image). "
               f"Give max_memory of at least {_size(needed)}, or use fewer or smaller crops (the 'fast' preset), "
               "fewer fitness images or a smaller fitness_image_size.")
    if given:
        raise ConfigError(message)
    logger.warning("%s Planning one image per micro-batch there.", message)
    return replace(plan, **{n: replace(p, batch=1) for n, p in short.items()})


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{int(value)} B"
