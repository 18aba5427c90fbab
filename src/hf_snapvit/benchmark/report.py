"""One elastic checkpoint's benchmark (``hf-snapvit bench``): interleaved latency of sliced vs dense models, and the
load time and memory of each sparsity in fresh processes, with the machine they ran on."""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import BenchmarkError
from ..utils.files import public_name, write_text_atomic
from ..loading.modeling import ElasticViTModel
from ..elastic.ranking import ElasticRanking
from .environment import hardware_info
from .latency import latency_vs_sparsity
from .loading import measure_loading


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
    if threads is not None:
        if threads < 1:
            raise BenchmarkError(f"threads={threads} must be at least 1.")
        torch.set_num_threads(threads)
    started = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "hf_snapvit.benchmark.run_bench",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "checkpoint": public_name(checkpoint),
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
