"""Measure what slicing buys: forward latency and throughput, load time and memory, ranking wall time.

Every speed number is meant to be read as a ratio to the dense model measured in the same run, because absolute
timings on shared machines drift. :func:`measure_latency` therefore runs the models it compares round-robin (one
timed forward of each per repeat, in a rotating order), and :func:`latency_vs_sparsity` puts the dense model and every
sliced one into that same rotation, next to the theoretical GFLOP ratio.

Load time and memory of ``ElasticViTModel.from_pretrained(path, sparsity=...)`` are measured in a fresh Python
process per configuration (:func:`measure_loading`), so that one load's memory does not leak into the next. Memory
comes from ``/proc/self/status`` (Linux): ``RssAnon`` is the memory the process owns (safetensors files are
memory-mapped, so file-backed pages inflate plain RSS), and a background thread samples its peak during the load.

Ranking wall time, with a per-phase breakdown for SnapViT (``SnapViTPruner.timings_``), comes from :func:`timed_rank`.
:func:`run_bench` bundles the latency and load measurements of one elastic checkpoint (``hf-snapvit bench``).
"""

from __future__ import annotations

import copy
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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from .errors import BenchmarkError
from .ranking import ElasticRanking

MIB = 1024 * 1024
STATUS_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")



# --------------------------------------------------------------------------------------------------- environment


def hardware_info(threads: int | None = None, device: str | torch.device | None = None) -> dict[str, Any]:
    """The machine and software a measurement ran on: CPU model and count, memory, threads, GPU, library versions.

    Args:
        threads: The torch thread count used (default: ``torch.get_num_threads()``).
        device: The device the models ran on; a CUDA device adds its name and memory.
    """
    import transformers

    from ._version import __version__

    def first_line(path: str, prefix: str) -> str | None:
        try:
            with open(path) as handle:
                for line in handle:
                    if line.lower().startswith(prefix.lower()):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    memory = first_line("/proc/meminfo", "MemTotal")
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = None
    try:
        import safetensors

        safetensors_version = safetensors.__version__
    except ImportError:  # pragma: no cover - a dependency
        safetensors_version = None
    info: dict[str, Any] = {
        "processor": platform.processor() or None,
        "cpu_model": first_line("/proc/cpuinfo", "model name"),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "mem_total_bytes": int(memory.split()[0]) * 1024 if memory else None,
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors_version,
        "hf_snapvit": __version__,
        "device": str(device) if device is not None else "cpu",
    }
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(torch.device(device))
        info.update(gpu_name=properties.name, gpu_memory_bytes=properties.total_memory, cuda=torch.version.cuda)
    return info


# --------------------------------------------------------------------------------------------------- latency


def dummy_inputs(model: PreTrainedModel, batch_size: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random ``pixel_values`` of the model's configured input size (``[B, C, H, W]``; patch sequences for
    backbones that take them, e.g. SigLIP2)."""
    from .architectures import get_spec, input_size, patchify

    config = getattr(model.config, "vision_config", None) or model.config
    size = input_size(model.config)
    channels = int(getattr(config, "num_channels", 3))
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(batch_size, channels, size, size, generator=generator)
    if getattr(get_spec(model), "patch_inputs", False):
        return patchify(pixels, int(config.patch_size))
    return {"pixel_values": pixels}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def measure_latency(
    models: Mapping[str, nn.Module],
    batch_sizes: Sequence[int] = (1, 8),
    *,
    repeats: int = 5,
    warmup: int = 1,
    inputs: Callable[[nn.Module, int], Mapping[str, torch.Tensor]] | None = None,
    seed: int = 0,
    show_progress: bool = False,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Forward latency and throughput of several models, measured interleaved.

    For each batch size every model gets ``warmup`` untimed forward passes; then each of ``repeats`` rounds times one
    forward pass of every model, in an order rotated by one model per round, so slow phases of a shared machine hit
    all models alike. Runs under ``torch.inference_mode()``; CUDA work is synchronised around every timed pass.

    Args:
        models: Name → model (in eval mode; each on its own device).
        batch_sizes: Images per forward pass.
        repeats: Timed rounds per batch size (the median is reported).
        warmup: Untimed passes per model and batch size.
        inputs: ``inputs(model, batch_size)`` → model inputs (default: :func:`dummy_inputs`, the same seeded
            pixels for every model); floating-point inputs are cast to each model's device and dtype.
        seed: Seed of the default inputs.
        show_progress: Show a progress bar over rounds.

    Returns:
        ``{name: {str(batch_size): {"median_ms", "min_ms", "runs_ms", "throughput" (images/s at the median)}}}``.
    """
    if repeats < 1 or warmup < 0:
        raise BenchmarkError(f"Need repeats >= 1 and warmup >= 0; got repeats={repeats}, warmup={warmup}.")
    if not models:
        raise BenchmarkError("measure_latency needs at least one model.")
    if any(int(b) < 1 for b in batch_sizes) or not batch_sizes:
        raise BenchmarkError(f"batch_sizes={list(batch_sizes)} must be positive integers.")
    make = inputs or (lambda model, batch: dummy_inputs(model, batch, seed=seed))
    names = list(models)
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    with torch.inference_mode(), tqdm(total=len(batch_sizes) * repeats, desc="latency", unit="round",
                                      disable=not show_progress) as bar:
        for batch in batch_sizes:
            prepared = {}
            for name in names:
                parameter = next(models[name].parameters())
                device = parameter.device
                prepared[name] = {k: v.to(device, dtype=parameter.dtype if v.is_floating_point() else v.dtype)
                                  for k, v in make(models[name], int(batch)).items()}
                for _ in range(warmup):
                    models[name](**prepared[name])
                _synchronize(device)
            runs: dict[str, list[float]] = {name: [] for name in names}
            for round_index in range(repeats):
                shift = round_index % len(names)
                for name in names[shift:] + names[:shift]:
                    device = _device_of(models[name])
                    _synchronize(device)
                    start = time.perf_counter()
                    models[name](**prepared[name])
                    _synchronize(device)
                    runs[name].append(time.perf_counter() - start)
                bar.update(1)
            for name in names:
                median = statistics.median(runs[name])
                results[name][str(batch)] = {
                    "median_ms": median * 1e3,
                    "min_ms": min(runs[name]) * 1e3,
                    "runs_ms": [r * 1e3 for r in runs[name]],
                    "throughput": int(batch) / median,
                }
    return results


def sliced_copy(model: PreTrainedModel, ranking: ElasticRanking, sparsity: float) -> PreTrainedModel:
    """A physically sliced deep copy of ``model`` at ``sparsity`` (``model`` is unchanged)."""
    from .slicing import slice_model_

    counts = ranking.keep_counts(sparsity)
    return slice_model_(copy.deepcopy(model), ranking.keep_indices(counts)).eval()


def latency_vs_sparsity(
    model: PreTrainedModel,
    ranking: ElasticRanking,
    sparsities: Sequence[float],
    *,
    batch_sizes: Sequence[int] = (1, 8, 32),
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Latency and throughput of sliced copies of ``model`` against the dense model, all measured interleaved.

    Args:
        model: The dense model ``ranking`` belongs to (units in the ranking's order).
        ranking: The elastic ranking that decides what each sparsity keeps.
        sparsities: Fractions of backbone parameters removed (each within ``ranking.max_sparsity``).
        batch_sizes: Images per forward pass.
        repeats: Timed rounds (median reported).
        warmup: Untimed passes per model and batch size.
        seed: Seed of the random input pixels.
        show_progress: Show a progress bar.

    Returns:
        ``{"dense": {...}, "rows": [...]}``; each row has the sparsity, parameters, GFLOPs, per-block widths, the
        latency per batch size, and ``speedup`` (dense median / sliced median) next to ``theoretical_speedup``
        (dense GFLOPs / sliced GFLOPs) and their ratio ``efficiency``.
    """
    from .budget import backbone_parameters, estimate_gflops, layer_widths, model_shape

    ranking.check_matches(model_shape(model))
    models: dict[str, nn.Module] = {"dense": model.eval()}
    counts = {}
    for sparsity in sparsities:
        if not 0.0 <= sparsity <= ranking.max_sparsity:
            raise BenchmarkError(f"sparsity={sparsity} is out of range: this ranking supports 0 <= sparsity <= "
                                 f"{ranking.max_sparsity:.4f}.")
        key = f"{sparsity:g}"
        models[key] = sliced_copy(model, ranking, sparsity)
        counts[key] = ranking.keep_counts(sparsity)
    timings = measure_latency(models, batch_sizes, repeats=repeats, warmup=warmup, seed=seed,
                              show_progress=show_progress)
    dense_gflops = estimate_gflops(model)

    def describe(name: str, sparsity: float) -> dict[str, Any]:
        heads, neurons = layer_widths(models[name])
        gflops = estimate_gflops(models[name])
        entry = {"sparsity": sparsity, "backbone_params": backbone_parameters(models[name]), "gflops": gflops,
                 "heads": heads, "neurons": neurons, "theoretical_speedup": dense_gflops / gflops,
                 "latency": timings[name]}
        entry["speedup"] = {b: timings["dense"][b]["median_ms"] / timings[name][b]["median_ms"] for b in timings[name]}
        entry["efficiency"] = {b: s / entry["theoretical_speedup"] for b, s in entry["speedup"].items()}
        return entry

    rows = []
    for sparsity in sparsities:
        entry = describe(f"{sparsity:g}", sparsity)
        entry["sparsity"] = counts[f"{sparsity:g}"].sparsity
        entry["requested_sparsity"] = sparsity
        rows.append(entry)
    dense = describe("dense", 0.0)
    models.clear()
    gc.collect()
    return {"dense": dense, "rows": rows}


# --------------------------------------------------------------------------------------------------- ranking time


def timed_rank(
    model: PreTrainedModel,
    method: str = "magnitude",
    data: Any = None,
    *,
    preset: str | None = None,
    seed: int = 0,
    mode: str | None = None,
    processor: Any = None,
    config: Any = None,
    show_progress: bool = True,
    **rank_kwargs: Any,
) -> tuple[ElasticRanking, dict[str, Any]]:
    """``hf_snapvit.rank`` with its wall time and, for SnapViT, the wall time of each phase.

    Args:
        model, method, data, preset, seed, mode, processor, show_progress, **rank_kwargs: As for
            :func:`hf_snapvit.rank`.
        config: For ``method="snapvit"``, a full :class:`~hf_snapvit.SnapViTConfig` instead of ``preset``.

    Returns:
        ``(ranking, {"method", "wall_seconds", "phases"})``; ``phases`` is ``SnapViTPruner.timings_`` (``data``,
        ``gradients``, ``search`` and its forward share ``search_forward``) for SnapViT, empty otherwise.
    """
    from .methods import rank

    start = time.perf_counter()
    phases: dict[str, float] = {}
    if method == "snapvit":
        from .methods.snapvit import SnapViTConfig, SnapViTPruner

        if data is None:
            raise BenchmarkError("method='snapvit' needs calibration images: pass data=...")
        overrides = dict(seed=seed, **{k: rank_kwargs.pop(k) for k in list(rank_kwargs)
                                       if k in ("min_head_keep_ratio", "min_neuron_keep_ratio", "paired_head_offset")})
        if mode is not None:
            overrides["mode"] = mode
        if rank_kwargs:
            raise BenchmarkError(f"Unexpected arguments for method='snapvit': {sorted(rank_kwargs)}.")
        if config is not None and (preset is not None or len(overrides) > 1 or "mode" in overrides):
            raise BenchmarkError("Give either config=SnapViTConfig(...) or preset/mode/floors, not both.")
        pruner = SnapViTPruner(config or SnapViTConfig.preset(preset or "default", **overrides))
        ranking = pruner.fit(model, data, processor=processor, show_progress=show_progress)
        phases = dict(pruner.timings_)
    else:
        if config is not None:
            raise BenchmarkError(f"config= is for method='snapvit'; method={method!r} takes preset=... instead.")
        ranking = rank(model, method=method, data=data, preset=preset, seed=seed, mode=mode, processor=processor,
                       show_progress=show_progress, **rank_kwargs)
    return ranking, {"method": method, "wall_seconds": time.perf_counter() - start, "phases": phases}


# --------------------------------------------------------------------------------------------------- memory (/proc)


def read_status(fields: tuple[str, ...] = STATUS_FIELDS) -> dict[str, int]:
    """Selected ``/proc/self/status`` fields, in bytes (missing fields, or a non-Linux system, give fewer keys)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in fields:
                    out[key] = int(value.split()[0]) * 1024  # reported in kB
    except OSError:
        pass
    return out


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0: write 5 to clear_refs). Returns whether it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class MemoryPoller(threading.Thread):
    """Samples ``RssAnon`` and ``VmRSS`` every ``interval`` seconds until the ``with`` block ends; keeps the peaks."""

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


def _count_mmapped(model: nn.Module) -> int | None:
    """How many parameters have their storage inside a mapping of a ``.safetensors`` file (zero-copy loads)."""
    ranges = []
    try:
        with open("/proc/self/maps") as handle:
            for line in handle:
                if ".safetensors" in line:
                    start, end = line.split()[0].split("-")
                    ranges.append((int(start, 16), int(end, 16)))
    except OSError:
        return None
    return sum(any(a <= p.untyped_storage().data_ptr() < b for a, b in ranges) for p in model.parameters())


# --------------------------------------------------------------------------------------------------- load time


def _stock_class(checkpoint: str):
    import transformers

    config = transformers.AutoConfig.from_pretrained(checkpoint)
    for name in config.architectures or []:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    return transformers.AutoModel


def load_child_main(spec_path: str) -> int:
    """Measure one configuration described by the JSON file ``spec_path`` (runs in a fresh process).

    The spec names the ``checkpoint``, the ``kind`` (``"elastic"`` at ``sparsity``, or ``"stock"`` transformers),
    ``threads``, whether to time the ``forward`` pass (``batch_sizes``, ``repeats``, ``warmup``), ``warm_loads``,
    ``poll_ms``, ``seed`` and the ``result_path`` to write JSON to.
    """
    with open(spec_path) as handle:
        spec = json.load(handle)
    torch.set_num_threads(int(spec["threads"]))
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # Import everything either loader touches lazily, so the fresh load time is not an import time.
    import accelerate  # noqa: F401  (the skeleton is built with accelerate.init_empty_weights)
    import safetensors.torch  # noqa: F401
    import transformers.conversion_mapping  # noqa: F401
    import transformers.core_model_loading  # noqa: F401

    from .budget import backbone_parameters, estimate_gflops, layer_widths
    from .modeling import ElasticViTModel

    checkpoint = spec["checkpoint"]
    if spec["kind"] == "elastic":
        sparsity = float(spec["sparsity"])

        def load():
            return ElasticViTModel.from_pretrained(checkpoint, sparsity=sparsity)
    else:
        stock = _stock_class(checkpoint)

        def load():
            return stock.from_pretrained(checkpoint)

    result: dict[str, Any] = {"kind": spec["kind"], "requested_sparsity": spec.get("sparsity"), "pid": os.getpid(),
                              "torch_threads": torch.get_num_threads(),
                              "torch_interop_threads": torch.get_num_interop_threads()}

    gc.collect()
    hwm_reset = reset_peak_rss()
    before = read_status()
    poll_s = float(spec["poll_ms"]) / 1000.0
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
        memory.update(poll_interval_ms=spec["poll_ms"], poll_samples=poller.samples,
                      peak_anon_growth=poller.peak_anon - before.get("RssAnon", 0),
                      peak_rss_growth_polled=poller.peak_rss - before.get("VmRSS", 0))
    result["load_s"] = load_s

    # Loaders may hand out tensors that view the memory-mapped file, whose pages only count once a forward pass
    # touches them; one batch-1 forward right after the load shows the resident footprint.
    if spec["forward"]:
        with torch.inference_mode():
            model(**dummy_inputs(model, 1, seed=int(spec["seed"])))
        touched = read_status()
        memory.update(after_first_forward=touched,
                      fwd_rss_growth=touched.get("VmRSS", 0) - before.get("VmRSS", 0),
                      fwd_anon_growth=touched.get("RssAnon", 0) - before.get("RssAnon", 0),
                      fwd_file_growth=touched.get("RssFile", 0) - before.get("RssFile", 0))
    result["memory"] = memory

    layout = getattr(model.config, "elastic_layout", None)
    heads, neurons = layer_widths(model)
    result["model"] = {
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
        "params_in_file_mmap": _count_mmapped(model),
        "non_contiguous_params": [n for n, p in model.named_parameters() if not p.is_contiguous()],
    }

    warm = []
    for _ in range(int(spec["warm_loads"])):
        gc.collect()
        start = time.perf_counter()
        extra = load()
        warm.append(time.perf_counter() - start)
        del extra
    gc.collect()
    result["warm_load_s_runs"] = warm
    result["warm_load_s"] = statistics.median(warm) if warm else None

    latency: dict[str, Any] = {}
    if spec["forward"]:
        model.eval()
        timed = measure_latency({"model": model}, [int(b) for b in spec["batch_sizes"]], repeats=int(spec["repeats"]),
                                warmup=int(spec["warmup"]), seed=int(spec["seed"]))["model"]
        latency = {b: {**entry, "warmup": int(spec["warmup"])} for b, entry in timed.items()}
    result["latency"] = latency
    with open(spec["result_path"], "w") as handle:
        json.dump(result, handle)
    return 0


_CHILD_CODE = "import sys; from hf_snapvit.benchmark import load_child_main; sys.exit(load_child_main(sys.argv[1]))"


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


# --------------------------------------------------------------------------------------------------- one call


def run_bench(
    checkpoint: str | os.PathLike,
    *,
    sparsities: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
    batch_sizes: Sequence[int] = (1, 8, 32),
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = None,
    device: str | None = None,
    latency: bool = True,
    load: bool = True,
    load_repeats: int = 1,
    output: str | os.PathLike | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Benchmark one elastic checkpoint (``hf-snapvit bench``): interleaved latency/throughput of sliced vs dense,
    with realised vs theoretical speedups, and load time / memory per sparsity.

    Args:
        checkpoint: An elastic checkpoint (local folder or Hub id; the load benchmark needs a local folder).
        sparsities: Sparsities to compare with the dense model.
        batch_sizes: Forward batch sizes.
        repeats: Timed rounds per batch size (median).
        warmup: Untimed passes per model and batch size.
        threads: ``torch.set_num_threads`` for the whole run (default: torch's current setting).
        device: Device for the latency benchmark (``"cpu"``, ``"cuda"``, ...; default CPU).
        latency: Run the latency benchmark.
        load: Run the load-time/memory benchmark (CPU, fresh processes; needs a local folder).
        load_repeats: Fresh processes per load configuration.
        output: Write the report as JSON here (atomically).
        show_progress: Show progress bars.

    Returns:
        ``{"hardware", "settings", "latency", "loading"}``.
    """
    from .files import write_text_atomic
    from .modeling import ElasticViTModel

    if threads is not None:
        if threads < 1:
            raise BenchmarkError(f"threads={threads} must be at least 1.")
        torch.set_num_threads(threads)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "hf_snapvit.benchmark.run_bench",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": str(checkpoint),
        "hardware": hardware_info(torch.get_num_threads(), device),
        "settings": {"sparsities": list(sparsities), "batch_sizes": list(batch_sizes), "repeats": repeats,
                     "warmup": warmup, "threads": torch.get_num_threads(), "device": device or "cpu",
                     "load_repeats": load_repeats, "inference_mode": True},
    }
    if latency:
        model = ElasticViTModel.from_pretrained(checkpoint)
        if device is not None:
            model.to(device)
        ranking = ElasticRanking.from_dict(model.config.elastic_ranking)
        report["latency"] = latency_vs_sparsity(model, ranking, sparsities, batch_sizes=batch_sizes, repeats=repeats,
                                                warmup=warmup, show_progress=show_progress)
    if load:
        if not Path(checkpoint).is_dir():
            raise BenchmarkError(
                f"The load benchmark reads a local checkpoint folder; {str(checkpoint)!r} is not one. Download it "
                "first (huggingface_hub.snapshot_download) or pass load=False.")
        # The interleaved measurement above is the latency to quote; the load children time batch 1 only.
        report["loading"] = measure_loading(checkpoint, sparsities, batch_sizes=[1], repeats=repeats, warmup=warmup,
                                            load_repeats=load_repeats, threads=torch.get_num_threads(),
                                            show_progress=show_progress)
    report["total_wall_s"] = time.perf_counter() - started
    if output is not None:
        write_text_atomic(output, json.dumps(report, indent=2))
    return report


def format_latency_table(result: Mapping[str, Any]) -> str:
    """A plain-text table of :func:`latency_vs_sparsity`'s result: GFLOPs, then per batch size the median latency,
    the realised speedup and the theoretical (GFLOP) speedup."""
    rows = [result["dense"], *result["rows"]]
    batches = list(result["dense"]["latency"])
    header = f"{'sparsity':>8} {'params M':>9} {'GFLOPs':>7} {'theory':>7}" + "".join(
        f" {'b' + b + ' ms':>9} {'b' + b + ' x':>7} {'img/s':>8}" for b in batches)
    lines = [header, "-" * len(header)]
    for row in rows:
        line = (f"{row['sparsity']:>8.3f} {row['backbone_params'] / 1e6:>9.2f} {row['gflops']:>7.3f} "
                f"{row['theoretical_speedup']:>7.2f}")
        for b in batches:
            entry = row["latency"][b]
            line += f" {entry['median_ms']:>9.1f} {row['speedup'][b]:>7.2f} {entry['throughput']:>8.1f}"
        lines.append(line)
    return "\n".join(lines)
