"""Writing an elastic checkpoint's format, beside its reader (:mod:`hf_snapvit.elastic.checkpoint`).

:func:`elastic_checkpoint` checks a model and its ranking and makes the model as it is stored: its heads and neurons
permuted into rank order (function-preserving) on a shadow copy, the ranking in rank order with the permuted
weights' fingerprint in ``config.elastic_ranking``, and a discovered model's proven spec in ``config.elastic_spec``.
:meth:`ElasticCheckpoint.write` writes it into a folder. The atomic folder write, the check that a discovered model
loads back, and the model card are :func:`hf_snapvit.save_elastic`'s (:mod:`hf_snapvit.publishing.saving`).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ..architectures import ArchitectureSpec, get_spec
from ..architectures.budget import model_shape
from ..architectures.discovery import is_discovered, spec_to_dict
from ..architectures.placement import offloaded_values, strip_hooks_
from ..architectures.prunable import note_partial
from ..errors import CheckpointError, ConfigError
from ..utils.files import public_name
from ..surgery.proof import ensure_proven
from ..surgery.slicing import slice_model_
from .fingerprint import fingerprint_of
from .ranking import ElasticRanking

__all__ = ["ElasticCheckpoint", "elastic_checkpoint"]


@dataclass(frozen=True)
class ElasticCheckpoint:
    """An elastic checkpoint ready to write: ``model`` (a shadow copy of the caller's, permuted into rank order, its
    config carrying the stored entries), ``ranking`` (as stored), and ``discovered``: the proven spec of a model (or
    a task model's encoder) no registry knows, which config.json carries, else ``None``."""

    model: PreTrainedModel
    ranking: ElasticRanking
    discovered: ArchitectureSpec | None

    def write(self, folder: str | os.PathLike, *, image_processor: Any = None, **save_kwargs: Any) -> None:
        """Write the weights and ``config.json`` (``save_pretrained``, with ``save_kwargs``) and, when given, the
        image processor into ``folder`` (not atomically: the caller stages the folder)."""
        self.model.save_pretrained(folder, **save_kwargs)
        if image_processor is not None:
            image_processor.save_pretrained(folder)


def elastic_checkpoint(model: PreTrainedModel, ranking: ElasticRanking, *,
                       base_model: str | None = None) -> ElasticCheckpoint:
    """Check ``model`` and ``ranking`` and make the checkpoint that stores them (``model`` is left as it is).

    Args:
        model: The dense model ``ranking`` was computed on.
        ranking: From :func:`hf_snapvit.rank`.
        base_model: Hub id stored as ``provenance["base_model"]`` (default: the recorded one); a local path is stored
            by its folder name only (:func:`hf_snapvit.utils.files.public_name`).

    Raises:
        ConfigError: ``ranking`` is no :class:`ElasticRanking`, does not match ``model``, or removes heads from a
            model that cannot lose any.
        CheckpointError: ``model`` is already sliced.
    """
    spec = ensure_proven(model)
    if not isinstance(ranking, ElasticRanking):
        raise ConfigError(f"save_elastic needs the ElasticRanking hf_snapvit.rank returns, got "
                          f"{type(ranking).__name__}.")
    ranking.check_matches(model_shape(model))
    ranking = note_partial(model, ranking)  # part of the backbone only: a warning, and the card says which share
    if not spec.prune_heads and ranking.floors()[0] < ranking.shape.num_heads:
        raise ConfigError(
            f"This {spec.model_type} model cannot run with fewer attention heads, so every block keeps all of them, "
            f"but the ranking's floor keeps {ranking.floors()[0]} of {ranking.shape.num_heads}. Rank it with "
            "hf_snapvit.rank(model, ...), which sets that floor (min_head_keep_ratio=1.0).")
    if getattr(model.config, "elastic_layout", None):
        raise CheckpointError(
            "save_elastic needs the dense model, but this one is sliced (config.elastic_layout is set). Load the "
            "dense elastic checkpoint or the original model instead."
        )
    data = ranking.sorted().to_dict()
    data["provenance"]["base_model"] = public_name(base_model or data["provenance"].get("base_model"))
    permuted = slice_model_(_shadow_copy(model), ranking.orders())
    data["provenance"]["weights_fingerprint"] = fingerprint_of(permuted)
    permuted.config.elastic_ranking = data
    # A model (or a task model's encoder) no registry knows: loading reads its proven spec from config.json.
    encoder = model.get_submodule(spec.encoder) if spec.task is not None else model
    encoder_spec = get_spec(encoder)
    discovered = encoder_spec if is_discovered(encoder_spec) else None
    if discovered is not None:
        permuted.config.elastic_spec = spec_to_dict(encoder_spec, encoder.config)
    return ElasticCheckpoint(permuted, ElasticRanking.from_dict(data), discovered)


def _shadow_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of ``model``'s module tree and config that shares its parameters and buffers: slicing the copy
    assigns new tensors to the copy's modules and leaves ``model`` as it is. Of a model accelerate dispatched, the
    copy has no hooks and holds the offloaded weights, read into host memory (so host memory must hold the model
    once: the checkpoint writer needs every tensor)."""
    copies: dict[int, torch.nn.Module] = {}

    def shadow(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) not in copies:
            clone = copy.copy(module)
            copies[id(module)] = clone
            clone._parameters = dict(module._parameters)
            clone._buffers = dict(module._buffers)
            clone._modules = {name: None if child is None else shadow(child)
                              for name, child in module._modules.items()}
        return copies[id(module)]

    clone = strip_hooks_(shadow(model))
    for module in copies.values():  # a model accelerate placed: the copy runs and saves without its hooks
        strip_hooks_(module)
    for module, values in offloaded_values(model):  # its offloaded weights, read into host memory a block at a time
        twin = copies[id(module)]
        for name, value in values.items():
            if name in twin._parameters:
                flag = module._parameters[name].requires_grad
                twin._parameters[name] = torch.nn.Parameter(value, requires_grad=flag)
            else:
                twin._buffers[name] = value
    clone.config = copy.deepcopy(model.config)
    return clone
