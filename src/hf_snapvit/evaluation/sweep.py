"""Sweeps: evaluate a grid of sparsities x ranking methods on one dataset, and write JSON, CSV and plots.

For every method and sparsity, the dense model is physically sliced by that method's ranking, evaluated with an
:class:`~hf_snapvit.evaluation.Evaluator` (the dense features are extracted once for the whole sweep) and, optionally,
timed against the dense model in the same interleaved measurement. The output folder receives:

* ``sweep.json``: every row with all metrics, the dense reference, ranking provenance and wall times, settings and
  hardware;
* ``sweep.csv``: one line per (method, sparsity), scalar columns only;
* ``accuracy_vs_sparsity.png``, ``accuracy_vs_gflops.png``: one line per method, one panel per metric;
* ``latency_vs_sparsity.png``: measured latency and realised vs theoretical (GFLOP) speedup;
* ``allocation_<method>.png``: the per-block allocation heatmap of each ranking.

The plots are drawn by :func:`hf_snapvit.plots.write_sweep_plots` from the rows, as ``sweep.json`` holds them.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..benchmark import compare_latency, hardware_info, sliced_copy
from ..architectures.budget import model_shape
from ..errors import SnapViTError, SweepError
from ..utils.extras import require_extra
from ..utils.files import public_name, write_text_atomic
from ..plots import write_sweep_plots
from ..pruning.methods import rank, ranking_method
from ..elastic.ranking import ElasticRanking
from ..data.views import load_processor
from .evaluator import Evaluator, load_model
from .images import load_split
from .probe import LinearProbeConfig
from .sweep_result import SweepResult, csv_text, json_text, result_row


def _resolve(entry: ElasticRanking | str | os.PathLike, model: PreTrainedModel, name: str,
             extra: Mapping[str, Any], width_multiple: int | None
             ) -> tuple[PreTrainedModel, ElasticRanking, dict[str, Any]]:
    """The dense model a ranking applies to, the ranking, and the method's facts: where the ranking came from, the
    ``extra`` facts given for it (its ``wall_seconds`` as ``ranking_seconds``), its mode, maximum and provenance."""
    base, ranking, info = _load_ranking(entry, model, name)
    info.update(extra)
    info.setdefault("ranking_seconds", extra.get("wall_seconds"))
    info.update(mode=ranking.mode, max_sparsity=ranking.max_sparsity_for(width_multiple), provenance=ranking.provenance,
                skipped=[])
    return base, ranking, info


def _load_ranking(entry: ElasticRanking | str | os.PathLike, model: PreTrainedModel, name: str
                  ) -> tuple[PreTrainedModel, ElasticRanking, dict[str, Any]]:
    """The dense model a ranking applies to, the ranking, and where it came from."""
    if isinstance(entry, ElasticRanking):
        try:
            entry.check_matches(model_shape(model))
        except SnapViTError as error:
            raise SweepError(f"The ranking of method {name!r} does not fit the model: {error}") from error
        return model, entry, {"source": "in memory"}
    if isinstance(entry, (str, os.PathLike)):
        from ..loading.modeling import ElasticViTModel

        # An elastic checkpoint stores its weights permuted into rank order; its own dense model is the one its
        # ranking indexes (same function as the original model).
        base = ElasticViTModel.from_pretrained(entry)
        stored = getattr(base.config, "elastic_ranking", None)
        if stored is None:
            raise SweepError(f"{str(entry)!r} (method {name!r}) is a sliced checkpoint without an elastic_ranking; "
                             "give the dense elastic checkpoint written by hf_snapvit.save_elastic.")
        ranking = ElasticRanking.from_dict(stored)
        base.to(next(model.parameters()).device)
        return base, ranking, {"source": public_name(entry)}
    raise SweepError(f"rankings[{name!r}] is a {type(entry).__name__}; give an ElasticRanking of the model or the "
                     "path of an elastic checkpoint.")


@dataclass(frozen=True)
class _LatencyPairs:
    """Times each sliced model against the dense one in the same interleaved measurement."""

    dense_model: PreTrainedModel
    batch_size: int
    repeats: int
    warmup: int

    def settings(self, enabled: bool) -> dict[str, Any]:
        return {"enabled": enabled, "batch_size": self.batch_size, "repeats": self.repeats, "warmup": self.warmup,
                "input": "seeded random pixels", "interleaved_with_dense": True, "threads": torch.get_num_threads()}

    def time(self, sliced: PreTrainedModel) -> dict[str, Any]:
        timed = compare_latency({"dense": self.dense_model, "sliced": sliced}, [self.batch_size],
                                repeats=self.repeats, warmup=self.warmup)
        key = str(self.batch_size)
        dense_ms, sliced_ms = timed["dense"][key]["median_ms"], timed["sliced"][key]["median_ms"]
        return {"latency_ms": sliced_ms, "dense_latency_ms": dense_ms, "speedup": dense_ms / sliced_ms,
                "throughput": timed["sliced"][key]["throughput"]}


def _checked_grid(rankings: Mapping[str, Any], sparsities: Sequence[float], plots: bool) -> list[float]:
    """The sparsities as floats, after checking them, the method names (which become file names) and, for
    ``plots``, that matplotlib is there: a sweep fails before its evaluation, not after it."""
    if plots:
        require_extra("matplotlib", "sweep(plots=True) (pass plots=False to write no plots)")
    if not rankings:
        raise SweepError("rankings is empty; give at least one method, e.g. {'magnitude': hf_snapvit.rank(model)}.")
    grid = [float(s) for s in sparsities]
    if not grid or any(not 0.0 < s < 1.0 for s in grid):
        raise SweepError(f"sparsities={grid} must be a non-empty list of values in (0, 1), e.g. 0.1 ... 0.6.")
    bad = [name for name in rankings if not re.fullmatch(r"[\w.+-]+", name)]
    if bad:
        raise SweepError(f"Method names {bad} must be non-empty and use only letters, digits, '_', '.', '+', '-' "
                         "(they become file names).")
    return grid


def _sweep_method(name: str, base: PreTrainedModel, ranking: ElasticRanking, info: dict[str, Any],
                  sparsities: Sequence[float], evaluator: Evaluator, dense: Mapping[str, Any],
                  timer: _LatencyPairs | None, width_multiple: int | None) -> list[dict[str, Any]]:
    """The rows of one method: ``base`` sliced by ``ranking`` at every sparsity it reaches, evaluated and timed."""
    rows = []
    limit = info["max_sparsity"]
    for sparsity in sparsities:
        if sparsity > limit:
            warnings.warn(f"Method {name!r}: sparsity {sparsity} exceeds the ranking's maximum "
                          f"{limit:.4f} (per-block floors); skipped.", stacklevel=4)
            info["skipped"].append(sparsity)
            continue
        sliced = sliced_copy(base, ranking, sparsity, width_multiple)
        row = result_row(name, sparsity, evaluator.evaluate(sliced, name=f"{name}@{sparsity:g}"))
        row["theoretical_speedup"] = dense["gflops"] / row["gflops"]
        row["ranking_seconds"] = info.get("ranking_seconds")
        if timer is not None:
            row.update(timer.time(sliced))
        rows.append(row)
        del sliced
        gc.collect()
    return rows


def run_sweep(
    model: PreTrainedModel,
    rankings: Mapping[str, ElasticRanking | str | os.PathLike],
    sparsities: Sequence[float],
    eval_data: Any,
    *,
    output_dir: str | os.PathLike,
    bank_data: Any = None,
    eval_labels: Any = None,
    bank_labels: Any = None,
    processor: Any = None,
    metrics: Sequence[str] | None = None,
    k: int = 20,
    probe: LinearProbeConfig | None = None,
    batch_size: int = 64,
    latency: bool = True,
    latency_batch_size: int = 8,
    latency_repeats: int = 3,
    latency_warmup: int = 1,
    ranking_info: Mapping[str, Mapping[str, Any]] | None = None,
    plots: bool = True,
    show_progress: bool = True,
    width_multiple: int | None = None,
) -> SweepResult:
    """Evaluate ``model`` sliced by every ranking at every sparsity; write JSON, CSV and plots to ``output_dir``.

    Args:
        model: The dense model (a ``*ForImageClassification`` gives top-1 too); the retention reference.
        rankings: Method name → an :class:`ElasticRanking` of ``model``, or the path of an elastic checkpoint (its
            stored ranking and its own dense weights are used, e.g. a SnapViT ranking saved earlier).
        sparsities: Fractions of backbone parameters to remove. A sparsity beyond a ranking's ``max_sparsity`` is
            skipped for that method, with a warning, and listed under ``methods[name]["skipped"]``.
        eval_data: Evaluation (test) images, see :class:`~hf_snapvit.evaluation.Evaluator`.
        output_dir: Folder for ``sweep.json``, ``sweep.csv`` and the PNGs (created; files are replaced atomically).
        bank_data: Labelled train images for k-NN and the linear probe.
        eval_labels: Labels of ``eval_data`` when it is not a labelled dataset.
        bank_labels: Labels of ``bank_data`` when it is not a labelled dataset.
        processor: The image processor (default: the model's).
        metrics: Subset of ``("top1", "knn", "linear", "retention")`` (default: all the data allows).
        k: Neighbours of the k-NN.
        probe: Linear-probe protocol.
        batch_size: Images per forward pass during evaluation.
        latency: Time every sliced model against the dense model (interleaved, random input).
        latency_batch_size: Batch size of the latency measurement.
        latency_repeats: Timed rounds per pair (median).
        latency_warmup: Untimed passes per model.
        ranking_info: Method → extra facts to record, e.g. ``{"wall_seconds": 412.0, "phases": {...}}`` (a
            ranking's ``provenance["timings"]``, see :func:`hf_snapvit.rank`); ``wall_seconds`` is recorded as the
            method's ``ranking_seconds`` unless that is given.
        plots: Write the PNG plots.
        show_progress: Show progress bars.
        width_multiple: Kept FFN widths are multiples of this (see :meth:`~hf_snapvit.ElasticRanking.keep_counts`;
            ``1`` for exact widths); recorded in the settings.

    Returns:
        The :class:`SweepResult` (also in ``output_dir/sweep.json``).
    """
    sparsities = _checked_grid(rankings, sparsities, plots)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model.eval()
    started = time.perf_counter()
    evaluator = Evaluator(eval_data, bank_data=bank_data, eval_labels=eval_labels, bank_labels=bank_labels,
                          dense_model=model, processor=processor, metrics=metrics, k=k, probe=probe,
                          batch_size=batch_size, show_progress=show_progress)
    dense = result_row("dense", 0.0, evaluator.evaluate(model, name="dense"))
    dense["theoretical_speedup"] = 1.0
    timer = _LatencyPairs(model, latency_batch_size, latency_repeats, latency_warmup)
    rows, methods, kept_rankings = _sweep_methods(model, rankings, ranking_info or {}, sparsities, evaluator, dense,
                                                  timer if latency else None, width_multiple)
    if latency and rows:
        # The dense model's latency: the median of its runs, one paired with every sliced model.
        dense["latency_ms"] = float(torch.tensor([row["dense_latency_ms"] for row in rows]).median())
        dense.update(dense_latency_ms=dense["latency_ms"], speedup=1.0)
    result = SweepResult(dense=dense, rows=rows, methods=methods,
                         settings={**_settings(evaluator, model, dense, sparsities, timer.settings(latency)),
                                   "width_multiple": width_multiple},
                         hardware=hardware_info(torch.get_num_threads(), next(model.parameters()).device))
    _write_files(result, kept_rankings, output, plots, started)
    return result


def _sweep_methods(model: PreTrainedModel, rankings: Mapping[str, ElasticRanking | str | os.PathLike],
                   ranking_info: Mapping[str, Mapping[str, Any]], sparsities: Sequence[float], evaluator: Evaluator,
                   dense: Mapping[str, Any], timer: _LatencyPairs | None, width_multiple: int | None
                   ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, ElasticRanking]]:
    """Every method's rows, its facts, and its ranking, method after method (one checkpoint in memory at a time)."""
    rows: list[dict[str, Any]] = []
    methods: dict[str, dict[str, Any]] = {}
    kept_rankings: dict[str, ElasticRanking] = {}
    for name, entry in rankings.items():
        base, kept_rankings[name], methods[name] = _resolve(entry, model, name, ranking_info.get(name, {}),
                                                            width_multiple)
        rows += _sweep_method(name, base, kept_rankings[name], methods[name], sparsities, evaluator, dense, timer,
                              width_multiple)
        if base is not model:
            del base
            gc.collect()
    return rows, methods, kept_rankings


def _settings(evaluator: Evaluator, model: PreTrainedModel, dense: Mapping[str, Any], sparsities: list[float],
              latency: dict[str, Any]) -> dict[str, Any]:
    """The sweep's settings as recorded in ``sweep.json`` (``wall_seconds`` is filled in last)."""
    return {
        "sparsities": sparsities, "metrics": list(evaluator.metrics) if evaluator.metrics else None, "k": evaluator.k,
        "probe": dataclasses.asdict(evaluator.probe), "batch_size": evaluator.batch_size,
        "num_eval": dense["num_eval"], "num_bank": dense["num_bank"], "eval_data": evaluator.eval_set.description,
        "bank_data": evaluator.bank_set.description if evaluator.bank_set is not None else None,
        "latency": latency, "model": public_name(getattr(model.config, "_name_or_path", None)),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "wall_seconds": None,
    }


def _write_files(result: SweepResult, rankings: Mapping[str, ElasticRanking], output: Path, plots: bool,
                 started: float) -> None:
    """``sweep.csv``, the plots and, last (with the sweep's wall time), ``sweep.json``."""
    result.files["csv"] = "sweep.csv"  # names in the output folder: no local path in sweep.json
    write_text_atomic(output / "sweep.csv", csv_text([result.dense, *result.rows]))
    if plots:
        result.files.update(write_sweep_plots(output, dense=result.dense, rows=result.rows, settings=result.settings,
                                              rankings=rankings))
    result.files["json"] = "sweep.json"
    result.settings["wall_seconds"] = time.perf_counter() - started
    write_text_atomic(output / "sweep.json", json_text(result))
def sweep_from_paths(
    model: str | os.PathLike | PreTrainedModel,
    data: str | os.PathLike,
    *,
    output_dir: str | os.PathLike,
    methods: Sequence[str] = (),
    checkpoints: Mapping[str, str | os.PathLike] | None = None,
    sparsities: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
    eval_split: str = "validation",
    bank_split: str | None = "train",
    calibration_split: str = "train",
    num_eval: int | None = 1000,
    num_bank: int | None = 2000,
    preset: str | None = "fast",
    seed: int = 0,
    mode: str | None = None,
    ranking_info: Mapping[str, Mapping[str, Any]] | None = None,
    show_progress: bool = True,
    **sweep_kwargs: Any,
) -> SweepResult:
    """Rank a checkpoint with ``methods``, add saved ``checkpoints``, and run :func:`run_sweep` on a dataset's splits.

    Args:
        model: The dense model or its path / Hub id (a ``*ForImageClassification`` checkpoint gives top-1 too).
        data: A folder of ``{split}.parquet`` files or a dataset name (see :func:`hf_snapvit.evaluation.load_split`).
        output_dir: Where :func:`run_sweep` writes its files.
        methods: Methods to rank with now (:func:`hf_snapvit.available_methods`), on the ``calibration_split``;
            their wall time (and SnapViT's phases) is recorded.
        checkpoints: Name → elastic checkpoint whose stored ranking is reused.
        sparsities: The sparsity grid.
        eval_split: Split evaluated on (a seeded subset of ``num_eval`` images).
        bank_split: Labelled split for k-NN and the linear probe (``num_bank`` images; seed ``seed + 1``), or
            ``None`` for neither.
        calibration_split: Split the data-driven methods draw their (unlabelled, except ``taylor-ce``) images from.
        num_eval: Evaluation images (``None``: the whole split).
        num_bank: Bank images (``None``: the whole split).
        preset: The methods' preset (SnapViT's, also the gradient baselines' image counts); a method whose config
            has no preset of that name runs its default.
        seed: Seed of the rankings and of the subsets.
        mode: Ranking mode (default: each method's).
        ranking_info: Extra facts per method (e.g. the recorded ranking time of a checkpoint).
        show_progress: Show progress bars.
        **sweep_kwargs: Passed to :func:`run_sweep` (``metrics``, ``k``, ``probe``, ``latency``, ...).

    Returns:
        The :class:`SweepResult`.
    """
    if not methods and not checkpoints:
        raise SweepError("Give at least one ranking: methods=[...] to rank now and/or checkpoints={name: path}.")
    path = None
    if not isinstance(model, PreTrainedModel):
        path, model = str(model), load_model(model)
    processor = sweep_kwargs.pop("processor", None) or load_processor(path or model,
                                                                      purpose="preprocess the sweep's images")
    eval_data = load_split(data, eval_split, num_samples=num_eval, seed=seed)
    bank_data = None if bank_split is None else load_split(data, bank_split, num_samples=num_bank, seed=seed + 1)
    rankings: dict[str, ElasticRanking | str | os.PathLike] = {}
    info: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (ranking_info or {}).items()}
    calibration = None
    for method in methods:
        entry = ranking_method(method)  # whether it reads images, and its presets
        if entry.needs_data and calibration is None:
            calibration = load_split(data, calibration_split)
        own = preset if preset in entry.config_cls.presets() else None  # a method without it: its default
        ranking = rank(model, method, calibration if entry.needs_data else None, preset=own, seed=seed, mode=mode,
                       processor=processor, show_progress=show_progress)
        rankings[method] = ranking
        timings = ranking.provenance["timings"]
        info[method] = {"method": method, "wall_seconds": timings["wall_seconds"], "phases": dict(timings["phases"]),
                        **info.get(method, {})}
    for name, checkpoint in (checkpoints or {}).items():
        if name in rankings:
            raise SweepError(f"{name!r} is both a method to rank and a checkpoint; give the checkpoint another name.")
        rankings[name] = checkpoint
    return run_sweep(model, rankings, sparsities, eval_data, bank_data=bank_data, processor=processor,
                     output_dir=output_dir, ranking_info=info, show_progress=show_progress, **sweep_kwargs)
