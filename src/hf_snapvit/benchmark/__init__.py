"""Measure what slicing buys: forward latency and throughput, load time and memory.

* :mod:`.environment`: the machine a measurement ran on and the process's memory from ``/proc/self``;
* :mod:`.latency`: interleaved forward latency of models against each other (:func:`compare_latency`) and of sliced
  copies against the dense model (:func:`latency_vs_sparsity`);
* :mod:`.loading`: load time and memory of ``ElasticViTModel.from_pretrained(path, sparsity=...)``, one fresh
  process per configuration (:func:`measure_loading`);
* :mod:`.report`: both for one elastic checkpoint (:func:`run_bench`, ``hf-snapvit bench``).

The wall time of a ranking, with SnapViT's phases, is in the ranking itself: ``rank(...).provenance["timings"]``.

May import loading and every earlier stage; never the pruner, evaluation, publishing or the CLI.
"""

from __future__ import annotations

from .environment import MIB, STATUS_FIELDS, MemoryPoller, device_slug, hardware_info, read_status, reset_peak_rss
from .latency import (compare_latency, dummy_inputs, format_latency_table, latency_vs_sparsity, measure_latency,
                      sliced_copy)
from .loading import add_load_ratios, load_child_main, measure_load_config, measure_loading, run_load_child
from .report import run_bench

__all__ = [
    "MIB",
    "STATUS_FIELDS",
    "MemoryPoller",
    "add_load_ratios",
    "compare_latency",
    "device_slug",
    "dummy_inputs",
    "format_latency_table",
    "hardware_info",
    "latency_vs_sparsity",
    "load_child_main",
    "measure_latency",  # deprecated name of compare_latency (FutureWarning)
    "measure_load_config",
    "measure_loading",
    "read_status",
    "reset_peak_rss",
    "run_bench",
    "run_load_child",
    "sliced_copy",
]
