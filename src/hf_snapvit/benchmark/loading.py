"""Load time and memory of ``ElasticViTModel.from_pretrained(path, sparsity=...)``, one fresh process per load.

A fresh Python process per configuration keeps one load's memory out of the next one's numbers. The child
(:func:`load_child_main`) imports everything the loaders touch before the clock starts, so a fresh load time is not
an import time, and reads its memory from ``/proc/self/status`` (see :mod:`.environment`).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm

from ..errors import BenchmarkError
from .environment import MemoryPoller, count_mmapped_parameters, read_status, reset_peak_rss
from .latency import compare_latency, dummy_inputs


def _loader(spec: dict[str, Any]) -> Callable[[], nn.Module]:
    """The load the spec describes: the elastic loader at its sparsity, or the stock transformers class."""
    import transformers

    from ..architectures import model_class
    from ..loading.modeling import ElasticViTModel

    checkpoint = spec["checkpoint"]
    if spec["kind"] == "elastic":
        sparsity = float(spec["sparsity"])
        return lambda: ElasticViTModel.from_pretrained(checkpoint, sparsity=sparsity)
    stock = model_class(transformers.AutoConfig.from_pretrained(checkpoint))
    return lambda: stock.from_pretrained(checkpoint)


def _import_loaders() -> None:
    """Import everything either loader touches lazily, so the fresh load time is not an import time."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import accelerate  # noqa: F401  (the skeleton is built with accelerate.init_empty_weights)
    import safetensors.torch  # noqa: F401
    try:  # transformers' weight-conversion modules: outside its public API, so a release may lack them
        import transformers.conversion_mapping  # noqa: F401
        import transformers.core_model_loading  # noqa: F401
    except ImportError:
        pass  # then loading does not use them either (hf_snapvit.elastic.saved_names)


def _timed_load(load: Callable[[], nn.Module], poll_ms: float) -> tuple[nn.Module, float, dict[str, Any]]:
    """``(model, seconds, memory)`` of one load; ``memory`` holds the /proc readings around it and their growth."""
    gc.collect()
    hwm_reset = reset_peak_rss()
    before = read_status()
    poll_s = float(poll_ms) / 1000.0
    poller = None
    if poll_s > 0:
        with MemoryPoller(poll_s) as poller:
            start = time.perf_counter()
            model = load()
            load_s = time.perf_counter() - start
    else:
        start = time.perf_counter()
        model = load()
        load_s = time.perf_counter() - start
    after = read_status()
    memory: dict[str, Any] = {
        "hwm_reset": hwm_reset, "before": before, "after": after,
        "peak_rss_growth": after.get("VmHWM", 0) - before.get("VmRSS", 0),
        "rss_growth": after.get("VmRSS", 0) - before.get("VmRSS", 0),
        "anon_growth": after.get("RssAnon", 0) - before.get("RssAnon", 0),
        "file_growth": after.get("RssFile", 0) - before.get("RssFile", 0),
    }
    if poller is not None:
        memory.update(poll_interval_ms=poll_ms, poll_samples=poller.samples,
                      peak_anon_growth=poller.peak_anon - before.get("RssAnon", 0),
                      peak_rss_growth_polled=poller.peak_rss - before.get("VmRSS", 0))
    return model, load_s, memory


def _first_forward_memory(model: nn.Module, memory: dict[str, Any], seed: int) -> None:
    """Add the memory after one batch-1 forward pass to ``memory``, in place.

    Loaders may hand out tensors that view the memory-mapped file, whose pages only count once a forward pass
    touches them; one forward right after the load shows the resident footprint.
    """
    before = memory["before"]
    with torch.inference_mode():
        model(**dummy_inputs(model, 1, seed=seed))
    touched = read_status()
    memory.update(after_first_forward=touched,
                  fwd_rss_growth=touched.get("VmRSS", 0) - before.get("VmRSS", 0),
                  fwd_anon_growth=touched.get("RssAnon", 0) - before.get("RssAnon", 0),
                  fwd_file_growth=touched.get("RssFile", 0) - before.get("RssFile", 0))


def _describe_loaded(model: nn.Module) -> dict[str, Any]:
    """The loaded model's class, widths, parameters, bytes, GFLOPs and layout, as the child reports them."""
    from ..architectures.budget import backbone_parameters, layer_widths
    from ..architectures.flops import estimate_gflops

    layout = getattr(model.config, "elastic_layout", None)
    heads, neurons = layer_widths(model)
    return {
        "class": type(model).__name__,
        "heads_per_block": heads,
        "neurons_per_block": neurons,
        "backbone_params": int(layout["num_params"]) if layout else backbone_parameters(model),
        "total_params": sum(p.numel() for p in model.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype),
        "gflops": estimate_gflops(model),
        "elastic_layout": ({k: v for k, v in layout.items() if k not in ("num_heads", "intermediate_size")}
                           if layout else None),
        "training": model.training,
        "params_in_file_mmap": count_mmapped_parameters(model),
        "non_contiguous_params": [n for n, p in model.named_parameters() if not p.is_contiguous()],
    }


def _warm_load_seconds(load: Callable[[], nn.Module], count: int) -> list[float]:
    """Seconds of ``count`` further loads in this process (files and modules already warm)."""
    warm = []
    for _ in range(count):
        gc.collect()
        start = time.perf_counter()
        extra = load()
        warm.append(time.perf_counter() - start)
        del extra
    gc.collect()
    return warm


def load_child_main(spec_path: str) -> int:
    """Measure one configuration described by the JSON file ``spec_path`` (runs in a fresh process).

    The spec names the ``checkpoint``, the ``kind`` (``"elastic"`` at ``sparsity``, or ``"stock"`` transformers),
    ``threads``, whether to time the ``forward`` pass (``batch_sizes``, ``repeats``, ``warmup``), ``warm_loads``,
    ``poll_ms``, ``seed`` and the ``result_path`` to write JSON to.
    """
    with open(spec_path) as handle:
        spec = json.load(handle)
    torch.set_num_threads(int(spec["threads"]))
    _import_loaders()
    load = _loader(spec)
    result: dict[str, Any] = {"kind": spec["kind"], "requested_sparsity": spec.get("sparsity"), "pid": os.getpid(),
                              "torch_threads": torch.get_num_threads(),
                              "torch_interop_threads": torch.get_num_interop_threads()}
    model, result["load_s"], memory = _timed_load(load, spec["poll_ms"])
    if spec["forward"]:
        _first_forward_memory(model, memory, int(spec["seed"]))
    result["memory"] = memory
    result["model"] = _describe_loaded(model)
    warm = _warm_load_seconds(load, int(spec["warm_loads"]))
    result["warm_load_s_runs"] = warm
    result["warm_load_s"] = statistics.median(warm) if warm else None
    latency: dict[str, Any] = {}
    if spec["forward"]:
        model.eval()
        timed = compare_latency({"model": model}, [int(b) for b in spec["batch_sizes"]], repeats=int(spec["repeats"]),
                                warmup=int(spec["warmup"]), seed=int(spec["seed"]))["model"]
        latency = {b: {**entry, "warmup": int(spec["warmup"])} for b, entry in timed.items()}
    result["latency"] = latency
    with open(spec["result_path"], "w") as handle:
        json.dump(result, handle)
    return 0


_CHILD_CODE = ("import sys; from hf_snapvit.benchmark.loading import load_child_main; "
               "sys.exit(load_child_main(sys.argv[1]))")


def run_load_child(spec: dict[str, Any], workdir: str | os.PathLike, timeout: float,
                   command: Sequence[str] | None = None) -> dict[str, Any]:
    """Run one load configuration in a fresh interpreter; returns its result (or an ``error`` entry).

    Args:
        spec: The configuration (see :func:`load_child_main`); ``result_path`` is added here.
        workdir: Folder for the spec and result files.
        timeout: Seconds before the child is abandoned.
        command: The child's command line before the spec path (default: ``python -c`` calling
            :func:`load_child_main`).
    """
    descriptor, spec_path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=workdir)
    os.close(descriptor)
    result_path = spec_path.replace("spec-", "result-")
    spec = {**spec, "result_path": result_path}
    with open(spec_path, "w") as handle:
        json.dump(spec, handle)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(spec["threads"])
    env["MKL_NUM_THREADS"] = str(spec["threads"])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    start = time.perf_counter()
    try:
        process = subprocess.run([*(command or [sys.executable, "-c", _CHILD_CODE]), spec_path], env=env,
                                 capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"child timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    try:
        if process.returncode != 0 or not os.path.exists(result_path):
            tail = (process.stderr or process.stdout or "")[-2000:]
            return {"error": f"child exited with {process.returncode}: {tail}"}
        with open(result_path) as handle:
            result = json.load(handle)
        result["child_wall_s"] = wall
        if process.stderr.strip():
            result["child_stderr_tail"] = process.stderr.strip()[-1000:]
        return result
    finally:
        for path in (spec_path, result_path):
            try:
                os.remove(path)
            except OSError:
                pass


def measure_load_config(base_spec: dict[str, Any], load_repeats: int, workdir: str | os.PathLike, timeout: float,
                        command: Sequence[str] | None = None) -> dict[str, Any]:
    """``load_repeats`` fresh processes for one configuration (medians of load time and memory); the first process
    also times warm reloads and the forward pass."""
    runs = []
    for i in range(load_repeats):
        run = run_load_child({**base_spec, "forward": i == 0, "warm_loads": base_spec["warm_loads"] if i == 0 else 0},
                             workdir, timeout, command)
        if "error" in run:
            return {"kind": base_spec["kind"], "requested_sparsity": base_spec.get("sparsity"), "error": run["error"]}
        runs.append(run)
    first = runs[0]

    def median_of(get):
        values = [v for v in (get(r) for r in runs) if v is not None]
        return statistics.median(values) if values else None

    memory_keys = ("peak_rss_growth", "rss_growth", "anon_growth", "file_growth", "peak_anon_growth")
    forward_keys = ("fwd_rss_growth", "fwd_anon_growth", "fwd_file_growth")  # measured in the first process only
    return {
        "kind": first["kind"],
        "requested_sparsity": first["requested_sparsity"],
        "model": first["model"],
        "torch_threads": first["torch_threads"],
        "load_s": median_of(lambda r: r["load_s"]),
        "load_s_runs": [r["load_s"] for r in runs],
        "warm_load_s": first["warm_load_s"],
        "warm_load_s_runs": first["warm_load_s_runs"],
        "memory": {**{k: median_of(lambda r, k=k: r["memory"].get(k)) for k in memory_keys},
                   **{k: first["memory"].get(k) for k in forward_keys}},
        "memory_runs": [r["memory"] for r in runs],
        "latency": first["latency"],
        "child_wall_s": [r.get("child_wall_s") for r in runs],
        **({"child_stderr_tail": first["child_stderr_tail"]} if "child_stderr_tail" in first else {}),
    }


def add_load_ratios(rows: list[dict[str, Any]], reference: dict[str, Any] | None, batch_sizes: Sequence[int]) -> None:
    """Add the actual sparsity and ratios to ``reference`` (the dense elastic load) to every row, in place."""

    def ratio(a, b):
        return a / b if a is not None and b not in (None, 0) else None

    for row in rows:
        if "error" in row or reference is None or "error" in reference:
            continue
        dense_params = reference["model"]["backbone_params"]
        row["actual_sparsity"] = 1.0 - row["model"]["backbone_params"] / dense_params
        ratios = {
            "backbone_params": ratio(row["model"]["backbone_params"], dense_params),
            "gflops": ratio(row["model"]["gflops"], reference["model"]["gflops"]),
            "param_bytes": ratio(row["model"]["param_bytes"], reference["model"]["param_bytes"]),
            "load_s": ratio(row["load_s"], reference["load_s"]),
            "warm_load_s": ratio(row["warm_load_s"], reference["warm_load_s"]),
        }
        for key in ("anon_growth", "peak_anon_growth", "peak_rss_growth", "rss_growth", "fwd_rss_growth",
                    "fwd_anon_growth", "fwd_file_growth"):
            ratios[key] = ratio(row["memory"].get(key), reference["memory"].get(key))
        for b in batch_sizes:
            mine, ref = row["latency"].get(str(b)), reference["latency"].get(str(b))
            ratios[f"latency_b{b}"] = ratio(mine and mine["median_ms"], ref and ref["median_ms"])
        row["ratios_to_elastic_dense"] = ratios


def measure_loading(
    checkpoint: str | os.PathLike,
    sparsities: Sequence[float] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
    *,
    batch_sizes: Sequence[int] = (1, 8),
    repeats: int = 5,
    warmup: int = 1,
    load_repeats: int = 1,
    warm_loads: int = 3,
    threads: int = 1,
    poll_ms: float = 2.0,
    seed: int = 0,
    stock: bool = True,
    timeout: float = 600.0,
    show_progress: bool = True,
    child_command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Load time, load memory and forward latency of ``ElasticViTModel.from_pretrained(checkpoint, sparsity=s)``.

    Every configuration runs in a fresh Python process. Sparsity 0 is always measured: it is the reference of the
    ratios. With ``stock``, the dense load by the stock transformers class is measured as well.

    Args:
        checkpoint: A local elastic checkpoint folder (read from the page cache once it has been read).
        sparsities: Sparsities to load.
        batch_sizes: Forward batch sizes timed after the load.
        repeats: Timed forward passes per batch size (median).
        warmup: Untimed forward passes per batch size.
        load_repeats: Fresh processes per configuration; load time and memory are their medians.
        warm_loads: Further loads in the first process, for the warm load time.
        threads: ``torch.set_num_threads`` (and OMP/MKL threads) in every child; 1 is the most reproducible.
        poll_ms: ``RssAnon`` sampling interval during the load (0 disables the poller).
        seed: Seed of the input pixels.
        stock: Also measure the stock transformers dense load.
        timeout: Seconds before a child is abandoned.
        show_progress: Show a progress bar over configurations.
        child_command: Command line of the child before the spec path (default: this module's child entry).

    Returns:
        ``{"results": [elastic rows], "stock_dense": row or None, "reference": ...}``; rows carry
        ``ratios_to_elastic_dense``, or an ``error`` if their child failed.
    """
    if load_repeats < 1 or repeats < 1 or warmup < 0 or warm_loads < 0 or threads < 1:
        raise BenchmarkError("Need load_repeats >= 1, repeats >= 1, warmup >= 0, warm_loads >= 0 and threads >= 1; "
                             f"got {load_repeats}, {repeats}, {warmup}, {warm_loads}, {threads}.")
    if any(not 0.0 <= s < 1.0 for s in sparsities):
        raise BenchmarkError(f"sparsities={list(sparsities)} must lie in [0, 1).")
    sparsities = sorted({0.0, *(round(float(s), 6) for s in sparsities)})
    base = {"checkpoint": str(checkpoint), "threads": threads, "batch_sizes": list(batch_sizes), "repeats": repeats,
            "warmup": warmup, "warm_loads": warm_loads, "poll_ms": poll_ms, "seed": seed}
    configs = [{**base, "kind": "elastic", "sparsity": s} for s in sparsities]
    if stock:
        configs.append({**base, "kind": "stock", "sparsity": None})
    rows = []
    with tempfile.TemporaryDirectory(prefix="hf-snapvit-load-") as workdir:
        for spec in tqdm(configs, desc="load benchmark", unit="config", disable=not show_progress):
            rows.append(measure_load_config(spec, load_repeats, workdir, timeout, child_command))
    elastic = [r for r in rows if r["kind"] == "elastic"]
    stock_row = next((r for r in rows if r["kind"] == "stock"), None)
    reference = next((r for r in elastic if r["requested_sparsity"] == 0.0), None)
    add_load_ratios(rows, reference, batch_sizes)
    return {"reference": "elastic sparsity 0", "sparsities": sparsities, "results": elastic, "stock_dense": stock_row}
