"""What a model card or a Hub upload describes: an elastic ranking, or an elastic or sliced checkpoint.

:func:`describe_checkpoint` reads a ranking, a checkpoint folder, a transformers model or its config into one
:class:`CheckpointDescription`, checking that it is elastic (``config.json["elastic_ranking"]``) or sliced
(``config.json["elastic_layout"]``). :func:`pipeline_tag_for` names the Hub task such a checkpoint serves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..architectures import task_model_spec
from ..architectures.prunable import PrunableShare
from ..errors import ModelCardError
from ..elastic.ranking import ElasticRanking


@dataclass
class CheckpointDescription:
    """What a card describes, whatever it was given as.

    Attributes:
        ranking: The stored ranking in rank order; ``None`` for a sliced checkpoint saved without it.
        layout: ``config.json["elastic_layout"]`` of a sliced checkpoint (per-block widths, sparsity, size);
            ``None`` for an elastic one.
        architectures: ``config.architectures``; empty when unknown (e.g. a bare ranking).
        name_or_path: ``config._name_or_path``, where the checkpoint was loaded from.
        pruned_part: For a task model, the sentence saying that only its vision encoder is pruned; for a backbone
            with block stacks left dense, the line saying which share of it is prunable; else ``None``.
        recovery: ``config.json["elastic_recovery"]`` of a recovered checkpoint; else ``None``.
        correction: ``config.json["elastic_correction"]`` of a weight-corrected sliced checkpoint; else ``None``.
        model_type: ``config.model_type``; ``None`` when unknown.
        auto_map: ``config.json["auto_map"]`` (the remote-code classes of a sliced checkpoint); empty if none.
    """

    ranking: ElasticRanking | None
    layout: dict[str, Any] | None = None
    architectures: list[str] = field(default_factory=list)
    name_or_path: str | None = None
    pruned_part: str | None = None
    recovery: dict[str, Any] | None = None
    correction: dict[str, Any] | None = None
    model_type: str | None = None
    auto_map: dict[str, str] = field(default_factory=dict)

    @property
    def has_task_head(self) -> bool:
        """Whether the ranking's shape has a task head (used to pick the pipeline tag without ``architectures``)."""
        return bool(self.ranking is not None and self.ranking.shape.head_flops > 0)


def _config_dict(source: Any) -> Any:
    """The config of a checkpoint folder, ``config.json`` file, model or config, as read (not yet checked)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            raise ModelCardError(
                f"{str(source)!r} is not a checkpoint folder (no config.json). Give an ElasticRanking, a model, or "
                "the folder written by hf_snapvit.save_elastic / save_pretrained."
            )
        return json.loads(config_file.read_text())
    config = getattr(source, "config", source)  # a model, or a config
    return config.to_dict() if hasattr(config, "to_dict") else config


def describe_checkpoint(source: Any) -> CheckpointDescription:
    """Read what a card or an upload describes.

    Args:
        source: An :class:`~hf_snapvit.ElasticRanking`, a checkpoint folder (or its ``config.json``), a
            transformers model, or its config.

    Returns:
        The description; a ranking is put into rank order.

    Raises:
        ModelCardError: When ``source`` is none of these, or its config is neither elastic nor sliced.
    """
    if isinstance(source, ElasticRanking):
        return CheckpointDescription(source.sorted() if not source.is_sorted() else source,
                                     pruned_part=pruned_part({"model_type": source.shape.model_type}, source),
                                     model_type=source.shape.model_type)
    config = _config_dict(source)
    if not isinstance(config, Mapping):
        raise ModelCardError(
            f"Cannot make a model card from {type(source).__name__}: give an ElasticRanking, a checkpoint folder, a "
            "transformers model or its config."
        )
    stored, layout = config.get("elastic_ranking"), config.get("elastic_layout")
    if stored is None and layout is None:
        raise ModelCardError(
            "This checkpoint is neither elastic nor sliced: its config has no 'elastic_ranking' or 'elastic_layout'. "
            "Rank it with hf_snapvit.rank(model) and save it with hf_snapvit.save_elastic(model, ranking, folder)."
        )
    ranking = ElasticRanking.from_dict(stored) if stored is not None else None
    return CheckpointDescription(
        ranking=ranking,
        layout=layout,
        architectures=list(config.get("architectures") or []),
        name_or_path=config.get("_name_or_path") or None,
        pruned_part=pruned_part(config, ranking),
        recovery=_mapping(config.get("elastic_recovery")),
        correction=_mapping(config.get("elastic_correction")),
        model_type=config.get("model_type"),
        auto_map=dict(config.get("auto_map") or {}),
    )


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def pruned_part(config: Mapping[str, Any], ranking: ElasticRanking | None = None) -> str | None:
    """The sentences saying which part of the model was pruned: for a task model's ``config.json`` (as a dict), its
    vision encoder; where ``ranking`` records that other block stacks stay dense, the share of the backbone that is
    prunable. ``None`` for a bare backbone pruned whole."""
    sentences = []
    task = task_model_spec(config.get("model_type"))
    if task is not None:
        encoder = (config.get(task.encoder_config) or {}).get("model_type")
        sentences.append(f"Only the vision encoder (`{task.encoder}`{f', a `{encoder}`' if encoder else ''}) is "
                         f"pruned; the rest of this `{task.model_type}` model (its {_REST[task.features]}) is loaded "
                         "as it is.")
    share = PrunableShare.from_dict(ranking.provenance.get("prunable")) if ranking is not None else None
    if share is not None:
        # A line of its own: what the sizes below shrink is this share.
        sentences.append(f"\n\n**Prunable share**: {share.sentence('`')} at every sparsity.")
    return " ".join(sentences).replace(" \n", "\n") or None


_REST = {"feature_maps": "neck and head", "hidden_states": "projector and language model",
         "last_hidden_state": "projector and language model", "pooler_output": "language model"}


def pipeline_tag_for(architectures: Sequence[str], has_task_head: bool = False) -> str:
    """The Hub ``pipeline_tag`` of a model: ``depth-estimation`` and ``image-text-to-text`` for those task models,
    ``image-classification`` for classifiers, else ``image-feature-extraction``.

    Args:
        architectures: ``config.architectures``; may be empty.
        has_task_head: Used when ``architectures`` is empty (e.g. ``ranking.shape.head_flops > 0``).
    """
    for suffix, tag in (("ForDepthEstimation", "depth-estimation"), ("ForConditionalGeneration", "image-text-to-text")):
        if any(suffix in a for a in architectures):
            return tag
    if architectures:
        return "image-classification" if any("ForImageClassification" in a for a in architectures) \
            else "image-feature-extraction"
    return "image-classification" if has_task_head else "image-feature-extraction"
