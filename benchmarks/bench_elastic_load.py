"""Benchmark: load time, load memory and forward latency of ElasticViTModel at several sparsities.

What it measures
----------------
1. Builds a ViT-B/16-shaped ``transformers.ViTModel`` from ``ViTConfig()`` defaults (hidden 768, 12 blocks, 12 heads,
   MLP 3072, 224 px) with seeded random weights, ranks it with ``hf_snapvit.rank(model, method="magnitude")`` and
   writes an elastic checkpoint with ``hf_snapvit.save_elastic`` (into a temporary folder, or ``--workdir``).
2. For every sparsity (``--sparsities``, default 0 0.1 ... 0.6) it starts a FRESH Python subprocess (this script in
   its hidden ``--child`` mode), so that memory readings of one load do not leak into the next, and measures there:

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
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Quiet transformers / huggingface_hub before they are imported (here and in every child process).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never touch the network

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "elastic_load.json"
DEFAULT_SPARSITIES = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------------------------------
# /proc helpers (Linux)
# --------------------------------------------------------------------------------------------------------------------

STATUS_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def read_status(fields: tuple[str, ...] = STATUS_FIELDS) -> dict[str, int]:
    """Selected ``/proc/self/status`` fields, in bytes (missing fields are left out)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    out[key] = int(value.split()[0]) * 1024  # reported in kB
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0: write 5 to clear_refs). Returns whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class MemoryPoller(threading.Thread):
    """Samples ``RssAnon`` and ``VmRSS`` every ``interval`` seconds until stopped; keeps the peaks."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_anon = 0
        self.peak_rss = 0
        self.samples = 0
        self._stop_event = threading.Event()
        self._started_sampling = threading.Event()

    def sample(self) -> None:
        status = read_status(("RssAnon", "VmRSS"))
        self.peak_anon = max(self.peak_anon, status.get("RssAnon", 0))
        self.peak_rss = max(self.peak_rss, status.get("VmRSS", 0))
        self.samples += 1

    def run(self) -> None:
        while True:
            self.sample()
            self._started_sampling.set()
            if self._stop_event.wait(self.interval):
                break

    def __enter__(self) -> "MemoryPoller":
        self.start()
        self._started_sampling.wait(5.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop_event.set()
        self.join()
        self.sample()  # the state right after the load counts too


# --------------------------------------------------------------------------------------------------------------------
# Child process: one configuration
# --------------------------------------------------------------------------------------------------------------------


def _count_mmapped(model: Any) -> int | None:
    """How many parameters have their storage inside a mapping of a ``.safetensors`` file (zero-copy loads)."""
    ranges = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if ".safetensors" in line:
                    start, end = line.split()[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:
        return None
    return sum(any(a <= p.untyped_storage().data_ptr() < b for a, b in ranges) for p in model.parameters())



def child_main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)

    import torch

    torch.set_num_threads(int(spec["threads"]))
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # Import everything either loader touches lazily, so the fresh load time is not an import time.
    import accelerate  # noqa: F401  (hf_snapvit builds the skeleton with accelerate.init_empty_weights)
    import safetensors.torch  # noqa: F401
    import transformers.conversion_mapping  # noqa: F401
    import transformers.core_model_loading  # noqa: F401
    from transformers import AutoConfig, ViTConfig, ViTModel  # noqa: F401

    import hf_snapvit

    checkpoint = spec["checkpoint"]
    if spec["kind"] == "elastic":
        sparsity = float(spec["sparsity"])

        def load():
            return hf_snapvit.ElasticViTModel.from_pretrained(checkpoint, sparsity=sparsity)
    else:

        def load():
            return ViTModel.from_pretrained(checkpoint)

    result: dict[str, Any] = {
        "kind": spec["kind"],
        "requested_sparsity": spec.get("sparsity"),
        "pid": os.getpid(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }

    # ---- fresh load: time and memory ----
    gc.collect()
    hwm_reset = reset_peak_rss()
    before = read_status()
    poll_s = float(spec["poll_ms"]) / 1000.0
    if poll_s > 0:
        with MemoryPoller(poll_s) as poller:
            t0 = time.perf_counter()
            model = load()
            load_s = time.perf_counter() - t0
    else:
        poller = None
        t0 = time.perf_counter()
        model = load()
        load_s = time.perf_counter() - t0
    after = read_status()

    memory: dict[str, Any] = {
        "hwm_reset": hwm_reset,
        "before": before,
        "after": after,
        "peak_rss_growth": after.get("VmHWM", 0) - before.get("VmRSS", 0),
        "rss_growth": after.get("VmRSS", 0) - before.get("VmRSS", 0),
        "anon_growth": after.get("RssAnon", 0) - before.get("RssAnon", 0),
        "file_growth": after.get("RssFile", 0) - before.get("RssFile", 0),
    }
    if poller is not None:
        memory["poll_interval_ms"] = spec["poll_ms"]
        memory["poll_samples"] = poller.samples
        memory["peak_anon_growth"] = poller.peak_anon - before.get("RssAnon", 0)
        memory["peak_rss_growth_polled"] = poller.peak_rss - before.get("VmRSS", 0)
    result["load_s"] = load_s

    # ---- resident footprint once the weights are used ----
    # Both loaders return tensors that view the memory-mapped safetensors file, so pages are only read (and only
    # count in RSS) when a forward pass touches them. One batch-1 forward right after the load shows the footprint.
    if spec["forward"]:
        with torch.inference_mode():
            model(pixel_values=torch.zeros(1, int(getattr(model.config, "num_channels", 3)),
                                           int(model.config.image_size), int(model.config.image_size)))
        touched = read_status()
        memory["after_first_forward"] = touched
        memory["fwd_rss_growth"] = touched.get("VmRSS", 0) - before.get("VmRSS", 0)
        memory["fwd_anon_growth"] = touched.get("RssAnon", 0) - before.get("RssAnon", 0)
        memory["fwd_file_growth"] = touched.get("RssFile", 0) - before.get("RssFile", 0)
    result["memory"] = memory

    # ---- what was loaded ----
    layout = getattr(model.config, "elastic_layout", None)
    heads, neurons = hf_snapvit.layer_widths(model)
    if layout:
        backbone_params = int(layout["num_params"])
    else:
        backbone_params = hf_snapvit.model_shape(model).num_params()
    result["model"] = {
        "class": type(model).__name__,
        "heads_per_block": heads,
        "neurons_per_block": neurons,
        "backbone_params": backbone_params,
        "total_params": sum(p.numel() for p in model.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "dtype": str(next(model.parameters()).dtype),
        "gflops": hf_snapvit.estimate_gflops(model),
        "elastic_layout": (
            {k: v for k, v in layout.items() if k not in ("num_heads", "intermediate_size")} if layout else None
        ),
        "training": model.training,
        "params_in_file_mmap": _count_mmapped(model),
        "non_contiguous_params": [n for n, p in model.named_parameters() if not p.is_contiguous()],
    }

    # ---- warm loads in the same process: time only ----
    warm = []
    for _ in range(int(spec["warm_loads"])):
        gc.collect()
        t0 = time.perf_counter()
        extra = load()
        warm.append(time.perf_counter() - t0)
        del extra
    gc.collect()
    result["warm_load_s_runs"] = warm
    result["warm_load_s"] = statistics.median(warm) if warm else None

    # ---- forward latency ----
    latency: dict[str, Any] = {}
    if spec["forward"]:
        model.eval()
        size = int(model.config.image_size)
        channels = int(getattr(model.config, "num_channels", 3))
        generator = torch.Generator().manual_seed(int(spec["seed"]))
        for batch in spec["batch_sizes"]:
            x = torch.randn(int(batch), channels, size, size, generator=generator)
            runs = []
            with torch.inference_mode():
                for _ in range(int(spec["warmup"])):
                    model(pixel_values=x)
                for _ in range(int(spec["repeats"])):
                    t0 = time.perf_counter()
                    model(pixel_values=x)
                    runs.append(time.perf_counter() - t0)
            latency[str(batch)] = {
                "median_ms": statistics.median(runs) * 1e3,
                "min_ms": min(runs) * 1e3,
                "runs_ms": [r * 1e3 for r in runs],
                "warmup": int(spec["warmup"]),
            }
    result["latency"] = latency

    with open(spec["result_path"], "w") as f:
        json.dump(result, f)
    return 0


# --------------------------------------------------------------------------------------------------------------------
# Parent process
# --------------------------------------------------------------------------------------------------------------------


def hardware_info(threads: int) -> dict[str, Any]:
    import torch
    import transformers

    import hf_snapvit

    model_name = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model_name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_total = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    try:
        import safetensors

        safetensors_version = safetensors.__version__
    except Exception:  # pragma: no cover
        safetensors_version = None
    return {
        "processor": platform.processor() or None,
        "cpu_model": model_name,
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "mem_total_bytes": mem_total,
        "torch_threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors_version,
        "hf_snapvit": hf_snapvit.__version__,
    }


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
    hf_snapvit.save_elastic(model, ranking, directory)
    timings["save_s"] = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
    info = {
        "path": str(directory),
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


def run_child(spec: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter; returns its result dict (or an ``error`` entry)."""
    fd, spec_path = tempfile.mkstemp(prefix="spec-", suffix=".json", dir=workdir)
    os.close(fd)
    result_path = spec_path.replace("spec-", "result-")
    spec = {**spec, "result_path": result_path}
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(spec["threads"])
    env["MKL_NUM_THREADS"] = str(spec["threads"])
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", spec_path],
            env=env, capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"child timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    try:
        if proc.returncode != 0 or not os.path.exists(result_path):
            tail = (proc.stderr or proc.stdout or "")[-2000:]
            return {"error": f"child exited with {proc.returncode}: {tail}"}
        with open(result_path) as f:
            result = json.load(f)
        result["child_wall_s"] = wall
        if proc.stderr.strip():
            result["child_stderr_tail"] = proc.stderr.strip()[-1000:]
        return result
    finally:
        for path in (spec_path, result_path):
            try:
                os.remove(path)
            except OSError:
                pass


def measure_config(base_spec: dict[str, Any], load_repeats: int, workdir: Path, timeout: float) -> dict[str, Any]:
    """``load_repeats`` fresh processes for one configuration; the first also times the forward pass."""
    runs = []
    for i in range(load_repeats):
        run = run_child({**base_spec, "forward": i == 0, "warm_loads": base_spec["warm_loads"] if i == 0 else 0},
                        workdir, timeout)
        if "error" in run:
            return {"kind": base_spec["kind"], "requested_sparsity": base_spec.get("sparsity"), "error": run["error"]}
        runs.append(run)
    first = runs[0]

    def med(get):
        values = [get(r) for r in runs]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    mem_keys = ("peak_rss_growth", "rss_growth", "anon_growth", "file_growth", "peak_anon_growth")
    fwd_keys = ("fwd_rss_growth", "fwd_anon_growth", "fwd_file_growth")  # measured in the first process only
    return {
        "kind": first["kind"],
        "requested_sparsity": first["requested_sparsity"],
        "model": first["model"],
        "torch_threads": first["torch_threads"],
        "load_s": med(lambda r: r["load_s"]),
        "load_s_runs": [r["load_s"] for r in runs],
        "warm_load_s": first["warm_load_s"],
        "warm_load_s_runs": first["warm_load_s_runs"],
        "memory": {**{k: med(lambda r, k=k: r["memory"].get(k)) for k in mem_keys},
                   **{k: first["memory"].get(k) for k in fwd_keys}},
        "memory_runs": [r["memory"] for r in runs],
        "latency": first["latency"],
        "child_wall_s": [r.get("child_wall_s") for r in runs],
        **({"child_stderr_tail": first["child_stderr_tail"]} if "child_stderr_tail" in first else {}),
    }


def add_derived(rows: list[dict[str, Any]], reference: dict[str, Any] | None, batch_sizes: list[int]) -> None:
    """Actual sparsity and ratios to ``reference`` (the dense elastic load), in place."""

    def ratio(a, b):
        return a / b if a is not None and b not in (None, 0) else None

    for row in rows:
        if "error" in row or reference is None or "error" in reference:
            continue
        ref_params = reference["model"]["backbone_params"]
        row["actual_sparsity"] = 1.0 - row["model"]["backbone_params"] / ref_params
        ratios = {
            "backbone_params": ratio(row["model"]["backbone_params"], ref_params),
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
    parser.add_argument("--child", metavar="SPEC", default=None, help=argparse.SUPPRESS)
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
    if args.child is not None:
        return child_main(args.child)

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

        base = {
            "checkpoint": str(checkpoint_dir), "threads": args.threads, "batch_sizes": args.batch_sizes,
            "repeats": args.repeats, "warmup": args.warmup, "warm_loads": args.warm_loads,
            "poll_ms": args.poll_ms, "seed": args.seed,
        }
        configs = [{**base, "kind": "elastic", "sparsity": s} for s in sparsities]
        if not args.no_stock:
            configs.append({**base, "kind": "stock", "sparsity": None})
        rows = []
        for spec in configs:
            name = ("stock ViTModel.from_pretrained" if spec["kind"] == "stock"
                    else f"elastic sparsity {spec['sparsity']}")
            t0 = time.perf_counter()
            print(f"  measuring {name} ...", end="", flush=True)
            row = measure_config(spec, args.load_repeats, workdir, args.child_timeout)
            print(f" {'FAILED' if 'error' in row else 'done'} ({time.perf_counter() - t0:.0f} s)", flush=True)
            rows.append(row)
    finally:
        if tmp is not None:
            tmp.cleanup()

    elastic = [r for r in rows if r["kind"] == "elastic"]
    stock = next((r for r in rows if r["kind"] == "stock"), None)
    reference = next((r for r in elastic if r["requested_sparsity"] == 0.0), None)
    add_derived(rows, reference, args.batch_sizes)
    print_tables(rows, args.batch_sizes, args.threads)

    report = {
        "benchmark": "elastic_load",
        "description": "ElasticViTModel.from_pretrained load time, load memory and forward latency per sparsity; "
                       "every configuration measured in a fresh subprocess. Ratios are to the dense elastic load "
                       "(sparsity 0) of this run. Memory in bytes, times in seconds unless the key says ms.",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "settings": {
            "sparsities": sparsities, "batch_sizes": args.batch_sizes, "repeats": args.repeats,
            "warmup": args.warmup, "load_repeats": args.load_repeats, "warm_loads": args.warm_loads,
            "threads": args.threads, "poll_ms": args.poll_ms, "seed": args.seed,
            "inference_mode": True, "checkpoint_in_page_cache": True,
        },
        "hardware": hardware,
        "checkpoint": checkpoint,
        "reference": "elastic sparsity 0",
        "results": elastic,
        "stock_dense": stock,
        "total_wall_s": time.perf_counter() - started,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(args.output.name + ".tmp")
    with open(partial, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(partial, args.output)
    print(f"\nWrote {args.output} (total {report['total_wall_s']:.0f} s)")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
