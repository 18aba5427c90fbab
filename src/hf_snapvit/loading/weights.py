"""Filling a sliced skeleton with exactly the slices of the checkpoint it keeps, as transformers' loader would: the
loading info it returns, tensors a changed config reshaped (refused, or initialised anew with
``ignore_mismatched_sizes``), tensors absent from the checkpoint initialised with a warning."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from transformers import PreTrainedModel

from ..architectures.budget import layer_widths
from ..elastic.checkpoint import CheckpointReader, disk_names, fused_row_blocks, load_sliced_state_dict
from ..errors import CheckpointError, ConfigError
from ..surgery.slicing import prefixes, slice_model_
from .arguments import LoadOptions


def load_weights(model: PreTrainedModel, keep: list[tuple[np.ndarray, np.ndarray]], reader: CheckpointReader,
                  stored: tuple[list[int], list[int]], options: LoadOptions) -> dict[str, Any]:
    """Slice the meta-device skeleton to ``keep`` and fill it with exactly those slices of the checkpoint, whose
    tensors must have the shapes of the ``stored`` widths (the dense ones, or a sliced checkpoint's layout); returns
    transformers' loading info (missing, unexpected and mismatched keys)."""
    dense_state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    sliced = tuple(map(list, stored)) != layer_widths(model)
    slice_model_(model, prefixes(*stored))
    held = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    slice_model_(model, keep)  # a prefix of what the checkpoint holds
    sliceable = {k for k, v in model.state_dict().items() if tuple(v.shape) != dense_state[k]}
    mapping = disk_names(model, reader.keys())
    mismatched = _mismatched(mapping, reader, held, sliceable, options)
    state = load_sliced_state_dict(model, reader, sliceable, held,
                                   "config.json's elastic_layout" if sliced else "config.json",
                                   fused_row_blocks(model), skip=set(mismatched))  # fused qkv: rows per block
    tied = getattr(model, "all_tied_weights_keys", None) or {}  # lm_head sharing the token embeddings (VLMs)
    missing = [name for name in model.state_dict() if name not in state and name not in tied]
    if missing:
        _initialise_missing(model, missing)
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.tie_weights()
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise CheckpointError(f"These tensors were neither in the checkpoint nor initialised: {left}.")
    model.eval()
    used = {key for key, _ in mapping.values()}
    return {"missing_keys": set(missing) - set(mismatched), "unexpected_keys": reader.keys() - used,
            "mismatched_keys": set(mismatched), "error_msgs": []}


def _mismatched(mapping: dict[str, Any], reader: CheckpointReader, held: dict[str, tuple[int, ...]],
                sliceable: set[str], options: LoadOptions) -> list[str]:
    """The tensors outside the blocks whose checkpoint shape differs from the model's because config overrides or
    ``__init__`` arguments changed them (a task head for ``num_labels=10``): refused as transformers refuses them,
    or, with ``ignore_mismatched_sizes``, left to be initialised anew. Without overrides a shape that differs is a
    damaged checkpoint, which :func:`~hf_snapvit.elastic.checkpoint.load_sliced_state_dict` reports."""
    if not options.changes_the_model:
        return []
    found = {name: (key, reader.shape(key)) for name, (key, chunk) in mapping.items()
             if name not in sliceable and chunk is None and reader.shape(key) != held[name]}
    if found and not options.ignore_mismatched_sizes:
        listed = "; ".join(f"{key}: the checkpoint holds {shape}, the model {held[name]}"
                           for name, (key, shape) in sorted(found.items()))
        raise ConfigError(f"The keyword arguments {options.overrides} change tensors the checkpoint holds "
                          f"({listed}). Pass "
                          "ignore_mismatched_sizes=True to initialise them anew (then train them), as transformers "
                          "does, or load without the overrides.")
    return sorted(found)


def _initialise_missing(model: PreTrainedModel, names: list[str]) -> None:
    """Give tensors absent from the checkpoint fresh values, as transformers does, and say so."""
    warnings.warn(
        f"Some weights were not in the checkpoint and are newly initialized: {names}. You should probably train "
        "them before use (as transformers would tell you for the same checkpoint).",
        stacklevel=3,
    )
    owners = {name.rsplit(".", 1)[0] if "." in name else "" for name in names}
    for owner in owners:
        module = model.get_submodule(owner)
        module.to_empty(device="cpu", recurse=False)
        model._init_weights(module)
