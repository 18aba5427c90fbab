"""Seeded draws that cover their source: one home for how every image sample is chosen.

Ranking, the stored weight correction, recovery and evaluation subsets all draw their images here. A draw of
``count`` images takes the rows with the ``count`` smallest *keys*, where a row's key is a 64-bit hash of the seed,
the row's shard and its position in that shard (:func:`row_keys`). The keys depend on nothing else, so:

* a source with random access (a ``datasets.Dataset``, a list, a tensor) is drawn exactly: every row's key is
  computed (8 bytes a row) and the rows are read in key order (:func:`key_order`), a uniform sample without
  replacement;
* a stream (a streaming ``datasets.IterableDataset``, a generator, any iterable) is read once, at most ``prefix`` rows
  of it (:data:`DEFAULT_STREAM_PREFIX`, or :class:`StreamSource`), keeping only the candidates of smallest key in a
  heap of undecoded rows (:func:`stream_candidates`): memory grows with ``count``, never with the rows read. A stream
  of several shards is read shard by shard, the first ``prefix / shards`` rows of each (in at most
  :data:`MAX_SHARD_GROUPS` contiguous groups), so the sample spans every shard instead of the first few;
* a single-shard stream of at most ``prefix`` rows draws the very rows, in the same order, that the same data opened
  map-style draws, and every process of a multi-process run computes the same draw.

A shuffle buffer, the obvious alternative, draws from the first rows only: over a class-sorted file its first 256
images come from a few classes. Where a draw still cannot represent its source (a stream longer than the prefix, or
a sample of a few classes) :mod:`hf_snapvit.data.coverage` says so.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import DataError

#: Rows of a stream read, at most, to draw from: a stream that holds more is drawn from its first this-many rows
#: (spread over its shards). Raise it with :class:`StreamSource` for a long stream in a fixed (e.g. class) order.
DEFAULT_STREAM_PREFIX = 100_000
#: Shards of a stream are read in at most this many contiguous groups (an image folder streams one file a shard).
MAX_SHARD_GROUPS = 1024
_MASK = (1 << 64) - 1
_KEY_CHUNK = 65_536


@dataclass(frozen=True)
class StreamSource:
    """A stream to draw calibration images from, with how many of its rows a draw may read.

    Pass it wherever hf_snapvit takes images (``rank(..., data=StreamSource(ds, prefix=500_000))``, recovery,
    correction). The draw reads at most ``prefix`` rows, the first ``prefix / n`` of each of the stream's ``n``
    shards, and holds only the sample in memory; it covers the whole stream when the stream has at most ``prefix``
    rows or is shuffled.

    Args:
        data: A streaming ``datasets.IterableDataset``, a generator or any iterable of images.
        prefix: Rows to read at most (default :data:`DEFAULT_STREAM_PREFIX`).
    """

    data: Any
    prefix: int = DEFAULT_STREAM_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)


def check_prefix(prefix: Any) -> int:
    """``prefix`` as a row count, or a :class:`DataError` naming the valid range."""
    if isinstance(prefix, bool) or not isinstance(prefix, (int, np.integer)) or prefix < 1:
        raise DataError(f"stream_prefix={prefix!r} must be a positive number of rows (default "
                        f"{DEFAULT_STREAM_PREFIX}); raise it to draw from more of a long stream.")
    return int(prefix)


def unwrap(data: Any, prefix: int | None = None) -> tuple[Any, int]:
    """``(the source, the prefix to read)`` of ``data``, a source or a :class:`StreamSource`."""
    if isinstance(data, StreamSource):
        return data.data, data.prefix if prefix is None else check_prefix(prefix)
    return data, DEFAULT_STREAM_PREFIX if prefix is None else check_prefix(prefix)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, element-wise on uint64 (arithmetic wraps modulo 2**64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_keys(seed: int, rows: Any, shard: int = 0) -> np.ndarray:
    """The draw keys of positions ``rows`` of shard ``shard`` under ``seed``: a counter-based hash, so a row's key
    does not depend on how many rows there are or on which were read before it."""
    base = _splitmix(_splitmix(np.array([int(seed) & _MASK], dtype=np.uint64)) ^ np.uint64(int(shard) & _MASK))
    return _splitmix(base ^ np.asarray(rows, dtype=np.uint64))


def key_order(length: int, seed: int) -> np.ndarray:
    """Every row of a random-access source of ``length`` rows, in key order: its first ``k`` rows are the draw of
    ``k``. (Rows of one shard: the order of a single-shard stream of the same rows.)"""
    return np.argsort(row_keys(seed, np.arange(length, dtype=np.uint64)), kind="stable")


@dataclass
class Candidates:
    """What a stream draw kept: the rows of smallest key, in key order, with what was read to find them.

    Attributes:
        items: The kept rows (undecoded), smallest key first.
        where: Each kept row's ``(shard group, position in it)``.
        read: Rows read.
        complete: Whether every row of the stream was read (no shard group was cut at its share of the prefix).
        groups: Shard groups read.
        labels_read: The label of every row read, in reading order, when a label was asked for.
        failures: Streams that an error ended early (see :class:`~hf_snapvit.data.streams.ResilientStream`).
    """

    items: list[Any] = field(default_factory=list)
    where: list[tuple[int, int]] = field(default_factory=list)
    read: int = 0
    complete: bool = True
    groups: int = 1
    labels_read: list[Any] | None = None
    failures: list[Any] = field(default_factory=list)


def shard_groups(data: Any) -> list[Any]:
    """The streams to read one after the other: ``data`` itself, or a ``datasets.IterableDataset`` of several shards
    split into at most :data:`MAX_SHARD_GROUPS` contiguous groups of shards (``IterableDataset.shard``)."""
    shards = getattr(data, "num_shards", None)
    if not isinstance(shards, int) or shards <= 1 or not hasattr(data, "shard"):
        return [data]
    groups = min(shards, MAX_SHARD_GROUPS)
    return [data.shard(num_shards=groups, index=g, contiguous=True) for g in range(groups)]


def stream_candidates(
    data: Any,
    count: int,
    seed: int,
    prefix: int,
    *,
    label_of: Callable[[Any], Any] | None = None,
    what: str = "calibration stream",
    show_progress: bool | None = None,
) -> Candidates:
    """The ``count`` rows of smallest key among at most ``prefix`` rows of a stream, holding only ``count`` rows.

    Each shard group (:func:`shard_groups`) is read for its share of the prefix, ``ceil(prefix / groups)`` rows
    (one more row is looked at to tell whether the group ended); a transient error reopens it where it failed.

    Args:
        data: The stream: a ``datasets.IterableDataset`` (read as it yields, e.g. undecoded) or any iterable.
        count: Rows to keep.
        seed: Seeds the keys.
        prefix: Rows to read at most.
        label_of: Reads a row's label, to record the labels of all rows read (for :mod:`hf_snapvit.data.coverage`).
        what: Names the stream in messages.
        show_progress: Show a progress bar over the rows read (``None``: only on a terminal).
    """
    from huggingface_hub.utils import tqdm

    from .streams import ResilientStream

    groups = shard_groups(data)
    share = max(1, math.ceil(prefix / len(groups)))
    found = Candidates(groups=len(groups), labels_read=None if label_of is None else [])
    heap: list[tuple[int, int, int, Any]] = []  # (-key, -group, -position, row): the largest key on top
    with tqdm(total=share * len(groups), desc="Drawing images (rows read)", unit="row", leave=False,
              disable=not show_progress if show_progress is not None else None) as bar:
        for g, group in enumerate(groups):
            stream = ResilientStream(group, what if len(groups) == 1 else f"{what} (shard group {g})")
            keys = np.empty(0, dtype=np.uint64)
            position = -1
            for position, row in enumerate(stream):
                if position == share:  # the group holds more than its share: the draw does not see all of it
                    found.complete = False
                    break
                found.read += 1
                if found.labels_read is not None:
                    found.labels_read.append(label_of(row))
                if position % _KEY_CHUNK == 0:  # keys a chunk at a time: memory does not grow with the prefix
                    keys = row_keys(seed, np.arange(position, min(position + _KEY_CHUNK, share), dtype=np.uint64), g)
                key = int(keys[position % _KEY_CHUNK])
                if len(heap) < count:
                    heapq.heappush(heap, (-key, -g, -position, row))
                elif -key > heap[0][0]:
                    heapq.heapreplace(heap, (-key, -g, -position, row))
            bar.update(min(position + 1, share))
            if stream.failure is not None:
                found.failures.append(stream)
    ordered = sorted(heap, key=lambda entry: (-entry[0], -entry[1], -entry[2]))
    found.items = [entry[3] for entry in ordered]
    found.where = [(-entry[1], -entry[2]) for entry in ordered]
    return found


def spare(count: int) -> int:
    """Candidates kept beyond ``count`` to replace corrupt images (more than a tenth corrupt fails the draw)."""
    return count // 10 + 1


def draw_valid(data: Any, count: int, seed: int, prefix: int, valid: Callable[[Any, tuple[int, int]], Any],
               **options: Any) -> tuple[Candidates, list[tuple[Any, Any, tuple[int, int]]]]:
    """The first ``count`` valid rows, in key order, of a stream's first ``prefix`` rows.

    ``valid(row, where)`` returns what a row gives (e.g. its decoded image) or ``None`` for a corrupt row, which
    the next candidate replaces. Candidates beyond ``count`` are kept (:func:`spare`); when that is not enough and
    the stream holds more rows, it is read again with four times the spare ones.

    Returns:
        The candidates found and ``(what valid gave, row, where)`` for each valid row, at most ``count``.
    """
    extra = spare(count)
    while True:
        found = stream_candidates(data, count + extra, seed, prefix, **options)
        chosen = []
        for row, where in zip(found.items, found.where):
            if len(chosen) == count:
                break
            value = valid(row, where)
            if value is not None:
                chosen.append((value, row, where))
        if len(chosen) == count or len(found.items) < count + extra or found.failures:
            return found, chosen
        extra *= 4
