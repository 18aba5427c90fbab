"""Timing forward passes: one synchronised pass, and rounds that interleave what they compare.

Absolute timings on a shared machine drift, so what is compared (the sizes of one switchable model, or several
models) is timed round-robin: each round times one pass of each, in an order rotated by one per round, and a slow
phase of the machine hits all of them alike. :func:`interleaved_ms` is that loop, under both
:func:`hf_snapvit.measure_latency` (a latency table of one switchable model) and
:func:`hf_snapvit.benchmark.compare_latency` (several models against each other).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

#: One timed pass: the model, its keyword inputs and the device to synchronise.
Pass = tuple[Callable[..., Any], Mapping[str, torch.Tensor], torch.device]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a wall-clock timing covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward_ms(model: Any, inputs: Mapping[str, torch.Tensor], device: torch.device) -> float:
    """Milliseconds of one forward pass of ``model`` on ``inputs``, ``device`` synchronised around it.

    Timed by hand: the rounds of :func:`interleaved_ms` interleave sizes (or models) one pass each, and
    ``torch.utils.benchmark.Timer`` does not time single passes (``timeit`` runs two untimed ones before each timing,
    ``blocked_autorange`` a whole series of one statement).
    """
    synchronize(device)
    start = time.perf_counter()
    model(**inputs)
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def interleaved_ms(passes: Sequence[Pass], *, repeats: int, warmup: int,
                   select: Callable[[int], Any] | None = None,
                   on_round: Callable[[], Any] | None = None) -> list[list[float]]:
    """Milliseconds of ``repeats`` passes of each of ``passes``, timed interleaved.

    Each pass first runs ``warmup`` times untimed; then each of ``repeats`` rounds times one run of every pass (see
    :func:`timed_forward_ms`), in an order rotated by one per round. The caller chooses the grad mode.

    Args:
        passes: ``(model, inputs, device)`` of each thing compared.
        repeats, warmup: Timed rounds; untimed runs of each pass first.
        select: Called with a pass's index, untimed, before each of its runs (a switchable model changes size
            there: one model then serves as every pass).
        on_round: Called after every round (a progress bar's update).

    Returns:
        The ``repeats`` timings of each pass, in the order of ``passes``.
    """
    if not passes:
        return []
    for i, (model, inputs, device) in enumerate(passes):
        if select is not None:
            select(i)
        for _ in range(warmup):
            model(**inputs)
        synchronize(device)
    runs: list[list[float]] = [[] for _ in passes]
    order = list(range(len(passes)))
    for round_index in range(repeats):
        shift = round_index % len(order)
        for i in order[shift:] + order[:shift]:
            if select is not None:
                select(i)
            runs[i].append(timed_forward_ms(*passes[i]))
        if on_round is not None:
            on_round()
    return runs
