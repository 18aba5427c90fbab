"""Ranking methods and :func:`rank`, the one entry point for all of them.

A method turns a model (and, for data-driven methods, calibration data) into importance scores; :func:`rank` wraps
them with the model's shape, the floors and the provenance (including the wall time of the run and of its phases)
into an :class:`~hf_snapvit.elastic.ranking.ElasticRanking`. Methods: ``"snapvit"`` (:mod:`.snapvit`), the gradient
baselines ``"snip"`` and ``"taylor-ce"`` and the data-free ``"magnitude"``, ``"lamp"`` and ``"random"``
(:mod:`.baselines`), and any data-free scorer added with :func:`register_method`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch
from transformers import PreTrainedModel

from ...architectures.inputs import pixel_shape
from ...architectures.budget import ModelShape, layer_widths, uneven_widths
from ...architectures.flops import measured_shape
from ...architectures.prunable import note_partial
from ...errors import ConfigError, DataError
from ...files import public_name
from ...surgery.proof import ensure_proven
from ...elastic.ranking import ElasticRanking, Floors, RankingMode
from ..memory_plan import parse_memory
from .baselines import GRADIENT_METHODS, gradient_baseline_scores, lamp_scores, magnitude_scores, random_scores
from .snapvit import SnapViTConfig, SnapViTPruner

Scorer = Callable[[PreTrainedModel, ModelShape, int], "tuple[np.ndarray, np.ndarray]"]

# Data-free scorers.
_METHODS: dict[str, Scorer] = {
    "magnitude": magnitude_scores,
    "random": random_scores,
    "lamp": lamp_scores,
}


def register_method(name: str, scorer: Scorer, *, exist_ok: bool = False) -> None:
    """Make a data-free ``scorer(model, shape, seed) -> (head_scores [L, H], neuron_scores [L, F])`` available as
    ``rank(model, method=name)``. Scores are non-negative totals per unit (larger = more important)."""
    if name in available_methods() and not exist_ok:
        raise ConfigError(f"method {name!r} is already registered; pass exist_ok=True to replace it.")
    _METHODS[name] = scorer


def available_methods() -> list[str]:
    """Names accepted by ``rank(method=...)``."""
    return sorted([*_METHODS, *GRADIENT_METHODS, "snapvit"])


def rank(
    model: PreTrainedModel,
    method: str = "magnitude",
    data: Any = None,
    *,
    config: SnapViTConfig | None = None,
    preset: str | None = None,
    processor: Any = None,
    mode: RankingMode | None = None,
    seed: int = 0,
    max_generations: int | None = None,
    min_head_keep_ratio: float = Floors.min_head_keep_ratio,
    min_neuron_keep_ratio: float = Floors.min_neuron_keep_ratio,
    paired_head_offset: float = Floors.paired_head_offset,
    label_column: str = "label",
    show_progress: bool = True,
    precision: str = "auto",
    max_memory: int | str | None = None,
) -> ElasticRanking:
    """Rank every attention head and FFN neuron of ``model``.

    The ranking's provenance records the method, its settings, the seed, the calibration data, the base model and
    ``timings``: ``{"wall_seconds": ..., "phases": {...}}`` (SnapViT's phases: ``data``, ``gradients``, ``search``
    and its forward passes ``search_forward``); and, where the pruned blocks are only part of the backbone (another
    stack of repeated blocks stays dense), ``prunable``: their share of its parameters and FLOPs, with a warning.
    The ranking's shape counts what one forward computes beyond the blocks (``shape.other_flops``).

    Args:
        model: A dense model of a supported architecture (see :func:`hf_snapvit.supported_model_types`).
        method: One of :func:`available_methods`. Data-free methods ignore ``data``, ``config`` and ``preset``.
        data: Calibration images for data-driven methods: PIL images, a ``datasets`` (Iterable)Dataset with an image
            column, or a ``[N, C, H, W]`` tensor of pixel values.
        config: A full :class:`SnapViTConfig` for ``method="snapvit"`` (then ``preset``, ``mode``, ``seed`` and the
            floors must stay at their defaults); for the gradient baselines it sets their images and crops.
        preset: ``"default"`` (when neither it nor ``config`` is given), ``"fast"`` or ``"paper"`` (see
            :meth:`SnapViTConfig.preset`); the gradient baselines use the preset's images and crops.
        processor: The model's image processor (default: loaded from ``model.name_or_path``).
        mode: ``"global"`` (heads and neurons compete by score per parameter) or ``"paired"`` (the reference code);
            default: the preset's mode for SnapViT, ``"global"`` otherwise.
        seed: Seed of every random choice, recorded in the provenance.
        max_generations: SnapViT's search length in xNES generations (0: the gradient scores and each block's unit
            order alone); default: the preset's (3 for ``"default"`` and ``"fast"``).
        min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset: The floors (see
            :class:`~hf_snapvit.elastic.ranking.Floors`).
        label_column: The label column of ``data`` for label-based methods (``taylor-ce``).
        show_progress: Show progress bars for long phases.
        precision: SnapViT's forward precision, ``"auto"`` (bf16 on CUDA and on CPUs with bf16 matrix units, else
            float32, or accelerate's ``--mixed_precision``), ``"fp32"`` or ``"bf16"`` (see :class:`SnapViTConfig`).
        max_memory: Memory budget of every phase (bytes, ``"40GiB"``, ``"512MB"``; ``None``: what the device has),
            met by micro-batches planned from the shapes, with the same ranking up to float rounding
            (:mod:`hf_snapvit.pruning.memory_plan`; recorded as ``provenance["memory_plan"]``).

    Example:
        >>> ranking = hf_snapvit.rank(model, method="magnitude")  # doctest: +SKIP
        >>> ranking.keep_counts(0.3).heads  # doctest: +SKIP
    """
    start = time.perf_counter()
    _check_arguments(method, max_generations, max_memory)
    floors = Floors(min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset)
    spec = ensure_proven(model)  # a model no registry knows: its discovered structure is checked before it is ranked
    heads, neurons = layer_widths(model)
    if len(set(heads)) != 1 or len(set(neurons)) != 1:
        raise uneven_widths(model, "rank() needs a dense model")
    if method == "snapvit" or method in GRADIENT_METHODS:
        if data is None:
            raise DataError(f"method={method!r} needs calibration images: pass data=... (images, a dataset or a "
                            "tensor).")
        _check_takes_images(model, method, data)
        config = _config(config, preset, mode if method == "snapvit" else None, seed, floors, method, precision,
                         max_generations)
    if not spec.prune_heads:  # the stock forward cannot run with fewer heads: every block keeps all of them
        floors = replace(floors, min_head_keep_ratio=1.0)
        config = None if config is None else replace(config, min_head_keep_ratio=1.0)
    if method == "snapvit":
        pruner = SnapViTPruner(config)
        ranking = pruner.fit(model, data, processor=processor, show_progress=show_progress, max_memory=max_memory)
        return _timed(note_partial(model, ranking), start, pruner.timings_)
    ranking = _baseline(model, method, data, config, processor, mode, seed, floors, label_column, show_progress,
                        max_memory)
    return _timed(note_partial(model, ranking), start, {})


def _check_arguments(method: str, max_generations: int | None, max_memory: Any) -> None:
    """Refuse an unknown method, a search length for a method without a search, or a bad budget, before any work
    (data-free methods need no memory plan: they hold the weights alone)."""
    if method not in _METHODS and method not in GRADIENT_METHODS and method != "snapvit":
        raise ConfigError(f"Unknown ranking method {method!r}. Available: {', '.join(available_methods())}.")
    if max_generations is not None and method != "snapvit":
        raise ConfigError(f"max_generations={max_generations!r} sets the length of SnapViT's search, and "
                          f"method={method!r} has none: leave max_generations out, or use method='snapvit'.")
    if max_memory is not None:
        parse_memory(max_memory)


def _check_takes_images(model: PreTrainedModel, method: str, data: Any) -> None:
    """A video model calibrates on clips: anything but a ``[N, T, C, H, W]`` tensor is refused here, by name."""
    clip = pixel_shape(model.config, 1)
    if len(clip) == 5 and not (isinstance(data, torch.Tensor) and data.ndim == 5):
        raise ConfigError(
            f"This {model.config.model_type} model takes video clips (pixel_values of shape [B, T, C, H, W] = "
            f"{list(clip)}), and method={method!r} calibrates on what the model takes: give data=... as a "
            "[N, T, C, H, W] tensor of clips, e.g. VideoMAEImageProcessor()(videos, return_tensors='pt')"
            "['pixel_values'], or rank with a data-free method (method='magnitude', 'lamp' or 'random').")


def _baseline(model: PreTrainedModel, method: str, data: Any, config: SnapViTConfig | None, processor: Any,
              mode: RankingMode | None, seed: int, floors: Floors, label_column: str,
              show_progress: bool, max_memory: int | str | None = None) -> ElasticRanking:
    """The ranking of a baseline method: data-free, or gradient-based with ``config``'s images and crops."""
    shape = measured_shape(model)
    if method in GRADIENT_METHODS:
        head_scores, neuron_scores, settings, calibration = gradient_baseline_scores(
            model, shape, method, data, scores=config.scores, num_images=config.num_gradient_images,
            processor=processor, seed=seed, label_column=label_column, show_progress=show_progress,
            max_memory=max_memory)
        settings["preset"] = config.preset_name()
    else:
        head_scores, neuron_scores = _METHODS[method](model, shape, seed)
        settings, calibration = {}, None
    return ElasticRanking(
        head_scores=head_scores,
        neuron_scores=neuron_scores,
        shape=shape,
        mode=mode or "global",
        **floors.to_dict(),
        provenance={
            "method": method,
            "settings": settings,
            "seed": seed,
            "calibration_data": calibration,
            "base_model": public_name(getattr(model.config, "_name_or_path", None) or None),
        },
    )


def _config(config: SnapViTConfig | None, preset: str | None, mode: RankingMode | None, seed: int, floors: Floors,
            method: str, precision: str = "auto", max_generations: int | None = None) -> SnapViTConfig:
    """The run's settings: ``config`` as given, or the preset with the caller's mode, seed, floors, precision and
    search length."""
    if config is None:
        overrides: dict[str, Any] = dict(seed=seed, precision=precision, **floors.to_dict())
        if mode is not None:
            overrides["mode"] = mode
        if max_generations is not None:
            overrides["max_generations"] = max_generations
        return SnapViTConfig.preset(preset or "default", **overrides)
    if not isinstance(config, SnapViTConfig):
        raise ConfigError(f"config must be a SnapViTConfig, got {type(config).__name__}.")
    if (preset is not None or mode is not None or seed != 0 or floors != Floors() or precision != "auto"
            or max_generations is not None):
        raise ConfigError(f"Give either config=SnapViTConfig(...) or preset/mode/seed/floors/precision/"
                          f"max_generations for method={method!r}, "
                          "not both: put them in the config (dataclasses.replace(config, seed=...)).")
    return config


def _timed(ranking: ElasticRanking, start: float, phases: dict[str, float]) -> ElasticRanking:
    timings = {"wall_seconds": time.perf_counter() - start, "phases": dict(phases)}
    return replace(ranking, provenance={**ranking.provenance, "timings": timings})


__all__ = ["Scorer", "SnapViTConfig", "SnapViTPruner", "available_methods", "rank", "register_method"]
