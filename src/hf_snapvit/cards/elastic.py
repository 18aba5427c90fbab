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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard

from .render import (CARD_TAGS, CITATION, GENERATED_MARKER, HEATMAP_FILENAME, TEMPLATE_PATH, base_model_advice,
                     render_card)
from .results import Evaluation, parse_evaluations
from .source import pipeline_tag_for
from ..elastic.file_names import CARD_FILE
from ..files import atomic_file
from ..plotting import plot_allocation

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


def make_model_card(
    source: Any,
    *,
    base_model: str | None = None,
    evaluations: Any = None,
    sparsities: Sequence[float] | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    license: str | None = None,
    datasets: str | list[str] | None = None,
    heatmap_path: str | None = HEATMAP_FILENAME,
    eval_dataset: str | None = None,
    eval_split: str | None = None,
    base_model_description: str | None = None,
) -> ModelCard:
    """Render the model card of an elastic (or sliced) checkpoint.

    Args:
        source: An :class:`~hf_snapvit.ElasticRanking`, a checkpoint folder (from :func:`~hf_snapvit.save_elastic`
            or ``save_pretrained`` of a sliced model), a transformers model, or its config.
        base_model: Hub id of the model that was pruned; by default the ranking's recorded base model when that is
            a Hub id (a local path is left out of the metadata).
        evaluations: Measured metrics per sparsity (the forms accepted are listed in :mod:`hf_snapvit.cards.results`);
            they fill the table's metric columns and the ``model-index``.
        sparsities: Sparsities of the table and the heatmap, each in ``(0, ranking.max_sparsity]``; default: the
            paper's grid 10 %, 20 %, ..., 60 %, up to ``max_sparsity``.
        repo_id: The repository the card is for, used in the usage snippet; default: the checkpoint folder's name
            (``<your-username>/<this-repo>`` for a card of a bare ranking).
        model_name: Title of the card and ``model-index`` name; default: the repository's or folder's name, else
            the model family's (``Elastic ViT``).
        license: ``license`` metadata (e.g. the base model's, ``"apache-2.0"``).
        datasets: ``datasets`` metadata (e.g. the calibration dataset's Hub id).
        heatmap_path: Path of the heatmap image relative to the card (written by :func:`write_model_card`);
            ``None`` leaves the image out.
        eval_dataset: Dataset name for evaluation results that carry none (``hf_snapvit.evaluation`` results).
        eval_split: Split name for those results, e.g. ``"validation"``.
        base_model_description: How the card's text names the base model when its id alone would mislead (e.g.
            "a ViT-Tiny fine-tuned on Tiny-ImageNet-200 from `WinKawaks/vit-tiny-patch16-224`"); default: the id.

    Returns:
        The card (``card.data`` holds the metadata; ``str(card)`` is the README.md text).
    """
    return render_card(source, base_model=base_model, evaluations=evaluations, sparsities=sparsities,
                       repo_id=repo_id, model_name=model_name, license=license, datasets=datasets,
                       heatmap_path=heatmap_path, eval_dataset=eval_dataset, eval_split=eval_split,
                       base_model_description=base_model_description).card


def write_model_card(
    source: Any,
    save_directory: str | os.PathLike,
    *,
    base_model: str | None = None,
    evaluations: Any = None,
    sparsities: Sequence[float] | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    license: str | None = None,
    datasets: str | list[str] | None = None,
    heatmap_path: str | None = HEATMAP_FILENAME,
    eval_dataset: str | None = None,
    eval_split: str | None = None,
    base_model_description: str | None = None,
) -> ModelCard:
    """Write ``README.md`` and the heatmap PNG it shows into ``save_directory``, each file atomically.

    Args:
        source, base_model, evaluations, sparsities, repo_id, model_name, license, datasets, heatmap_path,
            eval_dataset, eval_split, base_model_description: As in :func:`make_model_card`.
        save_directory: Destination folder (created if needed).

    Returns:
        The card written.
    """
    rendered = render_card(source, base_model=base_model, evaluations=evaluations, sparsities=sparsities,
                           repo_id=repo_id, model_name=model_name, license=license, datasets=datasets,
                           heatmap_path=heatmap_path, eval_dataset=eval_dataset, eval_split=eval_split,
                           base_model_description=base_model_description)
    card = rendered.card
    directory = Path(save_directory)
    directory.mkdir(parents=True, exist_ok=True)
    if rendered.heatmap_grid:
        plot_allocation(rendered.ranking, directory / heatmap_path, sparsities=rendered.heatmap_grid)
    with atomic_file(directory / CARD_FILE, "w", encoding="utf-8", newline="") as handle:
        text = str(card)
        handle.write(text if text.endswith("\n") else text + "\n")
    return card
