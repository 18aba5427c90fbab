"""Ranking a model accelerate placed (issue 65): one seeded ViT ranked by SnapViT plain, with every block offloaded to
disk (``dispatch_model``; embeddings and final norm on the CPU), and under ``cpu_offload``, each in a fresh process:
wall time, peak anonymous memory, and how the scores and budgets compare with the plain ranking's.

Memory is the process's anonymous (process-owned) memory, sampled every 2 ms (``RssAnon``): absolute, so the plain
run counts its resident weights, and accelerate's disk offload, which memory-maps the weights it loads, counts only
what the ranking allocates. The ranking runs in float32, where the two paths compute the same sums.

    python benchmarks/offloaded_ranking.py --shape vit-b16 --images 8 --generations 1
    python benchmarks/offloaded_ranking.py --shape tiny --images 4 --generations 1   # the test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import transformers  # noqa: E402

import bench_ranking_time  # noqa: E402
import hf_snapvit  # noqa: E402
from _harness import SHAPES, build, device_report, write_json  # noqa: E402
from _harness import parser as harness_parser  # noqa: E402
from hf_snapvit.benchmark.environment import MemoryPoller, read_status  # noqa: E402

MODES = ("plain", "disk", "cpu_offload")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness_parser(__doc__, shared=False)
    parser.add_argument("--shape", default="vit-b16", choices=sorted(SHAPES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--images", type=int, default=8, help="gradient and fitness images")
    parser.add_argument("--generations", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None,
                        help="JSON (default: benchmarks/results/offloaded_ranking/offloaded_ranking_<cpu>.json)")
    return parser.parse_args(argv)


def placed(model: transformers.PreTrainedModel, mode: str, folder: str) -> transformers.PreTrainedModel:
    from accelerate import cpu_offload, dispatch_model

    if mode == "disk":
        blocks = {f"layers.{i}": "disk" for i in range(model.config.num_hidden_layers)}
        return dispatch_model(model, {"embeddings": "cpu", **blocks, "layernorm": "cpu"}, offload_dir=folder)
    if mode == "cpu_offload":
        return cpu_offload(model, execution_device="cpu")
    return model


def child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: build, place and rank the model; time, memory and the ranking."""
    with tempfile.TemporaryDirectory(prefix="offload-") as folder:
        model = placed(build(args.shape, args.seed), mode, folder)
        size = model.config.image_size
        config = hf_snapvit.SnapViTConfig.preset("fast", precision="fp32", seed=args.seed,
                                                  num_gradient_images=args.images, num_fitness_images=args.images,
                                                  max_generations=args.generations)
        images = bench_ranking_time.load_images(None, 2 * args.images, args.seed)
        processor = transformers.ViTImageProcessor(size={"height": size, "width": size})
        before = read_status()
        with MemoryPoller(0.002) as poller:
            start = time.perf_counter()
            ranking = hf_snapvit.SnapViTPruner(config).fit(model, images, processor=processor, show_progress=False)
            wall = time.perf_counter() - start
    return {"mode": mode, "wall_seconds": wall, "anon_before_bytes": before.get("RssAnon", 0),
            "peak_anon_bytes": poller.peak_anon, "meta_parameters": sum(p.is_meta for p in model.parameters()),
            "head_scores": ranking.head_scores.tolist(), "neuron_scores": ranking.neuron_scores.tolist(),
            "keep_counts": {str(s): {"heads": counts.heads, "neurons": counts.neurons}
                            for s, counts in ((s, ranking.keep_counts(s)) for s in (0.3, 0.5))}}


def compare(row: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any]:
    """How ``row``'s ranking differs from the plain one: the largest relative score difference, equal budgets."""
    worst = 0.0
    for key in ("head_scores", "neuron_scores"):
        found, wanted = np.asarray(row[key]), np.asarray(plain[key])
        worst = max(worst, float(np.max(np.abs(found - wanted) / np.maximum(np.abs(wanted), 1e-300))))
    return {"max_relative_score_difference": worst, "same_keep_counts": row["keep_counts"] == plain["keep_counts"]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    output, report = device_report("offloaded_ranking.py", argv, args, shape=SHAPES[args.shape], rows=[])
    for mode in args.modes:
        command = [sys.executable, __file__, "--child", mode, "--shape", args.shape, "--images", str(args.images),
                   "--generations", str(args.generations), "--seed", str(args.seed)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            report["rows"].append({"mode": mode, "error": done.stderr[-2000:]})
            continue
        report["rows"].append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{mode:<12} {report['rows'][-1]['wall_seconds']:7.1f} s, peak anonymous memory "
              f"{report['rows'][-1]['peak_anon_bytes'] / 2**20:8.1f} MiB", file=sys.stderr, flush=True)
    plain = next((row for row in report["rows"] if row["mode"] == "plain" and "error" not in row), None)
    for row in report["rows"]:
        if plain is not None and "error" not in row:
            row.update(compare(row, plain))
    for row in report["rows"]:  # the scores themselves (3 MB for a ViT-B) stay out of the file: the comparison is in
        row.pop("head_scores", None), row.pop("neuron_scores", None)
    write_json(output, report)
    print(f"wrote {output}")
    return 1 if any("error" in row for row in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
