"""Where a forward pass spends its time, dense against sliced: torch.profiler time grouped by kind of work.

Per shape (random weights), the dense model and one sliced copy per sparsity are timed side by side
(``compare_latency``, median wall time) and profiled for ``--steps`` forwards; :func:`attributed_kind` groups the time
into :data:`KINDS` (work inside a gemm, attention or norm op counts as that op's). On CUDA the kinds are device kernel
time and ``gaps_ms`` = wall - kernel time (launch gaps, host overhead); on a CPU they are each op's self time and
``gaps_ms`` the time outside ops (the profiler's cost can make it negative; ``profiled_gaps_ms`` uses the profiled
forwards' own wall time). Each kind's sliced/dense ratio stands next to the GFLOP ratio.

    python benchmarks/profile_latency.py --device cuda --shapes vit-b16 --precision bf16 --batch-sizes 1 32 256
    python benchmarks/profile_latency.py --device cpu --shapes vit-ti16 vit-s16 --batch-sizes 1 8

Every model runs eagerly; ``serving_paths.py --profile`` groups the kernels of compiled paths the same way.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import hf_snapvit  # noqa: E402
from _harness import (  # noqa: E402
    DTYPES, build, device_report, latency_arguments, parse_latency_arguments, write_json)
from hf_snapvit.benchmark import compare_latency, dummy_inputs, sliced_copy  # noqa: E402
from hf_snapvit.loading.timing import synchronize  # noqa: E402

KINDS = ("gemm", "attention", "norm", "elementwise", "copies", "other")
# First match wins, so the order matters: fused attention kernels carry "cutlass" or "gemm" in their names, layer
# norm kernels "vectorized", dtype casts run in "elementwise_kernel<... direct_copy ...>", and aten::transpose is a
# view while a kernel named "transpose" really moves data.
_PATTERNS = (
    # On a CPU inductor's fused C++ kernels (norms, pointwise) run inside the compiled graph's call, whose name ends
    # in a hash that can spell anything; on CUDA its kernels are events of their own (triton_*).
    ("elementwise", r"^## Call CompiledFxGraph \w+ ##$"),
    ("attention", r"scaled_dot_product|flash|fmha|efficient_attention|attention|sdpa|softmax"),
    ("norm", r"layer_?norm|group_?norm|batch_?norm|rms_?norm"),
    # Views and allocations launch no kernel; on a CPU their time is dispatcher overhead.
    ("other", r"^aten::(view|_unsafe_view|_reshape_alias|reshape|t|transpose|permute|expand|as_strided_?|slice|select"
              r"|narrow|flatten|unsqueeze|squeeze|split|chunk|unbind|detach|alias|empty|empty_like|empty_strided"
              r"|resize_|resolve_conj|resolve_neg|dropout|lift_fresh)$"),
    # Layout conversions only: cuDNN's convolution kernels name their layout too ("..._fprop_..._nhwc_align8").
    ("copies", r"copy|memcpy|memset|^aten::(to|cat|stack|clone|contiguous)$|catarray|transpose|nchw_?to_?nhwc"
               r"|nhwc_?to_?nchw|^triton_poi_fused_(clone|cat)_\d+$"),
    # triton_tem_*: inductor's matrix-multiply templates (max-autotune).
    ("gemm", r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitk|conv|fprop|^triton_tem_|^aten::(mm|bmm|baddbmm|addmm|addmv"
             r"|matmul|linear|_addmm_activation)$"),
    ("elementwise", r"elementwise|gelu|relu|silu|tanh|sigmoid|activation|add|mul|div|sub|pow|sqrt|exp|erf|neg|fill"
                    r"|where|clamp|functor"),
)
_RULES = tuple((kind, re.compile(pattern, re.IGNORECASE)) for kind, pattern in _PATTERNS)
_OWNERS = ("gemm", "attention", "norm")  # kinds whose ops own the copies and views they run inside
TOP = 4  # names kept per kind and row, to check the grouping on a new GPU


def kind_of(name: str) -> str:
    """The kind of work a profiler event (an aten op or a device kernel) does, by its name: one of :data:`KINDS`."""
    for kind, pattern in _RULES:
        if pattern.search(name):
            return kind
    return "other"


def attributed_kind(name: str, ancestors: list[str]) -> str:
    """The kind an event's time counts as: the kind of its closest ancestor op (innermost first) that is a gemm,
    attention or norm op, else :func:`kind_of` its own name. The copies, views and pointwise work an op does for
    itself (on a CPU ``aten::addmm`` copies the bias into its output) belong to that op."""
    own = kind_of(name)
    if own in _OWNERS:
        return own
    return next((kind for kind in map(kind_of, ancestors) if kind in _OWNERS), own)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    options = latency_arguments(__doc__, [1, 32, 256])
    options.add_argument("--steps", type=int, default=10, help="profiled forwards per model and batch size")
    return parse_latency_arguments(options, argv)


def profile_forwards(model: torch.nn.Module, inputs: dict[str, torch.Tensor], steps: int, warmup: int,
                     device: torch.device) -> dict[str, Any]:
    """Per-forward profiled time of ``steps`` forwards, grouped by kind, with the top names of each kind."""
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    # inference_mode as in compare_latency, so the profiled ops are the ones whose wall time was measured.
    with torch.inference_mode():
        for _ in range(warmup):
            model(**inputs)
        synchronize(device)
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                model(**inputs)
            synchronize(device)
            # The profiled forwards' own wall time: the same forwards as the kinds, the profiler's cost included.
            profiled_wall_ms = (time.perf_counter() - start) * 1e3 / steps
    grouped = group_events(prof.events(), on_gpu, steps)
    return {**grouped, "profiled_wall_ms": profiled_wall_ms, "profiled_gaps_ms": profiled_wall_ms - grouped["busy_ms"]}


def _link(event: Any) -> int:
    """The correlation id of the op that launched a kernel or runtime call; 0 for an op itself."""
    return getattr(event, "linked_correlation_id", 0) or 0


def _ancestors(event: Any) -> list[str]:
    """The names of ``event`` (a profiler op, or None) and of the ops that called it, innermost first."""
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    return names


def group_events(events: list[Any], on_gpu: bool, steps: int) -> dict[str, Any]:
    """Per-forward time by kind of the profiler's ``events`` (``steps`` forwards): device kernels on a GPU, each
    op's self CPU time on a CPU, with the names that took the most time in each kind."""
    cpu = torch.autograd.DeviceType.CPU
    ops = [e for e in events if e.device_type == cpu and not e.is_async]
    if on_gpu:
        # A kernel counts whole. Its linked correlation id names the op that launched it (CUDA runtime calls carry
        # ids of their own, which may collide, so only the ops the runtime calls link to are looked up).
        launchers = {e.id: e for e in ops if not _link(e)}
        items = [(e.name, e.time_range.elapsed_us(), _ancestors(launchers.get(_link(e)) if _link(e) else None))
                 for e in events if e.device_type != cpu and not e.is_async]
    else:  # an op's time less its children's, so each microsecond counts once
        items = [(e.name, e.self_cpu_time_total, _ancestors(e.cpu_parent)) for e in ops]
    by_name: dict[tuple[str, str], float] = defaultdict(float)
    for name, us, ancestors in items:
        by_name[attributed_kind(name, ancestors), name] += us
    kinds: dict[str, dict[str, Any]] = {kind: {"ms": 0.0, "top": []} for kind in KINDS}
    for (kind, name), us in sorted(by_name.items(), key=lambda item: -item[1]):
        kinds[kind]["ms"] += us / 1e3 / steps
        if len(kinds[kind]["top"]) < TOP:
            kinds[kind]["top"].append([name[:160], us / 1e3 / steps])
    busy_ms = sum(k["ms"] for k in kinds.values())
    return {"kinds": kinds, "busy_ms": busy_ms, "host_op_ms": sum(e.self_cpu_time_total for e in ops) / 1e3 / steps,
            "events_per_forward": len(items) / steps}


def profile_shape(shape: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[float]]:
    """Rows (one per sparsity and batch size, dense first) for one shape, and the sparsities beyond its floors."""
    device = torch.device(args.device)
    model = build(shape, args.seed)
    ranking = hf_snapvit.rank(model, method="magnitude", seed=args.seed, show_progress=False)
    limit = ranking.max_sparsity_for(args.width_multiple)
    sparsities = [0.0] + [s for s in args.sparsities if 0 < s <= limit]
    dense_counts = ranking.keep_counts(0.0, width_multiple=args.width_multiple)
    models, counts = {}, {}
    for sparsity in sparsities:
        # The dense model is cast in place first, so the sliced copies are cut from it on the device.
        sliced = model if sparsity == 0 else sliced_copy(model, ranking, sparsity, width_multiple=args.width_multiple)
        models[f"{sparsity:g}"] = sliced.to(device=device, dtype=DTYPES[args.precision]).eval()
        counts[f"{sparsity:g}"] = ranking.keep_counts(sparsity, width_multiple=args.width_multiple)
    wall = compare_latency(models, args.batch_sizes, repeats=args.repeats, warmup=args.warmup, seed=args.seed)
    rows = _profile_rows(shape, models, counts, dense_counts, wall, args)
    del models
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, [s for s in args.sparsities if s > limit]


def _profile_rows(shape: str, models: dict[str, torch.nn.Module], counts: dict[str, Any], dense_counts: Any,
                  wall: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Profile every model (named by its sparsity) at every batch size: one row each, with its wall time."""
    device = torch.device(args.device)
    rows = []
    for batch in args.batch_sizes:
        for name, sliced in models.items():
            with torch.inference_mode():
                inputs = {k: v.to(device, dtype=DTYPES[args.precision] if v.is_floating_point() else v.dtype)
                          for k, v in dummy_inputs(sliced, batch, seed=args.seed).items()}
            profiled = profile_forwards(sliced, inputs, args.steps, args.warmup, device)
            kept = counts[name]
            wall_ms = wall[name][str(batch)]["median_ms"]
            rows.append({"shape": shape, "precision": args.precision,
                         "width_multiple": args.width_multiple,
                         "sparsity": float(name), "realised_sparsity": kept.sparsity, "batch_size": batch,
                         "gflops": kept.gflops, "gflop_ratio": kept.gflops / dense_counts.gflops,
                         "heads_ratio": sum(kept.heads) / sum(dense_counts.heads),
                         "neurons_ratio": sum(kept.neurons) / sum(dense_counts.neurons),
                         "wall_ms": wall_ms, **profiled, "gaps_ms": wall_ms - profiled["busy_ms"]})
    return rows


def add_shares_and_ratios(rows: list[dict[str, Any]]) -> None:
    """Each kind's share of the profiled time, and every time's ratio to the dense row of its shape and batch."""
    dense = {(r["shape"], r["batch_size"]): r for r in rows if r["sparsity"] == 0}
    for row in rows:
        base = dense[row["shape"], row["batch_size"]]
        for kind, entry in row["kinds"].items():
            entry["share"] = entry["ms"] / row["busy_ms"] if row["busy_ms"] > 0 else 0.0
            reference = base["kinds"][kind]["ms"]
            entry["ratio_to_dense"] = entry["ms"] / reference if reference > 0 else None
        row["gap_share_of_wall"] = row["gaps_ms"] / row["wall_ms"]
        for key in ("wall_ms", "busy_ms", "gaps_ms", "host_op_ms"):
            # A CPU's gaps can come out negative (profiler cost); a ratio of them would mean nothing.
            usable = base[key] > 0 and row[key] >= 0
            row[key.replace("_ms", "_ratio_to_dense")] = row[key] / base[key] if usable else None


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A readable table: ms per forward for each kind, the sliced/dense ratio in brackets on sliced rows."""
    columns = ["wall", *KINDS, "gaps"]
    lines = [f"{'shape':<8} {'batch':>5} {'sparsity':>8} {'GFLOP x':>7} " + " ".join(f"{c:>16}" for c in columns)]
    for row in rows:
        cells = []
        for column in columns:
            ms = row["kinds"][column]["ms"] if column in KINDS else row[f"{column}_ms"]
            ratio = row["kinds"][column]["ratio_to_dense"] if column in KINDS else row[f"{column}_ratio_to_dense"]
            cells.append(f"{ms:9.3f}" + (f" ({ratio:4.2f})" if row["sparsity"] and ratio is not None else " " * 7))
        lines.append(f"{row['shape']:<8} {row['batch_size']:>5} {row['sparsity']:>8.3f} {row['gflop_ratio']:>7.2f} "
                     + " ".join(f"{c:>16}" for c in cells))
    return lines


def timing_notes(on_gpu: bool) -> dict[str, str]:
    """What each time in a row measures, stored in the JSON next to the rows."""
    return {
        "wall_ms": "median wall time of one forward, outside the profiler, dense and sliced interleaved",
        "kinds": "CUDA kernel and memcpy time per forward" if on_gpu else "CPU self time of the ops per forward",
        "busy_ms": "the sum of the kinds",
        "host_op_ms": "CPU self time of every op and runtime call",
        "gaps_ms": ("wall - kernel time: launch gaps and host overhead while the GPU idles" if on_gpu
                    else "wall - op self time: Python and module overhead outside the ops"),
        "profiled_gaps_ms": "profiled_wall_ms - busy_ms: the gaps within the profiled forwards themselves",
    }


def main(argv: list[str] | None = None) -> int:
    """Profile every shape, write the JSON report and print the table."""
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    skipped: dict[str, list[float]] = {}
    for shape in args.shapes:
        shape_rows, skipped[shape] = profile_shape(shape, args)
        rows += shape_rows
    add_shares_and_ratios(rows)
    output, report = device_report("profile_latency.py", argv, args,
                                   timing=timing_notes(torch.device(args.device).type == "cuda"),
                                   skipped_sparsities=skipped, rows=rows)
    write_json(output, report)
    print(f"ms per forward ({report['timing']['kinds']}; gaps = {report['timing']['gaps_ms']}); "
          "(x.xx) = sliced/dense")
    print("\n".join(table_lines(rows)))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
