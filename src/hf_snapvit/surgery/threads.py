"""One CPU thread for work made of many small operations."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch runs on one CPU thread inside the block (this thread's setting, restored afterwards).

    For the many small operations of a switch or a load that reads a stored correction (unpacking a factor, a
    triangular solve of at most a few thousand columns): split over threads they gain nothing, and on a machine whose
    cores other processes keep busy each of the several hundred parallel regions waits for a descheduled worker. On
    2 loaded vCPUs a ViT-Tiny switch took 0.4-3 s with 2 threads and 0.05-0.15 s with one (docs/correction.md).
    """
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
