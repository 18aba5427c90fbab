"""Elastic checkpoints on disk: reading only the slices a model keeps (writing them is :mod:`.writing`).

An elastic checkpoint is a normal transformers checkpoint whose heads and FFN neurons were permuted into rank order
(function-preserving) with the ranking in ``config.json["elastic_ranking"]``. Stock ``AutoModel.from_pretrained``
loads it as the dense model; :class:`~hf_snapvit.ElasticViTModel` reads only the prefix of each projection that a
budget keeps, straight from the safetensors files.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

import torch
from safetensors import safe_open
from transformers import PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, cached_file

from ..architectures import ffn_inputs, get_attention, get_layers, get_mlp, get_spec, qkv_projections
from ..architectures.budget import ModelShape
from ..architectures.registry import SPEC_KEY
from ..errors import CheckpointError, RankingFormatError
from .config_file import check_architecture, read_config  # noqa: F401 (the loader's and the CLI's)
from .fingerprint import RESAVE, block_of, close, expected_values, read_units, unit_rows
from .ranking import ElasticRanking
from .saved_names import disk_names, unrenamed_hint

HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


# ------------------------------------------------------------------------------------ the stored entries
def elastic_entries(config: Any, source: Any, *, how_to_create: str = "ranking = hf_snapvit.rank(model) and "
                    "hf_snapvit.save_elastic(model, ranking, save_directory)") -> tuple[ElasticRanking | None, dict | None]:
    """``(ranking, layout)`` stored in a checkpoint's config: an elastic checkpoint has a ranking, a sliced one a
    layout (and its ranking when it kept one).

    Raises:
        RankingFormatError: Neither is there, or the ranking is corrupt; the message says how to create one
            (``how_to_create``).
    """
    stored = getattr(config, "elastic_ranking", None)
    layout = getattr(config, "elastic_layout", None)
    if stored is None and layout is None:
        raise RankingFormatError(
            f"{str(source)!r} is not an elastic checkpoint: its config.json has no 'elastic_ranking'. Create one with "
            f"{how_to_create}."
        )
    return (ElasticRanking.from_dict(stored) if stored is not None else None), layout


class CheckpointReader:
    """Random access to the tensors of a (possibly sharded) safetensors checkpoint, local or on the Hub.

    Tensors are memory-mapped; :meth:`read` materialises only the requested prefix of each dimension. An empty,
    truncated or garbage weights file, a corrupt shard index and a tensor missing from its shard raise
    :class:`CheckpointError` naming the file.
    """

    def __init__(self, path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> None:
        hub_kwargs = {k: v for k, v in hub_kwargs.items() if v is not None}
        common = dict(_raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
        self._handles: dict[str, Any] = {}
        self._index = cached_file(path_or_repo_id, SAFE_WEIGHTS_INDEX_NAME, **hub_kwargs, **common)
        if self._index is not None:
            weight_map = _read_index(self._index)
            files = {}
            for name in sorted(set(weight_map.values())):
                try:
                    files[name] = cached_file(path_or_repo_id, name, **hub_kwargs)
                except OSError as error:
                    raise _damaged(self._index, f"lists the shard {name!r}, which cannot be read ({error})") from None
            self._file_of = {key: files[name] for key, name in weight_map.items()}
        else:
            single = cached_file(path_or_repo_id, SAFE_WEIGHTS_NAME, **hub_kwargs, **common)
            if single is None:
                raise CheckpointError(
                    f"No {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} found in {str(path_or_repo_id)!r}. "
                    "Elastic checkpoints are stored as safetensors; re-save the model with save_pretrained()."
                )
            self._file_of = {key: single for key in self._open(single).keys()}

    def keys(self) -> set[str]:
        return set(self._file_of)

    def _open(self, path: str):
        if path not in self._handles:
            try:
                self._handles[path] = safe_open(path, "pt")
            except Exception as error:  # safetensors raises its own error types, and OSError
                raise _damaged(path, f"is not a readable safetensors file ({error})") from None
        return self._handles[path]

    def _slice(self, key: str):
        path = self._file_of[key]
        handle = self._open(path)
        try:
            return handle.get_slice(key)
        except Exception as error:
            raise _damaged(path, f"does not hold the tensor {key!r} that {self._index} assigns to it ({error})"
                           ) from None

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())

    def read(self, key: str, shape: tuple[int, ...], chunk: tuple[int, int] | None = None) -> torch.Tensor:
        """Read the leading ``shape`` block of tensor ``key``.

        ``chunk=(i, n)`` reads from the ``i``-th of ``n`` equal parts along dimension 0 (fused tensors such as a
        SwiGLU ``weights_in`` that stores two projections stacked).
        """
        view = self._slice(key)
        start = 0
        if chunk is not None:
            start = chunk[0] * (view.get_shape()[0] // chunk[1])
        index = tuple(slice(start, start + n) if d == 0 else slice(0, n) for d, n in enumerate(shape))
        return view[index] if index else view[...]


def _damaged(path: str | os.PathLike, why: str) -> CheckpointError:
    return CheckpointError(
        f"{str(path)!r} {why}: the checkpoint is damaged (or was not completely written or downloaded). Re-download "
        "it (from_pretrained(..., force_download=True) for a Hub repo) or save it again."
    )


def _read_index(path: str) -> dict[str, str]:
    """The ``weight_map`` of a shard index: tensor name -> shard file name in the checkpoint's folder."""
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _damaged(path, f"is not valid JSON ({error})") from None
    if not isinstance(index, dict) or "weight_map" not in index:
        raise _damaged(path, "has no 'weight_map'")
    weight_map = index["weight_map"]
    if not isinstance(weight_map, dict) or not weight_map:
        raise _damaged(path, f"has a weight_map that is not a non-empty JSON object ({type(weight_map).__name__})")
    for key, name in weight_map.items():
        if not isinstance(name, str) or not name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
            raise _damaged(path, f"maps {key!r} to {name!r} in its weight_map, which is not a file name in the "
                           "checkpoint's folder")
    return weight_map


def load_sliced_state_dict(
    model: PreTrainedModel, reader: CheckpointReader, sliceable: set[str], stored: dict[str, tuple[int, ...]],
    described_by: str = "config.json", row_blocks: dict[str, int] | None = None, skip: set[str] = frozenset(),
) -> dict[str, torch.Tensor]:
    """Read the tensors of ``model``'s (meta) state dict from ``reader``, taking prefixes for ``sliceable`` ones.

    Every tensor read must have exactly the shape ``stored`` gives it (what ``described_by``, the config or its
    elastic layout, says the checkpoint holds), as stock transformers requires of a dense checkpoint: a tensor that
    is larger, smaller or of another rank raises :class:`CheckpointError` naming it, whatever the budget. Tensors the
    checkpoint lacks (e.g. a pooler saved without) are left out, for the caller to initialise. ``row_blocks`` names the
    tensors made of equal row blocks (:func:`fused_row_blocks`), whose leading rows are read in each block; ``skip``
    the tensors not to read (left out, as absent ones are).
    """
    row_blocks = row_blocks or {}
    mapping = disk_names(model, reader.keys())
    state = {}
    for name, target in model.state_dict().items():
        if name in skip:
            continue
        if name not in mapping:
            if name in sliceable:
                raise CheckpointError(
                    f"The checkpoint has no tensor for the prunable {name!r}. Is this checkpoint of the architecture "
                    f"its config.json names?{unrenamed_hint(model)}"
                )
            continue
        key, chunk = mapping[name]
        found, held = reader.shape(key), tuple(stored[name])
        expected = held if chunk is None else (held[0] * chunk[1], *held[1:])
        if found != expected:
            raise CheckpointError(
                f"Checkpoint tensor {key!r} has shape {found}, but {described_by} says it holds {expected}. The "
                "weights do not match the config: the checkpoint is damaged or was edited; re-export it with "
                "hf_snapvit (save_elastic, or save_pretrained of a model ElasticViTModel loaded)."
            )
        # Copy into memory the model owns: a view into the memory-mapped file would keep the whole dense matrix
        # reachable for column slices, and the file mapped for the model's lifetime.
        state[name] = torch.empty(target.shape, dtype=target.dtype).copy_(
            read_blocks(reader, key, tuple(target.shape), chunk, row_blocks.get(name, 1)))
    return state


def fused_row_blocks(model: PreTrainedModel) -> dict[str, int]:
    """``{state-dict name: row blocks}`` of the weights and biases of ``model``'s fused q/k/v projections and packed
    FFN projections."""
    spec = get_spec(model)
    names = {id(p): n for n, p in model.named_parameters()}
    found = {}
    for layer in get_layers(model, spec):
        for linear, blocks in (*qkv_projections(get_attention(layer, spec), spec), *ffn_inputs(*get_mlp(layer, spec))):
            for param in (linear.weight, linear.bias):
                if blocks > 1 and param is not None:
                    found[names[id(param)]] = blocks
    return found


def read_blocks(reader: CheckpointReader, key: str, shape: tuple[int, ...], chunk: tuple[int, int] | None,
                blocks: int) -> torch.Tensor:
    """The leading ``shape`` block of tensor ``key`` (of its ``chunk``), or for a tensor of ``blocks`` equal row blocks
    (a fused ``qkv``: query, key, value rows; a packed FFN: value and gate rows) the leading rows of each block,
    concatenated: the first heads (neurons) of a rank-ordered fused projection are that many row ranges."""
    if blocks == 1:
        return reader.read(key, shape, chunk)
    part, parts = chunk or (0, 1)
    each = (shape[0] // blocks, *shape[1:])
    return torch.cat([reader.read(key, each, (part * blocks + b, parts * blocks)) for b in range(blocks)])


# ------------------------------------------------------------------------------------ checking the order
def check_ranking(config: Any, ranking: ElasticRanking | None, source: Any, model: PreTrainedModel,
                  shape: ModelShape, reader: CheckpointReader, *, sliced: bool = False,
                  resized: bool = True) -> None:
    """Check that ``ranking`` fits ``model`` (the dense skeleton the loader builds, of ``shape``) and that the weights
    ``reader`` reads are in the order ``config.elastic_ranking`` describes.

    A ``sliced`` checkpoint (``config.elastic_layout``) was written by a model this package sliced, so its units are
    in rank order by construction; its weights differing from the fingerprint means they were trained since (e.g.
    fine-tuned with ``Trainer``), which warns rather than fails, and loaded at its saved size (not ``resized``) its
    order is never used, so it is not checked.

    Raises:
        RankingFormatError: The ranking's cost model differs from the model's, its fingerprint is corrupt, or the
            weights are in another order (a ranking stored beside unpermuted weights, or copied from another
            checkpoint).

    A ranking without a fingerprint (written before fingerprints, or stored with plain ``save_pretrained``) loads
    with a warning.
    """
    if ranking is None:
        return
    ranking.check_matches(shape)
    if sliced and not resized:
        return
    stored = config.elastic_ranking.get("provenance")
    fingerprint = stored.get("weights_fingerprint") if isinstance(stored, dict) else None
    if fingerprint is None:
        warnings.warn(
            f"The elastic_ranking of {str(source)!r} has no weights fingerprint (it was written before hf_snapvit "
            "recorded one, or stored with plain save_pretrained), so whether the weights are in its rank order "
            "cannot be verified. If this checkpoint came from hf_snapvit.save_elastic, re-save it to add one: model = "
            "transformers.AutoModel.from_pretrained(path); hf_snapvit.save_elastic(model, hf_snapvit.ElasticRanking."
            "from_dict(model.config.elastic_ranking), folder). If the ranking was pasted beside unpermuted weights, "
            "the loaded models keep the wrong units: save the ranked model with hf_snapvit.save_elastic instead.",
            UserWarning, stacklevel=3,  # the caller of from_pretrained
        )
        return
    expected = expected_values(fingerprint, ranking)
    names = {id(p): n for n, p in model.named_parameters()}
    disk = disk_names(model, reader.keys())
    for block, ((v_weight, rows, hd, in_weight), (heads, neurons)) in enumerate(zip(unit_rows(model), expected)):
        found = [read_units(reader, block_of(disk.get(names[id(v_weight)]), rows), hd, len(heads)),
                 read_units(reader, disk.get(names[id(in_weight)]), None, len(neurons))]
        for kind, want, got in zip(("heads", "FFN neurons"), (heads, neurons), found):
            if got is not None and not close(want[:len(got)], got):
                if sliced:
                    warnings.warn(
                        f"The weights of {str(source)!r} differ from those its elastic_ranking was computed on "
                        f"(block {block}: the {kind}); it was probably fine-tuned (or its units reordered) after "
                        "slicing. Slicing it further "
                        "removes units in the ranking's order, which the training did not see; for a model of "
                        "another size, slice the dense elastic checkpoint and fine-tune that instead.",
                        UserWarning, stacklevel=3,
                    )
                    return
                raise _order_error(source, model, block, kind)


def _order_error(source: Any, model: PreTrainedModel, block: int, kind: str) -> RankingFormatError:
    """The error for weights that differ from the ranking's fingerprint in ``block`` (``kind``: heads or neurons).

    In a task model only the vision encoder is ranked, so a mismatch there means its tower is not the one the ranking
    was made on: the message names the tower, since the rest of the checkpoint may well be right.
    """
    spec = get_spec(model)
    stored = (f" (or its {SPEC_KEY} names other v_proj or mlp_in rows than the fingerprint's)"
              if getattr(model.config, SPEC_KEY, None) is not None else "")
    if spec.task is None:
        return RankingFormatError(
            f"The weights of {str(source)!r} are not in the weight order its elastic_ranking describes (block "
            f"{block}: the {kind} differ from the ranking's weights fingerprint): it was stored beside weights it "
            "was not made for (save_pretrained of an unpermuted model, a config.json copied from another "
            f"checkpoint){stored}; {RESAVE} from the model it was ranked on.")
    return RankingFormatError(
        f"The weights of {str(source)!r} are not in the weight order its elastic_ranking describes (block {block} "
        f"of the vision encoder {spec.encoder!r} of this {spec.task.model_type} model: the {kind} differ from the "
        "ranking's weights fingerprint). Its vision tower is not the one the ranking was made on: the tower's "
        "weights were replaced (by another tower of the same shape), or the elastic_ranking was copied from a "
        "checkpoint of another tower. Rank the model with the tower it has now (ranking = hf_snapvit.rank(model)) "
        "and save it with hf_snapvit.save_elastic(model, ranking, folder), or put back the tower the ranking was "
        "made on.")


def stored_widths(layout: Any, dense_shape: Any) -> tuple[list[int], list[int]]:
    """``(heads, neurons)`` per block as stored: the dense widths, or a sliced checkpoint's layout, checked: a list of
    one integer per block, each between 1 and the dense width."""
    if layout is None:
        return dense_shape.dense_heads, dense_shape.dense_neurons
    fix = "The checkpoint is corrupt: re-export it with save_pretrained of a model ElasticViTModel loaded."
    if not isinstance(layout, dict):
        raise RankingFormatError(f"config.elastic_layout must be a JSON object, got {type(layout).__name__}. {fix}")
    widths = []
    for key, dense in (("num_heads", dense_shape.num_heads), ("intermediate_size", dense_shape.intermediate_size)):
        if key not in layout:
            raise RankingFormatError(f"config.elastic_layout has no {key!r}. {fix}")
        values, L = layout[key], dense_shape.num_layers
        if not isinstance(values, list) or len(values) != L:
            found = f"has {len(values)} entries" if isinstance(values, list) else "is not a list"
            raise RankingFormatError(f"config.elastic_layout.{key}={values!r} {found}: expected a list of {L} "
                                     f"integers, one per block ({L} blocks). {fix}")
        for block, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= dense:
                kind = "an integer " if isinstance(value, bool) or not isinstance(value, int) else ""
                raise RankingFormatError(f"config.elastic_layout.{key}[{block}]={value!r} must be {kind}between 1 "
                                         f"and {dense} (the dense model's width). {fix}")
        widths.append(list(values))
    multiple = layout.get("width_multiple")
    if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1):
        raise RankingFormatError(f"config.elastic_layout.width_multiple={multiple!r} must be an integer >= 1. {fix}")
    return widths[0], widths[1]
