"""What the GPU latency scripts (``serving_paths.py``, ``profile_latency.py``) share: the random-weight shapes they
time, how each mode runs a model, and the switchable model's rows. (``bench_gpu_latency.py``, the precision and width
multiple grid of issues 15-29, left the tree once its results were recorded; it is in commit 96763dc.)

Modes: ``eager`` (plain PyTorch), ``compile`` (``torch.compile`` with inductor, default mode unless
``--compile-mode`` says otherwise) and ``compile-graphs`` (inductor with ``mode="reduce-overhead"``: CUDA graphs, which
replay a whole forward pass with one launch, for small batches). The dense model is always run the same way as the
models it is compared with.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import transformers
from transformers import PreTrainedModel

import hf_snapvit
from hf_snapvit import ElasticViTModel
from hf_snapvit.benchmark import measure_latency
from hf_snapvit.benchmark.latency import compiled_graph_room

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "vit-b16": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "vit-s16": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "vit-ti16": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    # For tests: small enough for a CPU, wide enough FFN (256) for the default multiple.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=32,
                 patch_size=8),
}


def build(shape: str, seed: int) -> transformers.ViTModel:
    """A random-weight ViT backbone of ``shape``: which units a ranking keeps does not matter for speed, only the
    widths do."""
    torch.manual_seed(seed)
    return transformers.ViTModel(transformers.ViTConfig(**SHAPES[shape]), add_pooling_layer=False).eval()


MODES = ("eager", "compile", "compile-graphs")
# "max-autotune" also captures CUDA graphs on a GPU; "max-autotune-no-cudagraphs" keeps it comparable to "compile".
COMPILE_MODES = ("default", "max-autotune", "max-autotune-no-cudagraphs")
# The first call of a compiled model compiles it. CUDA graph trees run the compiled code once more before they record
# a graph, and only later calls replay it, so fewer warm-up passes would time compilation or recording.
MIN_WARMUP = {"eager": 0, "compile": 1, "compile-graphs": 3}


def compile_options(mode: str, compile_mode: str = "default") -> dict[str, Any] | None:
    """Keyword arguments of ``torch.compile`` for ``mode`` (``None`` for eager)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not one of {MODES}.")
    if mode == "eager":
        return None
    return {"backend": "inductor", "mode": "reduce-overhead" if mode == "compile-graphs" else compile_mode}


def skip_reason(mode: str, device: str) -> str | None:
    """Why ``mode`` is not measured on ``device``, or ``None`` if it is."""
    if mode == "compile-graphs" and torch.device(device).type != "cuda":
        return (f"CUDA graphs need a CUDA device: on {device}, torch.compile(mode='reduce-overhead') falls back to "
                "the plain inductor code that mode 'compile' already measures")
    return None


def compile_counters() -> dict[str, int]:
    """Dynamo's and inductor's running counts of graphs compiled and of graphs that CUDA graphs skipped."""
    from torch._dynamo.utils import counters

    return {"graphs_compiled": int(counters["stats"]["unique_graphs"]),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}


def counters_since(before: Mapping[str, int]) -> dict[str, int]:
    """What :func:`compile_counters` counted since ``before``: a compiled run that compiled no graph, or whose CUDA
    graphs were skipped, did not run the way its mode says."""
    return {key: value - before[key] for key, value in compile_counters().items()}


@contextlib.contextmanager
def elastic_checkpoint(model: PreTrainedModel, ranking: hf_snapvit.ElasticRanking) -> Iterator[Path]:
    """A temporary elastic checkpoint of ``model``, which a switchable model is loaded from (every unit, in rank
    order)."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-latency-") as folder:
        hf_snapvit.save_elastic(model, ranking, folder, model_card=False)
        yield Path(folder)


def load_switchable(folder: Path, dtype: torch.dtype, device: str) -> PreTrainedModel:
    """The switchable model of the elastic checkpoint in ``folder``, in ``dtype`` on ``device``, at full size, without
    the pooler that the benchmark's models (``add_pooling_layer=False``) do not have either."""
    with warnings.catch_warnings():
        # The checkpoint holds no pooler, so loading warns that it is new; it is dropped right away.
        warnings.filterwarnings("ignore", message="Some weights were not in the checkpoint")
        model = ElasticViTModel.from_pretrained(folder, switchable=True, dtype=dtype)
    model.pooler = None
    return model.to(device).eval()


def switchable_rows(switchable: PreTrainedModel, dense: nn.Module, result: Mapping[str, Any],
                    options: Mapping[str, Any] | None, multiple: int,
                    timing: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The switchable model at every sparsity of ``result["rows"]``, each size timed side by side with ``dense``.

    Each size gets its own rotation with the dense model, switched to before it: a switch between timed passes would
    add its own cost to them. Compiled (``options``), the switchable model recompiles once per size; a failure is
    recorded in that size's row (``"error"``) rather than losing the rest of the run.

    Args:
        switchable: From :func:`load_switchable`, in the dtype and on the device of ``dense``.
        dense: The dense model of the run (eager; compiled here like the switchable one).
        result: ``latency_vs_sparsity``'s result for the same model, precision and multiple.
        options: ``torch.compile`` keyword arguments, or ``None`` for eager.
        multiple: The FFN width multiple of the run.
        timing: ``batch_sizes``, ``repeats``, ``warmup`` and ``seed`` for ``measure_latency``.
    """
    models = {"dense": dense, "switchable": switchable}
    room: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if options is not None:
        models = {name: torch.compile(model, dynamic=False, **options) for name, model in models.items()}
        # The sliced models' graphs of this run are still cached on the same function as these.
        room = compiled_graph_room(2 * (1 + len(result["rows"])) * len(timing["batch_sizes"]))
    rows = []
    with room:
        for row in result["rows"]:
            requested = row["requested_sparsity"]
            budget = switchable.set_budget(sparsity=requested, width_multiple=multiple)
            try:
                timings = measure_latency(models, **timing)
            except Exception as error:  # noqa: BLE001 - a compiler failure is a result; eager ones are bugs
                if options is None:
                    raise
                rows.append({"model": "switchable", "requested_sparsity": requested,
                             "error": f"{type(error).__name__}: {error}"})
                continue
            rows.append(_switchable_row(budget, requested, timings, result["dense"]["gflops"]))
    return rows


def _switchable_row(budget: Any, requested: float, timings: Mapping[str, Any], dense_gflops: float) -> dict[str, Any]:
    """A row like ``latency_vs_sparsity``'s, from the switchable model's budget and its rotation with the dense one
    (whose latency there is kept as ``dense_latency``)."""
    theoretical = dense_gflops / budget.gflops
    speedup = {batch: timings["dense"][batch]["median_ms"] / entry["median_ms"]
               for batch, entry in timings["switchable"].items()}
    return {"model": "switchable", "sparsity": budget.sparsity, "requested_sparsity": requested,
            "backbone_params": budget.num_params, "gflops": budget.gflops, "heads": list(budget.heads),
            "neurons": list(budget.neurons), "theoretical_speedup": theoretical, "latency": timings["switchable"],
            "dense_latency": timings["dense"], "speedup": speedup,
            "efficiency": {batch: value / theoretical for batch, value in speedup.items()}}
