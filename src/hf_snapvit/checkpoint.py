"""Elastic checkpoints on disk: atomic writing, and reading only the slices a model keeps.

An elastic checkpoint is a normal transformers checkpoint whose heads and FFN neurons were permuted into rank order
(function-preserving) with the ranking in ``config.json["elastic_ranking"]``. Stock ``AutoModel.from_pretrained``
loads it as the dense model; :class:`~hf_snapvit.ElasticViTModel` reads only the prefix of each projection that a
budget keeps, straight from the safetensors files.
"""

from __future__ import annotations

import copy
import json
import os
import warnings
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from transformers import PreTrainedModel
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME
from transformers.utils.hub import cached_file

from .architectures import get_attention, get_layers, get_mlp, get_spec, head_dim
from .budget import model_shape, skeleton
from .errors import CheckpointError, RankingFormatError
from .files import atomic_directory
from .ranking import ElasticRanking
from .slicing import slice_model_

HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")

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


def save_elastic(
    model: PreTrainedModel,
    ranking: ElasticRanking,
    save_directory: str | os.PathLike,
    *,
    image_processor: Any = None,
    **save_kwargs: Any,
) -> ElasticRanking:
    """Write the elastic checkpoint of ``model``: its weights permuted into rank order plus the ranking.

    The write is atomic (:func:`hf_snapvit.files.atomic_directory`): an interrupted save leaves ``save_directory``
    as it was. ``model`` is not touched: the permuted weights are new tensors of a shallow copy, so the model's
    parameter objects, values, gradients and config stay as they are (optimizers, hooks and EMA copies made before
    the save keep working). The stored ranking carries a fingerprint of the permuted weights
    (``provenance["weights_fingerprint"]``), which ``ElasticViTModel.from_pretrained`` checks.

    Args:
        model: The dense model that ``ranking`` was computed on.
        ranking: From :func:`hf_snapvit.rank`.
        save_directory: Destination folder (created if needed).
        image_processor: Saved alongside when given (e.g. ``AutoImageProcessor.from_pretrained(base)``), so
            pipelines can load the checkpoint by path alone.
        **save_kwargs: Passed to ``model.save_pretrained`` (``max_shard_size``, ...). To publish the folder, call
            :func:`hf_snapvit.push_to_hub` on it (or :func:`hf_snapvit.hub.save_and_push` for both in one call).

    Returns:
        The ranking as stored (in rank order), i.e. what ``ElasticViTModel.from_pretrained`` will resolve budgets with.
    """
    ranking.check_matches(model_shape(model))
    if getattr(model.config, "elastic_layout", None):
        raise CheckpointError(
            "save_elastic needs the dense model, but this one is sliced (config.elastic_layout is set). Load the dense "
            "elastic checkpoint or the original model instead."
        )
    data = ranking.sorted().to_dict()
    permuted = slice_model_(_shadow_copy(model), ranking.orders())
    data["provenance"]["weights_fingerprint"] = _fingerprint_of(permuted)
    permuted.config.elastic_ranking = data
    with atomic_directory(save_directory) as staging:
        permuted.save_pretrained(staging, **save_kwargs)
        if image_processor is not None:
            image_processor.save_pretrained(staging)
    return ElasticRanking.from_dict(data)


class CheckpointReader:
    """Random access to the tensors of a (possibly sharded) safetensors checkpoint, local or on the Hub.

    Tensors are memory-mapped; :meth:`read` materialises only the requested prefix of each dimension.
    """

    def __init__(self, path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> None:
        hub_kwargs = {k: v for k, v in hub_kwargs.items() if v is not None}
        common = dict(_raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
        index = cached_file(path_or_repo_id, SAFE_WEIGHTS_INDEX_NAME, **hub_kwargs, **common)
        if index is not None:
            with open(index) as f:
                weight_map: dict[str, str] = json.load(f)["weight_map"]
            files = {name: cached_file(path_or_repo_id, name, **hub_kwargs) for name in sorted(set(weight_map.values()))}
            self._file_of = {key: files[name] for key, name in weight_map.items()}
        else:
            single = cached_file(path_or_repo_id, SAFE_WEIGHTS_NAME, **hub_kwargs, **common)
            if single is None:
                raise CheckpointError(
                    f"No {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} found in {str(path_or_repo_id)!r}. "
                    "Elastic checkpoints are stored as safetensors; re-save the model with save_pretrained()."
                )
            with safe_open(single, "pt") as f:
                self._file_of = {key: single for key in f.keys()}
        self._handles: dict[str, Any] = {}

    def keys(self) -> set[str]:
        return set(self._file_of)

    def _handle(self, key: str):
        path = self._file_of[key]
        if path not in self._handles:
            self._handles[path] = safe_open(path, "pt")
        return self._handles[path]

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(key).get_slice(key).get_shape())

    def read(self, key: str, shape: tuple[int, ...], chunk: tuple[int, int] | None = None) -> torch.Tensor:
        """Read the leading ``shape`` block of tensor ``key``.

        ``chunk=(i, n)`` reads from the ``i``-th of ``n`` equal parts along dimension 0 (fused tensors such as a
        SwiGLU ``weights_in`` that stores two projections stacked).
        """
        view = self._handle(key).get_slice(key)
        start = 0
        if chunk is not None:
            start = chunk[0] * (view.get_shape()[0] // chunk[1])
        index = tuple(slice(start, start + n) if d == 0 else slice(0, n) for d, n in enumerate(shape))
        return view[index] if index else view[...]


def disk_names(model: PreTrainedModel, keys: set[str]) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """Map each state-dict name of ``model`` to ``(name in the checkpoint, chunk)``; names not found are left out.

    Checkpoints saved by transformers keep their historical tensor names (``attention.attention.query``), which
    transformers renames at load time. The renaming is transformers' own conversion mapping, applied in reverse
    exactly as ``save_pretrained`` does; names already in the in-memory layout are used as they are.
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import PrefixChange, WeightConverter, apply_converters, apply_renamings

    conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    converters = [c for c in reverse if isinstance(c, WeightConverter)]
    renamings = [c for c in reverse if not isinstance(c, WeightConverter)]
    prefix = model.base_model_prefix
    mapping: dict[str, tuple[str, tuple[int, int] | None]] = {}
    for name in model.state_dict():
        candidates: list[tuple[str, tuple[int, int] | None]] = [(name, None)]
        converted, pattern = apply_converters(name, converters)
        if pattern is not None:
            converter = next(c for c in converters if pattern in c.source_patterns)
            chunk = (converter.source_patterns.index(pattern), len(converter.source_patterns))
            candidates.append((apply_renamings(converted, renamings), chunk))
        else:
            candidates.append((apply_renamings(name, renamings), None))
        # A bare backbone checkpoint read into a task model, or the other way round.
        for key, chunk in list(candidates):
            candidates.append((f"{prefix}.{key}", chunk))
            if key.startswith(prefix + "."):
                candidates.append((key[len(prefix) + 1:], chunk))
        found = next((c for c in candidates if c[0] in keys), None)
        if found is not None:
            mapping[name] = found
    return mapping


def load_sliced_state_dict(
    model: PreTrainedModel, reader: CheckpointReader, sliceable: set[str]
) -> dict[str, torch.Tensor]:
    """Read the tensors of ``model``'s (meta) state dict from ``reader``, taking prefixes for ``sliceable`` ones.

    Tensors the checkpoint lacks (e.g. a pooler saved without) are left out, for the caller to initialise.
    """
    mapping = disk_names(model, reader.keys())
    state = {}
    for name, target in model.state_dict().items():
        if name not in mapping:
            if name in sliceable:
                raise CheckpointError(
                    f"The checkpoint has no tensor for the prunable {name!r}. Is this checkpoint of the architecture "
                    "its config.json names?"
                )
            continue
        key, chunk = mapping[name]
        stored = reader.shape(key)
        expected = tuple(target.shape)
        if chunk is not None:
            stored = (stored[0] // chunk[1], *stored[1:])
        if name not in sliceable and stored != expected:
            raise RankingFormatError(
                f"Checkpoint tensor {key!r} has shape {stored}, but the model expects {expected}. The checkpoint does "
                "not match its config.json (elastic_layout / architecture); re-export it with hf_snapvit."
            )
        if len(stored) != len(expected) or any(e > s for e, s in zip(expected, stored)):
            raise CheckpointError(
                f"Checkpoint tensor {key!r} has shape {stored}, smaller than the {expected} this budget needs. A sliced "
                "checkpoint cannot grow back: load the dense elastic checkpoint for larger models."
            )
        # Copy into memory the model owns: a view into the memory-mapped file would keep the whole dense matrix
        # reachable for column slices, and the file mapped for the model's lifetime.
        state[name] = torch.empty(expected, dtype=target.dtype).copy_(reader.read(key, expected, chunk))
    return state


# ------------------------------------------------------------------------------------ weight-order fingerprint
# A ranking describes one order of the units. save_elastic records, per block, the first weight (column 0) of each
# head's first value row and of the first FINGERPRINT_NEURONS FFN input rows, in stored order; the loader reads the
# same few values (one small slice per head, one per FFN) and refuses a ranking whose weights are in another order.
# Input rows are what a weight correction leaves alone; a prefix is what a sliced checkpoint keeps.
FINGERPRINT_NEURONS = 32
# Relative L2 distance per block. Other units in those places differ by about 140 % (independent values), while a
# bf16 re-save or ordinary fine-tuning of a sliced model (Trainer, recovery) moves the values by a few percent.
FINGERPRINT_TOLERANCE = 0.25
_RESAVE = "re-save it with hf_snapvit.save_elastic(model, ranking, folder)"


def _shadow_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of ``model``'s module tree and config that shares its parameters and buffers: slicing the copy
    assigns new tensors to the copy's modules and leaves ``model`` as it is."""
    copies: dict[int, torch.nn.Module] = {}

    def shadow(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) not in copies:
            clone = copy.copy(module)
            copies[id(module)] = clone
            clone._parameters = dict(module._parameters)
            clone._buffers = dict(module._buffers)
            clone._modules = {name: None if child is None else shadow(child) for name, child in module._modules.items()}
        return copies[id(module)]

    clone = shadow(model)
    clone.config = copy.deepcopy(model.config)
    return clone


def _unit_rows(model: PreTrainedModel) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
    """Per block: the value projection's weight, the head width and the first FFN input projection's weight."""
    spec = get_spec(model)
    rows = []
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        mlp, variant = get_mlp(layer, spec)
        rows.append((getattr(attention, spec.v_proj).weight, head_dim(attention, spec),
                     getattr(mlp, variant.in_proj[0]).weight))
    return rows


def _rounded(values: torch.Tensor) -> list[float]:
    values = torch.nan_to_num(values.detach().double().reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    return [float(f"{v:.6g}") for v in values.cpu().tolist()]


def _fingerprint_of(model: PreTrainedModel) -> dict[str, Any]:
    """The weight-order fingerprint of an in-memory (permuted) model."""
    heads, neurons = [], []
    for v_weight, hd, in_weight in _unit_rows(model):
        heads.append(_rounded(v_weight[::hd, 0]))
        neurons.append(_rounded(in_weight[:FINGERPRINT_NEURONS, 0]))
    return {"version": 1, "heads": heads, "neurons": neurons}


def verified_elastic_entries(config: Any, source: Any, **hub_kwargs: Any) -> tuple[ElasticRanking | None, dict | None]:
    """:func:`elastic_entries`, with the stored weights checked against the ranking's order
    (:func:`check_weight_order`)."""
    ranking, layout = elastic_entries(config, source)
    check_weight_order(config, ranking, source, **hub_kwargs)
    return ranking, layout


def check_weight_order(config: Any, ranking: ElasticRanking | None, source: Any, **hub_kwargs: Any) -> None:
    """Check that the stored weights are in the order ``config.elastic_ranking`` describes.

    Raises:
        RankingFormatError: The fingerprint is corrupt, or the weights are in another order (a ranking stored beside
            unpermuted weights, or copied from another checkpoint).

    A ranking without a fingerprint (written before fingerprints, or stored with plain ``save_pretrained``) loads
    with a warning.
    """
    if ranking is None:
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
            UserWarning, stacklevel=4,  # the caller of from_pretrained
        )
        return
    model = skeleton(config)
    ranking.check_matches(model_shape(model))
    expected = _expected(fingerprint, ranking)
    reader = CheckpointReader(source, **hub_kwargs)
    names = {id(p): n for n, p in model.named_parameters()}
    disk = disk_names(model, reader.keys())
    for block, ((v_weight, hd, in_weight), (heads, neurons)) in enumerate(zip(_unit_rows(model), expected)):
        found = [_read_units(reader, disk.get(names[id(v_weight)]), hd, len(heads)),
                 _read_units(reader, disk.get(names[id(in_weight)]), None, len(neurons))]
        for kind, want, got in zip(("heads", "FFN neurons"), (heads, neurons), found):
            if got is not None and not _close(want[:len(got)], got):
                raise RankingFormatError(
                    f"The weights of {str(source)!r} are not in the weight order its elastic_ranking describes "
                    f"(block {block}: the {kind} differ from the ranking's weights fingerprint). The ranking was "
                    "stored beside weights it was not made for (plain save_pretrained of an unpermuted model, or a "
                    f"config.json copied from another checkpoint); {_RESAVE} from the model it was ranked on."
                )


def _expected(fingerprint: Any, ranking: ElasticRanking) -> list[tuple[list[float], list[float]]]:
    """The fingerprint's per-block ``(heads, neurons)`` values, checked against the ranking's shape."""
    shape = ranking.shape
    try:
        blocks = list(zip(fingerprint["heads"], fingerprint["neurons"], strict=True))
        values = [([float(v) for v in h], [float(v) for v in f]) for h, f in blocks]
        ok = len(values) == shape.num_layers and all(
            len(h) == shape.num_heads and len(f) == min(shape.intermediate_size, FINGERPRINT_NEURONS)
            for h, f in values)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise RankingFormatError(
            "elastic_ranking.provenance.weights_fingerprint is corrupt: expected {'heads': [L][H] numbers, "
            f"'neurons': [L][min(F, {FINGERPRINT_NEURONS})] numbers}} for L={shape.num_layers} blocks of "
            f"H={shape.num_heads} heads and F={shape.intermediate_size} neurons; {_RESAVE}."
        )
    return values


def _read_units(reader: CheckpointReader, found: tuple[str, tuple[int, int] | None] | None, head_width: int | None,
                count: int) -> list[float] | None:
    """Column 0 of the first row of each stored head (``head_width`` rows each), or of the first ``count`` rows."""
    if found is None:
        return None  # the loader reports a missing tensor
    key, (part, parts) = found[0], found[1] or (0, 1)
    rows = reader.shape(key)[0] // parts
    if head_width is None:
        return _rounded(reader.read(key, (min(rows, count), 1), found[1]))
    stored = min(rows // head_width, count)
    # The i-th of parts·stored equal parts starts at head i's first row within projection ``part``.
    return [_rounded(reader.read(key, (1, 1), (part * (rows // head_width) + h, parts * (rows // head_width))))[0]
            for h in range(stored)]


def _close(expected: list[float], found: list[float]) -> bool:
    a, b = np.asarray(expected, dtype=np.float64), np.asarray(found, dtype=np.float64)
    return float(np.linalg.norm(a - b)) <= FINGERPRINT_TOLERANCE * float(np.linalg.norm(a)) + 1e-12 * len(a)
