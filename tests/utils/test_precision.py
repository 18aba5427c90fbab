"""utils/precision.py: how a precision setting resolves against accelerate's mixed precision and the device, bad
input, the CPU's bf16 units, and TF32 on CUDA only (tests/pruning/test_ranking_precision.py: a ranking in bf16)."""

from __future__ import annotations

import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.utils.precision import bf16_supported, resolve_precision, tf32_matmuls

CPU = torch.device("cpu")


def test_auto_is_bf16_on_a_cpu_with_bf16_units_else_float32_and_follows_accelerate(no_accelerator):
    import hf_snapvit.utils.precision as precision

    for native, auto in ((False, "no"), (True, "bf16")):
        no_accelerator.setattr(precision, "native_bf16_cpu", lambda native=native: native)
        assert resolve_precision("auto", CPU) == auto
        assert resolve_precision("fp32", CPU) == "no"
        assert resolve_precision("bf16", CPU) == "bf16"
    no_accelerator.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # what `accelerate launch --mixed_precision fp16` sets
    assert resolve_precision("auto", CPU) == "fp16"


def test_bf16_on_a_cpu_that_emulates_it_warns_and_is_still_allowed(no_accelerator, caplog):
    import hf_snapvit.utils.precision as precision

    for native in (False, True):
        no_accelerator.setattr(precision, "native_bf16_cpu", lambda native=native: native)
        caplog.clear()
        with caplog.at_level("WARNING", logger="hf_snapvit.utils.precision"):
            assert resolve_precision("bf16", CPU) == "bf16"
            assert resolve_precision("fp32", CPU) == "no" and resolve_precision("auto", CPU) == (
                "bf16" if native else "no")
        warned = [r.getMessage() for r in caplog.records]
        # Emulated: one warning, for the explicit bf16 only, naming the way out; with bf16 units, none.
        assert (warned == []) if native else (len(warned) == 1 and "precision='fp32' or 'auto'" in warned[0])
    no_accelerator.setattr(precision, "native_bf16_cpu", lambda: False)
    no_accelerator.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # accelerate's bf16 on such a CPU warns too
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_snapvit.utils.precision"):
        assert resolve_precision("auto", CPU) == "bf16"
    assert len(caplog.records) == 1 and "--mixed_precision no" in caplog.records[0].getMessage()


def test_native_bf16_cpu_reads_the_cpus_bf16_units(monkeypatch):
    import hf_snapvit.utils.precision as precision

    for amx, avx512 in ((False, False), (True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda avx512=avx512: avx512, raising=False)
        assert precision.native_bf16_cpu() == (amx or avx512)
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert not precision.native_bf16_cpu()  # a torch without the probes runs float32


@pytest.mark.parametrize("asked, configured", [("fp32", "bf16"), ("bf16", "fp16"), ("fp32", "fp16")])
def test_an_explicit_precision_that_contradicts_accelerate_is_an_error(no_accelerator, asked, configured):
    no_accelerator.setenv("ACCELERATE_MIXED_PRECISION", configured)
    with pytest.raises(hs.ConfigError, match=rf"precision='{asked}' conflicts with accelerate's mixed precision "
                                             rf"'{configured}'.*precision='auto'"):
        resolve_precision(asked, CPU)
    no_accelerator.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert resolve_precision("bf16", CPU) == "bf16"


def test_unknown_precision_is_rejected_with_the_choices():
    with pytest.raises(hs.ConfigError, match=r"precision='fp16'.*one of 'auto', 'fp32', 'bf16'"):
        hs.SnapViTConfig(precision="fp16")
    with pytest.raises(hs.ConfigError, match=r"precision='float32' is not one of \('auto', 'fp32', 'bf16'\)"):
        resolve_precision("float32", CPU)


def test_bf16_on_a_device_without_bf16_is_rejected(no_accelerator):
    meta = torch.device("meta")  # computes nothing: no bf16 products either
    assert bf16_supported(CPU) and not bf16_supported(meta)
    with pytest.raises(hs.ConfigError, match=r"precision='bf16' but the device meta does not support bfloat16"):
        resolve_precision("bf16", meta)
    assert resolve_precision("auto", meta) == "no"


def test_tf32_matmuls_allows_tf32_on_cuda_only_and_restores_the_setting():
    """The per-sample products (and float32 rankings) turn TF32 on for CUDA only; the caller's setting comes back,
    also after an error. The setting is a flag, so a CPU-only torch can check it."""
    before = torch.get_float32_matmul_precision()
    with tf32_matmuls(torch.device("cuda")):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == before
    for device, enabled in (("cpu", True), ("cuda", False)):  # a CPU, or a bf16 ranking's forwards
        with tf32_matmuls(torch.device(device), enabled=enabled):
            assert torch.get_float32_matmul_precision() == before
    with pytest.raises(RuntimeError, match="inside"):
        with tf32_matmuls(torch.device("cuda")):
            raise RuntimeError("inside")
    assert torch.get_float32_matmul_precision() == before
