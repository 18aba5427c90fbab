"""Measured latency of a switchable model at a grid of sizes, and the inverse: the largest size that meets a deadline.

A :class:`LatencyTable` holds one measurement: the device, dtype, batch size and width multiple it was taken with,
and the median forward latency at each sparsity of a grid. ``model.set_budget(latency_ms=...)`` uses the table that
matches where the model runs now and never guesses across devices: a table measured on another GPU, in another dtype
or at another batch size does not apply. Tables are saved beside a checkpoint as ``elastic_latency.json`` and
loaded with it (the file's format: :mod:`hf_snapvit.elastic.latency_file`).
"""

from __future__ import annotations

import platform
import statistics
from typing import Any, Sequence

import numpy as np
import torch
from huggingface_hub.utils import tqdm

from ..architectures import get_spec
from ..architectures.embedding import dummy_inputs, inference_settings
from ..errors import BudgetError
from ..elastic.file_names import LATENCY_FILE
from ..elastic.latency_file import (FORMAT_VERSION, LatencyTable, load_latency_tables, read_latency_file,
                                    write_latency_file)
from .timing import interleaved_ms, synchronize, timed_forward_ms

# The file's format is elastic.latency_file's; its names stay importable from here, where they were.
__all__ = ["FORMAT_VERSION", "LATENCY_FILE", "LatencyTable", "choose_table", "device_name", "dtype_name",
           "load_latency_tables", "measure_latency", "read_latency_file", "synchronize", "timed_forward_ms",
           "write_latency_file"]


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


