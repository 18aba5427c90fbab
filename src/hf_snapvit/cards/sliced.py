"""The model card (README.md) a sliced model's ``save_pretrained`` and ``push_to_hub`` write.

It is the card every other writer renders (:func:`hf_snapvit.cards.render.render_card`), without the heatmap, whose
drawing needs plotting: text only, so it lives before :mod:`hf_snapvit.loading.modeling` and needs nothing from
publishing, plotting or evaluation. ``hf_snapvit.push_to_hub`` uploads the same card with the heatmap drawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from huggingface_hub import ModelCard

from .render import render_card
from .sections import hub_id

#: Tags of every sliced checkpoint; ``custom_code`` is the Hub's tag for checkpoints loaded with trust_remote_code.
TAGS = ("hf-snapvit", "elastic", "pruned", "custom_code", "vision")


def base_model_id(config: Mapping[str, Any], name_or_path: str | None = None) -> str | None:
    """The Hub id of the model a sliced one came from: the ranking's recorded base model, else ``name_or_path``
    (where it was loaded from), if either is a Hub id; a local path is never written into a card."""
    ranking = config.get("elastic_ranking")
    recorded = (ranking.get("provenance") or {}).get("base_model") if isinstance(ranking, Mapping) else None
    return hub_id(recorded) or hub_id(name_or_path)


def sliced_card(config: Mapping[str, Any], repo: str, *, base_model: str | None = None,
                tags: list[str] | None = None) -> ModelCard:
    """The card of a sliced checkpoint whose ``config.json`` is ``config`` (with ``auto_map`` set).

    Args:
        config: The saved ``config.json``, as a dict; must have ``elastic_layout``.
        repo: How the title and snippets name the checkpoint: its Hub id, or for a local save the folder's name.
        base_model: Hub id of the model it was sliced from; omitted from the metadata when ``None``.
        tags: Extra tags (e.g. those ``push_to_hub(tags=...)`` was given).
    """
    # No warning about a missing base model: save_pretrained has no argument to give it (the elastic checkpoint's
    # ranking records it, and `hf-snapvit export --base-model` sets it).
    return render_card(dict(config), repo_id=repo, base_model=base_model, heatmap_path=None,
                       tags=[*TAGS, *(tags or [])], warn_base_model=False).card
