"""Benchmark: load time, load memory and forward latency of ElasticViTModel at several sparsities.

Builds a ViT-B/16-shaped ``transformers.ViTModel`` (``ViTConfig()`` defaults; ``--shape vit-l16``: ViT-L/16, 1.2 GB
in float32, the scale check of issue 65) with seeded random weights, ranks it
with ``magnitude`` and writes its elastic checkpoint into a temporary folder. ``hf_snapvit.benchmark.measure_loading``
then loads every sparsity (0 is always added: the reference of the ratios) and the dense model by stock transformers,
each in a FRESH Python process so the memory readings of one load do not leak into the next: the first load's time
and a median of warm reloads; anonymous-memory (``RssAnon``) growth and its peak polled every 2 ms (safetensors are
memory-mapped, so file-backed page cache would inflate RSS); the resident growth after one forward, which touches the
mapped weights; and the median forward latency per batch size under ``torch.inference_mode()`` with a fixed thread
count (1 by default: multi-threaded latency on small shared VMs can be bimodal; ``--threads 0`` uses every CPU).

The checkpoint is read from the page cache (it was just written), so load times are not cold-disk times. Nothing here
asserts on timing.

    python benchmarks/bench_elastic_load.py --load-repeats 2          # about 3-4 minutes per repeat on 2 cores
    python benchmarks/bench_elastic_load.py --shape vit-l16 --sparsities 0 0.3 0.5 --batch-sizes 1 --repeats 2 \
        --warm-loads 1 --no-stock --output benchmarks/results/bench_elastic_load/elastic_load_vit-l16.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# Quiet transformers before it is imported (here and in every child process); everything is local.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_snapvit  # noqa: E402
from _harness import RESULTS, timed, write_json  # noqa: E402
from hf_snapvit.benchmark import MIB, hardware_info, measure_loading  # noqa: E402
from hf_snapvit.utils.files import public_name  # noqa: E402

POLL_MS = 2.0
#: The model shapes to build (``ViTConfig`` overrides): ViT-B/16 (346 MB in float32) and ViT-L/16 (1.2 GB).
SHAPES: dict[str, dict[str, int]] = {
    "vit-b16": {},
    "vit-l16": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096},
}
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
              "patch_size")


def build_checkpoint(directory: Path, seed: int, shape: str = "vit-b16") -> dict[str, Any]:
    """The elastic checkpoint of a ``shape`` (:data:`SHAPES`) ViT in ``directory``, and what it is."""
    torch.manual_seed(seed)
    config = transformers.ViTConfig(**SHAPES[shape])
    model, build_s = timed(lambda: transformers.ViTModel(config).eval())
    ranking, rank_s = timed(lambda: hf_snapvit.rank(model, method="magnitude", seed=seed))
    save_s = timed(lambda: hf_snapvit.save_elastic(model, ranking, directory, model_card=False))[1]
    return {"path": public_name(directory), "files": sorted(p.name for p in directory.iterdir()),
            "size_bytes": sum(p.stat().st_size for p in directory.iterdir() if p.is_file()), "seed": seed,
            "ranking_method": "magnitude", "shape": shape, "config": {k: getattr(config, k) for k in SHAPE_KEYS},
            "dense_params_total": sum(p.numel() for p in model.parameters()),
            "build_s": build_s, "rank_s": rank_s, "save_s": save_s}


def print_table(rows: list[dict[str, Any]], batch_sizes: list[int]) -> None:
    """Load time, anonymous-memory growth and its peak, forward latency; the ratio to the dense elastic load after."""
    keys = [("load_s", "load s", 1), ("anon_growth", "anon MiB", MIB), ("peak_anon_growth", "peak MiB", MIB)]
    keys += [(f"latency_b{b}", f"b{b} ms", 1) for b in batch_sizes]
    print(f"{'model':<17}{'params M':>9}" + "".join(f"{title:>16}" for _, title, _ in keys))
    for row in rows:
        label = "stock ViTModel" if row["kind"] == "stock" else f"elastic s={row['requested_sparsity']:.2f}"
        if "error" in row:
            print(f"{label:<17}  ERROR: {row['error'].strip()[-200:]}")
            continue
        values = {"load_s": row["load_s"], **row["memory"],
                  **{f"latency_b{b}": (row["latency"].get(str(b)) or {}).get("median_ms") for b in batch_sizes}}
        ratios, cells = row.get("ratios_to_elastic_dense") or {}, []
        for key, _, scale in keys:
            text = "-" if values.get(key) is None else f"{values[key] / scale:.2f}"
            cells.append(text + ("" if ratios.get(key) is None else f" ({ratios[key]:.2f})"))
        print(f"{label:<17}{row['model']['backbone_params'] / 1e6:>9.2f}" + "".join(f"{c:>16}" for c in cells))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5, help="timed forward runs per batch size (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed forward runs per batch size")
    parser.add_argument("--load-repeats", type=int, default=1,
                        help="fresh processes per configuration; load time and memory are their median")
    parser.add_argument("--warm-loads", type=int, default=3, help="reloads in the first process (warm load time)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every child (0: every CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights, ranking and inputs")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="vit-b16", help="the ViT shape to build")
    parser.add_argument("--no-stock", action="store_true", help="skip the dense load by stock transformers")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_elastic_load" / "elastic_load.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.threads = args.threads or len(os.sched_getaffinity(0))
    sparsities = sorted({0.0, *(round(s, 6) for s in args.sparsities)})
    torch.set_num_threads(args.threads)
    hardware = hardware_info(args.threads)
    settings = {"sparsities": sparsities, "batch_sizes": args.batch_sizes, "repeats": args.repeats,
                "warmup": args.warmup, "load_repeats": args.load_repeats, "warm_loads": args.warm_loads,
                "threads": args.threads, "poll_ms": POLL_MS, "seed": args.seed, "inference_mode": True,
                "shape": args.shape, "stock": not args.no_stock,
                "checkpoint_in_page_cache": True}

    def run() -> tuple[dict, dict]:
        with tempfile.TemporaryDirectory(prefix="bench-elastic-load-") as tmp:
            folder = Path(tmp) / f"{args.shape}-elastic"
            checkpoint = build_checkpoint(folder, args.seed, args.shape)
            loading = measure_loading(folder, sparsities, batch_sizes=args.batch_sizes, stock=not args.no_stock,
                                      repeats=args.repeats, warmup=args.warmup, load_repeats=args.load_repeats,
                                      warm_loads=args.warm_loads, threads=args.threads, poll_ms=POLL_MS,
                                      seed=args.seed)
        return checkpoint, loading

    (checkpoint, loading), wall = timed(run)
    rows = loading["results"] + ([loading["stock_dense"]] if loading["stock_dense"] is not None else [])
    print_table(rows, args.batch_sizes)
    write_json(args.output, {
        "benchmark": "elastic_load",
        "description": "ElasticViTModel.from_pretrained load time, load memory and forward latency per sparsity; "
                       "every configuration measured in a fresh subprocess. Ratios are to the dense elastic load "
                       "(sparsity 0) of this run. Memory in bytes, times in seconds unless the key says ms.",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [public_name(arg) for arg in (sys.executable, *sys.argv)],  # no local paths in results
        "settings": settings, "hardware": hardware, "checkpoint": checkpoint, "reference": loading["reference"],
        "results": loading["results"], "stock_dense": loading["stock_dense"], "total_wall_s": wall}, indent=2)
    print(f"wrote {args.output} (total {wall:.0f} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
