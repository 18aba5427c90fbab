"""Forward latency and throughput of sliced models against the dense one, measured interleaved.

Every speed number is meant to be read as a ratio to the dense model measured in the same run, because absolute
timings on shared machines drift. :func:`compare_latency` therefore runs the models it compares round-robin (one
timed forward of each per repeat, in a rotating order), and :func:`latency_vs_sparsity` puts the dense model and every
sliced one into that same rotation, next to the theoretical GFLOP ratio.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures.embedding import dummy_inputs
from ..errors import BenchmarkError
from ..loading.timing import interleaved_ms
from ..elastic.ranking import ElasticRanking


def compare_latency(
    models: Mapping[str, nn.Module],
    batch_sizes: Sequence[int] = (1, 8),
    *,
    repeats: int = 5,
    warmup: int = 1,
    inputs: Callable[[nn.Module, int], Mapping[str, torch.Tensor]] | None = None,
    seed: int = 0,
    show_progress: bool = False,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Forward latency and throughput of several models against each other, measured interleaved.

    For each batch size every model gets ``warmup`` untimed forward passes; then each of ``repeats`` rounds times one
    forward pass of every model, in an order rotated by one model per round, so slow phases of a shared machine hit
    all models alike (:func:`~hf_snapvit.loading.timing.interleaved_ms`, the timer of
    :func:`hf_snapvit.measure_latency` too). Runs under ``torch.inference_mode()``; CUDA work is synchronised around
    every timed pass.

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
        raise BenchmarkError("compare_latency needs at least one model.")
    if any(int(b) < 1 for b in batch_sizes) or not batch_sizes:
        raise BenchmarkError(f"batch_sizes={list(batch_sizes)} must be positive integers.")
    make = inputs or (lambda model, batch: dummy_inputs(model, batch, seed=seed))
    names = list(models)
    results: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in names}
    with torch.inference_mode(), tqdm(total=len(batch_sizes) * repeats, desc="latency", unit="round",
                                      disable=not show_progress) as bar:
        for batch in batch_sizes:
            passes = []
            for name in names:
                parameter = next(models[name].parameters())
                prepared = {k: v.to(parameter.device, dtype=parameter.dtype if v.is_floating_point() else v.dtype)
                            for k, v in make(models[name], int(batch)).items()}
                passes.append((models[name], prepared, parameter.device))
            runs = interleaved_ms(passes, repeats=repeats, warmup=warmup, on_round=lambda: bar.update(1))
            for name, times in zip(names, runs):
                median = statistics.median(times)
                results[name][str(batch)] = {"median_ms": median, "min_ms": min(times), "runs_ms": times,
                                             "throughput": int(batch) * 1e3 / median}
    return results


def measure_latency(models: Mapping[str, nn.Module], batch_sizes: Sequence[int] = (1, 8), **kwargs: Any
                    ) -> dict[str, dict[str, dict[str, Any]]]:
    """Deprecated name of :func:`compare_latency` (``hf_snapvit.measure_latency`` is the latency table of one
    switchable model); warns with a ``FutureWarning``."""
    warnings.warn("hf_snapvit.benchmark.measure_latency is renamed compare_latency and will be removed in a later "
                  "release; call hf_snapvit.benchmark.compare_latency(models, batch_sizes, ...) (the same arguments). "
                  "hf_snapvit.measure_latency is another function: the latency table of one switchable model.",
                  FutureWarning, stacklevel=2)
    return compare_latency(models, batch_sizes, **kwargs)


def sliced_copy(model: PreTrainedModel, ranking: ElasticRanking, sparsity: float,
                width_multiple: int | None = None) -> PreTrainedModel:
    """A physically sliced deep copy of ``model`` at ``sparsity`` (``model`` is unchanged); ``width_multiple`` as in
    :meth:`~hf_snapvit.ElasticRanking.keep_counts`."""
    from ..surgery.slicing import slice_model_

    counts = ranking.keep_counts(sparsity, width_multiple=width_multiple)
    return slice_model_(copy.deepcopy(model), ranking.keep_indices(counts)).eval()


def recompile_limit_settings() -> tuple[str, str]:
    """The names of dynamo's per-function graph limit and of its fail-when-hit flag in this torch version."""
    # Older torch versions call these cache_size_limit and fail_on_cache_limit_hit.
    if hasattr(torch._dynamo.config, "recompile_limit"):
        return "recompile_limit", "fail_on_recompile_limit_hit"
    return "cache_size_limit", "fail_on_cache_limit_hit"


def compiled_graph_room(graphs: int) -> contextlib.AbstractContextManager[None]:
    """Let dynamo keep ``graphs`` more graphs per function for the duration, and fail rather than run eagerly past
    that.

    All transformers models enter their forward through one shared wrapper function, and dynamo keeps at most
    ``recompile_limit`` (8) graphs per function: every further model or batch size then runs eagerly, with only a
    logged warning, so a comparison of compiled models would time some of them uncompiled.
    """
    config = torch._dynamo.config
    limit, fail = recompile_limit_settings()
    settings: dict[str, Any] = {limit: getattr(config, limit) + graphs}
    if hasattr(config, fail):
        settings[fail] = True
    return config.patch(**settings)


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
    width_multiple: int | None = None,
    compile: bool | Mapping[str, Any] = False,
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
        width_multiple: Kept FFN widths are multiples of this (see :meth:`~hf_snapvit.ElasticRanking.keep_counts`).
        compile: Time each model through ``torch.compile``: ``True`` with its default settings, or a mapping of its
            keyword arguments (``{"mode": "reduce-overhead"}``), the same for every model. Shapes are static
            (``dynamic=False`` unless the mapping says otherwise): one graph per model and batch size, as a server
            with fixed batch sizes runs. Compilation happens in the warm-up passes (at least one is needed).

    Returns:
        ``{"dense": {...}, "rows": [...]}``; each row has the sparsity, parameters, GFLOPs, per-block widths, the
        latency per batch size, and ``speedup`` (dense median / sliced median) next to ``theoretical_speedup``
        (dense GFLOPs / sliced GFLOPs) and their ratio ``efficiency``.
    """
    from ..architectures.budget import backbone_parameters, layer_widths, model_shape
    from ..architectures.flops import estimate_gflops

    ranking.check_matches(model_shape(model))
    models: dict[str, nn.Module] = {"dense": model.eval()}
    counts = {}
    limit = ranking.max_sparsity_for(width_multiple)
    for sparsity in sparsities:
        if not 0.0 <= sparsity <= limit:
            raise BenchmarkError(f"sparsity={sparsity} is out of range: this ranking supports 0 <= sparsity <= "
                                 f"{limit:.4f} at width_multiple={width_multiple}.")
        key = f"{sparsity:g}"
        models[key] = sliced_copy(model, ranking, sparsity, width_multiple)
        counts[key] = ranking.keep_counts(sparsity, width_multiple=width_multiple)
    room: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    timed = models
    if isinstance(compile, Mapping) or compile:
        options = {"dynamic": False, **(compile if isinstance(compile, Mapping) else {})}
        timed = {name: torch.compile(m, **options) for name, m in models.items()}
        room = compiled_graph_room(len(models) * len(batch_sizes))
    with room:
        timings = compare_latency(timed, batch_sizes, repeats=repeats, warmup=warmup, seed=seed,
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
