"""Benchmark: load time, load memory and forward latency of ElasticViTModel at several sparsities.

What it measures
----------------
1. Builds a ViT-B/16-shaped ``transformers.ViTModel`` from ``ViTConfig()`` defaults (hidden 768, 12 blocks, 12 heads,
   MLP 3072, 224 px) with seeded random weights, ranks it with ``hf_snapvit.rank(model, method="magnitude")`` and
   writes an elastic checkpoint with ``hf_snapvit.save_elastic`` (into a temporary folder, or ``--workdir``).
2. For every sparsity (``--sparsities``, default 0 0.1 ... 0.6) ``hf_snapvit.benchmark.measure_loading`` starts a
   FRESH Python subprocess, so that memory readings of one load do not leak into the next, and measures there:

   * load time of ``ElasticViTModel.from_pretrained(dir, sparsity=s)`` -- the first load in the process ("fresh";
     modules it needs are imported beforehand, so the time is not an import time), and the median of
     ``--warm-loads`` further loads in the same process ("warm");
   * memory of the fresh load, from ``/proc/self/status``: peak RSS growth (``VmHWM`` after the load minus ``VmRSS``
     right before it; the high-water mark is reset via ``/proc/self/clear_refs`` first where the kernel allows),
     anonymous-memory growth (``RssAnon`` after minus before) and the peak ``RssAnon`` growth seen by a background
     thread polling every ``--poll-ms`` during the load. safetensors files are memory-mapped, so file-backed page
     cache pages inflate RSS; ``RssAnon`` is the memory the process really owns;
   * the resident footprint once the weights are used: ``VmRSS`` / ``RssAnon`` growth after the load plus one
     batch-1 forward pass. Both loaders hand out tensors that view the memory-mapped file, so pages only become
     resident when a forward pass touches them; the numbers right after the load do not include the weights;
   * forward latency under ``torch.inference_mode()`` with a fixed ``torch.set_num_threads`` (``--threads``, default
     1, recorded): ``--warmup`` untimed runs, then the median of ``--repeats`` timed runs, for every
     ``--batch-sizes`` entry. One thread is the default because multi-threaded latency on small shared VMs can be
     bimodal (one busy vCPU stalls the OpenMP team); use ``--threads 0`` for all available CPUs.

   The same is measured for the dense model loaded by stock ``transformers.ViTModel.from_pretrained(dir)``.
3. Prints a table and writes JSON (``--output``) with the hardware, and per sparsity the actual sparsity, backbone
   parameters, theoretical GFLOPs, load time, memory and latency, each also as a ratio to the dense elastic load
   (sparsity 0) of the same run, plus the stock-transformers dense load for reference.

The checkpoint is read from the OS page cache (it was just written), so load times are not cold-disk times. The
numbers are measurements, not pass/fail checks: nothing here asserts on timing.

How to run (about 3-4 minutes on a 2-core CPU with the defaults)::

    python benchmarks/bench_elastic_load.py
    python benchmarks/bench_elastic_load.py --sparsities 0 0.3 0.6 --batch-sizes 1 --repeats 10 --threads 4
    python benchmarks/bench_elastic_load.py --load-repeats 3 --output /tmp/elastic_load.json

``--load-repeats N`` runs N fresh processes per configuration (the first also times the forward pass) and reports
the median load time and memory across them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Quiet transformers before it is imported (here and in every child process).
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never touch the network

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "elastic_load.json"
DEFAULT_SPARSITIES = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]

# The measurement code lives in hf_snapvit.benchmark (also used by `hf-snapvit bench`); this script builds the
# ViT-B/16-shaped checkpoint, runs it and prints the tables.
from hf_snapvit.benchmark import MIB, hardware_info, measure_loading  # noqa: E402
from hf_snapvit.files import public_name, write_text_atomic  # noqa: E402


def build_checkpoint(directory: Path, seed: int) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import ViTConfig, ViTModel

    import hf_snapvit

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    timings = {}
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    config = ViTConfig()
    model = ViTModel(config).eval()
    timings["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ranking = hf_snapvit.rank(model, method="magnitude", seed=seed)
    timings["rank_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf_snapvit.save_elastic(model, ranking, directory, model_card=False)  # the checkpoint alone, as measured
    timings["save_s"] = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    info = {
        "path": public_name(directory),
        "files": sorted(p.name for p in directory.iterdir()),
        "size_bytes": size,
        "seed": seed,
        "ranking_method": "magnitude",
        "config": {
            k: getattr(config, k)
            for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                      "patch_size")
        },
        "dense_params_total": sum(p.numel() for p in model.parameters()),
        **timings,
    }
    del model, ranking
    gc.collect()
    return info


def _fmt(value: Any, spec: str, width: int) -> str:
    if value is None:
        return "-".rjust(width)
    return format(value, spec).rjust(width)


def print_tables(rows: list[dict[str, Any]], batch_sizes: list[int], threads: int) -> None:
    def label(row):
        if row["kind"] == "stock":
            return "stock ViTModel"
        return f"elastic s={row['requested_sparsity']:.2f}"

    def mib(value):
        return None if value is None else value / MIB

    lat_heads = "".join(f"{'b' + str(b) + ' ms':>9}" for b in batch_sizes)
    header = (f"{'model':<17}{'act.sp':>7}{'params M':>9}{'GFLOPs':>7}{'load s':>7}{'warm s':>7}"
              f"{'anonΔ':>7}{'anonPk':>7}{'HWMΔ':>7}{'fwdRSSΔ':>8}{'fwdAnonΔ':>9}{lat_heads}")
    print(f"\nAbsolute (torch threads = {threads}; memory in MiB)")
    print("  load s = first load in a fresh process; warm s = median reload in that process")
    print("  anonΔ / anonPk / HWMΔ = RssAnon growth, polled RssAnon peak growth, VmHWM - VmRSS-before, "
          "over the load")
    print("  fwdRSSΔ / fwdAnonΔ = VmRSS / RssAnon growth after the load plus one batch-1 forward "
          "(mmap pages touched)")
    print("  latency = median forward time")
    print(header)
    print("-" * len(header))
    for row in rows:
        if "error" in row:
            print(f"{label(row):<17}  ERROR: {row['error'].strip().splitlines()[-1] if row['error'].strip() else ''}")
            continue
        mem = row["memory"]
        lat = "".join(_fmt((row["latency"].get(str(b)) or {}).get("median_ms"), ".0f", 9) for b in batch_sizes)
        print(f"{label(row):<17}{_fmt(row.get('actual_sparsity'), '.3f', 7)}"
              f"{_fmt(row['model']['backbone_params'] / 1e6, '.2f', 9)}{_fmt(row['model']['gflops'], '.2f', 7)}"
              f"{_fmt(row['load_s'], '.3f', 7)}{_fmt(row['warm_load_s'], '.3f', 7)}"
              f"{_fmt(mib(mem['anon_growth']), '.1f', 7)}{_fmt(mib(mem['peak_anon_growth']), '.1f', 7)}"
              f"{_fmt(mib(mem['peak_rss_growth']), '.1f', 7)}{_fmt(mib(mem.get('fwd_rss_growth')), '.1f', 8)}"
              f"{_fmt(mib(mem.get('fwd_anon_growth')), '.1f', 9)}{lat}")

    lat_heads = "".join(f"{'b' + str(b):>7}" for b in batch_sizes)
    header = (f"{'model':<17}{'params':>7}{'GFLOPs':>7}{'load':>7}{'warm':>7}{'anonΔ':>7}{'anonPk':>7}"
              f"{'HWMΔ':>7}{'fwdRSSΔ':>8}{'fwdAnonΔ':>9}{lat_heads}")
    print("\nRatios to the dense elastic load (elastic s=0.00) of this run")
    print(header)
    print("-" * len(header))
    for row in rows:
        r = row.get("ratios_to_elastic_dense")
        if r is None:
            continue
        lat = "".join(_fmt(r.get(f"latency_b{b}"), ".2f", 7) for b in batch_sizes)
        print(f"{label(row):<17}{_fmt(r['backbone_params'], '.3f', 7)}{_fmt(r['gflops'], '.3f', 7)}"
              f"{_fmt(r['load_s'], '.2f', 7)}{_fmt(r['warm_load_s'], '.2f', 7)}{_fmt(r['anon_growth'], '.2f', 7)}"
              f"{_fmt(r['peak_anon_growth'], '.2f', 7)}{_fmt(r['peak_rss_growth'], '.2f', 7)}"
              f"{_fmt(r['fwd_rss_growth'], '.2f', 8)}{_fmt(r['fwd_anon_growth'], '.2f', 9)}{lat}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for what each number means.",
    )
    parser.add_argument("--sparsities", type=float, nargs="+", default=DEFAULT_SPARSITIES,
                        help="sparsities to load (0 is always added: it is the reference). Default: 0 0.1 ... 0.6")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], help="forward batch sizes (default 1 8)")
    parser.add_argument("--repeats", type=int, default=5, help="timed forward runs per batch size (median reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed forward runs per batch size before timing")
    parser.add_argument("--load-repeats", type=int, default=1,
                        help="fresh processes per configuration; load time and memory are their median (default 1)")
    parser.add_argument("--warm-loads", type=int, default=3,
                        help="extra loads in the same process after the fresh one, for the warm load time")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads (and OMP/MKL_NUM_THREADS) in every child; default 1, the most "
                             "reproducible setting on shared or small machines. 0 = all CPUs available")
    parser.add_argument("--poll-ms", type=float, default=2.0,
                        help="RssAnon polling interval during the fresh load, in ms (0 disables polling)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights, ranking and inputs")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="folder for the elastic checkpoint (kept); default: a temporary folder, deleted")
    parser.add_argument("--no-stock", action="store_true", help="skip the stock transformers dense load")
    parser.add_argument("--child-timeout", type=float, default=600.0, help="seconds before a child is abandoned")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help=f"JSON output (default {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    for name in ("repeats", "load_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.warm_loads < 0:
        parser.error("--warmup and --warm-loads must be >= 0")
    if any(not 0.0 <= s < 1.0 for s in args.sparsities):
        parser.error("--sparsities must lie in [0, 1)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads < 0:
        raise SystemExit("--threads must be >= 0")
    if args.threads == 0:
        try:
            args.threads = len(os.sched_getaffinity(0))
        except AttributeError:
            args.threads = os.cpu_count() or 1
    sparsities = sorted({0.0, *(round(s, 6) for s in args.sparsities)})
    started = time.perf_counter()

    import torch

    torch.set_num_threads(args.threads)
    hardware = hardware_info(args.threads)
    print(f"CPU: {hardware['cpu_model'] or hardware['processor']} | {hardware['cpu_count']} CPUs | "
          f"torch {hardware['torch']} ({args.threads} threads) | transformers {hardware['transformers']}")

    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-elastic-load-")
        workdir = Path(tmp.name)
    else:
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    try:
        checkpoint_dir = workdir / "vit-b16-elastic"
        print(f"Building ViT-B/16 (random, seed {args.seed}), ranking (magnitude), saving to {checkpoint_dir} ...")
        checkpoint = build_checkpoint(checkpoint_dir, args.seed)
        print(f"  build {checkpoint['build_s']:.1f} s, rank {checkpoint['rank_s']:.1f} s, "
              f"save {checkpoint['save_s']:.1f} s, {checkpoint['size_bytes'] / MIB:.0f} MiB on disk")

        loading = measure_loading(
            checkpoint_dir, sparsities, batch_sizes=args.batch_sizes, repeats=args.repeats, warmup=args.warmup,
            load_repeats=args.load_repeats, warm_loads=args.warm_loads, threads=args.threads, poll_ms=args.poll_ms,
            seed=args.seed, stock=not args.no_stock, timeout=args.child_timeout)
    finally:
        if tmp is not None:
            tmp.cleanup()

    rows = loading["results"] + ([loading["stock_dense"]] if loading["stock_dense"] is not None else [])
    print_tables(rows, args.batch_sizes, args.threads)

    report = {
        "benchmark": "elastic_load",
        "description": "ElasticViTModel.from_pretrained load time, load memory and forward latency per sparsity; "
                       "every configuration measured in a fresh subprocess. Ratios are to the dense elastic load "
                       "(sparsity 0) of this run. Memory in bytes, times in seconds unless the key says ms.",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [public_name(arg) for arg in (sys.executable, *sys.argv)],  # no local paths in results
        "settings": {
            "sparsities": sparsities, "batch_sizes": args.batch_sizes, "repeats": args.repeats,
            "warmup": args.warmup, "load_repeats": args.load_repeats, "warm_loads": args.warm_loads,
            "threads": args.threads, "poll_ms": args.poll_ms, "seed": args.seed,
            "inference_mode": True, "checkpoint_in_page_cache": True,
        },
        "hardware": hardware,
        "checkpoint": checkpoint,
        "reference": loading["reference"],
        "results": loading["results"],
        "stock_dense": loading["stock_dense"],
        "total_wall_s": time.perf_counter() - started,
    }
    write_text_atomic(args.output, json.dumps(report, indent=2))
    print(f"\nWrote {args.output} (total {report['total_wall_s']:.0f} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
