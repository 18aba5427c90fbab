"""Wall time of a SnapViT ranking and of its phases, next to the forward-pass floor measured in the same run.

Per shape (random weights), preset and precision ``SnapViTPruner.fit`` runs once, with its phase times (``data``,
``gradients``, ``search`` and the search's ``search_forward``, timed with device events on CUDA). The **forward
floor** is the images the search forwards (teacher pass plus every evaluation at every fitness sparsity) at the dense
model's measured throughput; pruned candidates are cheaper, so it bounds how much of the search is forwards at all.
Images: the first rows of a parquet with an ``image`` column (``--data``), else random 64x64 RGB ones.

    python benchmarks/bench_ranking_time.py --device cuda --shapes vit-b16 --presets default fast --precisions bf16 \
        --data train.parquet
    # side by side: fitness images, images per gradient step, split fitness images, the share of tokens forwarded
    python benchmarks/bench_ranking_time.py --shapes vit-b16 --presets default --precisions bf16 \
        --fitness-images 1000 256 --gradient-batch-sizes 16 64 --split-fitness-images 0 1 \
        --fitness-token-fractions 1 0.5
    # on a CPU with a tiny model (what the test runs):
    python benchmarks/bench_ranking_time.py --device cpu --shapes tiny --presets fast --images 8 --generations 1

A count listed twice runs twice: the first ranking of a process also pays the device's one-time start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import sys
import time
import timeit
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils import benchmark  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402

import hf_snapvit  # noqa: E402
from _harness import SHAPES as STANDARD, build, device_report, parser, write_json  # noqa: E402
from hf_snapvit.architectures.embedding import image_embedding  # noqa: E402
from hf_snapvit.utils.precision import autocast, resolve_precision, tf32_matmuls  # noqa: E402
from hf_snapvit.loading.timing import synchronize  # noqa: E402

# The standard ViT shapes (vit-ti16 is the shared ViT-Tiny's: a CPU's ranking times without the shared checkpoint),
# and a tiny one for tests, small enough for a CPU.
SHAPES = {**{name: STANDARD[name] for name in ("vit-b16", "vit-s16", "vit-ti16")},
          "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                       patch_size=8)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # Each value of a list option below runs every preset once, side by side; None keeps the preset's value.
    options = parser(__doc__, shared=False)
    options.add_argument("--shapes", nargs="+", default=["vit-s16", "vit-b16"], choices=sorted(SHAPES))
    options.add_argument("--presets", nargs="+", default=["default", "fast", "paper"],
                         choices=["default", "fast", "paper"])
    options.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    options.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    options.add_argument("--data", default=None, help="parquet file with an 'image' column (default: random images)")
    options.add_argument("--images", type=int, default=None, help="gradient and fitness images each")
    options.add_argument("--fitness-images", type=int, nargs="+", default=[None], help="fitness images")
    options.add_argument("--gradient-batch-sizes", type=int, nargs="+", default=[None], help="images per gradient step")
    options.add_argument("--split-fitness-images", type=int, nargs="+", default=[None], choices=[0, 1],
                         help="1: each fitness sparsity on its own share (SnapViTConfig.split_fitness_images)")
    options.add_argument("--fitness-token-fractions", type=float, nargs="+", default=[None],
                         help="share of each fitness image's tokens forwarded (SnapViTConfig.fitness_token_fraction)")
    options.add_argument("--generations", type=int, default=None, help="cap on xNES generations")
    options.add_argument("--fitness-batch-size", type=int, default=None,
                         help="images per search forward (default: 256 on an accelerator, 64 on a CPU)")
    options.add_argument("--floor-repeats", type=int, default=5, help="timed dense forwards for the throughput")
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--output", default=None,
                         help="JSON file (default: results/bench_ranking_time/ranking_time_<device>.json)")
    return options.parse_args(argv)


def load_images(path: str | None, count: int, seed: int) -> list[Image.Image]:
    """The first ``count`` images of the parquet at ``path`` (read a record batch at a time), else random ones."""
    if path is None:
        rng = np.random.default_rng(seed)
        return [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(count)]
    import io

    import pyarrow.parquet as pq

    images: list[Image.Image] = []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256, columns=["image"]):
        for cell in batch.column("image").to_pylist():
            images.append(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))
            if len(images) == count:
                return images
    raise SystemExit(f"{path} holds {len(images)} images; this run needs {count} (lower --images).")


def dense_throughput(model: transformers.ViTModel, batch_size: int, precision: str, repeats: int) -> float:
    """Images per second of the dense model's embedding forward at the search's batch size and precision."""
    device = next(model.parameters()).device
    size = model.config.image_size
    pixels = torch.randn(batch_size, 3, size, size, device=device)
    def clock() -> float:  # Timer's default clock synchronises only the current accelerator
        synchronize(device)
        return timeit.default_timer()

    # Timer.timeit runs max(repeats // 100, 2) warm-up forwards first (kernels chosen, memory allocated), then times
    # `repeats`, at torch's thread count (Timer's default is one thread).
    timer = benchmark.Timer(stmt="image_embedding(model, inputs)", timer=clock, num_threads=torch.get_num_threads(),
                            globals={"image_embedding": image_embedding, "model": model,
                                     "inputs": {"pixel_values": pixels}})
    with torch.no_grad(), tf32_matmuls(device, enabled=precision == "no"), autocast(device, precision=precision):
        seconds = timer.timeit(number=repeats).raw_times[0]
    return repeats * len(pixels) / seconds


def run_one(model: transformers.ViTModel, images: list[Image.Image], preset: str, precision: str,
            args: argparse.Namespace, settings: dict[str, Any] | None = None,
            gradient_batch: int | None = None) -> dict[str, Any]:
    """One ranking with its phase times, and the dense forward floor of its search. ``settings``: this run's
    :class:`~hf_snapvit.SnapViTConfig` fields (``None`` values keep the preset's), after the command's own."""
    overrides: dict[str, Any] = {"precision": precision, "seed": args.seed}
    if args.images is not None:
        overrides.update(num_gradient_images=args.images, num_fitness_images=args.images)
    if args.generations is not None:
        overrides["max_generations"] = args.generations
    if args.fitness_batch_size is not None:
        overrides["fitness_batch_size"] = args.fitness_batch_size
    overrides.update({k: v for k, v in (settings or {}).items() if v is not None})
    config = hf_snapvit.SnapViTConfig.preset(preset, **overrides)
    if gradient_batch is not None:
        config = dataclasses.replace(config, scores=dataclasses.replace(config.scores, batch_size=gradient_batch))
    size = model.config.image_size
    processor = transformers.ViTImageProcessor(size={"height": size, "width": size})
    pruner = hf_snapvit.SnapViTPruner(config)
    device = next(model.parameters()).device
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    ranking = pruner.fit(model, images, processor=processor, show_progress=False)
    wall = time.perf_counter() - start
    # What a larger gradient step costs in memory: the ranking's peak, the model's weights included (CUDA only).
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    resolved = resolve_precision(precision, device)
    batch_size = ranking.provenance["settings"]["fitness_batch_size"]
    throughput = dense_throughput(model, batch_size, resolved, args.floor_repeats)
    search = ranking.provenance["search"]
    # The teacher pass, then every evaluation at every sparsity: on every image, or each sparsity on its share, or
    # (rotating) at one sparsity per generation.
    one = config.split_fitness_images or config.rotate_fitness_sparsities
    per_evaluation = 1 if one else len(config.fitness_sparsities)
    forwarded = config.num_fitness_images * (1 + search["evaluations"] * per_evaluation)
    phases = pruner.timings_
    return {
        "preset": preset, "precision": precision, "ran_in": ranking.provenance["precision"],
        "fitness_batch_size": batch_size,
        "num_gradient_images": config.num_gradient_images, "num_fitness_images": config.num_fitness_images,
        "gradient_batch_size": config.scores.batch_size, "split_fitness_images": config.split_fitness_images,
        "fitness_token_fraction": config.fitness_token_fraction,
        "evaluations": search["evaluations"], "generations": search["generations"],
        "wall_seconds": wall, "phases": phases, "peak_memory_bytes": peak,
        "dense_images_per_second": throughput, "search_images_forwarded": forwarded,
        "search_forward_floor_seconds": forwarded / throughput,
        "search_forward_fraction": phases["search_forward"] / phases["search"] if phases["search"] else None,
    }


def _tokens(fraction: float) -> str:
    return "" if fraction == 1 else f"({fraction:g} of the tokens) "


def summary_line(shape: str, row: dict[str, Any]) -> str:
    p = row["phases"]
    return (f"{shape:<8} {row['preset']:<8} {row['ran_in']:<5} {row['num_fitness_images']:5d} fitness images "
            f"{'(split) ' if row['split_fitness_images'] else ''}{_tokens(row['fitness_token_fraction'])}"
            f"{row['gradient_batch_size']:4d} per step wall {row['wall_seconds']:7.1f} s | data "
            f"{p['data']:6.1f} gradients {p['gradients']:6.1f} search {p['search']:6.1f} (forwards "
            f"{p['search_forward']:6.1f}, {100 * (row['search_forward_fraction'] or 0):3.0f} %; dense floor "
            f"{row['search_forward_floor_seconds']:6.1f})"
            + (f" peak {row['peak_memory_bytes'] / 2**30:.1f} GiB" if row["peak_memory_bytes"] is not None else ""))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    presets = [hf_snapvit.SnapViTConfig.preset(p) for p in args.presets]
    needed = max((args.images or c.num_gradient_images) + (n or args.images or c.num_fitness_images)
                 for c in presets for n in args.fitness_images)
    images = load_images(args.data, needed, args.seed)
    output, report = device_report("bench_ranking_time.py", argv, args, "ranking_time",
                                   data=args.data or "random 64x64 images", runs=[])
    for shape in args.shapes:
        model = build(shape, args.seed, args.device, SHAPES)
        for preset, precision, fitness, batch, split, tokens in itertools.product(
                args.presets, args.precisions, args.fitness_images, args.gradient_batch_sizes,
                args.split_fitness_images, args.fitness_token_fractions):
            settings = {"num_fitness_images": fitness, "fitness_token_fraction": tokens,
                        "split_fitness_images": None if split is None else bool(split)}
            row = {"shape": shape, **run_one(model, images, preset, precision, args, settings, batch)}
            report["runs"].append(row)
            print(summary_line(shape, row), file=sys.stderr, flush=True)
            # Written after every run: a long GPU session that is cut off keeps what it measured.
            write_json(output, report)
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
