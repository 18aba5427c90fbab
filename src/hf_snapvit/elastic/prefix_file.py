"""The prefix correction of an elastic checkpoint on disk, :data:`~hf_snapvit.elastic.file_names.PREFIX_FILE` beside
its weights: written, read and applied at load here, beside the checkpoint's reader; fitted by
:class:`hf_snapvit.correction.prefix.PrefixCorrection`.

Per block and projection (``{block}.{kind}.…``, ``kind`` in :data:`KINDS`):

* ``lower``: the Cholesky factor ``L`` of the damped Hessian, its lower triangle packed row by row (float32). The
  rows of a prefix come first, so the factor of the first ``k`` columns is the first ``k(k+1)/2`` values: a load
  reads only what its size keeps, as it does for the weights.
* ``projected``: ``(WL)ᵀ``, ``[in, out]``; a prefix is its first ``k`` rows.
* ``column0``: the layer's first input column (the one every size keeps) when the factors were made. The loader
  compares it with the checkpoint's own: factors made for other weights (trained or replaced since) are refused.

The file's metadata holds the record (settings, images, tokens, damping). A save of the checkpoint's weights
(``save_elastic``, ``save_pretrained``) replaces the file with the checkpoint, like its weights.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save
from transformers import PreTrainedModel

from ..architectures import get_layers, get_spec
from ..errors import CheckpointError, CorrectionError
from ..utils.files import atomic_file
from ..surgery.slicing import OUTPUT_KINDS, output_projections
from ..surgery.threads import one_thread
from .file_names import PREFIX_FILE

#: The two column-pruned projections of a block, in the order a prefix correction keeps them.
KINDS = OUTPUT_KINDS

FORMAT_VERSION = 1
# Relative distance of a layer's first column from the one the factors were made with: a bf16 re-save moves it by
# about 0.4 %, training by a few percent or more.
COLUMN_TOLERANCE = 0.01
REFIT = ("re-create it with hf_snapvit.add_prefix_correction(folder, images), or load with "
         "prefix_correction=False")


def pack_lower(L: torch.Tensor) -> torch.Tensor:
    """The lower triangle of a square ``L``, row by row (a prefix of rows is a prefix of the result)."""
    rows, cols = torch.tril_indices(L.shape[0], L.shape[0], device=L.device)
    return L[rows, cols]


def unpack_lower(packed: torch.Tensor, size: int) -> torch.Tensor:
    """The ``[size, size]`` lower-triangular matrix whose packed rows start ``packed``."""
    # The lower triangle's entries in row-major order are the packed order, which masked_scatter_ fills.
    mask = torch.ones(size, size, dtype=torch.bool, device=packed.device).tril_()
    return packed.new_zeros(size, size).masked_scatter_(mask, packed[: size * (size + 1) // 2])


def write_prefix_file(folder: str | os.PathLike, factors: Sequence[Sequence[Any]], record: dict[str, Any]) -> Path:
    """Write the factors (per block, one :class:`~hf_snapvit.correction.prefix.PrefixFactors` per kind, columns in the
    stored, rank order) and ``record`` to ``folder/prefix_correction.safetensors`` atomically."""
    tensors = {}
    for block, pair in enumerate(factors):
        for kind, f in zip(KINDS, pair):
            if not torch.equal(f.order, torch.arange(len(f.order))):
                raise CheckpointError("Only the factors of a model whose units are stored in rank order (an elastic "
                                      "checkpoint) can be saved; fit them on the loaded elastic checkpoint.")
            tensors[f"{block}.{kind}.lower"] = pack_lower(f.L).contiguous()
            tensors[f"{block}.{kind}.projected"] = f.WL.T.contiguous()
            tensors[f"{block}.{kind}.column0"] = f.column0.float().contiguous()
    path = Path(folder) / PREFIX_FILE
    metadata = {"format_version": str(FORMAT_VERSION), "record": json.dumps(record)}
    with atomic_file(path, "wb") as handle:
        handle.write(save(tensors, metadata=metadata))
    return path


class PrefixFile:
    """Reads the prefix correction of one checkpoint, checking every tensor it hands out."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        try:
            self._handle = safe_open(self.path, "pt")
            metadata = self._handle.metadata() or {}
        except Exception as error:  # safetensors raises its own error types, and OSError
            raise CheckpointError(f"{self.path!r} is not a readable safetensors file ({error}); {REFIT}.") from None
        version = metadata.get("format_version")
        if version != str(FORMAT_VERSION):
            raise CheckpointError(f"{self.path!r} has format_version {version!r}; this hf_snapvit reads version "
                                  f"{FORMAT_VERSION}. Upgrade hf_snapvit, or {REFIT}.")
        try:
            self.record = json.loads(metadata.get("record", ""))
        except json.JSONDecodeError:
            raise CheckpointError(f"{self.path!r} has no readable record in its metadata; {REFIT}.") from None
        self._keys = set(self._handle.keys())

    def __deepcopy__(self, memo: dict) -> "PrefixFile":
        return self  # read-only: a copied model shares it

    def __reduce__(self) -> tuple:
        return PrefixFile, (self.path,)

    def _tensor(self, name: str, shape: tuple[int, ...], rows: int | None = None) -> torch.Tensor:
        if name not in self._keys:
            raise CheckpointError(f"{self.path!r} has no tensor {name!r}: it was made for another model; {REFIT}.")
        view = self._handle.get_slice(name)
        if tuple(view.get_shape()) != shape or view.get_dtype() not in ("F32", "F64"):
            raise CheckpointError(f"{self.path!r}: {name} is {view.get_dtype()} {tuple(view.get_shape())}, expected "
                                  f"float32 {shape}: it was made for another model; {REFIT}.")
        values = (view[:rows] if rows is not None else view[:]).double()
        # A sum is NaN or infinite if any value is (float64 sums of float32 values cannot overflow): the full check
        # only confirms it, which keeps it out of every switch's cost.
        if not torch.isfinite(values.sum()) and not torch.isfinite(values).all():
            raise CheckpointError(f"{self.path!r}: {name} holds NaN or infinite values; {REFIT}.")
        return values

    def weight(self, block: int, kind: str, kept: int, dense: torch.Tensor) -> torch.Tensor:
        """``[out, kept]`` float64: the corrected first ``kept`` columns of the layer whose full weight (or any prefix
        of it: only column 0 is read) is ``dense``, after checking the factors against it."""
        out, size = dense.shape[0], self.width(block, kind)
        column0 = self._tensor(f"{block}.{kind}.column0", (out,))
        given = dense[:, 0].detach().double().cpu()
        if float((given - column0).norm()) > COLUMN_TOLERANCE * max(float(column0.norm()), 1e-12):
            raise CheckpointError(f"{self.path!r} was made for other weights (block {block}, {kind}: the first column "
                                  "differs from the checkpoint's); the weights were trained or replaced since. "
                                  f"{REFIT[0].upper()}{REFIT[1:]}.")
        if not 1 <= kept <= size:
            raise CheckpointError(f"Block {block} {kind}: {kept} columns kept, but the factors cover 1 to {size}.")
        L = unpack_lower(self._tensor(f"{block}.{kind}.lower", (size * (size + 1) // 2,), kept * (kept + 1) // 2),
                         kept)
        if not bool((torch.diagonal(L) > 0).all()):
            raise CheckpointError(f"{self.path!r}: the factor of block {block} {kind} is not positive definite; "
                                  f"{REFIT}.")
        projected = self._tensor(f"{block}.{kind}.projected", (size, out), kept)
        return torch.linalg.solve_triangular(L.T, projected, upper=True).T

    def applies_at(self, sparsity: float) -> bool:
        """Whether a model of this sparsity is corrected (:func:`applies_at`)."""
        return applies_at(self.record, sparsity)

    def width(self, block: int, kind: str) -> int:
        """The number of input columns the factors of a block's projection cover (its dense width)."""
        name = f"{block}.{kind}.projected"
        if name not in self._keys:
            raise CheckpointError(f"{self.path!r} has no tensor {name!r}: it was made for another model; {REFIT}.")
        return int(self._handle.get_slice(name).get_shape()[0])


def find_prefix_file(path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> PrefixFile | None:
    """The checkpoint's prefix correction, or ``None`` if it has none. A Hub checkpoint whose file can be neither
    found nor known to be absent (offline, or the Hub unreachable, and the file not in the cache) warns that its
    sizes load uncorrected if it has one."""
    from transformers.utils import cached_file

    given = {k: v for k, v in hub_kwargs.items() if v is not None}
    path = cached_file(path_or_repo_id, PREFIX_FILE, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False, **given)
    if path:
        return PrefixFile(path)
    if not Path(path_or_repo_id).is_dir() and not _known_absent(str(path_or_repo_id), given):
        warnings.warn(f"Could not check whether {str(path_or_repo_id)!r} has a {PREFIX_FILE} (offline or the Hub "
                      "unreachable, and the file is not in the cache): if it has one, this load is not corrected. "
                      "Load once online, or download the file into the cache, to use it.", stacklevel=3)
    return None


def _known_absent(repo_id: str, given: dict[str, Any]) -> bool:
    """Whether the cache records that the repository has no prefix correction (the Hub answered so earlier)."""
    from huggingface_hub import try_to_load_from_cache

    filename = f"{given['subfolder']}/{PREFIX_FILE}" if given.get("subfolder") else PREFIX_FILE
    found = try_to_load_from_cache(repo_id, filename, cache_dir=given.get("cache_dir"),
                                   revision=given.get("revision"))
    # A path: cached; None: unknown; anything else is huggingface_hub's marker of a file known not to exist.
    return found is not None and not isinstance(found, str)


def prefix_file_for(source: str | os.PathLike, wanted: bool | None, hub_kwargs: dict[str, Any],
                    fitting: bool, layout: Any) -> PrefixFile | None:
    """The prefix correction a load applies: the checkpoint's (``wanted`` ``None`` or ``True``), unless the load
    fits the weights itself (``fitting``: a correction or recovery of its own), the checkpoint is sliced
    (``layout``), or it was turned off."""
    sliced = bool(layout)
    if wanted is not None and not isinstance(wanted, bool):
        raise CorrectionError(f"prefix_correction={wanted!r} must be True, False or None.")
    if wanted is False or (wanted is None and (fitting or sliced)):
        return None
    if fitting:
        raise CorrectionError("prefix_correction=True and correction_data/recovery_data both fit the weights; pass "
                              "one of them (correction_data corrects this one size with its own images).")
    found = None if sliced else find_prefix_file(source, **hub_kwargs)
    if found is None and wanted:
        where = "is sliced (its weights are already final)" if sliced else f"has no {PREFIX_FILE}"
        raise CorrectionError(f"prefix_correction=True, but {str(source)!r} {where}. Create the file with "
                              "hf_snapvit.add_prefix_correction(folder, images) on the dense elastic checkpoint, or "
                              "load with prefix_correction=None.")
    return found


def first_band(helped: Sequence[bool]) -> list[bool]:
    """Of the checked sizes in order of sparsity, those in the first run where the correction helped: the factors
    fit the dense model's inputs, which drift further from a size's own the more it prunes, so past a size where the
    correction did not help a larger one is not trusted either (a held-out check of a few hundred images can pass
    there by chance; on the shared ViT-Tiny such sizes lost k-NN accuracy on the validation images)."""
    band, started, ended = [], False, False
    for flag in helped:
        ended = ended or (started and not flag)
        started = started or flag
        band.append(bool(flag) and not ended)
    return band


def applies_at(record: dict[str, Any], sparsity: float) -> bool:
    """Whether the prefix correction described by ``record`` applies to a model of ``sparsity``.

    Without a size check (``record["sizes"]`` absent) it applies at every size. Otherwise the checked sparsities
    bracket the one asked for, and it applies only where the correction helped at both (at the nearest one, below the
    first checked size), within the first run of checked sizes it helped (:func:`first_band`); beyond the last
    checked size it does not apply.
    """
    sizes = record.get("sizes")
    if sizes is None:
        return True
    checked = sorted((float(s["sparsity"]), bool(s["kept"])) for s in sizes)
    helped = list(zip([s for s, _ in checked], first_band([kept for _, kept in checked])))
    below = [kept for s, kept in helped if s <= sparsity + 1e-6]
    above = [kept for s, kept in helped if s >= sparsity - 1e-6]
    if not above:
        return False
    return above[0] and (not below or below[-1])


def correct_widths_(model: PreTrainedModel, source: Any) -> bool:
    """Correct a loaded model's attention and FFN output projections for the widths it has now, in place: each keeps
    a prefix of the stored rank order, and ``source`` (a :class:`~hf_snapvit.correction.prefix.PrefixCorrection`
    fitted on the dense model, or the checkpoint's :class:`PrefixFile`) gives the corrected weights. A layer that
    keeps every column is left as it is (the dense model stays bit-identical). Returns whether a layer changed."""
    spec = get_spec(model)
    changed = False
    with one_thread(), torch.no_grad():  # small solves: see one_thread
        for block, layer in enumerate(get_layers(model, spec)):
            for kind, linear in zip(KINDS, output_projections(layer, spec)):
                kept = linear.weight.shape[1]
                if kept < source.width(block, kind):
                    new = source.weight(block, kind, kept, linear.weight)
                    linear.weight.copy_(new.to(dtype=linear.weight.dtype, device=linear.weight.device))
                    changed = True
    return changed


__all__ = ["COLUMN_TOLERANCE", "FORMAT_VERSION", "KINDS", "PREFIX_FILE", "PrefixFile", "applies_at", "correct_widths_",
           "find_prefix_file", "first_band", "pack_lower", "prefix_file_for", "unpack_lower", "write_prefix_file"]
