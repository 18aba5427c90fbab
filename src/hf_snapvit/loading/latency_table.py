"""Measured latency of a switchable model at a grid of sizes, and the inverse: the largest size that meets a deadline.

A :class:`LatencyTable` holds one measurement: the device, dtype, batch size and width multiple it was taken with,
and the median forward latency at each sparsity of a grid. ``model.set_budget(latency_ms=...)`` uses the table that
matches where the model runs now and never guesses across devices: a table measured on another GPU, in another dtype
or at another batch size does not apply. Tables are saved beside a checkpoint as ``elastic_latency.json`` and
loaded with it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from huggingface_hub.utils import tqdm

from ..architectures import get_spec
from ..architectures.embedding import dummy_inputs, inference_settings
from ..architectures.budget import budget_number
from ..errors import BudgetError, CheckpointError
from ..files import write_text_atomic
from .timing import interleaved_ms

LATENCY_FILE = "elastic_latency.json"
FORMAT_VERSION = 1


def device_name(device: str | torch.device) -> str:
    """What a latency is specific to: the accelerator's name (``"cuda: NVIDIA H100 80GB HBM3"``), or the CPU's model
    name and the number of threads torch uses (``"cpu: AMD EPYC 7B13 (2 threads)"``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu: {_cpu_model()} ({torch.get_num_threads()} threads)"
    return device.type


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class LatencyTable:
    """Median forward latency of one model at a grid of sizes, on one device, dtype and batch size.

    Args:
        device: :func:`device_name` of where it was measured.
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
        """A JSON-ready copy, which :meth:`from_dict` reads back."""
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


def choose_table(tables: Sequence[LatencyTable], device: str, dtype: str, width_multiple: int | None,
                 batch_size: int | None) -> LatencyTable:
    """The table measured on ``device`` in ``dtype`` with ``width_multiple`` (and ``batch_size``, which may be left
    out when only one batch size was measured there).

    Raises:
        BudgetError: no table matches (the message lists those there are and how to measure one).
    """
    here = [t for t in tables if (t.device, t.dtype, t.width_multiple) == (device, dtype, width_multiple)]
    if batch_size is not None:
        here = [t for t in here if t.batch_size == batch_size]
    if len(here) == 1:
        return here[0]
    if len(here) > 1:
        raise BudgetError(f"Latency tables for {device} ({dtype}) exist at batch sizes "
                          f"{sorted(t.batch_size for t in here)}: pass batch_size= to set_budget.")
    have = [f"{t.device} / {t.dtype} / batch {t.batch_size} / width multiple {t.width_multiple}" for t in tables]
    batch = batch_size or 1
    raise BudgetError(
        f"No latency table for {device} / {dtype} / batch {'any' if batch_size is None else batch_size} / width "
        f"multiple {width_multiple}, "
        f"so latency_ms cannot be turned into a size without guessing (tables here: {have or 'none'}). Measure one: "
        f"hf_snapvit.measure_latency(model, batch_size={batch}) (or `hf-snapvit bench CHECKPOINT --latency-table`), "
        "then call set_budget(latency_ms=...) again."
    )


def measure_latency(model: Any, batch_size: int = 1, *, dtype: torch.dtype | str | None = None,
                    device: str | torch.device | None = None, sparsities: Sequence[float] | None = None,
                    width_multiple: int | None = None, repeats: int = 10, warmup: int = 2,
                    show_progress: bool = True) -> LatencyTable:
    """Time a switchable model at a grid of sizes where it runs now, and keep the table on it.

    Every round times one forward pass at each size, in an order rotated by one size per round, so a slow phase of a
    shared machine hits all sizes alike (:func:`~hf_snapvit.loading.timing.interleaved_ms`; switching size between
    passes costs nothing). The model's budget is restored
    afterwards, and the table is added to ``model.elastic_latency_tables`` (replacing one with the same key), where
    ``set_budget(latency_ms=...)`` finds it; ``model.save_pretrained(path, whole=True)`` saves it.

    Args:
        model: A model from ``ElasticViTModel.from_pretrained(path, switchable=True)``.
        batch_size: Images per forward pass.
        dtype, device: Where to time it; they must be the model's own (move the model first, e.g.
            ``model.to("cuda", torch.bfloat16)``), so the table describes the model as it will run.
        sparsities: The grid (dense is always added); default seven sizes from dense to the largest sparsity.
        width_multiple: As in ``set_budget``; ``None``: the default.
        repeats: Timed rounds (the median is kept); warmup: untimed passes per size first.
        show_progress: Show a progress bar over rounds.
    """
    parameter = next(model.parameters())
    for name, asked, actual in (("device", device, parameter.device), ("dtype", dtype, parameter.dtype)):
        if asked is not None and (torch.device(asked) if name == "device" else _as_dtype(asked)) != actual:
            raise BudgetError(f"measure_latency({name}={asked!r}) differs from the model's {name} {actual}: move the "
                              f"model first (model.to(...)), then measure, so the table describes the model as it "
                              "will run.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BudgetError(f"batch_size={batch_size!r} must be a positive integer.")
    if repeats < 1 or warmup < 0:
        raise BudgetError(f"Need repeats >= 1 and warmup >= 0; got repeats={repeats}, warmup={warmup}.")
    top = model.max_sparsity(width_multiple)
    # The dense size is always measured: budgets above the slowest measured size must come back to full size.
    default = (np.floor(np.linspace(0.0, top, 7) * 1e6) / 1e6).tolist()  # rounded down: never past the top
    grid = sorted({0.0, *(sparsities if sparsities is not None else default)})
    inputs = {k: v.to(parameter.device, dtype=parameter.dtype if v.is_floating_point() else v.dtype)
              for k, v in dummy_inputs(model, batch_size).items()}
    # inference_settings: the model as it serves images (ViTMAE: every patch, not its pre-training mask). no_grad,
    # not inference_mode: transformers caches tensors across models (BEiT's relative position index), and one made
    # in inference mode breaks any later training in the process.
    with model.budget(sparsity=0.0, width_multiple=width_multiple), torch.no_grad(), \
            inference_settings(model, get_spec(model)), \
            tqdm(total=repeats, desc="latency", unit="round", disable=not show_progress) as bar:
        budgets = [model.set_budget(sparsity=s, width_multiple=width_multiple) for s in grid]
        # One model serves as every pass: select switches its size (untimed; switching costs nothing).
        runs = interleaved_ms([(model, inputs, parameter.device)] * len(grid), repeats=repeats, warmup=warmup,
                              select=lambda i: model.set_budget(sparsity=grid[i], width_multiple=width_multiple),
                              on_round=lambda: bar.update(1))
    # Two grid points can resolve to the same size (one width group apart); keep the first of each.
    rows = {}
    for budget, times in zip(budgets, runs):
        rows.setdefault(round(budget.sparsity, 9), (budget.gflops, statistics.median(times)))
    if len(rows) < 2:
        raise BudgetError(f"The grid {grid} resolves to fewer than 2 distinct sizes; give sparsities further apart.")
    table = LatencyTable(device=device_name(parameter.device), dtype=dtype_name(parameter.dtype),
                         batch_size=batch_size, width_multiple=budgets[0].width_multiple,
                         sparsities=tuple(rows), gflops=tuple(g for g, _ in rows.values()),
                         latency_ms=tuple(t for _, t in rows.values()), repeats=repeats)
    model.add_latency_table(table)
    return table


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


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
