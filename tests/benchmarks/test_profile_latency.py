"""benchmarks/profile_latency.py runs as is on a CPU with a tiny model (the H100 run uses the same code), and its
grouping of op and kernel names into kinds of work holds for the names CPU and GPU profiles really contain."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from helpers import load_benchmark

script = load_benchmark("profile_latency")

NAMES = {
    "aten::addmm": "gemm",
    "aten::linear": "gemm",
    "aten::mm": "gemm",
    "aten::bmm": "gemm",
    "aten::mkldnn_convolution": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__"
    "5x_cublas": "gemm",
    "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn": "gemm",
    "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN": "gemm",
    "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>": "gemm",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>": "gemm",
    "aten::layer_norm": "norm",
    "aten::native_layer_norm": "norm",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": "norm",
    "aten::scaled_dot_product_attention": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>"
    ">": "attention",
    "fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)":
        "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_kernel0_0": "attention",
    "aten::softmax": "attention",
    "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 7, false>": "attention",
    "aten::gelu": "elementwise",
    "aten::add": "elementwise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}>": "elementwise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>": "elementwise",
    "aten::copy_": "copies",
    "aten::_to_copy": "copies",
    "aten::cat": "copies",
    "Memcpy HtoD (Pageable -> Device)": "copies",
    "Memset (Device)": "copies",
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_"
    "cuda(at::TensorIteratorBase&)>>": "copies",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_contig<at::native::(anonymous namespace)::"
    "OpaqueType<2u>, unsigned int, 3, 128, 1>": "copies",
    "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true>": "copies",
    # The patch embedding's convolution on the H100 (cuDNN names the layout; only a conversion kernel is a copy).
    "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x128_32x5_nhwc_align8>"
    "(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_128x1": "gemm",
    # Inductor's kernels (torch.compile), named after the ops they fuse.
    "triton_per_fused_add_native_layer_norm_3": "norm",
    "triton_red_fused_native_layer_norm_0": "norm",
    "triton_poi_fused_gelu_4": "elementwise",
    "triton_poi_fused_add_1": "elementwise",
    "triton_poi_fused_clone_2": "copies",
    "triton_poi_fused_cat_0": "copies",
    "triton_tem_fused_addmm_5": "gemm",
    # On a CPU the compiled graph's fused kernels run inside its call; the hash must not decide the kind.
    "## Call CompiledFxGraph f6usj4lsftanhxfzconvgemmsdpa ##": "elementwise",
    "aten::transpose": "other",  # a view: no data moves
    "aten::view": "other",
    "aten::empty": "other",
    "cudaLaunchKernel": "other",
}


@pytest.mark.parametrize("name", NAMES)
def test_kind_of_groups_real_op_and_kernel_names(name):
    assert script.kind_of(name) == NAMES[name]


def test_every_kind_is_one_of_the_listed_kinds():
    assert {script.kind_of(name) for name in NAMES} == set(script.KINDS)


def test_work_an_op_does_for_itself_counts_as_that_op():
    assert script.attributed_kind("aten::copy_", ["aten::addmm", "aten::linear"]) == "gemm"  # the bias, on a CPU
    assert script.attributed_kind("aten::transpose", ["aten::scaled_dot_product_attention"]) == "attention"
    assert script.attributed_kind("aten::empty", ["aten::native_layer_norm", "aten::layer_norm"]) == "norm"
    assert script.attributed_kind("Memcpy HtoD (Pageable -> Device)", ["aten::copy_", "aten::to"]) == "copies"
    assert script.attributed_kind("aten::gelu", []) == "elementwise"
    assert script.attributed_kind("aten::transpose", ["aten::contiguous"]) == "other"
    # A kernel keeps its own strong kind whoever launched it.
    assert script.attributed_kind("ampere_bf16_s16816gemm_bf16", ["aten::scaled_dot_product_attention"]) == "gemm"


def _op(id, name, us, parent=None, link=0):
    return SimpleNamespace(id=id, name=name, self_cpu_time_total=us, cpu_parent=parent, linked_correlation_id=link,
                           device_type=torch.autograd.DeviceType.CPU, is_async=False)


def _kernel(name, us, link):
    return SimpleNamespace(id=0, name=name, linked_correlation_id=link, device_type=torch.autograd.DeviceType.CUDA,
                           is_async=False, time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_on_a_gpu_kernels_are_grouped_by_name_and_by_the_op_that_launched_them():
    linear = _op(1, "aten::linear", 5.0)
    addmm = _op(2, "aten::addmm", 4.0, parent=linear)
    copy = _op(3, "aten::copy_", 2.0, parent=addmm)
    gelu = _op(4, "aten::gelu", 3.0)
    # A runtime call whose own id collides with the gelu op's: kernels must not be pinned on it.
    launch = _op(4, "cudaLaunchKernel", 1.0, parent=gelu, link=4)
    events = [linear, addmm, copy, gelu, launch,
              _kernel("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", 20.0, link=3),
              _kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 100.0, link=2),
              _kernel("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", 30.0, link=4),
              _kernel("Memcpy HtoD (Pageable -> Device)", 10.0, link=0)]
    grouped = script.group_events(events, on_gpu=True, steps=2)
    ms = {kind: entry["ms"] for kind, entry in grouped["kinds"].items()}
    assert ms == pytest.approx({"gemm": 0.06, "attention": 0, "norm": 0, "elementwise": 0.015, "copies": 0.005,
                                "other": 0})
    assert grouped["busy_ms"] == pytest.approx(0.08) and grouped["events_per_forward"] == 2
    assert grouped["host_op_ms"] == pytest.approx(0.0075)  # every op and runtime call's self time, per forward
    assert grouped["kinds"]["gemm"]["top"][0] == ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", pytest.approx(0.05)]


def test_the_profile_groups_dense_and_sliced_time_by_kind_per_batch(tmp_path):
    output = tmp_path / "profile.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--batch-sizes", "1", "2", "--steps", "2",
                        "--repeats", "2", "--warmup", "1", "--precision", "fp32", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["hardware"]["device"] == "cpu" and report["settings"]["precision"] == "fp32"
    assert report["skipped_sparsities"] == {"tiny": []}
    rows = {(r["sparsity"], r["batch_size"]): r for r in report["rows"]}
    assert set(rows) == {(0.0, 1), (0.0, 2), (0.5, 1), (0.5, 2)}  # the dense row has sparsity 0
    for (sparsity, batch), row in rows.items():
        dense = rows[0.0, batch]
        assert set(row["kinds"]) == set(script.KINDS)
        assert all(entry["ms"] >= 0 and 0 <= entry["share"] <= 1 for entry in row["kinds"].values())
        assert math.isclose(sum(entry["share"] for entry in row["kinds"].values()), 1.0, rel_tol=1e-9)
        assert math.isclose(sum(entry["ms"] for entry in row["kinds"].values()), row["busy_ms"], rel_tol=1e-9)
        assert row["kinds"]["gemm"]["ms"] > 0 and row["kinds"]["attention"]["ms"] > 0
        assert row["wall_ms"] > 0 and math.isclose(row["gaps_ms"], row["wall_ms"] - row["busy_ms"], abs_tol=1e-9)
        assert row["profiled_wall_ms"] > 0 and math.isclose(row["profiled_gaps_ms"],
                                                            row["profiled_wall_ms"] - row["busy_ms"], abs_tol=1e-9)
        assert row["events_per_forward"] > 0 and row["host_op_ms"] > 0
        assert all(name.startswith("aten::") for entry in row["kinds"].values() for name, _ in entry["top"])
        assert math.isclose(row["kinds"]["gemm"]["ratio_to_dense"],
                            row["kinds"]["gemm"]["ms"] / dense["kinds"]["gemm"]["ms"], rel_tol=1e-9)
        if sparsity == 0:
            assert row["gflop_ratio"] == 1.0 and row["kinds"]["gemm"]["ratio_to_dense"] == 1.0
        else:
            # Half the parameters go: fewer GFLOPs, fewer heads and FFN neurons (widths multiples of 64).
            assert 0.3 < row["gflop_ratio"] < 0.7 and row["realised_sparsity"] > 0.4
            assert row["heads_ratio"] < 1 and row["neurons_ratio"] < 1


def test_sparsities_beyond_the_floors_are_skipped_and_recorded(tmp_path):
    output = tmp_path / "profile.json"
    assert script.main(["--device", "cpu", "--shapes", "tiny", "--sparsities", "0.9", "--batch-sizes", "1",
                        "--steps", "1", "--repeats", "1", "--warmup", "0", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["skipped_sparsities"] == {"tiny": [0.9]}
    assert [r["sparsity"] for r in report["rows"]] == [0.0] and report["settings"]["precision"] == "fp32"


def test_a_compiled_path_profile_groups_inductor_kernels(tmp_path):
    """Compiled models are profiled through serving_paths.py, with profile_latency's grouping: inductor's fused
    kernels, not only aten ops, and the gemms inside the compiled graph."""
    output = tmp_path / "serving.json"
    assert load_benchmark("serving_paths").main(
        ["--device", "cpu", "--shapes", "tiny", "--paths", "compile", "--batch-sizes", "2", "--sparsities", "0.5",
         "--repeats", "1", "--warmup", "0", "--profile", "--output", str(output)]) == 0
    (run,) = json.loads(output.read_text())["runs"]
    assert "error" not in run and run["warmup"] == 1  # compiled before timing
    kinds = run["profile"]["kinds"]
    assert any(name.startswith("## Call CompiledFxGraph") for name, _ in kinds["elementwise"]["top"])
    assert kinds["gemm"]["ms"] > 0
