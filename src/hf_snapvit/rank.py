"""``hf_snapvit.rank``: one entry point for every ranking method.

A method turns a model (and, for data-driven methods, calibration data) into importance scores; :func:`rank` wraps
them with the model's shape, the floors and the provenance into an :class:`~hf_snapvit.ElasticRanking`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from transformers import PreTrainedModel

from .baselines import lamp_scores, magnitude_scores, random_scores
from .budget import ModelShape, layer_widths, model_shape
from .errors import SnapViTError
from .ranking import ElasticRanking, RankingMode

Scorer = Callable[[PreTrainedModel, ModelShape, int], "tuple[np.ndarray, np.ndarray]"]

# Data-free scorers.
_METHODS: dict[str, Scorer] = {
    "magnitude": magnitude_scores,
    "random": random_scores,
    "lamp": lamp_scores,
}

# Baselines scored by gradients on calibration images, with the same images and crops as the SnapViT preset.
_GRADIENT_METHODS: dict[str, dict[str, str]] = {
    "snip": {"definition": "snip"},
    "taylor-ce": {"loss": "ce", "definition": "taylor"},
}


def register_method(name: str, scorer: Scorer, *, exist_ok: bool = False) -> None:
    """Make a data-free ``scorer(model, shape, seed) -> (head_scores [L, H], neuron_scores [L, F])`` available as
    ``rank(model, method=name)``. Scores are non-negative totals per unit (larger = more important)."""
    if name in available_methods() and not exist_ok:
        raise ValueError(f"method {name!r} is already registered; pass exist_ok=True to replace it.")
    _METHODS[name] = scorer


def available_methods() -> list[str]:
    """Names accepted by ``rank(method=...)``."""
    return sorted([*_METHODS, *_GRADIENT_METHODS, "snapvit"])


def rank(
    model: PreTrainedModel,
    method: str = "magnitude",
    data: Any = None,
    *,
    preset: str | None = None,
    processor: Any = None,
    mode: RankingMode | None = None,
    seed: int = 0,
    min_head_keep_ratio: float = 0.2,
    min_neuron_keep_ratio: float = 0.05,
    paired_head_offset: float = 0.15,
    label_column: str = "label",
    show_progress: bool = True,
) -> ElasticRanking:
    """Rank every attention head and FFN neuron of ``model``.

    Args:
        model: A dense model of a supported architecture (see :func:`hf_snapvit.supported_model_types`).
        method: One of :func:`available_methods`. Data-free methods ignore ``data`` and ``preset``.
        data: Calibration images for data-driven methods: PIL images, a ``datasets`` (Iterable)Dataset with an image
            column, or a ``[N, C, H, W]`` tensor of pixel values.
        preset: ``"default"`` (when not given), ``"fast"`` or ``"paper"`` for ``method="snapvit"`` (see
            :meth:`SnapViTConfig.preset`).
        processor: The model's image processor (default: loaded from ``model.name_or_path``).
        mode: ``"global"`` (heads and neurons compete by score per parameter) or ``"paired"`` (the reference code);
            default: the preset's mode for SnapViT, ``"global"`` otherwise.
        seed: Seed of every random choice, recorded in the provenance.
        min_head_keep_ratio: Per-block floor on kept heads.
        min_neuron_keep_ratio: Per-block floor on kept FFN neurons.
        paired_head_offset: ``"paired"`` mode's head ratio offset.
        label_column: The label column of ``data`` for label-based methods (``taylor-ce``).
        show_progress: Show progress bars for long phases.

    Example:
        >>> ranking = hf_snapvit.rank(model, method="magnitude")  # doctest: +SKIP
        >>> ranking.keep_counts(0.3).heads  # doctest: +SKIP
    """
    floors = dict(min_head_keep_ratio=min_head_keep_ratio, min_neuron_keep_ratio=min_neuron_keep_ratio,
                  paired_head_offset=paired_head_offset)
    if method == "snapvit":
        from .snapvit import SnapViTConfig, SnapViTPruner

        if data is None:
            raise SnapViTError("method='snapvit' needs calibration images: pass data=... (images, a dataset or a tensor).")
        overrides = dict(seed=seed, **floors)
        if mode is not None:
            overrides["mode"] = mode
        config = SnapViTConfig.preset(preset or "default", **overrides)
        return SnapViTPruner(config).fit(model, data, processor=processor, show_progress=show_progress)
    if method not in _METHODS and method not in _GRADIENT_METHODS:
        raise SnapViTError(
            f"Unknown ranking method {method!r}. Available: {', '.join(available_methods())}."
        )
    heads, neurons = layer_widths(model)
    if len(set(heads)) != 1 or len(set(neurons)) != 1:
        raise SnapViTError(
            "rank() needs a dense model, but this one is already sliced (per-block heads "
            f"{heads}, neurons {neurons}). Rank the original checkpoint instead."
        )
    shape = model_shape(model)
    if method in _GRADIENT_METHODS:
        head_scores, neuron_scores, settings, calibration = _gradient_baseline(
            model, shape, method, data, preset=preset, processor=processor, seed=seed, label_column=label_column,
            show_progress=show_progress)
    else:
        head_scores, neuron_scores = _METHODS[method](model, shape, seed)
        settings, calibration = {}, None
    return ElasticRanking(
        head_scores=head_scores,
        neuron_scores=neuron_scores,
        shape=shape,
        mode=mode or "global",
        **floors,
        provenance={
            "method": method,
            "settings": settings,
            "seed": seed,
            "calibration_data": calibration,
            "base_model": getattr(model.config, "_name_or_path", None) or None,
        },
    )


def _gradient_baseline(model, shape, method, data, *, preset, processor, seed, label_column, show_progress):
    """Scores of a gradient baseline, with the images and crops of the SnapViT preset, and their provenance.

    Under ``accelerate launch`` the gradient steps are split across processes like SnapViT's (see
    :mod:`hf_snapvit.distributed`)."""
    from dataclasses import replace

    from .distributed import draw_calibration, mixed_precision, on_process_device, process_state
    from .scoring import gradient_scores
    from .snapvit import SnapViTConfig

    if data is None:
        raise SnapViTError(f"method={method!r} needs calibration images: pass data=... (a dataset or images).")
    config = SnapViTConfig.preset(preset or "default", seed=seed)
    scores = replace(config.scores, **_GRADIENT_METHODS[method])
    labelled = scores.loss == "ce"
    state = process_state()
    images, _, _, labels = draw_calibration(data, config.num_gradient_images, 0, step_size=scores.step_size,
                                            seed=seed, label_column=label_column if labelled else None, state=state)
    if processor is None and not hasattr(images, "shape"):
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(model.config._name_or_path)
    with on_process_device(model, state):
        heads, neurons = gradient_scores(model, images, processor, scores, labels=labels, seed=seed,
                                         show_progress=show_progress and state.is_main_process)
    if scores.definition != "taylor":  # means over a unit's weights -> totals, as every ranking score is
        heads, neurons = heads * shape.params_per_head, neurons * shape.params_per_neuron
    settings = {"scores": scores.to_dict(), "num_gradient_images": len(images), "preset": preset or "default"}
    if mixed_precision() != "no":  # it changes the scores; full precision leaves the record as it always was
        settings["mixed_precision"] = mixed_precision()
    calibration = {"source": type(data).__name__, "num_gradient": len(images),
                   "label_column": label_column if labelled else None}
    return heads, neurons, settings, calibration
