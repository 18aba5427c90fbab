"""Where the gradient phase of a SnapViT ranking spends its time, for each number of images per gradient step.

For one model shape (random weights, ``bench_ranking_time.py``'s shapes and images), the preset's gradient scores
(:func:`hf_snapvit.scoring.gradient_scores`, the phase ``SnapViTPruner.fit`` runs first) are computed on ``--images``
calibration images with each of ``--batch-sizes`` images per step: timed once after an untimed step, then profiled
with torch.profiler over ``--profile-steps`` steps and grouped by kind of work as ``profile_latency.py`` groups a
forward (on CUDA the device kernels; ``gaps_ms`` = wall − kernel time is the GPU waiting on the host). Times are per
image. Beside them, on the same images and device: the wall time of making the multi-crops alone, and of the
``default`` preset's unit order (``block_orders``, ``"output"``) on ``--images`` fitness images.

    python benchmarks/profile_ranking.py --device cuda --shape vit-b16 --images 256 --batch-sizes 16 64 \\
        --data train.parquet
    python benchmarks/profile_ranking.py --device cpu --shape tiny --images 8 --batch-sizes 2 4   # what the test runs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import bench_ranking_time  # noqa: E402
import hf_snapvit  # noqa: E402
from hf_snapvit.benchmark import device_slug, hardware_info  # noqa: E402
from hf_snapvit.correction import CorrectionConfig  # noqa: E402
from hf_snapvit.files import write_text_atomic  # noqa: E402
from hf_snapvit.latency_table import synchronize  # noqa: E402
from hf_snapvit.methods.block_order import block_orders  # noqa: E402
from hf_snapvit.scoring import gradient_scores  # noqa: E402
from hf_snapvit.views import Normalizer, processor_inputs, seeded_multi_crops  # noqa: E402
from profile_latency import group_events  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="vit-b16", choices=sorted(bench_ranking_time.SHAPES))
    parser.add_argument("--preset", default="default", choices=["default", "fast", "paper"])
    parser.add_argument("--images", type=int, default=256, help="gradient images timed (and fitness images ordered)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="images per gradient step")
    parser.add_argument("--profile-steps", type=int, default=2, help="gradient steps under the profiler")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data", default=None, help="parquet file with an 'image' column (default: random images)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None,
                        help="JSON file (default: benchmarks/results/profile_ranking_<device name>.json)")
    args = parser.parse_args(argv)
    if min(args.images, args.profile_steps, *args.batch_sizes) < 1:
        parser.error("--images, --profile-steps and --batch-sizes must be positive integers.")
    return args


def timed(device: torch.device, work) -> float:
    """Seconds ``work()`` takes, the device's queue included."""
    synchronize(device)
    start = time.perf_counter()
    work()
    synchronize(device)
    return time.perf_counter() - start


def crop_seconds(images: list, scores: Any, processor: Any, input_size: int, seed: int, device: torch.device) -> float:
    """The multi-crops of ``images`` alone, made as the gradient steps make them (a step's images at a time, one
    generator per image; on the device when it is an accelerator)."""
    normalizer = Normalizer(processor)
    on = None if device.type == "cpu" else device
    step = scores.batch_size
    return timed(device, lambda: [seeded_multi_crops(images[i:i + step], i, seed, scores.crops, normalizer, input_size,
                                                     on) for i in range(0, len(images), step)])


def profile_batch(model, images: list, processor: Any, scores: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One step size: the timed gradient phase on every image, the crops alone, and the profile of a few steps."""
    device = next(model.parameters()).device

    def run(pictures: list) -> None:
        gradient_scores(model, pictures, processor, scores, seed=args.seed, show_progress=False,
                        precision=args.precision)

    run(images[:scores.batch_size])  # untimed: kernels chosen, memory allocated
    wall = timed(device, lambda: run(images))
    crops = crop_seconds(images, scores, processor, model.config.image_size, args.seed, device)
    profiled = images[:scores.batch_size * args.profile_steps]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        profiled_wall = timed(device, lambda: run(profiled))
    grouped = group_events(prof.events(), device.type == "cuda", len(profiled))
    profiled_ms = profiled_wall * 1e3 / len(profiled)
    return {"batch_size": scores.batch_size, "images": len(images), "wall_seconds": wall,
            "ms_per_image": wall * 1e3 / len(images), "crops_seconds": crops,
            "profile": {"images": len(profiled), "wall_ms_per_image": profiled_ms,
                        "gaps_ms_per_image": profiled_ms - grouped["busy_ms"], **grouped}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    model = bench_ranking_time.build(args.shape, args.seed, args.device)
    images = bench_ranking_time.load_images(args.data, args.images, args.seed)
    size = model.config.image_size
    processor = transformers.ViTImageProcessor(size={"height": size, "width": size})
    base = hf_snapvit.SnapViTConfig.preset(args.preset).scores
    rows = []
    for batch in args.batch_sizes:
        rows.append(profile_batch(model, images, processor, dataclasses.replace(base, batch_size=batch), args))
        print(f"{args.shape} {batch:4d} images per step: {rows[-1]['ms_per_image']:.2f} ms per image "
              f"(crops alone {rows[-1]['crops_seconds'] * 1e3 / args.images:.2f}; profiled: kernels "
              f"{rows[-1]['profile']['busy_ms']:.2f}, gaps {rows[-1]['profile']['gaps_ms_per_image']:.2f})",
              file=sys.stderr, flush=True)
    pixels = processor_inputs(images, processor).to(device)
    order_config = CorrectionConfig(num_samples=None, batch_size=base.batch_size, guard=False)
    unit_order = timed(device, lambda: block_orders(model, pixels, order="output", config=order_config,
                                                    show_progress=False))
    print(f"{args.shape} unit order on {args.images} images: {unit_order:.2f} s", file=sys.stderr)
    hardware = hardware_info(device=args.device)
    name = device_slug(hardware)
    output = Path(args.output) if args.output else ROOT / "benchmarks" / "results" / f"profile_ranking_{name}.json"
    report = {"command": " ".join(["python", "benchmarks/profile_ranking.py",
                                   *(argv if argv is not None else sys.argv[1:])]),
              "hardware": hardware, "data": args.data or "random 64x64 images",
              "settings": {k: v for k, v in vars(args).items() if k != "output"},
              "gradients": rows, "unit_order_seconds": unit_order}
    write_text_atomic(output, json.dumps(report, indent=1) + "\n")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
