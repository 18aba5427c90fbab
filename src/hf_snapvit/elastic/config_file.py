"""A checkpoint's ``config.json`` as the loader reads it: checked before transformers reads it (the folder) and after
(a model type transformers knows, an ``architectures`` entry of that type), so a damaged or edited config is refused
naming the entry, before any weight is touched."""

from __future__ import annotations

import os
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from ..architectures import model_class
from ..architectures.limits import CONFIG_ERRORS
from ..architectures.registry import auto_class_table
from ..errors import CheckpointError
from ..utils.sources import check_source


def read_config(source: str | os.PathLike, hub_kwargs: dict[str, Any],
                overrides: dict[str, Any]) -> tuple[PretrainedConfig, dict[str, Any]]:
    """``config.json`` of ``source`` with ``overrides`` applied, and the overrides that are no config attribute
    (``AutoConfig.from_pretrained(..., return_unused_kwargs=True)``), checked by :func:`check_source` before it is
    read and by :func:`check_architecture` after."""
    check_source(source, hub_kwargs.get("subfolder"))
    try:
        config, unused = AutoConfig.from_pretrained(source, return_unused_kwargs=True, **hub_kwargs, **overrides)
    except CONFIG_ERRORS as error:  # an unknown or missing model_type, a value its config class refuses
        cause = " ".join(str(error).split())
        cause = cause if len(cause) <= 150 else cause[:147] + "..."
        raise CheckpointError(
            f"{str(source)!r}: transformers cannot read its config.json ({cause}). Fix the entry named (a "
            "\"model_type\" must be the type the weights were saved from, known to this transformers).") from error
    check_architecture(config, source)
    return config, unused


def check_architecture(config: PretrainedConfig, source: str | os.PathLike) -> None:
    """Refuse a ``config.json`` whose ``architectures`` names the class of another model type (hand-edited, or copied
    from another checkpoint): building it would fail deep inside transformers, or load another model's weights.

    Raises:
        CheckpointError: The class ``config.architectures`` names takes another config class than ``model_type``'s.
    """
    cls = model_class(config)
    expected = getattr(cls, "config_class", None)
    bare = auto_class_table("MODEL_MAPPING_NAMES").get(config.model_type)
    example = f" (the bare model is {bare!r})" if isinstance(bare, str) else ""
    if cls.__module__.startswith("transformers.models.auto") or expected is None or isinstance(config, expected):
        return  # the Auto fallback, a class without a config class, or the class of this config
    raise CheckpointError(
        f"{str(source)!r}: config.json's \"architectures\" names {cls.__name__}, a {expected.model_type!r} model "
        f"that takes a {expected.__name__}, but its \"model_type\" is {config.model_type!r} "
        f"({type(config).__name__}): the checkpoint's architecture does not match its config. Set \"architectures\" "
        f"in config.json to the class the weights were saved from, a class of model_type "
        f"{config.model_type!r}{example}, or re-save the model with save_pretrained (hf_snapvit.save_elastic for an "
        "elastic checkpoint).")
