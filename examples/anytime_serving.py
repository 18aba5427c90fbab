"""Anytime serving: one resident switchable ViT picks its size per batch so that each batch meets its deadline.

A stream of batches arrives at a rate that changes over time (seeded: calm -> burst -> calm). Every batch has the
same deadline, counted from its arrival; the time a batch waits for the previous one to finish (queueing delay)
eats into it. The script:

1. makes an elastic checkpoint (the shared ViT-Tiny ranked by weight magnitude, into a temporary folder; ``--tiny``:
   a 2-block random ViT built in code, seconds; ``--checkpoint DIR``: yours),
2. loads it once with ``ElasticViTModel.from_pretrained(dir, switchable=True)``,
3. measures a latency table at the serving batch size with ``hf_snapvit.measure_latency`` (the default deadline is
   ``--deadline-fraction`` x the dense latency it predicts),
4. serves the stream on a simulated clock: before each batch, ``model.set_budget(latency_ms=deadline - queueing
   delay, batch_size=B)`` picks the largest size predicted to fit (the smallest size when none fits, counted as a
   fallback), then the forward pass really runs and its measured time moves the clock (``--headroom 0.9`` asks for
   90% of the time left instead: the table holds median latencies, so a size that just fits runs over half the time),
5. serves the same stream with one fixed size (the same model at ``--fixed-sparsity``, default 0: dense),

and prints batches, throughput, deadline misses, mean sparsity and p50/p95 end-to-end latency (queueing +
inference) of both runs, and misses and sparsity per phase. Arrival rates are set relative to the measured dense
latency (``--calm-load 0.5``: one batch per two dense forward passes; ``--burst-load 1.5``), so the stream stresses
the model the same way on any machine. Images are random pixels: latency does not depend on them.

    python examples/anytime_serving.py                              # shared ViT-Tiny, batch 8: under 1 min on 2 CPUs
    python examples/anytime_serving.py --tiny --num-batches 20      # seconds
    python examples/anytime_serving.py --checkpoint vit-tiny-elastic --deadline-ms 120 --output serving.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import transformers
from huggingface_hub.utils import tqdm

import hf_snapvit

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
# (name, share of the batches, which load option sets its arrival rate)
PHASES = (("calm-1", 0.3, "calm_load"), ("burst", 0.4, "burst_load"), ("calm-2", 0.3, "calm_load"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--checkpoint", default=None, help="an elastic checkpoint folder or Hub id (default: make "
                        "one)")
    source.add_argument("--tiny", action="store_true", help="a 2-block random ViT built in code (for tests)")
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"),
                        help="dense model ranked into the checkpoint when none is given")
    parser.add_argument("--batch-size", type=int, default=8, help="images per batch (default: %(default)s)")
    parser.add_argument("--num-batches", type=int, default=100, help="batches in the stream (default: %(default)s)")
    deadline = parser.add_mutually_exclusive_group()
    deadline.add_argument("--deadline-ms", type=float, default=None, help="per-batch deadline from arrival, in ms")
    deadline.add_argument("--deadline-fraction", type=float, default=0.8,
                          help="deadline = this x the dense latency the table predicts (default: %(default)s)")
    parser.add_argument("--headroom", type=float, default=1.0, help="ask set_budget for this fraction of the time "
                        "left (the table holds medians, so 1.0 runs over about half the time; default: %(default)s)")
    parser.add_argument("--fixed-sparsity", type=float, default=0.0, help="size of the fixed model (default: dense)")
    parser.add_argument("--calm-load", type=float, default=0.5, help="arrival rate in calm phases, in batches per "
                        "dense forward pass (default: %(default)s)")
    parser.add_argument("--burst-load", type=float, default=1.5,
                        help="arrival rate in the burst (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the arrival times (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds of the latency table")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes per size before the table")
    parser.add_argument("--device", default="cpu", help="where the model runs (default: %(default)s)")
    parser.add_argument("--output", default=None, metavar="FILE.json", help="write the results here")
    args = parser.parse_args(argv)
    for name in ("batch_size", "num_batches", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("deadline_ms", "deadline_fraction", "headroom", "calm_load", "burst_load"):
        value = getattr(args, name)
        if value is not None and not value > 0:  # also refuses NaN
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    return args


def tiny_vit() -> tuple[transformers.ViTForImageClassification, transformers.ViTImageProcessor]:
    """A seeded 2-block ViT classifier on 32 x 32 images, its weights moved off the init so ranks are distinct."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                                    image_size=32, patch_size=8, num_labels=5)
    model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model, transformers.ViTImageProcessor(size={"height": 32, "width": 32})


def make_checkpoint(args: argparse.Namespace, folder: Path) -> str:
    """The elastic checkpoint to serve: ``--checkpoint``, or a magnitude ranking of ``--model`` (``--tiny``: the tiny
    random ViT) saved into ``folder``."""
    if args.checkpoint is not None:
        return args.checkpoint
    if args.tiny:
        dense, processor = tiny_vit()
    else:
        dense = transformers.AutoModelForImageClassification.from_pretrained(args.model).eval()
        processor = transformers.AutoImageProcessor.from_pretrained(args.model)
    output = folder / "elastic"
    hf_snapvit.save_elastic(dense, hf_snapvit.rank(dense, method="magnitude"), output, image_processor=processor,
                            model_card=False)
    return str(output)


def arrival_times(num_batches: int, dense_ms: float, loads: dict[str, float], seed: int) -> list[tuple[float, str]]:
    """``(arrival ms, phase)`` of each batch: Poisson arrivals whose mean gap is ``dense_ms / load`` of the phase."""
    rng = np.random.default_rng(seed)
    counts = [round(share * num_batches) for _, share, _ in PHASES[:-1]]
    counts.append(num_batches - sum(counts))
    arrivals, clock = [], 0.0
    for (name, _, load), count in zip(PHASES, counts):
        for _ in range(count):
            clock += float(rng.exponential(dense_ms / loads[load]))
            arrivals.append((clock, name))
    return arrivals


def adaptive_policy(model: Any, batch_size: int, headroom: float) -> Callable[[float], tuple[Any, bool]]:
    """Before a batch with ``remaining`` ms left: the largest size the latency table says fits in ``headroom x
    remaining``, else the smallest size (``fallback=True``)."""
    smallest = model.max_sparsity()

    def choose(remaining: float) -> tuple[Any, bool]:
        if remaining > 0:
            try:
                return model.set_budget(latency_ms=headroom * remaining, batch_size=batch_size), False
            except hf_snapvit.BudgetError:  # even the smallest size measured is predicted to be too slow
                pass
        return model.set_budget(sparsity=smallest), True

    return choose


def fixed_policy(model: Any, sparsity: float) -> Callable[[float], tuple[Any, bool]]:
    """One size for every batch, set now (when the run starts)."""
    budget = model.set_budget(sparsity=sparsity)
    return lambda remaining: (budget, False)


def serve(model: Any, arrivals: list[tuple[float, str]], pixels: torch.Tensor, deadline_ms: float,
          choose: Callable[[float], tuple[Any, bool]], desc: str) -> list[dict[str, Any]]:
    """Serve the stream on a simulated clock: one batch at a time, in arrival order; the size is chosen when the
    server takes the batch, and the measured time of choosing plus the forward pass advances the clock."""
    records, free_at = [], 0.0
    for index, (arrival, phase) in enumerate(tqdm(arrivals, desc=desc, unit="batch")):
        start = max(arrival, free_at)
        queued = start - arrival
        if pixels.device.type == "cuda":
            torch.cuda.synchronize(pixels.device)
        began = time.perf_counter()
        _, fallback = choose(deadline_ms - queued)
        budget = model.elastic_budget  # the size this batch really runs at
        with torch.inference_mode():
            model(pixel_values=pixels)
        if pixels.device.type == "cuda":
            torch.cuda.synchronize(pixels.device)
        service = (time.perf_counter() - began) * 1e3
        free_at = start + service
        records.append({"batch": index, "phase": phase, "arrival_ms": arrival, "queued_ms": queued,
                        "service_ms": service, "latency_ms": queued + service, "finish_ms": free_at,
                        "sparsity": budget.sparsity, "gflops": budget.gflops, "fallback": fallback,
                        "predicted_ms": budget.predicted_latency_ms, "missed": queued + service > deadline_ms})
    return records


def summarize(records: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """Batches, throughput, misses, fallbacks, mean sparsity and latency percentiles of one run, overall and per
    phase."""
    latency = np.array([r["latency_ms"] for r in records])
    makespan_s = (records[-1]["finish_ms"] - records[0]["arrival_ms"]) / 1e3
    misses = sum(r["missed"] for r in records)
    phases = {}
    for name, _, _ in PHASES:
        rows = [r for r in records if r["phase"] == name]
        if rows:
            phases[name] = {"batches": len(rows), "misses": sum(r["missed"] for r in rows),
                            "mean_sparsity": float(np.mean([r["sparsity"] for r in rows]))}
    return {"batches": len(records), "images": len(records) * batch_size,
            "throughput_images_per_s": len(records) * batch_size / makespan_s,
            "capacity_images_per_s": len(records) * batch_size / (sum(r["service_ms"] for r in records) / 1e3),
            "misses": misses, "miss_rate": misses / len(records),
            "fallbacks": sum(r["fallback"] for r in records),
            "mean_sparsity": float(np.mean([r["sparsity"] for r in records])),
            "mean_gflops_per_image": float(np.mean([r["gflops"] for r in records])),
            "p50_latency_ms": float(np.percentile(latency, 50)), "p95_latency_ms": float(np.percentile(latency, 95)),
            "mean_service_ms": float(np.mean([r["service_ms"] for r in records])), "phases": phases}


def format_results(results: dict[str, Any]) -> str:
    """The comparison table and the per-phase table."""
    runs = results["runs"]
    labels = {"switchable": "switchable (set_budget per batch)",
              "fixed": f"fixed (sparsity {results['fixed_sparsity']:.2f})"}
    lines = [f"deadline {results['deadline_ms']:.1f} ms per batch of {results['batch_size']} (table: dense "
             f"{results['dense_latency_ms']:.1f} ms, smallest {results['smallest_latency_ms']:.1f} ms at sparsity "
             f"{results['max_sparsity']:.2f}); device {results['table']['device']}", "",
             f"{'model':<34} {'batches':>7} {'images/s':>9} {'capacity':>9} {'misses':>14} {'fallbacks':>9} "
             f"{'mean sparsity':>13} {'p50 ms':>8} {'p95 ms':>8}"]
    for key, label in labels.items():
        s = runs[key]["summary"]
        misses = f"{s['misses']} ({s['miss_rate']:.1%})"
        lines.append(f"{label:<34} {s['batches']:>7} {s['throughput_images_per_s']:>9.1f} "
                     f"{s['capacity_images_per_s']:>9.1f} {misses:>14} "
                     f"{s['fallbacks']:>9} {s['mean_sparsity']:>13.3f} {s['p50_latency_ms']:>8.1f} "
                     f"{s['p95_latency_ms']:>8.1f}")
    names = list(runs["switchable"]["summary"]["phases"])
    lines += ["(images/s: served over the stream's span; capacity: per second of compute, busy time only)", "",
              f"{'per phase: misses / mean sparsity':<34} " + " ".join(f"{n:>16}" for n in names)]
    for key, label in labels.items():
        phases = runs[key]["summary"]["phases"]
        cells = [f"{p['misses']}/{p['batches']} / {p['mean_sparsity']:.2f}" for p in (phases[n] for n in names)]
        lines.append(f"{label:<34} " + " ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def simulate(args: argparse.Namespace, checkpoint: str) -> dict[str, Any]:
    """Load ``checkpoint`` switchable, measure its latency table, serve the stream adaptively and at a fixed size."""
    model = hf_snapvit.ElasticViTModel.from_pretrained(checkpoint, switchable=True, device_map=args.device).eval()
    if not 0.0 <= args.fixed_sparsity <= model.max_sparsity():
        raise SystemExit(f"error: --fixed-sparsity {args.fixed_sparsity} is outside [0, {model.max_sparsity():.3f}]")
    table = hf_snapvit.measure_latency(model, batch_size=args.batch_size, repeats=args.repeats, warmup=args.warmup)
    dense_ms = table.latency_at(0.0)
    deadline_ms = args.deadline_ms if args.deadline_ms is not None else args.deadline_fraction * dense_ms
    config = model.config
    pixels = torch.randn(args.batch_size, config.num_channels, config.image_size, config.image_size,
                         generator=torch.Generator().manual_seed(args.seed)).to(model.device, model.dtype)
    arrivals = arrival_times(args.num_batches, dense_ms, {"calm_load": args.calm_load,
                                                          "burst_load": args.burst_load}, args.seed)
    runs = {}
    policies = {"switchable": lambda: adaptive_policy(model, args.batch_size, args.headroom),
                "fixed": lambda: fixed_policy(model, args.fixed_sparsity)}
    for name, policy in policies.items():  # each policy sets the model's size when its run starts
        records = serve(model, arrivals, pixels, deadline_ms, policy(), desc=name)
        runs[name] = {"summary": summarize(records, args.batch_size), "batches": records}
    return {"checkpoint": "tiny random ViT" if args.tiny else Path(args.checkpoint or args.model).name,
            "batch_size": args.batch_size, "deadline_ms": deadline_ms, "dense_latency_ms": dense_ms,
            "smallest_latency_ms": table.latency_at(table.sparsities[-1]), "max_sparsity": model.max_sparsity(),
            "fixed_sparsity": args.fixed_sparsity, "settings": vars(args), "table": table.to_dict(), "runs": runs}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the simulation; print the comparison and return the results (also written to ``--output``)."""
    args = parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars
    with tempfile.TemporaryDirectory() as tmp:
        results = simulate(args, make_checkpoint(args, Path(tmp)))
    print(format_results(results))
    if args.output is not None:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return results


if __name__ == "__main__":
    main()
