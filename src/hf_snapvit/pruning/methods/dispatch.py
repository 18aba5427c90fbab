"""rank(): look the method up in the registry, check the model and the data, run its ranker, and complete the
ranking's provenance (the method, what it reads, the wall time of the run and of its phases)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from transformers import PreTrainedModel

from ...architectures.inputs import pixel_shape
from ...architectures.budget import layer_widths, uneven_widths
from ...architectures.prunable import note_partial
from ...errors import ConfigError, DataError
from ...surgery.proof import ensure_proven
from ...elastic.ranking import ElasticRanking
from ..memory_plan import parse_memory
from .config import RankingConfig
from .registry import available_methods, ranking_method


def rank(
    model: PreTrainedModel,
    method: str = "magnitude",
    data: Any = None,
    *,
    config: RankingConfig | None = None,
    processor: Any = None,
    label_column: str = "label",
    show_progress: bool = True,
    max_memory: int | str | None = None,
    **overrides: Any,
) -> ElasticRanking:
    """Rank every attention head and FFN neuron of ``model`` with a registered method.

    The ranking's provenance records the method, what it reads (``needs_data``, ``needs_labels``: the registry's
    answer, which the model card repeats), its settings, the seed, the calibration data, the base model and
    ``timings``: ``{"wall_seconds": ..., "phases": {...}}`` (SnapViT's phases: ``data``, ``gradients``, ``search``
    and its forward passes ``search_forward``); and, where the pruned blocks are only part of the backbone (another
    stack of repeated blocks stays dense), ``prunable``: their share of its parameters and FLOPs, with a warning.
    The ranking's shape counts what one forward computes beyond the blocks (``shape.other_flops``).

    Args:
        model: A dense model of a supported architecture (see :func:`hf_snapvit.supported_model_types`).
        method: One of :func:`available_methods`. Data-free methods ignore ``data``.
        data: Calibration images for data-driven methods: PIL images, a ``datasets`` (Iterable)Dataset with an image
            column, or a ``[N, C, H, W]`` tensor of pixel values.
        config: The method's settings, an instance of its config class (``"snapvit"``: :class:`SnapViTConfig`;
            ``"snip"``, ``"taylor-ce"``: :class:`GradientBaselineConfig`; data-free: :class:`DataFreeConfig`).
        processor: The model's image processor (default: loaded from ``model.name_or_path``).
        label_column: The label column of ``data`` for the methods that read labels (``taylor-ce``).
        show_progress: Show progress bars for long phases.
        max_memory: Memory budget of every phase (bytes, ``"40GiB"``, ``"512MB"``; ``None``: what the device has),
            met by micro-batches planned from the shapes, with the same ranking up to float rounding
            (:mod:`hf_snapvit.pruning.memory_plan`; recorded as ``provenance["memory_plan"]``).
        **overrides: Fields of the method's config, replacing those of ``config`` or of the preset: ``preset``
            (``"default"`` when neither it nor ``config`` is given, ``"fast"`` or ``"paper"``), ``mode``, ``seed``,
            the floors ``min_head_keep_ratio``, ``min_neuron_keep_ratio``, ``paired_head_offset``, and the
            method's own, e.g. SnapViT's ``max_generations`` (0: the gradient scores and each block's unit order
            alone) and ``precision``. A setting the method's config lacks is refused with the list of those it has.

    Example:
        >>> ranking = hf_snapvit.rank(model, method="magnitude")  # doctest: +SKIP
        >>> ranking = hf_snapvit.rank(model, "snapvit", images, preset="fast", seed=1)  # doctest: +SKIP
    """
    start = time.perf_counter()
    entry = ranking_method(method)
    settings = entry.config(config, **overrides)  # a bad setting fails before any work
    if max_memory is not None:  # data-free methods need no memory plan, but a bad budget is refused alike
        parse_memory(max_memory)
    spec = ensure_proven(model)  # a model no registry knows: its discovered structure is checked before it is ranked
    heads, neurons = layer_widths(model)
    if len(set(heads)) != 1 or len(set(neurons)) != 1:
        raise uneven_widths(model, "rank() needs a dense model")
    if entry.needs_data:
        if data is None:
            raise DataError(f"method={method!r} needs calibration images: pass data=... (images, a dataset or a "
                            "tensor).")
        _check_takes_images(model, method, data)
    else:
        data = None
    if not spec.prune_heads:  # the stock forward cannot run with fewer heads: every block keeps all of them
        settings = replace(settings, min_head_keep_ratio=1.0)
    ranker = entry.ranker_cls(settings)
    run: dict[str, Any] = dict(processor=processor, show_progress=show_progress, max_memory=max_memory)
    if entry.needs_labels:
        run["label_column"] = label_column
    ranking = note_partial(model, ranker.fit(model, data, **run))
    timings = {"wall_seconds": time.perf_counter() - start, "phases": dict(getattr(ranker, "timings_", {}))}
    # What the method reads, from the registry, so that a card (a stage below it) can say so of any method.
    reads = {"needs_data": entry.needs_data, "needs_labels": entry.needs_labels}
    return replace(ranking, provenance={**ranking.provenance, "method": method, **reads, "timings": timings})


def _check_takes_images(model: PreTrainedModel, method: str, data: Any) -> None:
    """A video model calibrates on clips: anything but a ``[N, T, C, H, W]`` tensor is refused here, by name."""
    clip = pixel_shape(model.config, 1)
    if len(clip) == 5 and not (isinstance(data, torch.Tensor) and data.ndim == 5):
        data_free = [name for name in available_methods() if not ranking_method(name).needs_data]
        raise ConfigError(
            f"This {model.config.model_type} model takes video clips (pixel_values of shape [B, T, C, H, W] = "
            f"{list(clip)}), and method={method!r} calibrates on what the model takes: give data=... as a "
            "[N, T, C, H, W] tensor of clips, e.g. VideoMAEImageProcessor()(videos, return_tensors='pt')"
            f"['pixel_values'], or rank with a data-free method (method={' or '.join(map(repr, data_free))}).")


__all__ = ["rank"]
