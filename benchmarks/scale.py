"""How ranking and loading cost grow with the model: seconds per phase and peak memory from ViT-B/16 to ViT-g/14.

For each shape (random weights, built on the device: a ranking's time does not depend on the weights), each preset is
run once with few images (``bench_ranking_time.run_one``: wall time, its phases and the peak GPU memory), then the
elastic checkpoint is written and loaded sliced at ``--load-sparsity`` through
``ElasticViTModel.from_pretrained(..., device_map=<device>, dtype=bfloat16)``, timed with its peak GPU memory. The
summary fits, for each measure, the exponent ``b`` of ``seconds ~ parameters ** b`` over the shapes (least squares
in log-log): ``b = 1`` is linear growth.

    python benchmarks/scale.py --device cuda --shapes vit-b16 vit-l16 so400m vit-g14 --images 64
    python benchmarks/scale.py --device cpu --shapes tiny small --presets fast --images 4 --generations 1   # the test

``--cpu-memory`` runs the CPU mode instead (:mod:`scale_memory`): peak resident memory and seconds per phase of narrow
shapes at 197 to 1025 tokens and growing depth and width, with and without a ``max_memory`` budget of a quarter of
the unbudgeted peak's activations, checking that the budget holds and the rankings are equal:

    python benchmarks/scale.py --cpu-memory --output benchmarks/results/scale/scale_memory_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import bench_ranking_time  # noqa: E402
import scale_memory  # noqa: E402
import hf_snapvit  # noqa: E402
from _harness import SHAPES as STANDARD, build, device_report, timed, write_json  # noqa: E402
from _harness import parser as harness_parser  # noqa: E402

SHAPES = {**{name: STANDARD[name] for name in ("vit-b16", "vit-l16", "so400m", "vit-g14")},
          # For tests.
          "tiny": bench_ranking_time.SHAPES["tiny"],
          "small": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                        image_size=32, patch_size=8)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness_parser(__doc__, shared=False)
    parser.add_argument("--shapes", nargs="+", default=["vit-b16", "vit-l16", "so400m", "vit-g14"],
                        choices=sorted(SHAPES))
    parser.add_argument("--presets", nargs="+", default=["fast", "default"])
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--images", type=int, default=64, help="gradient and fitness images of each ranking")
    parser.add_argument("--generations", type=int, default=None, help="cap on xNES generations (default: preset's)")
    parser.add_argument("--floor-repeats", type=int, default=3)
    parser.add_argument("--load-sparsity", type=float, default=0.3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="JSON (default: benchmarks/results/scale_<device name>.json)")
    memory = parser.add_argument_group("CPU mode")
    memory.add_argument("--cpu-memory", action="store_true",
                        help="peak memory and phase seconds of narrow shapes, with and without a budget")
    memory.add_argument("--memory-shapes", nargs="+", choices=sorted(scale_memory.MEMORY_SHAPES),
                        default=["t197", "t577", "t729", "t1025", "t197-depth4", "t197-width128"])
    memory.add_argument("--memory-images", type=int, default=8, help="gradient and fitness images of each ranking")
    memory.add_argument("--budget-of-peak", type=float, default=None,
                        help="budget as this share of the unbudgeted peak (default: the plan's batch-independent "
                             "part plus a quarter of the rest)")
    return parser.parse_args(argv)


def load_sliced(model: transformers.ViTModel, ranking: hf_snapvit.ElasticRanking,
                args: argparse.Namespace) -> dict[str, Any]:
    """Write the elastic checkpoint, then time its sliced load onto the device in bf16, with the peak memory."""
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="scale-") as folder:
        saved = timed(lambda: hf_snapvit.save_elastic(model, ranking, folder, model_card=False))[1]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

        def load() -> torch.nn.Module:
            with warnings.catch_warnings():
                # The benchmark's models have no pooler (add_pooling_layer=False): loading warns that it is new.
                warnings.filterwarnings("ignore", message="Some weights were not in the checkpoint")
                sliced = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=args.load_sparsity,
                                                                     dtype=torch.bfloat16, device_map=args.device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return sliced

        sliced, loaded = timed(load)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        params = sum(p.numel() for p in sliced.parameters())
        del sliced
    return {"save_seconds": saved, "load_seconds": loaded, "load_peak_memory_bytes": peak,
            "loaded_parameters": params, "sparsity": args.load_sparsity}


def exponent(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of log(y) against log(x): ``y ~ x ** slope``; ``None`` with under two shapes."""
    points = [(x, y) for x, y in points if x > 0 and y and y > 0]
    if len({x for x, _ in points}) < 2:
        return None
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
            / sum((x - mean_x) ** 2 for x in xs))


def growth(rows: list[dict[str, Any]], presets: list[str]) -> dict[str, float | None]:
    """The growth exponent of every measure against the backbone's parameters."""
    result: dict[str, float | None] = {}
    for preset in presets:
        ranked = [row for row in rows if "phases" in row["rankings"].get(preset, {})]
        for key in ("wall_seconds", "gradients", "search", "peak_memory_bytes"):
            result[f"{preset}.{key}"] = exponent([
                (row["parameters"], row["rankings"][preset].get(key, row["rankings"][preset]["phases"].get(key)))
                for row in ranked])
    for key in ("load_seconds", "load_peak_memory_bytes", "save_seconds"):
        result[key] = exponent([(row["parameters"], row["load"][key]) for row in rows if "load" in row])
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_memory:
        args.device, args.images = "cpu", args.memory_images
        output, report = device_report("scale.py", argv, args, prefix="scale_memory")
        return scale_memory.run(args, output, report, write_json)
    output, report = device_report("scale.py", argv, args, rows=[])
    # run_one reads these from its own command line's namespace.
    options = argparse.Namespace(images=args.images, generations=args.generations, seed=args.seed,
                                 fitness_batch_size=None, floor_repeats=args.floor_repeats)
    images = bench_ranking_time.load_images(None, 2 * args.images, args.seed)
    for shape in args.shapes:
        model, seconds = timed(lambda: build(shape, args.seed, args.device, SHAPES))
        row: dict[str, Any] = {"shape": shape, "config": SHAPES[shape], "build_seconds": seconds,
                               "parameters": sum(p.numel() for p in model.parameters()), "rankings": {}}
        report["rows"].append(row)
        ranking = None
        for preset in args.presets:
            try:
                result = bench_ranking_time.run_one(model, images, preset, args.precision, options)
            except torch.OutOfMemoryError as error:  # the largest shape not fitting is a result
                row["rankings"][preset] = {"error": f"out of memory: {error}"[:500]}
                continue
            row["rankings"][preset] = result
            if ranking is None:
                ranking = hf_snapvit.rank(model, method="magnitude", show_progress=False)
            print(f"{row['parameters'] / 1e6:8.1f} M params: {bench_ranking_time.summary_line(shape, result)}",
                  file=sys.stderr, flush=True)
            write_json(output, report)
        if ranking is not None:
            # Loading does not depend on which units a ranking keeps; a magnitude ranking is instant.
            row["load"] = load_sliced(model, ranking, args)
            print(f"{shape:<8} saved in {row['load']['save_seconds']:.1f} s, loaded at {args.load_sparsity:g} in "
                  f"{row['load']['load_seconds']:.1f} s", file=sys.stderr, flush=True)
        del model
        report["growth_exponents"] = growth([r for r in report["rows"] if r["rankings"]], args.presets)
        write_json(output, report)
    print(json.dumps(report["growth_exponents"], indent=1))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
