"""Sliced vs dense latency across precisions, run modes and FFN width multiples, next to the GFLOP ratio.

For each model shape (random weights: which units a ranking keeps does not matter for speed, only the widths do),
each precision, each mode and each ``width_multiple``, the dense model and one sliced copy per sparsity run
round-robin in one process (``hf_snapvit.benchmark.latency_vs_sparsity``), so every speedup is a ratio measured side
by side, with the dense model run the same way as the sliced ones. The switchable model (``ElasticViTModel.
from_pretrained(path, switchable=True)``) is then switched to each of the same sizes and timed side by side with the
dense model, one rotation per size (rows with ``"model": "switchable"``). The JSON records, per row, the median
latency and throughput per batch size, the realised speedup, the theoretical one (dense GFLOPs / sliced GFLOPs) and
their ratio (``efficiency``), with the device name and library versions; a PNG beside it plots speedup against the
GFLOP ratio at the largest batch (with matplotlib).

Precisions: ``fp32`` (TF32 off), ``tf32`` (fp32 weights, TF32 matmuls), ``bf16`` and ``fp16`` (weights cast). Modes:
``eager``, ``compile`` (``torch.compile``, inductor; ``--compile-mode max-autotune`` for autotuned kernels) and
``compile-graphs`` (``mode="reduce-overhead"``: CUDA graphs; skipped, with the reason recorded, off CUDA). Compiled
models have static shapes (one graph per model and batch size) and at least one warm-up pass (three with CUDA graphs),
so compilation is never timed. On a CPU only ``fp32`` and ``bf16`` make sense, with small batches.

    python benchmarks/bench_gpu_latency.py --device cuda                       # ViT-S/16 and ViT-B/16, the full grid
    python benchmarks/bench_gpu_latency.py --device cpu --shapes vit-ti16 vit-s16 --precisions fp32 \\
        --modes eager compile --batch-sizes 1 32 --multiples 1 --output benchmarks/results/cpu_latency_compile.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper module beside this script

import torch  # noqa: E402
import transformers  # noqa: E402

import _latency_modes as modes  # noqa: E402
import hf_snapvit  # noqa: E402
from hf_snapvit.benchmark import device_slug, hardware_info, latency_vs_sparsity  # noqa: E402
from hf_snapvit.files import write_text_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "vit-b16": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "vit-s16": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "vit-ti16": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    # For tests: small enough for a CPU, wide enough FFN (256) for the default multiple.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=32,
                 patch_size=8),
}
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = tuple(DTYPES)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["vit-s16", "vit-b16"], choices=sorted(SHAPES))
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--modes", nargs="+", default=list(modes.MODES), choices=modes.MODES)
    parser.add_argument("--compile-mode", default="default", choices=modes.COMPILE_MODES,
                        help="torch.compile mode of the 'compile' mode (max-autotune also uses CUDA graphs on a GPU)")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 8, 64],
                        help="FFN width multiples to compare (1 = exact widths)")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.6])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds per batch size (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed passes (compiled modes: at least 1, or 3 "
                                                              "with CUDA graphs)")
    parser.add_argument("--switchable", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the switchable model at every size")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None,
                        help="JSON file (default: benchmarks/results/gpu_latency_<device name>.json)")
    parser.add_argument("--plot", default=None, help="PNG of speedup against GFLOP ratio (default: beside the JSON)")
    return parser.parse_args(argv)


def build(shape: str, seed: int) -> transformers.ViTModel:
    """A random-weight ViT backbone of ``shape``."""
    torch.manual_seed(seed)
    return transformers.ViTModel(transformers.ViTConfig(**SHAPES[shape]), add_pooling_layer=False).eval()


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 matmuls on or off for the duration, restored afterwards."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def measure(model: transformers.ViTModel, ranking: hf_snapvit.ElasticRanking, switchable: Any, precision: str,
            mode: str, multiple: int, args: argparse.Namespace) -> dict[str, Any]:
    """One precision, mode and multiple: the dense model and every sparsity side by side, sliced copies and then the
    switchable model (``None``: not timed). A compiled run that fails records its error instead of its rows."""
    run: dict[str, Any] = {"precision": precision, "mode": mode, "width_multiple": multiple}
    reason = modes.skip_reason(mode, args.device)
    if reason is not None:
        return {**run, "skipped": reason, "rows": []}
    options = modes.compile_options(mode, args.compile_mode)
    limit = ranking.max_sparsity_for(multiple)
    timing = {"batch_sizes": args.batch_sizes, "repeats": args.repeats, "seed": args.seed,
              "warmup": max(args.warmup, modes.MIN_WARMUP[mode])}
    run.update(compile_options=options, warmup=timing["warmup"],
               skipped_sparsities=[s for s in args.sparsities if s > limit])  # beyond the floors at this multiple
    typed = copy.deepcopy(model).to(device=args.device, dtype=DTYPES[precision])
    before = modes.compile_counters()
    try:
        with tf32(precision == "tf32"):
            result = latency_vs_sparsity(typed, ranking, [s for s in args.sparsities if s <= limit],
                                         show_progress=False, width_multiple=multiple, compile=options or False,
                                         **timing)
            rows = [{"model": "sliced", **row} for row in result["rows"]]
            if switchable is not None:
                rows += modes.switchable_rows(switchable, typed, result, options, multiple, timing)
    except Exception as error:  # noqa: BLE001 - a compiler failure is a result of the run; eager ones are bugs
        if options is None:
            raise
        return {**run, "error": f"{type(error).__name__}: {error}", "rows": []}
    finally:
        del typed
        torch._dynamo.reset()  # the next run starts with empty compile caches (and frees CUDA graph pools)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if options is not None:
        run.update(modes.counters_since(before))
    return {**run, "dense": result["dense"], "rows": rows}


def summary_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One line per row: the speedup at the largest batch next to the GFLOP ratio; skipped and failed runs and rows
    with their reason."""
    lines = [f"{'shape':<9} {'model':<10} {'mode':<14} {'precision':<9} {'mult':>4} {'sparsity':>8} {'GFLOP x':>8} "
             f"{'speedup':>8} {'eff':>5}  (largest batch)"]
    for run in runs:
        prefix = f"{run['shape']:<9} {{:<10}} {run['mode']:<14} {run['precision']:<9} {run['width_multiple']:>4}"
        if "skipped" in run or "error" in run:
            lines.append(f"{prefix.format('-')} {run.get('skipped') or 'failed: ' + run['error']}")
        for row in run["rows"]:
            if "error" in row:
                lines.append(f"{prefix.format(row['model'])} {row['requested_sparsity']:>8.3f} failed: {row['error']}")
                continue
            batch = max(row["speedup"], key=int)
            lines.append(f"{prefix.format(row['model'])} {row['sparsity']:>8.3f} {row['theoretical_speedup']:>8.2f} "
                         f"{row['speedup'][batch]:>8.2f} {row['efficiency'][batch]:>5.2f}")
    return lines


def measure_shape(shape: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every precision, mode and multiple of one shape, printing each run's last line as it finishes."""
    model = build(shape, args.seed)
    ranking = hf_snapvit.rank(model, method="magnitude", seed=args.seed, show_progress=False)
    runs = []
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(modes.elastic_checkpoint(model, ranking)) if args.switchable else None
        for precision in args.precisions:
            switchable = None if folder is None else modes.load_switchable(folder, DTYPES[precision], args.device)
            for mode in args.modes:
                for multiple in args.multiples:
                    runs.append({"shape": shape, **measure(model, ranking, switchable, precision, mode, multiple,
                                                           args)})
                    print(summary_lines(runs[-1:])[-1], file=sys.stderr, flush=True)
            del switchable
    return runs


def main(argv: list[str] | None = None) -> int:
    """Measure every shape, write the JSON and the plot, print the summary."""
    args = parse_args(argv)
    runs = [run for shape in args.shapes for run in measure_shape(shape, args)]
    hardware = hardware_info(device=args.device)
    name = device_slug(hardware)
    output = Path(args.output) if args.output else ROOT / "benchmarks" / "results" / f"gpu_latency_{name}.json"
    report = {"command": " ".join(["python", "benchmarks/bench_gpu_latency.py", *(argv or sys.argv[1:])]),
              "hardware": hardware, "settings": {k: v for k, v in vars(args).items() if k != "output"}, "runs": runs}
    write_text_atomic(output, json.dumps(report, indent=1) + "\n")
    print("\n".join(summary_lines(runs)))
    print(f"wrote {output}")
    plot = modes.plot_speedups(runs, Path(args.plot) if args.plot else output.with_suffix(".png"),
                               hardware.get("gpu_name") or args.device)
    if plot is not None:
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
