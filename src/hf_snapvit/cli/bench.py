"""``hf-snapvit bench``: latency, load time and memory of an elastic checkpoint at several sparsities."""

from __future__ import annotations

import argparse
from typing import Any

from .options import check_checkpoint_source, fraction, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``bench``."""
    parser.add_argument("checkpoint", metavar="ELASTIC", help="elastic checkpoint folder (or Hub id with --no-load)")
    parser.add_argument("--sparsities", type=fraction, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                        metavar="S", help="sparsities compared with the dense model")
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8, 32], metavar="B")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed rounds per batch size (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes per model and batch size")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default=None, help="device of the latency benchmark (default: cpu)")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency benchmark")
    parser.add_argument("--no-load", action="store_true", help="skip the load time / memory benchmark")
    parser.add_argument("--load-repeats", type=positive_int, default=1, help="fresh processes per load setting")
    parser.add_argument("--output", default=None, metavar="FILE.json", help="also write the report here")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark the checkpoint with :func:`hf_snapvit.benchmark.run_bench`."""
    from ..benchmark import run_bench

    check_checkpoint_source(args.checkpoint, "ELASTIC")
    return run_bench(args.checkpoint, sparsities=args.sparsities, batch_sizes=args.batch_sizes, repeats=args.repeats,
                     warmup=args.warmup, threads=args.threads, device=args.device, latency=not args.no_latency,
                     load=not args.no_load, load_repeats=args.load_repeats, output=args.output,
                     show_progress=not args.quiet)


def render(r: dict[str, Any]) -> str:
    """The result of :func:`run` as text."""
    from ..benchmark import format_latency_table

    hardware = r.get("hardware") or {}
    lines = [f"checkpoint: {r.get('checkpoint')}",
             "hardware:   " + ", ".join(f"{k} {v}" for k, v in hardware.items() if isinstance(v, (str, int, float)))]
    if r.get("latency"):
        lines += ["", "latency (interleaved with the dense model; x = speedup over dense):",
                  format_latency_table(r["latency"])]
    if r.get("loading"):
        lines += ["", f"{'sparsity':>8}  {'load s':>7}  {'x dense':>7}  {'memory x dense':>14}"]
        for row in r["loading"]["results"]:
            if "error" in row:
                lines.append(f"{row.get('requested_sparsity'):>8}  error: {' '.join(str(row['error']).split())}")
                continue
            ratios = row.get("ratios_to_elastic_dense") or {}
            memory = ratios.get("anon_growth")
            lines.append(f"{row['requested_sparsity']:>8.2f}  {row['load_s']:>7.3f}  {ratios.get('load_s') or 0:>7.2f}"
                         f"  {memory if memory is None else f'{memory:.2f}':>14}")
    return "\n".join(lines)
