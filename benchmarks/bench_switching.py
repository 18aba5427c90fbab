"""Switching a resident model's size in place, on a ViT-B/16-shaped model: what a switch costs, and whether the
switched model runs as fast as the separately sliced one.

In one run, side by side:
- switch time: ``set_budget(sparsity=...)`` cycling through 0.3, 0, 0.5, 0.1, 0.5, 0.3 (median and p90, the first
  resolution of each budget and the steady state once each is remembered);
- latency at 50 % after a switch against ``ElasticViTModel.from_pretrained(folder, sparsity=0.5)``, interleaved
  (one pass of each per round), per batch size; the criterion is a ratio of at most 1.1;
- storage: every parameter's data pointer and size before and after all switches, and the switchable model's
  parameter bytes against the dense model's (one copy of the dense weights);
- memory: peak RSS growth over the switches (after a warm-up pass); on CUDA also peak allocated memory;
- a latency table (``hf_snapvit.measure_latency``) and its plot.

    python benchmarks/bench_switching.py                                   # CPU, ViT-B/16 shape, a few minutes
    python benchmarks/bench_switching.py --device cuda --dtype bfloat16 --batch-sizes 256 64 \
        --output benchmarks/results/bench_switching/switching_vit_b_h100.json             # a GPU (H100)
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers

import hf_snapvit
from _harness import RESULTS, command, parser, timed, write_json
from hf_snapvit import ElasticViTModel
from hf_snapvit.benchmark.environment import hardware_info, read_status, reset_peak_rss
from hf_snapvit.loading.timing import synchronize
from hf_snapvit.plots import plot_latency_table

SEQUENCE = (0.3, 0.0, 0.5, 0.1, 0.5, 0.3)
CONFIGS = {
    "vit-b": dict(),  # transformers.ViTConfig's defaults: ViT-B/16 at 224 px
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=32,
                 patch_size=8),
}


def parse_args(argv: list[str] | None = None) -> Any:
    options = parser(__doc__, shared=False)
    options.add_argument("--config", choices=sorted(CONFIGS), default="vit-b")
    options.add_argument("--device", default="cpu")
    options.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    options.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 1])
    options.add_argument("--repeats", type=int, default=10, help="interleaved rounds per batch size")
    options.add_argument("--switches", type=int, default=1000, help="timed switches")
    options.add_argument("--table-repeats", type=int, default=5, help="rounds of the latency table")
    options.add_argument("--output", type=Path, default=RESULTS / "bench_switching" / "switching_vit_b_cpu.json")
    return options.parse_args(argv)


def _elastic_checkpoint(config: dict[str, Any], folder: Path) -> int:
    torch.manual_seed(0)
    model = transformers.ViTModel(transformers.ViTConfig(**config)).eval()
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), folder, model_card=False)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _switch_times(model: Any, count: int) -> dict[str, Any]:
    """Seconds per ``set_budget`` call: budgets never asked before (cold: resolved from the ranking) and the
    sequence's budgets asked again and again (steady: remembered)."""
    top = model.max_sparsity()
    cold = [timed(lambda: model.set_budget(sparsity=min(s, top * 0.99)))[1]
            for s in (0.05, 0.15, 0.25, 0.35, 0.45, 0.55)]
    steady = sorted(timed(lambda: model.set_budget(sparsity=SEQUENCE[i % len(SEQUENCE)]))[1] for i in range(count))
    return {"cold_ms": [t * 1e3 for t in cold], "median_ms": statistics.median(steady) * 1e3,
            "p90_ms": steady[int(0.9 * (len(steady) - 1))] * 1e3, "count": count}


def _interleaved(models: dict[str, Any], inputs: dict[str, torch.Tensor], repeats: int,
                 device: torch.device) -> dict[str, Any]:
    runs: dict[str, list[float]] = {name: [] for name in models}
    names = list(models)
    with torch.inference_mode():
        for model in models.values():
            model(**inputs)
        for r in range(repeats):
            for name in names[r % 2:] + names[: r % 2]:
                if name == "switchable":
                    models[name].set_budget(sparsity=0.5)  # a switch right before every timed pass
                synchronize(device)
                runs[name].append(timed(lambda: (models[name](**inputs), synchronize(device)))[1] * 1e3)
    medians = {name: statistics.median(times) for name, times in runs.items()}
    return {"median_ms": medians, "runs_ms": runs, "ratio": medians["switchable"] / medians["sliced"]}


def run(args: Any) -> dict[str, Any]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    with tempfile.TemporaryDirectory() as tmp:
        dense_bytes = _elastic_checkpoint(CONFIGS[args.config], Path(tmp))
        model = ElasticViTModel.from_pretrained(tmp, switchable=True, dtype=dtype).to(device)
        sliced = ElasticViTModel.from_pretrained(tmp, sparsity=0.5, dtype=dtype).to(device)
    storage = [(p.data_ptr(), p.nbytes) for p in model.parameters()]
    size = model.config.image_size
    latency = {}
    for batch in args.batch_sizes:
        inputs = {"pixel_values": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
                  .to(device, dtype)}
        latency[str(batch)] = _interleaved({"switchable": model, "sliced": sliced}, inputs, args.repeats, device)
    with torch.inference_mode():
        model(**inputs)  # the warm-up pass whose memory the switches must not add to
    reset = reset_peak_rss()
    before = read_status().get("VmHWM")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.max_memory_allocated(device)
    switches = _switch_times(model, args.switches)
    memory = {"peak_rss_reset": reset, "peak_rss_before": before, "peak_rss_after": read_status().get("VmHWM")}
    if device.type == "cuda":
        memory.update(cuda_peak_before=cuda_before, cuda_peak_after=torch.cuda.max_memory_allocated(device))
    memory["growth_bytes"] = (memory["cuda_peak_after"] - memory["cuda_peak_before"] if device.type == "cuda"
                              else (memory["peak_rss_after"] or 0) - (memory["peak_rss_before"] or 0))
    table = hf_snapvit.measure_latency(model, batch_size=args.batch_sizes[0], repeats=args.table_repeats,
                                       show_progress=False)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    smallest_weight = min(m.weight.nbytes for m in model.modules() if isinstance(m, torch.nn.Linear))
    memory["smallest_weight_bytes"] = smallest_weight
    unchanged = storage == [(p.data_ptr(), p.nbytes) for p in model.parameters()]
    return {
        "benchmark": "bench_switching", "command": command("bench_switching.py", None),
        "config": args.config, "dtype": args.dtype, "hardware": hardware_info(device=device),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "switch": switches, "latency_at_0.5": latency, "latency_table": table.to_dict(),
        "storage": {"pointers_and_bytes_unchanged": unchanged, "parameter_bytes": param_bytes,
                    "dense_parameter_bytes_float32": dense_bytes},
        "memory": memory,
        "criteria": {
            "switch_median_under_1ms": switches["median_ms"] < 1.0,
            "latency_within_1.1x_of_sliced": {b: r["ratio"] <= 1.1 for b, r in latency.items()},
            "storage_unchanged": unchanged,
            "one_copy_of_the_dense_weights": param_bytes * 32 // torch.finfo(dtype).bits == dense_bytes,
            # Python objects (the remembered budgets) may take a page or two; a weight copy would take at least
            # the smallest projection weight.
            "peak_memory_growth_below_smallest_weight": memory["growth_bytes"] < smallest_weight,
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run(args)
    write_json(args.output, result, indent=2)
    plot_latency_table([hf_snapvit.LatencyTable.from_dict(result["latency_table"])], args.output.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("switch", "criteria")}, indent=2))
    for batch, row in result["latency_at_0.5"].items():
        print(f"batch {batch}: switchable {row['median_ms']['switchable']:.2f} ms, sliced "
              f"{row['median_ms']['sliced']:.2f} ms, ratio {row['ratio']:.3f}")
    return result


if __name__ == "__main__":
    main()
