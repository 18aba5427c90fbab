"""Which way of serving a ViT is fastest: eager PyTorch against torch.compile's paths, dense and sliced side by side.

A *path* (:data:`PATHS`) is one way a user runs a model: eager, ``torch.compile`` as users call it, compiled with
``attn_implementation=hf_snapvit.UNPADDED_SDPA`` or with eager attention, inductor's ``freezing``, ``max-autotune``,
CUDA graphs. Per shape (random weights) and path, the dense model and one sliced copy per sparsity run round-robin
with the eager dense model as an anchor. The summary reports, per batch size, each size's speedup over the **fastest
dense path** next to its GFLOP ratio (``efficiency``), so a slow dense reference flatters no one. ``--profile``
groups each path's kernels at the largest batch as ``profile_latency.py`` does; ``--switchable`` also times the
switchable model at every size, eagerly.

    python benchmarks/serving_paths.py --device cuda --shapes vit-b16 --paths eager compile-unpadded graphs-unpadded \
        --path-batch-sizes compile-unpadded=32,256 graphs-unpadded=1,32 --batch-sizes 1 32 256 --switchable \
        --sparsities 0.1 0.3 0.5 0.6 --repeats 10
    # on a CPU, what the test runs (aot_eager needs no C++ compiler):
    python benchmarks/serving_paths.py --device cpu --shapes tiny --paths eager compile-unpadded --backend aot_eager
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402
import torch.nn as nn  # noqa: E402

import profile_latency  # noqa: E402
import hf_snapvit  # noqa: E402
from _harness import (  # noqa: E402
    DTYPES, build, device_report, latency_arguments, parse_latency_arguments, write_json)
from hf_snapvit.benchmark import compare_latency, dummy_inputs, sliced_copy  # noqa: E402
from hf_snapvit.architectures.attention import UNPADDED_SDPA  # noqa: E402
from hf_snapvit.benchmark.latency import compiled_graph_room  # noqa: E402


@dataclasses.dataclass(frozen=True)
class ServingPath:
    """How a path runs a model: ``compile`` (``None``: eager) holds ``torch.compile``'s keyword arguments besides the
    backend; ``attention`` the model's ``attn_implementation`` (``None``: as loaded, ``"sdpa"``); ``inductor``
    inductor settings patched while it compiles."""

    compile: dict[str, Any] | None = None
    attention: str | None = None
    inductor: dict[str, Any] = dataclasses.field(default_factory=dict)
    cuda_only: bool = False

    def describe(self) -> dict[str, Any]:
        return {"compile": self.compile, "attention": self.attention, "inductor": self.inductor}


GRAPHS = {"mode": "reduce-overhead"}
PATHS = {
    "eager": ServingPath(),
    # torch.compile(model) as users call it.
    "compile": ServingPath(compile={}),
    "compile-unpadded": ServingPath(compile={}, attention=UNPADDED_SDPA),
    # Inductor writes the attention itself from the model's matmuls and softmax.
    "compile-eager-attention": ServingPath(compile={}, attention="eager"),
    "compile-freezing": ServingPath(compile={}, attention=UNPADDED_SDPA, inductor={"freezing": True}),
    "max-autotune": ServingPath(compile={"mode": "max-autotune-no-cudagraphs"}, attention=UNPADDED_SDPA),
    "graphs": ServingPath(compile=GRAPHS, cuda_only=True),
    "graphs-unpadded": ServingPath(compile=GRAPHS, attention=UNPADDED_SDPA, cuda_only=True),
}
ANCHOR = "eager-dense"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    options = latency_arguments(__doc__, [32, 256])
    options.add_argument("--paths", nargs="+", default=["eager", "compile", "compile-unpadded", "graphs-unpadded"],
                         choices=list(PATHS))
    options.add_argument("--path-batch-sizes", nargs="*", default=[], metavar="PATH=B1,B2",
                         help="batch sizes of one path (e.g. graphs=1,32: CUDA graphs pay off at small batches)")
    options.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: CPU tests)")
    options.add_argument("--switchable", action="store_true",
                         help="also time the switchable model at every size on the eager path")
    options.add_argument("--profile", action="store_true", help="record each path's kernels at the largest batch")
    args = parse_latency_arguments(options, argv)
    args.batches_of = {path: list(args.batch_sizes) for path in args.paths}
    for item in args.path_batch_sizes:
        path, _, sizes = item.partition("=")
        if path not in args.batches_of or not sizes:
            options.error(f"--path-batch-sizes {item!r}: expected PATH=B1,B2 with PATH one of --paths {args.paths}")
        args.batches_of[path] = [int(size) for size in sizes.split(",")]
    return args


def prepared(model: nn.Module, path: ServingPath, backend: str) -> nn.Module:
    """``model`` wrapped and compiled as ``path`` runs it."""
    if path.compile is None:
        return model
    return torch.compile(model, backend=backend, dynamic=False, **path.compile)


def path_models(dense: nn.Module, ranking: hf_snapvit.ElasticRanking, path: ServingPath,
                sparsities: Sequence[float], width_multiple: int) -> dict[str, nn.Module]:
    """The dense model and its sliced copies (named by sparsity) with ``path``'s attention implementation."""
    base = dense
    if path.attention is not None:
        base = copy.deepcopy(dense)
        base.set_attn_implementation(path.attention)
    models = {"0": base}
    for sparsity in sparsities:
        models[f"{sparsity:g}"] = sliced_copy(base, ranking, sparsity, width_multiple=width_multiple)
    return models


def compile_waits(path: ServingPath, warmup: int) -> int:
    """Warm-up passes a path needs before it is timed: compiling, and with CUDA graphs recording too."""
    if path.compile is None:
        return warmup
    return max(warmup, 3 if path.compile.get("mode") == "reduce-overhead" else 1)


def measure_path(name: str, shape: str, dense: nn.Module, ranking: hf_snapvit.ElasticRanking,
                 counts: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One path's rotation: its dense and sliced models and the eager dense anchor, at the path's batch sizes. A
    failed compiled path records its error."""
    path = PATHS[name]
    run: dict[str, Any] = {"shape": shape, "path": name, "settings": path.describe(),
                           "batch_sizes": args.batches_of[name]}
    if path.cuda_only and torch.device(args.device).type != "cuda":
        return {**run, "skipped": f"CUDA graphs need a CUDA device, not {args.device}"}
    models = path_models(dense, ranking, path, args.sparsities, args.width_multiple)
    timed = {key: prepared(model, path, args.backend) for key, model in models.items()}
    if name != "eager":
        timed[ANCHOR] = dense
    warmup = compile_waits(path, args.warmup)
    inputs = (lambda model, batch: dummy_inputs(dense, batch, seed=args.seed))
    try:
        # An empty patch changes nothing: eager and most compiled paths keep inductor's settings.
        with compiled_graph_room(len(timed) * len(run["batch_sizes"])), inductor_config.patch(**path.inductor):
            latency = compare_latency(timed, run["batch_sizes"], repeats=args.repeats, warmup=warmup, inputs=inputs,
                                      seed=args.seed)
            profile = path_profile(timed["0"], dense, max(run["batch_sizes"]), warmup, args) if args.profile else None
    except Exception as error:  # noqa: BLE001 - a compiler failure is a result of the path; eager ones are bugs
        if path.compile is None:
            raise
        return {**run, "error": f"{type(error).__name__}: {str(error)[:2000]}"}
    finally:
        torch._dynamo.reset()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    anchor = latency["0"] if name == "eager" else latency[ANCHOR]
    rows = [{"model": "dense" if key == "0" else "sliced", "sparsity": counts[key].sparsity,
             "requested_sparsity": float(key), "gflops": counts[key].gflops,
             "gflop_ratio": counts["0"].gflops / counts[key].gflops, "latency": latency[key],
             "to_eager_dense": {b: anchor[b]["median_ms"] / entry["median_ms"] for b, entry in latency[key].items()}}
            for key in models]
    return {**run, "warmup": warmup, "anchor_latency": anchor, "rows": rows, "profile": profile}


def path_profile(model: nn.Module, dense: nn.Module, batch: int, warmup: int,
                 args: argparse.Namespace) -> dict[str, Any]:
    """The kernels (device) or ops (CPU) of a few forwards of ``model``, by kind, with the top names of each."""
    device = torch.device(args.device)
    dtype = next(dense.parameters()).dtype
    with torch.inference_mode():
        inputs = {k: v.to(device, dtype=dtype) for k, v in dummy_inputs(dense, batch, seed=args.seed).items()}
    result = profile_latency.profile_forwards(model, inputs, steps=3, warmup=warmup, device=device)
    return {"batch_size": batch, "busy_ms": result["busy_ms"], "kinds": result["kinds"]}


def load_switchable(folder: str | Path, dtype: torch.dtype, device: str) -> nn.Module:
    """The switchable model of the elastic checkpoint in ``folder`` at full size, without the pooler that the
    benchmark's models (``add_pooling_layer=False``) do not have either."""
    with warnings.catch_warnings():
        # The checkpoint holds no pooler, so loading warns that it is new; it is dropped right away.
        warnings.filterwarnings("ignore", message="Some weights were not in the checkpoint")
        model = hf_snapvit.ElasticViTModel.from_pretrained(folder, switchable=True, dtype=dtype)
    model.pooler = None
    return model.to(device).eval()


def switchable_rows(dense: nn.Module, ranking: hf_snapvit.ElasticRanking, shape: str,
                    args: argparse.Namespace) -> dict[str, Any]:
    """The switchable model, eager, at each sparsity, timed beside the eager dense model. Each size gets its own
    rotation, switched to before it: a switch between timed passes would add its own cost to them."""
    dense_gflops, rows = ranking.keep_counts(0.0).gflops, []
    with tempfile.TemporaryDirectory(prefix="serving-paths-") as folder:
        hf_snapvit.save_elastic(dense, ranking, folder, model_card=False)
        switchable = load_switchable(folder, next(dense.parameters()).dtype, args.device)
        for requested in args.sparsities:
            budget = switchable.set_budget(sparsity=requested, width_multiple=args.width_multiple)
            timings = compare_latency({"dense": dense, "switchable": switchable}, args.batch_sizes,
                                      repeats=args.repeats, warmup=args.warmup, seed=args.seed)
            theoretical = dense_gflops / budget.gflops
            speedup = {batch: timings["dense"][batch]["median_ms"] / entry["median_ms"]
                       for batch, entry in timings["switchable"].items()}
            rows.append({"model": "switchable", "sparsity": budget.sparsity, "requested_sparsity": requested,
                         "backbone_params": budget.num_params, "gflops": budget.gflops, "heads": list(budget.heads),
                         "neurons": list(budget.neurons), "theoretical_speedup": theoretical,
                         "latency": timings["switchable"], "dense_latency": timings["dense"], "speedup": speedup,
                         "efficiency": {batch: value / theoretical for batch, value in speedup.items()}})
    return {"shape": shape, "path": "eager", "model": "switchable", "rows": rows}


def fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape and batch size: the fastest dense path, and each size's fastest path against it."""
    best: dict[str, dict[str, dict[float, dict[str, Any]]]] = {}
    for run in runs:
        if run.get("model") == "switchable":
            continue
        for row in run.get("rows", []):
            for batch, entry in row["latency"].items():
                cell = best.setdefault(run["shape"], {}).setdefault(batch, {})
                current = cell.get(row["requested_sparsity"])
                if current is None or entry["median_ms"] < current["ms"]:
                    cell[row["requested_sparsity"]] = {"ms": entry["median_ms"], "path": run["path"],
                                                       "sparsity": row["sparsity"], "gflop_ratio": row["gflop_ratio"]}
    summary: dict[str, Any] = {}
    for shape, cells in best.items():
        for batch, cell in cells.items():
            dense = cell.pop(0.0)
            sizes = [{**size, "requested_sparsity": requested, "speedup": dense["ms"] / size["ms"],
                      "efficiency": dense["ms"] / size["ms"] / size["gflop_ratio"]}
                     for requested, size in sorted(cell.items())]
            summary.setdefault(shape, {})[batch] = {"fastest_dense": dense, "sizes": sizes}
    return summary


def summary_lines(runs: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """Each path's dense latency against the eager dense anchor, then the fastest-path table."""
    lines = [f"{'shape':<8} {'path':<24} {'batch':>5} {'dense ms':>9} {'eager ms':>9} {'x eager':>8}  top kernels"]
    for run in runs:
        if "rows" not in run:
            lines.append(f"{run['shape']:<8} {run['path']:<24} {run.get('skipped') or 'failed: ' + run['error']}")
            continue
        if run.get("model") == "switchable":
            continue
        dense = run["rows"][0]
        tops = ""
        if run.get("profile"):
            kinds = run["profile"]["kinds"]
            tops = " | ".join(f"{kind} {kinds[kind]['ms']:.2f} ms: {kinds[kind]['top'][0][0][:50]}"
                              for kind in ("gemm", "attention") if kinds[kind]["top"])
        for batch, entry in dense["latency"].items():
            lines.append(f"{run['shape']:<8} {run['path']:<24} {batch:>5} {entry['median_ms']:>9.2f} "
                         f"{run['anchor_latency'][batch]['median_ms']:>9.2f} {dense['to_eager_dense'][batch]:>8.2f}  "
                         + (tops if batch == str(max(map(int, dense["latency"]))) else ""))
    lines.append(f"{'shape':<8} {'batch':>5} {'sparsity':>8} {'fastest path':<24} {'ms':>8} {'speedup':>8} "
                 f"{'GFLOP x':>8} {'eff':>5}   (against the fastest dense path)")
    for shape, cells in summary.items():
        for batch, cell in sorted(cells.items(), key=lambda item: int(item[0])):
            dense = cell["fastest_dense"]
            lines.append(f"{shape:<8} {batch:>5} {0:>8.3f} {dense['path']:<24} {dense['ms']:>8.2f}")
            for size in cell["sizes"]:
                lines.append(f"{shape:<8} {batch:>5} {size['sparsity']:>8.3f} {size['path']:<24} {size['ms']:>8.2f} "
                             f"{size['speedup']:>8.2f} {size['gflop_ratio']:>8.2f} {size['efficiency']:>5.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure every shape and path, write the JSON (after every path: a cut-off run keeps what it measured)."""
    args = parse_args(argv)
    output, report = device_report("serving_paths.py", argv, args, runs=[])
    dtype = DTYPES[args.precision]
    for shape in args.shapes:
        model = build(shape, args.seed)
        ranking = hf_snapvit.rank(model, method="magnitude", seed=args.seed, show_progress=False)
        limit = ranking.max_sparsity_for(args.width_multiple)
        if any(s > limit for s in args.sparsities):
            raise SystemExit(f"--sparsities {args.sparsities}: {shape} supports at most {limit:.3f} at "
                             f"--width-multiple {args.width_multiple}")
        counts = {f"{s:g}": ranking.keep_counts(s, width_multiple=args.width_multiple) for s in [0.0, *args.sparsities]}
        dense = model.to(device=args.device, dtype=dtype).eval()
        for name in args.paths:
            report["runs"].append(measure_path(name, shape, dense, ranking, counts, args))
            print(summary_lines(report["runs"][-1:], {})[1], file=sys.stderr, flush=True)
            report["summary"] = fastest(report["runs"])
            write_json(output, report)
        if args.switchable:
            report["runs"].append(switchable_rows(dense, ranking, shape, args))
            write_json(output, report)
        del model, dense
    report["summary"] = fastest(report["runs"])
    write_json(output, report)
    print("\n".join(summary_lines(report["runs"], report["summary"])))
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
