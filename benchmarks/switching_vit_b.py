"""Switching a resident ViT-B/16 in place: what a switch costs in time, storage and memory, and whether the switched
model runs as fast as the separately sliced one.

A ViT-B/16-shaped ``transformers.ViTModel`` (``ViTConfig()`` defaults, pooler included, seeded random weights) is
ranked by magnitude and saved as an elastic checkpoint in a temporary folder. From it, in ONE process, side by side:

- switch time: ``set_budget(sparsity=...)`` cycling through 0.3, 0, 0.5, 0.1, 0.5, 0.3 (``--switches`` calls, after
  each budget was resolved once; the first resolutions are recorded apart), median / p90 / max; and the raw width
  change alone (``hf_snapvit.switching.set_widths_`` with the same widths, no budget resolution);
- memory: peak RSS (``VmHWM``, reset right before) before and after those switches, after a warm-up forward pass;
  on CUDA also ``torch.cuda.max_memory_allocated`` before and after;
- storage: every parameter's ``(data_ptr, nbytes)`` before and after all switches and timed passes (must be
  identical), and the switchable model's parameter bytes against the dense model's (one copy of the dense weights);
- latency at 50 %: the switchable model right after a switch (to another size and back, untimed) against
  ``ElasticViTModel.from_pretrained(folder, sparsity=0.5)``, interleaved round-robin (the order alternates every
  round), same inputs, ``torch.inference_mode()``, per batch size; the criterion is switchable / sliced <= 1.1;
- a latency table per batch size (``hf_snapvit.measure_latency``, default grid) with GFLOPs per size, plotted with
  ``hf_snapvit.plotting.plot_latency_table`` beside the JSON (same name, ``.png``).

Criteria in the JSON are computed from these measurements. Nothing is asserted on timing in the tests.

    python benchmarks/switching_vit_b.py                                 # CPU, float32, batch 8 and 1 (~3 min, 2 cores)
    python benchmarks/switching_vit_b.py --device cuda --dtype bfloat16 --batch-sizes 8 1 64 \\
        --output benchmarks/results/switching_vit_b_h100.json           # a GPU
    python benchmarks/switching_vit_b.py --tiny --repeats 2 --switches 30 --output /tmp/s.json   # seconds
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local

import torch  # noqa: E402
import transformers  # noqa: E402

import hf_snapvit  # noqa: E402
from hf_snapvit.benchmark.environment import MIB, hardware_info, read_status, reset_peak_rss  # noqa: E402
from hf_snapvit.files import write_text_atomic  # noqa: E402
from hf_snapvit.plotting import plot_latency_table  # noqa: E402
from hf_snapvit.switching import set_widths_  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "switching_vit_b_cpu.json"
SEQUENCE = (0.3, 0.0, 0.5, 0.1, 0.5, 0.3)
TARGET = 0.5
MAX_RATIO = 1.1  # switchable / sliced latency at TARGET
MAX_GROWTH = 1 * MIB  # peak memory growth allowed over all switches: far below one projection's weight
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, image_size=32,
            patch_size=8)
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size",
                "patch_size")
# Largest output difference, switchable vs sliced at TARGET, that still counts as the same model.
OUTPUT_ATOL = {"float32": 1e-3, "bfloat16": 1e-1, "float16": 2e-2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=sorted(OUTPUT_ATOL))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 1])
    parser.add_argument("--repeats", type=int, default=30, help="interleaved rounds per batch size (each model once)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes per model and batch size")
    parser.add_argument("--switches", type=int, default=1000, help="timed set_budget calls (and raw width changes)")
    parser.add_argument("--table-repeats", type=int, default=5, help="rounds of each latency table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="a 2-block toy ViT instead of ViT-B/16 (for tests)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON; the plot goes beside it (.png)")
    args = parser.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here.")
    if min(args.batch_sizes) < 1 or args.repeats < 1 or args.switches < 1 or args.table_repeats < 1:
        parser.error("--batch-sizes, --repeats, --switches and --table-repeats must be positive.")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _summary(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {"median_ms": statistics.median(ordered), "p90_ms": ordered[min(len(ordered) - 1,
                                                                             math.ceil(0.9 * len(ordered)) - 1)],
            "mean_ms": statistics.fmean(ordered), "min_ms": ordered[0], "max_ms": ordered[-1], "count": len(ordered)}


def _storage(model: torch.nn.Module) -> list[tuple[str, int, int]]:
    return [(name, p.data_ptr(), p.nbytes) for name, p in model.named_parameters()]


def build_checkpoint(folder: Path, config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Seeded random ViT (pooler included) -> magnitude ranking -> elastic checkpoint in ``folder``."""
    torch.manual_seed(seed)
    dense = transformers.ViTModel(transformers.ViTConfig(**config), add_pooling_layer=True).eval()
    hf_snapvit.save_elastic(dense, hf_snapvit.rank(dense, method="magnitude"), folder, model_card=False)
    return {"num_params": sum(p.numel() for p in dense.parameters()),
            "parameter_shapes": {n: list(p.shape) for n, p in dense.named_parameters()}}


def load_models(folder: Path, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any, list[str]]:
    """The switchable model and the one sliced at TARGET, moved with ``.to(device, dtype)``; plus every warning and
    transformers log record of WARNING or above the two loads gave."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            switchable = hf_snapvit.ElasticViTModel.from_pretrained(folder, switchable=True)
            sliced = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=TARGET)
    finally:
        logger.removeHandler(handler)
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    return switchable.to(device, dtype).eval(), sliced.to(device, dtype).eval(), messages


def time_switches(model: Any, count: int) -> dict[str, Any]:
    """``set_budget`` over SEQUENCE: the first resolution of each budget, then ``count`` timed calls; and the same
    widths set directly with ``set_widths_`` (the part of a switch that touches the modules)."""
    first: dict[str, float] = {}
    widths = []
    for sparsity in SEQUENCE:
        start = time.perf_counter()
        budget = model.set_budget(sparsity=sparsity)
        first.setdefault(str(sparsity), (time.perf_counter() - start) * 1e3)
        widths.append((budget.heads, budget.neurons))
    switch_ms, raw_ms = [], []
    for i in range(count):
        sparsity = SEQUENCE[i % len(SEQUENCE)]
        start = time.perf_counter()
        model.set_budget(sparsity=sparsity)
        switch_ms.append((time.perf_counter() - start) * 1e3)
    for i in range(count):
        heads, neurons = widths[i % len(widths)]
        start = time.perf_counter()
        set_widths_(model, heads, neurons)
        raw_ms.append((time.perf_counter() - start) * 1e3)
    model.set_budget(sparsity=SEQUENCE[-1])  # the raw changes bypass elastic_budget: make it true again
    return {"sequence": list(SEQUENCE), "first_resolution_ms": first,
            "set_budget": _summary(switch_ms) | {"runs_ms": switch_ms},
            "raw_width_change": _summary(raw_ms) | {"runs_ms": raw_ms}}


def switches_with_memory(model: Any, inputs: dict[str, torch.Tensor], count: int,
                         device: torch.device) -> tuple[dict[str, Any], dict[str, Any]]:
    """After a warm-up forward pass, reset the peak RSS (and CUDA peak), run :func:`time_switches`, read the peaks
    again. Returns ``(switch times, memory)``."""
    with torch.inference_mode():
        model(**inputs)
    _sync(device)
    memory: dict[str, Any] = {"peak_rss_reset": reset_peak_rss(), "before": read_status()}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        memory.update(cuda_allocated_before=torch.cuda.memory_allocated(device),
                      cuda_peak_before=torch.cuda.max_memory_allocated(device))
    switches = time_switches(model, count)
    memory["after"] = read_status()
    if "VmHWM" in memory["before"] and "VmHWM" in memory["after"]:
        memory["peak_rss_growth_bytes"] = memory["after"]["VmHWM"] - memory["before"]["VmHWM"]
    if device.type == "cuda":
        memory.update(cuda_allocated_after=torch.cuda.memory_allocated(device),
                      cuda_peak_after=torch.cuda.max_memory_allocated(device))
        memory["cuda_peak_growth_bytes"] = memory["cuda_peak_after"] - memory["cuda_peak_before"]
    memory["switches"] = count
    return switches, memory


def compare_latency(switchable: Any, sliced: Any, inputs: dict[str, torch.Tensor], repeats: int, warmup: int,
                    device: torch.device) -> dict[str, Any]:
    """Forward latency at TARGET, interleaved round-robin: each round runs both models once, the order alternating;
    before each of its timed passes the switchable model switches to another size and back (untimed)."""
    models = {"switchable": switchable, "sliced": sliced}
    runs: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        switchable.set_budget(sparsity=TARGET)
        outputs = {name: model(**inputs).last_hidden_state.float() for name, model in models.items()}
        for _ in range(warmup):
            for model in models.values():
                model(**inputs)
        for r in range(repeats):
            for name in (("switchable", "sliced") if r % 2 == 0 else ("sliced", "switchable")):
                if name == "switchable":
                    other = SEQUENCE[r % len(SEQUENCE)]
                    switchable.set_budget(sparsity=other if other != TARGET else 0.0)
                    switchable.set_budget(sparsity=TARGET)
                _sync(device)
                start = time.perf_counter()
                models[name](**inputs)
                _sync(device)
                runs[name].append((time.perf_counter() - start) * 1e3)
    medians = {name: statistics.median(times) for name, times in runs.items()}
    return {"median_ms": medians, "min_ms": {name: min(times) for name, times in runs.items()},
            "ratio": medians["switchable"] / medians["sliced"],
            "paired_ratio_median": statistics.median(a / b for a, b in zip(runs["switchable"], runs["sliced"])),
            "max_abs_output_difference": float((outputs["switchable"] - outputs["sliced"]).abs().max()),
            "runs_ms": runs}


def _inputs(config: transformers.PretrainedConfig, batch: int, seed: int, device: torch.device,
            dtype: torch.dtype) -> dict[str, torch.Tensor]:
    size, channels = config.image_size, config.num_channels
    pixels = torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed + batch))
    return {"pixel_values": pixels.to(device, dtype)}


def criteria(result: dict[str, Any]) -> dict[str, Any]:
    """Met / not met, from the measurements in ``result``."""
    memory, storage = result["memory"], result["storage"]
    growth = memory.get("cuda_peak_growth_bytes", memory.get("peak_rss_growth_bytes"))
    rss_valid = memory["peak_rss_reset"] or "cuda_peak_growth_bytes" in memory
    return {
        f"latency_within_{MAX_RATIO}x_of_sliced": {b: row["ratio"] <= MAX_RATIO
                                                    for b, row in result["latency_at_50"].items()},
        "outputs_equal_sliced": all(row["max_abs_output_difference"] <= OUTPUT_ATOL[result["dtype"]]
                                    for row in result["latency_at_50"].values()),
        "data_pointers_and_sizes_unchanged": storage["unchanged"],
        "one_copy_of_the_dense_weights": storage["switchable_parameter_bytes"] == storage["dense_parameter_bytes"],
        "peak_memory_growth_under_1MiB": None if growth is None or not rss_valid else growth < MAX_GROWTH,
        "switch_median_under_1ms": result["switch"]["set_budget"]["median_ms"] < 1.0,
        "loading_warned_nothing": not result["load_warnings"],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    config = dict(TINY) if args.tiny else {}
    with tempfile.TemporaryDirectory() as tmp:
        dense = build_checkpoint(Path(tmp), config, args.seed)
        switchable, sliced, load_warnings = load_models(Path(tmp), device, dtype)
    before = _storage(switchable)
    first_inputs = _inputs(switchable.config, args.batch_sizes[0], args.seed, device, dtype)
    switches, memory = switches_with_memory(switchable, first_inputs, args.switches, device)
    latency = {str(b): compare_latency(switchable, sliced, _inputs(switchable.config, b, args.seed, device, dtype),
                                       args.repeats, args.warmup, device) for b in args.batch_sizes}
    tables = [hf_snapvit.measure_latency(switchable, batch_size=b, repeats=args.table_repeats, show_progress=False)
              for b in args.batch_sizes]
    after = _storage(switchable)
    at_target = switchable.set_budget(sparsity=TARGET)
    itemsize = torch.empty((), dtype=dtype).element_size()
    result = {
        "benchmark": "switching_vit_b",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": {"class": "transformers.ViTModel (pooler included), seeded random weights, magnitude ranking",
                  "config": {k: getattr(transformers.ViTConfig(**config), k) for k in SHAPE_FIELDS} | {"tiny": args.tiny},
                  "num_params": dense["num_params"], "seed": args.seed},
        "device": str(device), "dtype": args.dtype,
        "settings": {k: getattr(args, k) for k in ("batch_sizes", "repeats", "warmup", "switches", "table_repeats")},
        "load_warnings": load_warnings,
        "budget_at_50": {"sparsity": at_target.sparsity, "gflops": at_target.gflops,
                         "heads": list(at_target.heads), "neurons": list(at_target.neurons),
                         "sliced_num_params": sum(p.numel() for p in sliced.parameters())},
        "switch": switches, "memory": memory, "latency_at_50": latency,
        "storage": {"unchanged": before == after, "parameters": len(before),
                    "changed": [name for (name, *x), (_, *y) in zip(before, after) if x != y],
                    "switchable_parameter_bytes": sum(nbytes for *_, nbytes in after),
                    "dense_parameter_bytes": dense["num_params"] * itemsize,
                    "shapes_equal_dense": {n: list(p.shape) for n, p in switchable.named_parameters()}
                    == dense["parameter_shapes"]},
        "latency_tables": [t.to_dict() for t in tables],
    }
    result["criteria"] = criteria(result)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    result = {"command": " ".join(["python", "benchmarks/switching_vit_b.py", *argv])} | run(args)
    result["hardware"] = hardware_info(device=result["device"])
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "hf_snapvit": result["hardware"]["hf_snapvit"]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    plot = args.output.with_suffix(".png")
    plot_latency_table([hf_snapvit.LatencyTable.from_dict(t) for t in result["latency_tables"]], plot)
    result["plot"] = plot.name
    write_text_atomic(args.output, json.dumps(result, indent=1) + "\n")
    switch = result["switch"]
    print(f"set_budget: median {switch['set_budget']['median_ms']:.4f} ms, p90 {switch['set_budget']['p90_ms']:.4f} "
          f"ms; raw width change median {switch['raw_width_change']['median_ms']:.4f} ms")
    for batch, row in result["latency_at_50"].items():
        print(f"batch {batch}: switchable {row['median_ms']['switchable']:.2f} ms, sliced "
              f"{row['median_ms']['sliced']:.2f} ms, ratio {row['ratio']:.3f} (paired {row['paired_ratio_median']:.3f})")
    print(f"memory: {json.dumps({k: v for k, v in result['memory'].items() if 'growth' in k})}; storage unchanged: "
          f"{result['storage']['unchanged']}")
    print(json.dumps(result["criteria"], indent=1))
    print(f"wrote {args.output} and {plot}")
    return result


if __name__ == "__main__":
    main()
