"""The latency tables of an elastic checkpoint on disk, :data:`~hf_snapvit.elastic.file_names.LATENCY_FILE` beside
its weights: :class:`LatencyTable` (one measurement) and the file that holds them, written and read here, beside the
checkpoint's reader. Measuring is :func:`hf_snapvit.measure_latency` (:mod:`hf_snapvit.loading.latency_table`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..architectures.budget import budget_number
from ..errors import BudgetError, CheckpointError
from ..utils.files import write_text_atomic
from .file_names import LATENCY_FILE

__all__ = ["FORMAT_VERSION", "LATENCY_FILE", "LatencyTable", "load_latency_tables", "read_latency_file",
           "write_latency_file"]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class LatencyTable:
    """Median forward latency of one model at a grid of sizes, on one device, dtype and batch size.

    Args:
        device: :func:`hf_snapvit.loading.latency_table.device_name` of where it was measured.
        dtype: The parameters' dtype (``"float32"``, ``"bfloat16"``, ...).
        batch_size: Images per forward pass.
        width_multiple: The FFN width multiple the sizes were resolved with.
        sparsities: Achieved sparsity of each measured size, ascending.
        gflops: Theoretical GFLOPs of one image at each size.
        latency_ms: Median latency of one forward pass at each size, in milliseconds.
        repeats: Timed passes per size.
        torch_version: The torch that ran it.
    """

    device: str
    dtype: str
    batch_size: int
    width_multiple: int | None
    sparsities: tuple[float, ...]
    gflops: tuple[float, ...]
    latency_ms: tuple[float, ...]
    repeats: int = 0
    torch_version: str = torch.__version__

    def __post_init__(self) -> None:
        n = len(self.sparsities)
        if n < 2 or len(self.gflops) != n or len(self.latency_ms) != n:
            raise CheckpointError(f"A latency table needs at least 2 sizes with one sparsity, GFLOP count and latency "
                                  f"each; got {len(self.sparsities)}, {len(self.gflops)} and {len(self.latency_ms)}.")
        for name in ("sparsities", "gflops", "latency_ms"):
            values = getattr(self, name)
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                       for v in values):
                raise CheckpointError(f"LatencyTable.{name}={list(values)!r} must be finite non-negative numbers.")
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if any(b <= a for a, b in zip(self.sparsities, self.sparsities[1:])):
            raise CheckpointError(f"LatencyTable.sparsities={list(self.sparsities)} must be strictly ascending.")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise CheckpointError(f"LatencyTable.batch_size={self.batch_size!r} must be a positive integer.")

    def key(self) -> tuple[str, str, int, int | None]:
        """``(device, dtype, batch_size, width_multiple)``: what a table is specific to."""
        return self.device, self.dtype, self.batch_size, self.width_multiple

    def envelope(self) -> np.ndarray:
        """Latencies made non-increasing in sparsity: each size is charged the slowest of itself and every smaller
        size measured, so timing noise never lets a larger model look faster than a smaller one."""
        return np.maximum.accumulate(np.asarray(self.latency_ms)[::-1])[::-1]

    def latency_at(self, sparsity: float) -> float:
        """Predicted latency (ms) at ``sparsity``, interpolated linearly on :meth:`envelope`."""
        return float(np.interp(sparsity, self.sparsities, self.envelope()))

    def sparsity_for(self, latency_ms: float) -> float:
        """The smallest sparsity (the largest model) whose predicted latency is at most ``latency_ms``.

        Raises:
            BudgetError: even the smallest measured size is slower than ``latency_ms``.
        """
        latency_ms = budget_number("latency_ms", latency_ms)
        curve = self.envelope()
        if latency_ms >= curve[0]:
            return self.sparsities[0]
        if latency_ms < curve[-1]:
            raise BudgetError(
                f"latency_ms={latency_ms!r} is out of range: the smallest size measured (sparsity "
                f"{self.sparsities[-1]:.3f}) takes {curve[-1]:.3f} ms at batch {self.batch_size} on {self.device} "
                f"({self.dtype}); this table supports latency_ms >= {curve[-1]:.3f}. Use a smaller batch, a faster "
                "device or dtype, or a ranking with lower floors."
            )
        i = int(np.nonzero(curve <= latency_ms)[0][0])  # first grid point that fits; the one before does not
        s0, s1, l0, l1 = self.sparsities[i - 1], self.sparsities[i], curve[i - 1], curve[i]
        return float(s1 if l0 == l1 else s0 + (l0 - latency_ms) / (l0 - l1) * (s1 - s0))

    def to_dict(self) -> dict[str, Any]:
        """The table as ``elastic_latency.json`` stores it (lists, not tuples)."""
        return asdict(self) | {"sparsities": list(self.sparsities), "gflops": list(self.gflops),
                               "latency_ms": list(self.latency_ms)}

    @classmethod
    def from_dict(cls, data: Any) -> "LatencyTable":
        """A table from :meth:`to_dict`'s JSON, checked (a :class:`CheckpointError` names what is wrong)."""
        if not isinstance(data, dict):
            raise CheckpointError(f"A latency table must be a JSON object, got {type(data).__name__}.")
        required = ("device", "dtype", "batch_size", "sparsities", "gflops", "latency_ms")
        missing = [k for k in required if k not in data]
        if missing:
            raise CheckpointError(f"A latency table lacks {missing}; re-measure it with hf_snapvit.measure_latency.")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for name in ("sparsities", "gflops", "latency_ms"):
            if not isinstance(known[name], list):
                raise CheckpointError(f"latency table field {name}={known[name]!r} must be a list of numbers.")
        return cls(**known)


def read_latency_file(path: str | os.PathLike) -> list[LatencyTable]:
    """The tables of an ``elastic_latency.json`` file (a :class:`CheckpointError` if it is corrupt)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} is not a readable latency file ({error}); delete it or re-measure.") from error
    if not isinstance(data, dict) or not isinstance(data.get("tables"), list):
        raise CheckpointError(f"{path} must hold a JSON object with a 'tables' list; delete it or re-measure.")
    if data.get("format", FORMAT_VERSION) > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format {data['format']}, newer than this hf_snapvit reads "
                              f"({FORMAT_VERSION}); upgrade hf-snapvit.")
    return [LatencyTable.from_dict(t) for t in data["tables"]]


def write_latency_file(tables: Sequence[LatencyTable], folder: str | os.PathLike, *,
                       merge: bool = True) -> list[LatencyTable]:
    """Write ``tables`` to ``folder/elastic_latency.json`` atomically; with ``merge``, tables already there stay
    unless a new one has the same key (device, dtype, batch size, width multiple). Returns every table written."""
    path = Path(folder) / LATENCY_FILE
    kept = {t.key(): t for t in (read_latency_file(path) if merge and path.is_file() else [])}
    kept.update({t.key(): t for t in tables})
    text = json.dumps({"format": FORMAT_VERSION, "tables": [t.to_dict() for t in kept.values()]}, indent=2)
    write_text_atomic(path, text + "\n")
    return list(kept.values())


def load_latency_tables(path_or_repo_id: str | os.PathLike, **hub_kwargs: Any) -> list[LatencyTable]:
    """The tables of a checkpoint's ``elastic_latency.json`` (local folder or Hub repo); none if it has no such file
    or the Hub cannot be reached (latency budgets then ask for a measurement)."""
    from transformers.utils import cached_file

    path = cached_file(path_or_repo_id, LATENCY_FILE, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False, **hub_kwargs)
    return read_latency_file(path) if path else []
