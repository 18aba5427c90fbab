"""Model cards for elastic and sliced checkpoints, with the allocation heatmap they show.

:func:`make_model_card` returns the card :func:`hf_snapvit.cards.render.render_card` renders (the one card every
writer of a README.md uses, a sliced model's ``save_pretrained`` included): YAML metadata (``base_model``,
``library_name: transformers``, tags, ``pipeline_tag`` and, when evaluations are given, a ``model-index``), a
sparsity → parameters / GFLOPs / kept units / measured metrics table, the allocation heatmap, a usage snippet, the
ranking's provenance and the SnapViT citation. :func:`write_model_card` writes the card and its heatmap into a
folder. The heatmap needs matplotlib (``hf-snapvit[plots]``); without it the card says how to add it.

The sections' text comes from :mod:`hf_snapvit.cards.sections`, what the card describes from
:mod:`hf_snapvit.cards.source`, and measured results (:class:`Evaluation`, :func:`parse_evaluations`; the forms
they may be given in are described there) from :mod:`hf_snapvit.cards.results`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Unpack

from huggingface_hub import ModelCard

from .render import (CARD_TAGS, CITATION, GENERATED_MARKER, HEATMAP_FILENAME, TEMPLATE_PATH, CardOptions,
                     base_model_advice, card_options, render_card)
from .results import Evaluation, parse_evaluations
from .source import pipeline_tag_for
from ..elastic.file_names import CARD_FILE
from ..utils.files import atomic_file
from ..plots import plot_allocation

__all__ = [
    "CARD_TAGS",
    "CITATION",
    "GENERATED_MARKER",
    "HEATMAP_FILENAME",
    "TEMPLATE_PATH",
    "Evaluation",
    "base_model_advice",
    "make_model_card",
    "parse_evaluations",
    "pipeline_tag_for",
    "write_model_card",
]


def make_model_card(source: Any, **options: Unpack[CardOptions]) -> ModelCard:
    """Render the model card of an elastic (or sliced) checkpoint.

    Args:
        source: An :class:`~hf_snapvit.ElasticRanking`, a checkpoint folder (from :func:`~hf_snapvit.save_elastic`
            or ``save_pretrained`` of a sliced model), a transformers model, or its config.
        **options: The card's settings (:class:`~hf_snapvit.cards.render.CardOptions`: ``base_model``,
            ``evaluations``, ``sparsities``, ``repo_id``, ``model_name``, ``license``, ``datasets``,
            ``heatmap_path``, ``eval_dataset``, ``eval_split``, ``base_model_description``).

    Returns:
        The card (``card.data`` holds the metadata; ``str(card)`` is the README.md text).
    """
    return render_card(source, **card_options("make_model_card", options)).card


def write_model_card(source: Any, save_directory: str | os.PathLike, **options: Unpack[CardOptions]) -> ModelCard:
    """Write ``README.md`` and the heatmap PNG it shows into ``save_directory``, each file atomically.

    Args:
        source, **options: As in :func:`make_model_card`.
        save_directory: Destination folder (created if needed).

    Returns:
        The card written.
    """
    options = card_options("write_model_card", options)
    rendered = render_card(source, **options)
    heatmap_path = options["heatmap_path"]
    card = rendered.card
    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    if rendered.heatmap_grid:
        plot_allocation(rendered.ranking, directory / heatmap_path, sparsities=rendered.heatmap_grid)
    with atomic_file(directory / CARD_FILE, "w", encoding="utf-8", newline="") as handle:
        text = str(card)
        handle.write(text if text.endswith("\n") else text + "\n")
    return card
