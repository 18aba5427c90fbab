"""Precision of forward passes. Mixed precision comes from the accelerate configuration (``accelerate launch
--mixed_precision bf16`` or the config file, or an ``Accelerator`` created before ranking) or from the ranking's own
``precision`` setting (:func:`resolve_precision`: ``"auto"`` is bf16 on CUDA and on CPUs that multiply bf16 in
hardware, float32 elsewhere) and applies to forward passes through ``torch.autocast``; scores are still accumulated
in float64.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from ..errors import ConfigError
from .logs import get_logger

logger = get_logger(__name__)

_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16}


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


__all__ = [
    "PRECISIONS",
    "autocast",
    "bf16_supported",
    "mixed_precision",
    "native_bf16_cpu",
    "resolve_precision",
    "tf32_matmuls",
]
