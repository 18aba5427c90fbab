"""``hf-snapvit bench``: latency, load time and memory of an elastic checkpoint at several sparsities; with
``--latency-table``, the latency tables a switchable model's ``set_budget(latency_ms=...)`` reads."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import BenchmarkError
from .formatting import gflops
from .models import add_model_argument, model_config
from .options import add_width_multiple, fraction, positive_int

DEFAULT_SPARSITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
DTYPES = ("float32", "bfloat16", "float16")
# What "x" means in every table bench prints: how many times faster than the dense model (> 1 is faster).
SPEEDUP = "x = speedup, the dense model's time / this size's"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``bench``."""
    add_model_argument(parser, "ELASTIC", "elastic checkpoint folder (or Hub id, with --no-load or --latency-table)")
    parser.add_argument("--sparsities", type=fraction, nargs="+", default=None, metavar="S",
                        help="sparsities compared with the dense model (default: 0.1 to 0.6); with --latency-table "
                             "the grid measured, dense always included (default: 7 sizes from dense to the smallest)")
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 8, 32], metavar="B")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed rounds per batch size (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes per model and batch size")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default=None, help="device of the latency benchmark (default: cpu)")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency benchmark")
    parser.add_argument("--no-load", action="store_true", help="skip the load time / memory benchmark")
    parser.add_argument("--load-repeats", type=positive_int, default=1, help="fresh processes per load setting")
    parser.add_argument("--output", default=None, metavar="FILE.json",
                        help="also write the report here (with --latency-table: a valid elastic_latency.json holding "
                             "the checkpoint's tables and the new ones)")
    group = parser.add_argument_group("latency tables (instead of the benchmark above)")
    group.add_argument("--latency-table", action="store_true",
                       help="load the checkpoint switchable, time it at a grid of sizes per --batch-sizes value on "
                            "--device in --dtype, and write the tables to ELASTIC/elastic_latency.json (merged with "
                            "the tables there; a Hub id needs --output), where set_budget(latency_ms=...) finds them")
    group.add_argument("--dtype", choices=DTYPES, default=None,
                       help="dtype the tables are measured in (default: the checkpoint's, else float32)")
    add_width_multiple(group)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark the checkpoint with :func:`hf_snapvit.benchmark.run_bench`, or measure its latency tables."""
    model_config(args.model, "ELASTIC", elastic=True)
    if args.latency_table:
        return run_latency_tables(args)
    given = [option for option, value in (("--dtype", args.dtype), ("--width-multiple", args.width_multiple))
             if value is not None]
    if given:
        raise BenchmarkError(f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} only to "
                             "--latency-table (the benchmark runs the checkpoint in its own dtype, default widths).")
    from ..benchmark import run_bench

    return run_bench(args.model, sparsities=args.sparsities or DEFAULT_SPARSITIES, batch_sizes=args.batch_sizes,
                     repeats=args.repeats, warmup=args.warmup, threads=args.threads, device=args.device,
                     latency=not args.no_latency, load=not args.no_load, load_repeats=args.load_repeats,
                     output=args.output, show_progress=not args.quiet)


def _latency_settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(device, dtype)`` of ``--device`` and ``--dtype``, checked before anything is loaded."""
    import torch

    if args.no_latency:
        raise BenchmarkError("--latency-table measures latency; it cannot be combined with --no-latency.")
    if args.warmup < 0:
        raise BenchmarkError(f"--warmup {args.warmup} must be 0 or more.")
    try:
        device = torch.device(args.device or "cpu")
    except RuntimeError as error:
        raise BenchmarkError(f"--device {args.device!r} is not a device torch knows ({error}); e.g. cpu, cuda, "
                             "cuda:1.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchmarkError(f"--device {args.device!r}: torch sees no CUDA device here.")
    if not Path(args.model).expanduser().is_dir() and args.output is None:
        raise BenchmarkError(f"{args.model!r} is not a local folder, so the tables cannot be written beside it: "
                             "give --output FILE.json (upload it to the repo as elastic_latency.json), or download "
                             "the checkpoint first (huggingface_hub.snapshot_download).")
    return device, None if args.dtype is None else getattr(torch, args.dtype)


def run_latency_tables(args: argparse.Namespace) -> dict[str, Any]:
    """``bench --latency-table``: one :func:`hf_snapvit.measure_latency` table per batch size, written beside a
    local checkpoint (merged by key with the tables there) and to ``--output``."""
    import datetime
    import json
    import time

    import torch

    from ..utils.files import public_name, write_text_atomic
    from ..elastic.file_names import LATENCY_FILE
    from ..elastic.latency_file import FORMAT_VERSION, write_latency_file
    from ..loading.latency_table import measure_latency
    from ..loading.modeling import ElasticViTModel

    device, dtype = _latency_settings(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model = ElasticViTModel.from_pretrained(args.model, switchable=True, dtype=dtype, device_map=device).eval()
    grid = None if args.sparsities is None else sorted({0.0, *args.sparsities})
    measured = [measure_latency(model, batch_size=b, sparsities=grid, width_multiple=args.width_multiple,
                                repeats=args.repeats, warmup=args.warmup, show_progress=not args.quiet)
                for b in args.batch_sizes]
    local = Path(args.model).expanduser().is_dir()
    if local:
        tables = write_latency_file(measured, Path(args.model).expanduser())
    else:  # the Hub repo's own tables (loaded with the model), the new ones replacing those with the same key
        tables = model.elastic_latency_tables
    result: dict[str, Any] = {
        "benchmark": "hf_snapvit.measure_latency",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": public_name(args.model),
        "settings": {"batch_sizes": list(args.batch_sizes), "sparsities": grid, "repeats": args.repeats,
                     "warmup": args.warmup, "threads": torch.get_num_threads(), "device": str(device),
                     "dtype": measured[0].dtype, "width_multiple": args.width_multiple},
        "format": FORMAT_VERSION,
        "tables": [t.to_dict() for t in tables],
        "measured": [list(t.key()) for t in measured],
        "latency_file": f"{public_name(args.model)}/{LATENCY_FILE}" if local else None,
        "output": args.output,
        "total_wall_s": time.perf_counter() - started,
    }
    if not local:
        result["note"] = (f"{args.model} is not a local folder: the tables went to {args.output} only; upload it "
                          f"to the repo as {LATENCY_FILE} for from_pretrained(..., switchable=True) to find them.")
    if args.output is not None:
        write_text_atomic(args.output, json.dumps(result, indent=2) + "\n")
    return result


def render(r: dict[str, Any]) -> str:
    """The result of :func:`run` as text."""
    if "measured" in r:
        return _render_latency_tables(r)
    from ..benchmark import format_latency_table

    hardware = r.get("hardware") or {}
    lines = [f"checkpoint: {r.get('checkpoint')}",
             "hardware:   " + ", ".join(f"{k} {v}" for k, v in hardware.items() if isinstance(v, (str, int, float)))]
    if r.get("latency"):
        lines += ["", f"latency (interleaved with the dense model; {SPEEDUP}; theory = the GFLOPs' speedup):",
                  format_latency_table(r["latency"])]
    if r.get("loading"):
        lines += ["", f"load time and memory ({SPEEDUP}; memory: this size's resident memory growth / the dense "
                      "model's):", f"{'sparsity':>8}  {'load s':>7}  {'load x':>7}  {'memory':>7}"]
        for row in r["loading"]["results"]:
            if "error" in row:
                lines.append(f"{row.get('requested_sparsity'):>8}  error: {' '.join(str(row['error']).split())}")
                continue
            ratios = row.get("ratios_to_elastic_dense") or {}
            time_ratio, memory = ratios.get("load_s"), ratios.get("anon_growth")
            speedup = 1 / time_ratio if time_ratio else None  # the report keeps time / dense time
            lines.append(f"{row['requested_sparsity']:>8.2f}  {row['load_s']:>7.3f}  {_ratio(speedup):>7}  "
                         f"{_ratio(memory):>7}")
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _render_latency_tables(r: dict[str, Any]) -> str:
    """The tables measured now, one row per size and one latency column per batch size."""
    keys = [tuple(k) for k in r["measured"]]
    new = sorted((t for t in r["tables"] if (t["device"], t["dtype"], t["batch_size"], t["width_multiple"]) in keys),
                 key=lambda t: t["batch_size"])
    settings = r.get("settings") or {}
    lines = [f"checkpoint: {r.get('checkpoint')}"]
    for device, dtype, multiple in dict.fromkeys((t["device"], t["dtype"], t["width_multiple"]) for t in new):
        group = [t for t in new if (t["device"], t["dtype"], t["width_multiple"]) == (device, dtype, multiple)]
        sizes = {}  # sparsity -> GFLOPs, over every table of the group
        for t in group:
            sizes.update(zip(t["sparsities"], t["gflops"]))
        lines += ["", f"median latency of one forward pass, ms ({device}, {dtype}, width multiple {multiple}; "
                      f"{settings.get('repeats')} rounds, {settings.get('warmup')} warmup):",
                  f"{'sparsity':>8}  {'GFLOPs':>7}" + "".join(f"  {'batch %d' % t['batch_size']:>9}" for t in group)]
        for sparsity in sorted(sizes):
            cells = [dict(zip(t["sparsities"], t["latency_ms"])).get(sparsity) for t in group]
            lines.append(f"{sparsity:>8.3f}  {gflops(sizes[sparsity]):>7}"
                         + "".join(f"  {'-' if c is None else f'{c:.2f}':>9}" for c in cells))
    written = [w for w in (r.get("latency_file"), r.get("output")) if w]
    others = len(r["tables"]) - len(new)
    lines += ["", f"written to {' and '.join(map(str, written))}" + (f" ({len(r['tables'])} tables in all; {others} "
                                                                     "kept from before)" if others else "")]
    if r.get("note"):
        lines.append(r["note"])
    return "\n".join(lines)
