"""scale.py's CPU mode: peak memory and seconds per phase of SnapViT rankings, with and without a memory budget.

Each ranking runs in a fresh child process (random-weight narrow ViTs, random images), so that its peak resident
memory is its own: the child resets its peak (``/proc/self/clear_refs``) after loading the images, samples its
resident memory every 2 ms during the ranking and reports the peak of each phase (data, gradients with the unit
order, search) and of the whole ranking (``VmHWM``), each above the resident memory before the model was built.
For every shape and preset the ranking runs once without a budget and once with ``max_memory`` what the plan holds
whatever the batch (weights, pixels, score sums) plus a quarter of the rest of the unbudgeted peak (its
activations), at least one image per micro-batch: the budget holds when the budgeted peak is within 10 % of it, and the results equal when every
score agrees to 1e-6 relative and every block's unit orders are the same. The planner's estimate of each phase is
reported beside the measured peak.

    python benchmarks/scale.py --cpu-memory                          # the committed table (minutes)
    python benchmarks/scale.py --cpu-memory --memory-shapes t197 --presets fast --images 4 --generations 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Narrow ViTs: 197, 577, 729 (730 with the class token) and 1025 tokens; then growing depth and width at 197.
MEMORY_SHAPES = {
    "t197": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=224),
    "t577": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=384),
    "t729": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=432),
    "t1025": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=512),
    "t197-depth4": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=2, intermediate_size=256,
                        image_size=224),
    "t197-width128": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                          image_size=224),
    # For the test.
    "tiny": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                 patch_size=8),
}
PHASES = ("data", "gradients", "search")
TOLERANCE = 0.10


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One ranking in this (fresh) process: its scores, phase seconds and peak memory above the pre-model RSS."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    import hf_snapvit

    torch.manual_seed(spec["seed"])
    rng = np.random.default_rng(spec["seed"])
    images = [Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)) for _ in range(2 * spec["images"])]
    config = transformers.ViTConfig(**{"patch_size": 16, **MEMORY_SHAPES[spec["shape"]]})
    processor = transformers.ViTImageProcessor(size={"height": config.image_size, "width": config.image_size})
    overrides = dict(num_gradient_images=spec["images"], num_fitness_images=spec["images"], precision="fp32")
    if spec["generations"] is not None:
        overrides["max_generations"] = spec["generations"]
    settings = hf_snapvit.SnapViTConfig.preset(spec["preset"], **overrides)
    _warm_up(spec["preset"], images)
    with open("/proc/self/clear_refs", "w") as refs:  # the peak so far (imports, images) is not the ranking's
        refs.write("5")
    base = _status("VmRSS")
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter(), _status("VmRSS")))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    sampler.start()
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()
    pruner = hf_snapvit.SnapViTPruner(settings)
    ranking = pruner.fit(model, images, processor=processor, show_progress=False, max_memory=spec["max_memory"])
    done.set()
    sampler.join()
    wall = time.perf_counter() - start
    peak = _status("VmHWM") - base
    timings = pruner.timings_
    # The phases run in this order; the gradient phase's span includes the unit order.
    spans, edge = {}, start
    for phase in PHASES:
        length = timings.get(phase, 0.0) + (timings.get("unit_order", 0.0) if phase == "gradients" else 0.0)
        spans[phase] = (edge, edge + length)
        edge += length
    phase_peaks = {phase: max((rss - base for t, rss in samples if a <= t <= b), default=None)
                   for phase, (a, b) in spans.items()}
    return {"shape": spec["shape"], "preset": spec["preset"], "max_memory": spec["max_memory"], "wall_seconds": wall,
            "phases": timings, "peak_bytes": peak, "phase_peak_bytes": phase_peaks,
            "plan": ranking.provenance["memory_plan"],
            "tokens": (config.image_size // config.patch_size) ** 2 + 1,
            "head_scores": ranking.head_scores.tolist(), "neuron_scores": ranking.neuron_scores.tolist(),
            "orders": [[h.tolist(), n.tolist()] for h, n in ranking.orders()]}


def _warm_up(preset: str, images: list) -> None:
    """A tiny ranking of the same preset first: the modules it imports and the kernels' first-use buffers are the
    process's, not the measured ranking's."""
    import gc

    import transformers

    import hf_snapvit

    config = transformers.ViTConfig(**MEMORY_SHAPES["tiny"])
    processor = transformers.ViTImageProcessor(size={"height": config.image_size, "width": config.image_size})
    settings = hf_snapvit.SnapViTConfig.preset(preset, num_gradient_images=2, num_fitness_images=2, max_generations=1,
                                               precision="fp32")
    hf_snapvit.SnapViTPruner(settings).fit(transformers.ViTModel(config, add_pooling_layer=False).eval(), images[:4],
                                           processor=processor, show_progress=False)
    gc.collect()


def _run_child(spec: dict[str, Any]) -> dict[str, Any]:
    # Large blocks come from mmap and go back to the system when freed, so that the resident memory follows what
    # is alive rather than what glibc's heap keeps.
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1",
           "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the child ranking {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _equal(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, float]:
    import numpy as np

    worst = 0.0
    for key in ("head_scores", "neuron_scores"):
        x, y = np.asarray(a[key]), np.asarray(b[key])
        worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300))))
    return worst <= 1e-6 and a["orders"] == b["orders"], worst


def compare(shape: str, preset: str, args: argparse.Namespace) -> dict[str, Any]:
    """The unbudgeted and the quarter-budget rankings of one shape and preset, and the checks between them."""
    spec = dict(shape=shape, preset=preset, images=args.images, generations=args.generations, seed=args.seed,
                max_memory=None)
    free = _run_child(spec)
    # What the plan counts as held whatever the batch (weights, pixels, sums), and a quarter of the rest of the
    # unbudgeted peak, the activations; at least one image per part (the smallest shapes).
    phases = ("gradient", "search", "correction")
    fixed = max(free["plan"][p]["fixed"] for p in phases)
    smallest = max(free["plan"][p]["fixed"] + free["plan"][p]["per_image"] for p in phases)
    share = args.budget_of_peak
    wanted = fixed + (free["peak_bytes"] - fixed) // 4 if share is None else int(share * free["peak_bytes"])
    budget = max(wanted, smallest)
    budgeted = _run_child({**spec, "max_memory": budget})
    same, worst = _equal(budgeted, free)
    row = {"shape": shape, "config": MEMORY_SHAPES[shape], "tokens": free["tokens"], "preset": preset,
           "budget_bytes": budget, "budget_rule": "fixed + (peak - fixed) / 4" if share is None else f"{share} x peak",
           "planned_fixed_bytes": fixed, "budget_holds": budgeted["peak_bytes"] <= budget * (1 + TOLERANCE),
           "same_ranking": same, "max_relative_score_difference": worst,
           "budgeted_over_unbudgeted_peak": budgeted["peak_bytes"] / free["peak_bytes"]}
    for name, run in (("unbudgeted", free), ("budgeted", budgeted)):
        row[name] = {k: run[k] for k in ("wall_seconds", "phases", "peak_bytes", "phase_peak_bytes")}
        row[name]["micro_batches"] = {p: run["plan"][p]["batch"] for p in ("gradient", "search", "correction")}
        row[name]["estimated_peak_bytes"] = {p: run["plan"][p]["peak"] for p in ("gradient", "search", "correction")}
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as the markdown table of ``docs/results.md``."""
    mib = 2**20
    lines = ["| shape | tokens | preset | peak MiB (gradients / search) | s (gradients / search) | budget MiB | "
             "budgeted peak MiB (gradients / search) | s (gradients / search) | images per gradient part | holds | "
             "same ranking |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for name in ("unbudgeted", "budgeted"):
            run, peaks = r[name], r[name]["phase_peak_bytes"]
            phases = run["phases"]
            cells.append(f"{run['peak_bytes'] / mib:.1f} ({(peaks['gradients'] or 0) / mib:.1f} / "
                         f"{(peaks['search'] or 0) / mib:.1f})")
            cells.append(f"{phases['gradients'] + phases.get('unit_order', 0):.1f} / {phases['search']:.1f}")
        c = r["config"]
        shape = f"{c['hidden_size']} x {c['num_hidden_layers']} blocks, {c['image_size']} px"
        lines.append(f"| {shape} | {r['tokens']} | {r['preset']} | {cells[0]} | {cells[1]} | "
                     f"{r['budget_bytes'] / mib:.1f} | {cells[2]} | {cells[3]} | "
                     f"{r['budgeted']['micro_batches']['gradient']} | {'yes' if r['budget_holds'] else 'NO'} | "
                     f"{'yes' if r['same_ranking'] else 'NO'} |")
    return "\n".join(lines)


def run(args: argparse.Namespace, output: Path, report: dict[str, Any], write_json) -> int:
    """Every shape and preset of ``args``; the report gains ``memory_rows`` and ``memory_checks``."""
    report["memory_rows"] = []
    for shape in args.memory_shapes:
        for preset in args.presets:
            row = compare(shape, preset, args)
            report["memory_rows"].append(row)
            print(f"{shape:>14} {preset:>7}: peak {row['unbudgeted']['peak_bytes'] / 2**20:7.1f} MiB, budget "
                  f"{row['budget_bytes'] / 2**20:6.1f} MiB -> {row['budgeted']['peak_bytes'] / 2**20:6.1f} MiB "
                  f"(holds: {row['budget_holds']}, same ranking: {row['same_ranking']}), "
                  f"{row['unbudgeted']['wall_seconds']:.1f} s -> {row['budgeted']['wall_seconds']:.1f} s",
                  file=sys.stderr, flush=True)
            write_json(output, report)
    rows = report["memory_rows"]
    report["memory_checks"] = {"budgets_hold": all(r["budget_holds"] for r in rows),
                               "rankings_equal": all(r["same_ranking"] for r in rows)}
    write_json(output, report)
    print(table(rows))
    print(json.dumps(report["memory_checks"]))
    print(f"wrote {output}")
    return 0 if all(report["memory_checks"].values()) else 1


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    print(json.dumps(child(json.loads(sys.argv[2]))))
