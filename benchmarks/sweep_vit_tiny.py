"""Sweep the shared ViT-Tiny (Tiny-ImageNet-200): every ranking method x sparsity, evaluated and timed.

For each method the dense model is ranked on unlabelled train images (``hf_snapvit.rank``, whose provenance
records the ranking wall time and SnapViT's per-phase times), or a saved elastic checkpoint is reused with
``--ranking NAME=PATH``. Every sparsity is then evaluated on a seeded subset of the validation split: top-1 with the
model's head, k-NN (k = 20, L2-normalised final-norm CLS features, a seeded subset of the train split as the memory
bank), the linear probe (trained on the bank, epoch chosen on 20 % of it) and representation retention; each sliced
model is also timed against the dense one (interleaved, random input). ``hf_snapvit.evaluation.run_sweep`` writes
``sweep.json``, ``sweep.csv`` and the plots to ``--output-dir``.

    python benchmarks/sweep_vit_tiny.py --methods snapvit snip taylor-ce lamp magnitude random
    python benchmarks/sweep_vit_tiny.py --methods magnitude random lamp \
        --ranking snapvit=PATH/TO/vit-tiny-elastic-snapvit --num-val 300 --num-bank 1000 \
        --output-dir benchmarks/results/sweep_vit_tiny_small

A ``<PATH>.fit.json`` file next to a ``--ranking`` checkpoint (``{"timings": {...}}``, as written by the script that
made it) supplies that ranking's phase times; the wall time is then their sum.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local

import torch  # noqa: E402
import transformers  # noqa: E402

from hf_snapvit.evaluation import LinearProbeConfig, sweep_from_paths  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"),
                        help="folder with train.parquet and validation.parquet")
    parser.add_argument("--methods", nargs="*",
                        default=["snapvit", "snip", "taylor-ce", "lamp", "magnitude", "random"],
                        help="methods to rank with now (hf_snapvit.available_methods())")
    parser.add_argument("--ranking", action="append", default=[], metavar="NAME=PATH",
                        help="reuse the ranking of a saved elastic checkpoint under NAME (repeatable)")
    parser.add_argument("--preset", default="fast", help="SnapViT preset (and the gradient baselines' images)")
    parser.add_argument("--mode", default=None, choices=["global", "paired"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width-multiple", type=int, default=None,
                        help="round kept FFN widths to multiples of this (default: the library's, 64 here; 1: exact "
                             "widths, as the stored results were measured)")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--num-val", type=int, default=1000, help="validation images evaluated on (seeded subset)")
    parser.add_argument("--num-bank", type=int, default=2000, help="train images in the k-NN / probe bank")
    parser.add_argument("--metrics", nargs="+", default=None, choices=["top1", "knn", "linear", "retention"])
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--probe-epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    parser.add_argument("--latency-batch-size", type=int, default=8)
    parser.add_argument("--latency-repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the whole run (default 1: multi-threaded timings on small shared "
                             "VMs are bimodal); 0 = torch's default")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "benchmarks" / "results" / "sweep_vit_tiny")
    args = parser.parse_args(argv)
    for item in args.ranking:
        if "=" not in item:
            parser.error(f"--ranking {item!r}: expected NAME=PATH")
    if not args.methods and not args.ranking:
        parser.error("give --methods and/or --ranking")
    return args


def saved_ranking_info(path: str) -> dict:
    """Phase times recorded next to a saved checkpoint, if any."""
    fit = Path(str(path).rstrip("/") + ".fit.json")
    if not fit.is_file():
        return {"wall_seconds": None, "phases": {}, "note": "ranking time not recorded with the checkpoint"}
    timings = {k: v for k, v in json.loads(fit.read_text()).get("timings", {}).items() if isinstance(v, (int, float))}
    wall = sum(v for k, v in timings.items() if k != "search_forward")  # search_forward is part of search
    return {"wall_seconds": wall, "phases": timings, "timings_file": str(fit)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoints, info = {}, {}
    for item in args.ranking:
        name, path = item.split("=", 1)
        checkpoints[name], info[name] = path, saved_ranking_info(path)
    result = sweep_from_paths(
        args.model, args.data, output_dir=args.output_dir, methods=args.methods, checkpoints=checkpoints,
        sparsities=args.sparsities, num_eval=args.num_val, num_bank=args.num_bank, preset=args.preset, seed=args.seed,
        mode=args.mode, ranking_info=info, metrics=args.metrics, k=args.k,
        probe=LinearProbeConfig(epochs=args.probe_epochs, seed=args.seed), batch_size=args.batch_size,
        latency=not args.no_latency, latency_batch_size=args.latency_batch_size,
        latency_repeats=args.latency_repeats, width_multiple=args.width_multiple)
    for method, entry in result.methods.items():
        seconds = entry.get("ranking_seconds")
        print(f"{method}: ranking {'-' if seconds is None else f'{seconds:.1f} s'} {entry.get('phases') or ''}")
    print(result.to_markdown(("top1", "knn_top1", "linear_top1", "retention")))
    if not args.no_latency:
        print("\nspeedup over dense (measured / GFLOP ratio), batch", args.latency_batch_size)
        for row in result.rows:
            print(f"  {row['method']:>10} s={row['sparsity']:.3f}: {row['speedup']:.2f} / "
                  f"{row['theoretical_speedup']:.2f}")
    print(f"wrote {', '.join(sorted(result.files.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
