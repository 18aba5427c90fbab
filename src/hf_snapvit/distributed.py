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

Mixed precision comes from the accelerate configuration (``accelerate launch --mixed_precision bf16`` or the config
file, or an ``Accelerator`` created before ranking) or from the ranking's own ``precision`` setting
(:func:`resolve_precision`: ``"auto"`` is bf16 on CUDA and on CPUs that multiply bf16 in hardware, float32
elsewhere) and applies to forward passes through
``torch.autocast``; scores are still accumulated in float64.

Without a launcher there is one process and every function here reduces to the single-process computation.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence, TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import gather_object, reduce

from .errors import ConfigError, ProcessFailedError
from .logs import get_logger

logger = get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16}


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


def mixed_precision() -> str:
    """The configured mixed precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``.

    Read from an existing ``Accelerator``'s state, else from ``ACCELERATE_MIXED_PRECISION`` (what ``accelerate launch``
    sets from ``--mixed_precision`` or the config file). The ``AcceleratorState`` is not created here, so a caller can
    still build its own ``Accelerator(mixed_precision=...)`` afterwards.
    """
    from accelerate.state import AcceleratorState
    from accelerate.utils import parse_choice_from_env

    if "_mixed_precision" in AcceleratorState._shared_state:
        return str(AcceleratorState().mixed_precision)
    return parse_choice_from_env("ACCELERATE_MIXED_PRECISION", "no")


def autocast(device: torch.device, *, gradients: bool = False,
             precision: str | None = None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` for ``precision`` or, by default, the configured mixed precision (a no-op for ``"no"``).

    Args:
        device: Where the forward pass runs.
        gradients: The forward pass feeds a backward pass. float16 then stays off: the scored gradients reach 1e-15,
            far below float16's range, and a loss scaler would need an optimizer step to unscale; bfloat16 (and fp8,
            which autocasts to bfloat16 as accelerate does) has float32's exponent range and is used for both.
        precision: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"`` (from :func:`resolve_precision`); ``None`` reads
            :func:`mixed_precision`.

    Returns:
        A context manager.
    """
    precision = mixed_precision() if precision is None else precision
    dtype = _AUTOCAST_DTYPES.get(precision)
    if dtype is None or (gradients and dtype == torch.float16):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


PRECISIONS = ("auto", "fp32", "bf16")


def resolve_precision(precision: str, device: torch.device) -> str:
    """The autocast precision (accelerate's names: ``"no"``, ``"bf16"``, ...) of a ranking that asks for ``precision``.

    ``"auto"`` follows accelerate's mixed precision when one is configured (``--mixed_precision``, the config file or
    an ``Accelerator``), else runs bf16 on CUDA devices that support it and on CPUs that multiply bf16 matrices in
    hardware (:func:`native_bf16_cpu`), and float32 elsewhere. ``"fp32"`` and
    ``"bf16"`` are explicit and must agree with a configured mixed precision: two different answers to "which
    precision" are an error, not a silent override.

    Raises:
        ConfigError: ``precision`` is unknown, conflicts with accelerate's setting, or asks bf16 of a device
            without bf16 support.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r} is not one of {PRECISIONS}: use 'auto' (bf16 on CUDA, float32 "
                          "elsewhere), 'fp32' or 'bf16'.")
    configured = mixed_precision()
    if precision == "auto":
        if configured == "no":
            fast = bf16_supported(device) if device.type == "cuda" else device.type == "cpu" and native_bf16_cpu()
            return "bf16" if fast else "no"
        return _checked_cpu_bf16(configured, device)
    wanted = "no" if precision == "fp32" else "bf16"
    if configured != "no" and configured != wanted:
        raise ConfigError(f"precision={precision!r} conflicts with accelerate's mixed precision {configured!r} "
                          f"(--mixed_precision or the accelerate config); use precision='auto' to follow "
                          f"accelerate, or configure --mixed_precision {'no' if wanted == 'no' else wanted}.")
    if wanted == "bf16" and not bf16_supported(device):
        raise ConfigError(f"precision='bf16' but the device {device} does not support bfloat16; choose one of "
                          f"{PRECISIONS} other than 'bf16' ('auto' picks float32 there).")
    return _checked_cpu_bf16(wanted, device)


def _checked_cpu_bf16(precision: str, device: torch.device) -> str:
    """``precision``, with a warning when it is bf16 on a CPU that emulates bf16: allowed, but slow."""
    if precision == "bf16" and device.type == "cpu" and not native_bf16_cpu():
        logger.warning("Ranking in bf16 on a CPU without bf16 matrix units (AMX or AVX512-BF16): bf16 is emulated "
                       "there and several times slower than float32 (on an AMD EPYC with AVX2: the gradient phase "
                       "15x, forwards 8x; docs/results.md). Use precision='fp32' or 'auto' (float32 on such CPUs), or "
                       "accelerate's --mixed_precision no.")
    return precision


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` can run bfloat16 matrix products (CUDA: compute capability 8.0 or later)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        ones = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
        return bool((ones @ ones)[0, 0] == 2)
    except (RuntimeError, TypeError):
        return False


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX or AVX512-BF16 instructions, which oneDNN uses).

    There a SnapViT ranking's forward passes run in bf16 by default: on an Intel Xeon with AMX the ``fast`` preset
    ranks the shared ViT-Tiny in 108 s instead of 194 s at the same accuracy (``docs/results.md``). Elsewhere bf16
    is emulated and much slower (an AMD EPYC with AVX2: the gradient phase 15x, forwards 8x;
    ``benchmarks/results/bench_ranking_time/ranking_time_cpu_avx2_precisions.json``), so ``"auto"`` keeps float32
    there.
    """
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        check = getattr(torch.cpu, probe, None)  # private probes of torch.cpu: a torch without them answers "no"
        try:
            if check is not None and check():
                return True
        except RuntimeError:
            pass
    return False


@contextlib.contextmanager
def tf32_matmuls(device: torch.device, enabled: bool = True) -> Iterator[None]:
    """Allow TF32 float32 matrix products on a CUDA ``device`` inside the block (``enabled``): for a whole float32
    ranking (``enabled=precision == "no"``), or around float32 products of values that were computed in bf16 or TF32
    (the per-sample gradients).

    TF32 keeps float32's range with a 10-bit mantissa in the products (a dense ViT-B/16 forward: 206 ms in float32,
    61 ms with TF32 on an H100, ``/work/shared/docs/gpu-device.md``); the global setting is restored afterwards.
    Elsewhere (CPU) nothing changes, so float32 CPU rankings stay exact float32.
    """
    if device.type != "cuda" or not enabled:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


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
    "PRECISIONS",
    "autocast",
    "finish_processes",
    "bf16_supported",
    "local_share",
    "map_across_processes",
    "mixed_precision",
    "on_process_device",
    "process_state",
    "raise_if_failed_anywhere",
    "reduce_sum",
    "native_bf16_cpu",
    "resolve_precision",
    "tf32_matmuls",
]
