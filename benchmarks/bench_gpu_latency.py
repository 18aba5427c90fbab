"""Sliced vs dense latency on a GPU across precisions and FFN width multiples, next to the GFLOP ratio.

For each model shape (random weights: which units a ranking keeps does not matter for speed, only the widths do),
each precision and each ``width_multiple``, the dense model and one sliced copy per sparsity run round-robin in one
process (``hf_snapvit.benchmark.latency_vs_sparsity``), so every speedup is a ratio measured side by side. The JSON
records, per row, the median latency and throughput per batch size, the realised speedup, the theoretical one
(dense GFLOPs / sliced GFLOPs) and their ratio (``efficiency``), with the device name and library versions.

Precisions: ``fp32`` (TF32 off), ``tf32`` (fp32 weights, TF32 matmuls), ``bf16`` and ``fp16`` (weights cast),
``bf16-compile`` (bf16 and ``torch.compile``). On a CPU only ``fp32`` and ``bf16`` make sense, with small batches.

    python benchmarks/bench_gpu_latency.py --device cuda                       # ViT-S/16 and ViT-B/16, the full grid
    python benchmarks/bench_gpu_latency.py --device cpu --shapes vit-ti16 --precisions fp32 --batch-sizes 1 8 \\
        --multiples 1 64 --output benchmarks/results/cpu_latency_widths.json
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

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_snapvit  # noqa: E402
from hf_snapvit.benchmark import hardware_info, latency_vs_sparsity  # noqa: E402
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
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "bf16-compile")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["vit-s16", "vit-b16"], choices=sorted(SHAPES))
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 8, 64],
                        help="FFN width multiples to compare (1 = exact widths)")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.6])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds per batch size (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None,
                        help="JSON file (default: benchmarks/results/gpu_latency_<device name>.json)")
    return parser.parse_args(argv)


def build(shape: str, seed: int) -> transformers.ViTModel:
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


def measure(model: transformers.ViTModel, ranking: hf_snapvit.ElasticRanking, precision: str, multiple: int,
            args: argparse.Namespace) -> dict[str, Any]:
    """One precision and multiple: the dense model and every sparsity, side by side."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "bf16-compile": torch.bfloat16}.get(precision,
                                                                                               torch.float32)
    typed = copy.deepcopy(model).to(device=args.device, dtype=dtype)
    limit = ranking.max_sparsity_for(multiple)
    sparsities = [s for s in args.sparsities if s <= limit]
    with tf32(precision == "tf32"):
        result = latency_vs_sparsity(typed, ranking, sparsities, batch_sizes=args.batch_sizes,
                                     repeats=args.repeats, warmup=args.warmup, seed=args.seed, show_progress=False,
                                     width_multiple=multiple, compile=precision.endswith("-compile"))
    del typed
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    skipped = [s for s in args.sparsities if s > limit]  # beyond the floors at this multiple
    return {"precision": precision, "width_multiple": multiple, "skipped_sparsities": skipped, **result}


def summary_lines(runs: list[dict[str, Any]]) -> list[str]:
    """One line per row: the speedup at the largest batch next to the GFLOP ratio."""
    lines = [f"{'shape':<9} {'precision':<13} {'mult':>4} {'sparsity':>8} {'GFLOP x':>8} {'speedup':>8} {'eff':>5}"
             "  (largest batch)"]
    for run in runs:
        for row in run["rows"]:
            batch = max(row["speedup"], key=int)
            lines.append(f"{run['shape']:<9} {run['precision']:<13} {run['width_multiple']:>4} "
                         f"{row['sparsity']:>8.3f} {row['theoretical_speedup']:>8.2f} {row['speedup'][batch]:>8.2f} "
                         f"{row['efficiency'][batch]:>5.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = []
    for shape in args.shapes:
        model = build(shape, args.seed)
        ranking = hf_snapvit.rank(model, method="magnitude", seed=args.seed, show_progress=False)
        for precision in args.precisions:
            for multiple in args.multiples:
                runs.append({"shape": shape, **measure(model, ranking, precision, multiple, args)})
                print(summary_lines(runs[-1:])[-1], file=sys.stderr, flush=True)
    hardware = hardware_info(device=args.device)
    name = (hardware.get("gpu_name") or args.device).lower().replace(" ", "-")
    output = Path(args.output) if args.output else ROOT / "benchmarks" / "results" / f"gpu_latency_{name}.json"
    report = {"command": " ".join(["python", "benchmarks/bench_gpu_latency.py", *(argv or sys.argv[1:])]),
              "hardware": hardware, "settings": {k: v for k, v in vars(args).items() if k != "output"}, "runs": runs}
    write_text_atomic(output, json.dumps(report, indent=1) + "\n")
    print("\n".join(summary_lines(runs)))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
