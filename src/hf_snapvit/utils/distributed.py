"""Multi-process ranking through accelerate: ``accelerate launch -m hf_snapvit prune ...`` on N processes.

Every process runs the same program on the same inputs; three places split the work (paper §3 phases):

* gradient scores are data-parallel: the gradient images are cut into whole gradient steps, process ``r`` takes
  steps ``r, r + N, r + 2N, ...``, and the per-weight float64 sums are added across processes
  (:func:`accelerate.utils.reduce`). An image's crops depend only on ``(seed, image index)``, so the sums equal the
  one-process sums up to the order of float64 additions;
* the candidates of each xNES generation are split across processes (``PartialState.split_between_processes``) and
  their fitness values gathered (:func:`accelerate.utils.gather_object`), so every process holds the same fitness
  vector and therefore the same search state;
* the calibration sample is not split: every process draws it (:mod:`hf_snapvit.data.sampling`; a stream is read once
  per process, undecoded, and only the sample is decoded), and the draw depends on the source and the seed only, so
  every process holds the one-process sample. Splitting the stream itself (``split_dataset_by_node``) would let each
  process draw inside its own shards, a different sample than one process draws.

Forward passes run in the precision of :mod:`hf_snapvit.utils.precision`.

Without a launcher there is one process and every function here reduces to the single-process computation.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence, TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import gather_object, reduce

from ..errors import ProcessFailedError

T = TypeVar("T")
R = TypeVar("R")


def process_state() -> PartialState:
    """The accelerate process state, initialising ``torch.distributed`` when the program was launched on N processes.

    An ``Accelerator`` or ``PartialState`` the caller created first is reused as is. Otherwise processes run on the
    CPU (gloo) when ``ACCELERATE_USE_CPU`` is set or no accelerator is present: ``PartialState()`` alone would treat a
    ``--multi_gpu`` launch on a CPU-only machine as N unrelated single processes, each ranking everything.

    Returns:
        The shared :class:`accelerate.PartialState`.
    """
    if PartialState._shared_state:
        return PartialState()
    from accelerate.utils import parse_flag_from_env

    cpu = parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.accelerator.is_available()
    return PartialState(cpu=cpu)


@contextlib.contextmanager
def on_process_device(model: torch.nn.Module, state: PartialState | None = None) -> Iterator[torch.device]:
    """Run ``model`` on this process's device for the duration (multi-process runs only), then move it back.

    A launcher gives each process its own device (``cuda:<local rank>``); a model loaded on the CPU is moved there.
    A single process leaves the model where the caller put it.

    Yields:
        The device the model is on inside the block.
    """
    state = state or process_state()
    original = next(model.parameters()).device
    if state.num_processes == 1 or original == state.device:
        yield original
        return
    model.to(state.device)
    try:
        yield state.device
    finally:
        model.to(original)


def local_share(items: Sequence[T], state: PartialState | None = None) -> list[T]:
    """This process's elements of ``items``: ``items[rank::num_processes]`` (all of them for one process)."""
    state = state or process_state()
    return list(items[state.process_index::state.num_processes])


def reduce_sum(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Element-wise sums of each tensor over all processes (the tensors themselves for one process).

    Args:
        tensors: Tensors of the same shapes and dtypes on every process, in the same order; the list is updated in
            place.

    Returns:
        The sums, on every process (the same tensors for one process).
    """
    if process_state().num_processes == 1:
        return tensors
    # One tensor at a time, replacing it in the list: reduce() works on a copy, and the statistics of a large model
    # take hundreds of MB.
    for i, tensor in enumerate(tensors):
        tensors[i] = reduce(tensor, reduction="sum")
    return tensors


def finish_processes() -> None:
    """Under ``accelerate launch``: wait until every process got here, then close the process group.

    A process that leaves while the main one is still writing (a checkpoint, its card) tears down gloo's threads
    under a live peer, which aborts it ("terminate called without an active exception") and fails the launch. Every
    process must call it at the same point; with one process it does nothing.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def raise_if_failed_anywhere(error: BaseException | None, state: PartialState | None = None) -> None:
    """Re-raise ``error`` here, or an error of another process, so that no process waits forever in a collective.

    Every process must call it at the same point. The local exception is re-raised as itself; another process's
    failure becomes a :class:`~hf_snapvit.errors.SnapViTError` naming that process and its message.
    """
    state = state or process_state()
    if state.num_processes == 1:
        if error is not None:
            raise error
        return
    messages = gather_object([None if error is None else f"{type(error).__name__}: {error}"])
    if error is not None:
        raise error
    for rank, message in enumerate(messages):
        if message is not None:
            raise ProcessFailedError(f"Process {rank} of {state.num_processes} failed: {message}")


def map_across_processes(fn: Callable[[T], R], items: Sequence[T], state: PartialState | None = None) -> list[R]:
    """``[fn(x) for x in items]`` with the items split across processes; every process gets the whole result.

    Process ``r`` evaluates a contiguous block of ``items`` (``PartialState.split_between_processes``); the results
    are gathered with :func:`accelerate.utils.gather_object` and put back in the order of ``items``. An exception in
    any process is raised in all of them.

    Args:
        fn: Deterministic function of one item (every process must compute the same value for the same item).
        items: The same sequence on every process.
        state: The process state (default: :func:`process_state`).

    Returns:
        The results, in the order of ``items``.
    """
    state = state or process_state()
    if state.num_processes == 1:
        return [fn(x) for x in items]
    local: list[tuple[int, R]] = []
    error: BaseException | None = None
    with state.split_between_processes(list(range(len(items)))) as mine:
        try:
            local = [(i, fn(items[i])) for i in mine]
        except Exception as exc:  # re-raised below, after the others know
            error = exc
    raise_if_failed_anywhere(error, state)
    results = dict(gather_object(local))
    return [results[i] for i in range(len(items))]


__all__ = [
    "finish_processes",
    "local_share",
    "map_across_processes",
    "on_process_device",
    "process_state",
    "raise_if_failed_anywhere",
    "reduce_sum",
]
