"""Forward latency and throughput of sliced models vs the dense model, with realised vs theoretical speedups.

The dense model and one physically sliced copy per sparsity run round-robin in the same process
(``hf_snapvit.benchmark.latency_vs_sparsity``): each timed round runs every model once, in a rotating order, so slow
phases of a shared machine hit all of them alike. For every batch size the JSON records the median and minimum
latency, the throughput, the realised speedup (dense median / sliced median) and the theoretical one (dense GFLOPs /
sliced GFLOPs, the paper's formulas), with the hardware, torch threads and batch sizes.

Models: ``--model`` is a dense checkpoint (ranked here with the data-free ``--method``), an elastic checkpoint (its
stored ranking is used), or a synthetic random model of a standard shape: ``vit-b16`` (ViT-B/16, 224 px),
``vit-s16`` or ``vit-ti16``. Which units a ranking keeps does not matter for speed, only the per-block widths do.

    python benchmarks/bench_latency.py                                      # shared ViT-Tiny, magnitude ranking
    python benchmarks/bench_latency.py --model PATH/TO/vit-tiny-elastic-snapvit
    python benchmarks/bench_latency.py --model vit-b16 --batch-sizes 1 8 --repeats 3
    python benchmarks/bench_latency.py --model vit-b16 --device cuda --dtype bfloat16 --batch-sizes 1 32 256
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_snapvit  # noqa: E402
from hf_snapvit.architectures import model_class  # noqa: E402
from hf_snapvit.benchmark import format_latency_table, hardware_info, latency_vs_sparsity  # noqa: E402
from hf_snapvit.files import public_name, write_text_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SHAPES = {
    "vit-b16": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "vit-s16": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "vit-ti16": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"),
                        help=f"checkpoint path, elastic checkpoint, or one of {', '.join(SHAPES)}")
    parser.add_argument("--method", default="magnitude", help="data-free ranking for a dense checkpoint")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per batch size (median reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0 = torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None,
                        help="JSON output (default benchmarks/results/latency_<model>.json)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0 or any(b < 1 for b in args.batch_sizes):
        parser.error("need --repeats >= 1, --warmup >= 0 and positive --batch-sizes")
    return args


def load(args: argparse.Namespace):
    """(dense model, ranking, description)."""
    if args.model in SHAPES:
        torch.manual_seed(args.seed)
        model = transformers.ViTModel(transformers.ViTConfig(**SHAPES[args.model]), add_pooling_layer=False)
        return model, hf_snapvit.rank(model, method=args.method, seed=args.seed), f"{args.model} (random weights)"
    config = transformers.AutoConfig.from_pretrained(args.model)
    if getattr(config, "elastic_ranking", None) is not None:
        model = hf_snapvit.ElasticViTModel.from_pretrained(args.model)
        return model, hf_snapvit.ElasticRanking.from_dict(model.config.elastic_ranking), public_name(args.model)
    model = model_class(config).from_pretrained(args.model)
    return model, hf_snapvit.rank(model, method=args.method, seed=args.seed), public_name(args.model)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, ranking, description = load(args)
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    grid = [s for s in args.sparsities if s <= ranking.max_sparsity]
    if len(grid) < len(args.sparsities):
        print(f"skipping sparsities above the ranking's maximum {ranking.max_sparsity:.3f}")
    hardware = hardware_info(torch.get_num_threads(), args.device)
    print(f"{description} | {hardware['cpu_model']} | {hardware['torch_threads']} threads | device {args.device}"
          + (f" ({hardware['gpu_name']})" if "gpu_name" in hardware else ""))
    result = latency_vs_sparsity(model, ranking, grid, batch_sizes=args.batch_sizes, repeats=args.repeats,
                                 warmup=args.warmup, seed=args.seed)
    print(format_latency_table(result))
    name = Path(args.model).name if args.model not in SHAPES else args.model
    output = args.output or ROOT / "benchmarks" / "results" / f"latency_{name}.json"
    report = {
        "benchmark": "bench_latency",
        "description": "Forward latency/throughput of sliced vs dense models, measured round-robin in one process "
                       "(torch.inference_mode, seeded random input). speedup = dense median / sliced median; "
                       "theoretical_speedup = dense GFLOPs / sliced GFLOPs; efficiency = their ratio.",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [public_name(arg) for arg in (sys.executable, *sys.argv)],  # no local paths in results
        "model": description,
        "ranking": {"method": ranking.provenance.get("method"), "mode": ranking.mode},
        "settings": {"sparsities": grid, "batch_sizes": args.batch_sizes, "repeats": args.repeats,
                     "warmup": args.warmup, "threads": torch.get_num_threads(), "device": args.device,
                     "dtype": args.dtype, "seed": args.seed},
        "hardware": hardware,
        "result": result,
        "total_wall_s": time.perf_counter() - started,
    }
    write_text_atomic(output, json.dumps(report, indent=2))
    print(f"wrote {output} ({report['total_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
