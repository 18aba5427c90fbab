"""A 7 B ViT on one device (issue 65): ranked with SnapViT, saved elastic, loaded sliced; seconds and peak memory.

The model has the shape of DINOv3 ViT-7B/16 (hidden 4096, 40 blocks, 32 heads, SwiGLU FFN of 8192, patch 16, 4
register tokens) with seeded random weights, built on the device in the ranking's dtype (a ranking's time and memory
do not depend on the weights). It is ranked once (``bench_ranking_time.run_one``: wall time, phases, peak device
memory), with ``--max-memory-mib`` placed first by accelerate within that much of the device (the rest offloaded to
host memory, or to disk on a CPU: a model larger than its device), saved with ``save_elastic`` into ``--workdir``,
freed, and loaded at each ``--load-sparsities`` in a fresh process (``ElasticViTModel.from_pretrained(...,
device_map=<device>, dtype=<dtype>)``; ``--load-here``, for dry runs, loads in this process), which reports its load
time, the loaded parameters' bytes, its peak device memory (``torch.cuda.max_memory_allocated``) and the growth of its
host memory during the load: of its anonymous (process-owned) memory at the end, and of the kernel's peak resident
size ``VmHWM`` (reset before the load), which also counts the checkpoint pages it mapped.

    python benchmarks/big_vit.py --device cuda --shape dinov3-7b --images 64 --generations 1   # h100_checks step 25
    python benchmarks/big_vit.py --device cuda --shape dinov3-7b --max-memory-mib 8192 --images 64  # step 26
    python benchmarks/big_vit.py --device cpu --shape tiny --images 4 --generations 1          # the dry run (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

import bench_ranking_time  # noqa: E402
import hf_snapvit  # noqa: E402
from _harness import DTYPES, device_report, timed, write_json  # noqa: E402
from _harness import parser as harness_parser  # noqa: E402
from hf_snapvit.benchmark.environment import read_status, reset_peak_rss  # noqa: E402

#: ``DINOv3ViTConfig`` fields per shape; ``tiny`` runs the same code in seconds on a CPU.
SHAPES: dict[str, dict[str, Any]] = {
    "dinov3-7b": dict(hidden_size=4096, num_hidden_layers=40, num_attention_heads=32, intermediate_size=8192,
                      use_gated_mlp=True, hidden_act="silu", patch_size=16, image_size=224, num_register_tokens=4,
                      layerscale_value=1e-5),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, use_gated_mlp=True,
                 hidden_act="silu", patch_size=16, image_size=32, num_register_tokens=4),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness_parser(__doc__, shared=False)
    parser.add_argument("--shape", default="dinov3-7b", choices=sorted(SHAPES))
    parser.add_argument("--preset", default="fast", choices=["fast", "default"])
    parser.add_argument("--precision", default=None, choices=["fp32", "bf16"],
                        help="the ranking's and the weights' precision (default: bf16 on CUDA, fp32 elsewhere)")
    parser.add_argument("--images", type=int, default=64, help="gradient and fitness images of the ranking")
    parser.add_argument("--generations", type=int, default=1, help="xNES generations (0: the scores alone)")
    parser.add_argument("--load-sparsities", type=float, nargs="+", default=[0.0, 0.3, 0.5])
    parser.add_argument("--max-memory-mib", type=float, default=None,
                        help="rank the model placed by accelerate within this much of the device's memory (MiB): "
                        "the blocks that do not fit are offloaded to host memory (to disk on a CPU)")
    parser.add_argument("--load-here", action="store_true",
                        help="load each size in this process instead of a fresh one (a dry run's shortcut: the "
                        "host-memory figures then include what the ranking left behind)")
    parser.add_argument("--workdir", default=None, help="where the elastic checkpoint goes (default: a temporary "
                        "folder, removed at the end)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child-load", nargs=2, metavar=("FOLDER", "SPARSITY"), help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None,
                        help="JSON (default: benchmarks/results/big_vit/big_vit_<device>.json)")
    args = parser.parse_args(argv)
    args.precision = args.precision or ("bf16" if torch.device(args.device).type == "cuda" else "fp32")
    return args


def build(shape: str, seed: int, device: str, dtype: torch.dtype) -> transformers.PreTrainedModel:
    """The random-weight model of ``shape``, initialised on ``device`` in ``dtype`` (7 B parameters in float32 would
    take 27 GB before the cast)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.DINOv3ViTModel._from_config(transformers.DINOv3ViTConfig(**SHAPES[shape]), dtype=dtype)
    return model.eval()


def child_load(folder: str, sparsity: float, args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: load ``folder`` at ``sparsity`` onto the device; its time, bytes and peak memory."""
    device = torch.device(args.device)
    if device.type == "cuda":  # a load in the ranking's process (--load-here) must not report the ranking's peak
        torch.cuda.reset_peak_memory_stats(device)
    reset_peak_rss()
    before = read_status()
    start = time.perf_counter()
    model = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=sparsity, dtype=DTYPES[args.precision],
                                                       device_map=args.device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    after = read_status()
    return {"sparsity": sparsity, "load_seconds": seconds,
            "loaded_parameters": sum(p.numel() for p in model.parameters()),
            "loaded_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "devices": sorted({str(p.device) for p in model.parameters()}),
            "peak_device_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "host_anon_growth_bytes": after.get("RssAnon", 0) - before.get("RssAnon", 0),
            "peak_host_growth_bytes": after.get("VmHWM", 0) - before.get("VmRSS", 0)}


def load_in_children(folder: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for sparsity in args.load_sparsities:
        if args.load_here:
            rows.append({**child_load(folder, sparsity, args), "fresh_process": False})
        else:
            command = [sys.executable, __file__, "--child-load", folder, str(sparsity), "--device", args.device,
                       "--precision", args.precision]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                rows.append({"sparsity": sparsity, "error": done.stderr[-2000:]})
                continue
            rows.append({**json.loads(done.stdout.strip().splitlines()[-1]), "fresh_process": True})
        rows[-1]["peak_device_over_loaded"] = (rows[-1]["peak_device_bytes"] / rows[-1]["loaded_bytes"]
                                               if rows[-1]["peak_device_bytes"] else None)
    return rows


def placed(model: transformers.PreTrainedModel, args: argparse.Namespace, offload: str) -> torch.nn.Module:
    """``model`` placed by accelerate within ``--max-memory-mib`` of its device: ``infer_auto_device_map`` fills the
    device block by block and offloads the rest to host memory (on a CPU, to disk in ``offload``)."""
    from accelerate import dispatch_model, infer_auto_device_map

    device, cap = torch.device(args.device), int(args.max_memory_mib * 2**20)
    memory = {device.index or 0: cap, "cpu": 2**40} if device.type == "cuda" else {"cpu": cap}
    model = model.to("cpu")  # accelerate moves what fits to the device, and keeps the rest where it is
    device_map = infer_auto_device_map(model, max_memory=memory, no_split_module_classes=model._no_split_modules)
    if set(device_map.values()) == {"disk"}:
        raise SystemExit(f"--max-memory-mib {args.max_memory_mib} leaves no module on {args.device}: raise it.")
    return dispatch_model(model, device_map, offload_dir=offload)


def rank_and_save(folder: str, args: argparse.Namespace, report: dict[str, Any]) -> None:
    model, seconds = timed(lambda: build(args.shape, args.seed, args.device, DTYPES[args.precision]))
    if args.max_memory_mib is not None:
        model = placed(model, args, str(Path(folder).parent / "offload"))
        places = [str(device) for device in model.hf_device_map.values()]
        report["device_map"] = {place: places.count(place) for place in sorted(set(places))}
    report.update(build_seconds=seconds, parameters=sum(p.numel() for p in model.parameters()),
                  weight_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
    print(f"built {report['parameters'] / 1e9:.2f} B parameters in {seconds:.0f} s", file=sys.stderr, flush=True)
    options = argparse.Namespace(images=args.images, generations=args.generations, seed=args.seed,
                                 fitness_batch_size=None, floor_repeats=1)
    images = bench_ranking_time.load_images(None, 2 * args.images, args.seed)
    try:
        report["ranking"] = bench_ranking_time.run_one(model, images, args.preset, args.precision, options)
    except torch.OutOfMemoryError as error:  # not fitting is a result; the sliced loads still run
        report["ranking"] = {"error": f"out of memory: {error}"[:500]}
    print(f"ranking: {json.dumps(report['ranking'])[:400]}", file=sys.stderr, flush=True)
    # Loading does not depend on which units a ranking keeps; a magnitude ranking is instant.
    ranking = hf_snapvit.rank(model, method="magnitude", show_progress=False)
    report["save_seconds"] = timed(lambda: hf_snapvit.save_elastic(model, ranking, folder, model_card=False))[1]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_load:
        print(json.dumps(child_load(args.child_load[0], float(args.child_load[1]), args)))
        return 0
    output, report = device_report("big_vit.py", argv, args, shape=SHAPES[args.shape])
    with tempfile.TemporaryDirectory(prefix="big-vit-", dir=args.workdir) as scratch:
        folder = str(Path(scratch) / "elastic")
        rank_and_save(folder, args, report)
        write_json(output, report)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        report["loads"] = load_in_children(folder, args)
    write_json(output, report)
    for row in report["loads"]:
        print(json.dumps(row), file=sys.stderr)
    print(f"wrote {output}")
    return 1 if "error" in report["ranking"] or any("error" in row for row in report["loads"]) else 0


if __name__ == "__main__":
    sys.exit(main())
