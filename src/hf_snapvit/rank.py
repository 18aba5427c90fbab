"""``hf_snapvit.rank``: one entry point for every ranking method.

A method turns a model (and, for data-driven methods, calibration data) into importance scores; :func:`rank` wraps
them with the model's shape, the floors and the provenance into an :class:`~hf_snapvit.ElasticRanking`.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from transformers import PreTrainedModel

from .baselines import magnitude_scores, random_scores
from .budget import ModelShape, layer_widths, model_shape
from .errors import SnapViTError
from .ranking import ElasticRanking, RankingMode

Scorer = Callable[[PreTrainedModel, ModelShape, int], "tuple[np.ndarray, np.ndarray]"]

_METHODS: dict[str, tuple[Scorer, bool]] = {
    "magnitude": (magnitude_scores, False),
    "random": (random_scores, False),
}


def register_method(name: str, scorer: Scorer, *, needs_data: bool, exist_ok: bool = False) -> None:
    """Make ``scorer`` available as ``rank(model, method=name)``."""
    if name in _METHODS and not exist_ok:
        raise ValueError(f"method {name!r} is already registered; pass exist_ok=True to replace it.")
    _METHODS[name] = (scorer, needs_data)


def available_methods() -> list[str]:
    """Names accepted by ``rank(method=...)``."""
    return sorted([*_METHODS, "snapvit"])


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
    show_progress: bool = True,
) -> ElasticRanking:
    """Rank every attention head and FFN neuron of ``model``.

    Args:
        model: A dense model of a supported architecture (see :func:`hf_snapvit.supported_model_types`).
        method: One of :func:`available_methods`. Data-free methods ignore ``data`` and ``preset``.
        data: Calibration images for data-driven methods: PIL images, a ``datasets`` (Iterable)Dataset with an image
            column, or a ``[N, C, H, W]`` tensor of pixel values.
        preset: ``"paper"`` (default) or ``"fast"`` for ``method="snapvit"`` (see :meth:`SnapViTConfig.preset`).
        processor: The model's image processor (default: loaded from ``model.name_or_path``).
        mode: ``"global"`` (heads and neurons compete by score per parameter) or ``"paired"`` (the reference code);
            default: the preset's mode for SnapViT, ``"global"`` otherwise.
        seed: Seed of every random choice, recorded in the provenance.
        min_head_keep_ratio: Per-block floor on kept heads.
        min_neuron_keep_ratio: Per-block floor on kept FFN neurons.
        paired_head_offset: ``"paired"`` mode's head ratio offset.
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
        config = SnapViTConfig.preset(preset or "paper", **overrides)
        return SnapViTPruner(config).fit(model, data, processor=processor, show_progress=show_progress)
    if method not in _METHODS:
        raise SnapViTError(
            f"Unknown ranking method {method!r}. Available: {', '.join(available_methods())}."
        )
    heads, neurons = layer_widths(model)
    if len(set(heads)) != 1 or len(set(neurons)) != 1:
        raise SnapViTError(
            "rank() needs a dense model, but this one is already sliced (per-block heads "
            f"{heads}, neurons {neurons}). Rank the original checkpoint instead."
        )
    scorer, _ = _METHODS[method]
    shape = model_shape(model)
    head_scores, neuron_scores = scorer(model, shape, seed)
    return ElasticRanking(
        head_scores=head_scores,
        neuron_scores=neuron_scores,
        shape=shape,
        mode=mode or "global",
        **floors,
        provenance={
            "method": method,
            "settings": {},
            "seed": seed,
            "calibration_data": None,
            "base_model": getattr(model.config, "_name_or_path", None) or None,
        },
    )
