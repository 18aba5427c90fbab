"""Sweeps: evaluate a grid of sparsities x ranking methods on one dataset, and write JSON, CSV and plots.

For every method and sparsity, the dense model is physically sliced by that method's ranking, evaluated with an
:class:`~hf_snapvit.evaluation.Evaluator` (the dense features are extracted once for the whole sweep) and, optionally,
timed against the dense model in the same interleaved measurement. The output folder receives:

* ``sweep.json``: every row with all metrics, the dense reference, ranking provenance and wall times, settings and
  hardware;
* ``sweep.csv``: one line per (method, sparsity), scalar columns only;
* ``accuracy_vs_sparsity.png``, ``accuracy_vs_gflops.png``: one line per method, one panel per metric;
* ``latency_vs_sparsity.png``: measured latency and realised vs theoretical (GFLOP) speedup;
* ``allocation_<method>.png``: the per-block allocation heatmap of each ranking (:mod:`hf_snapvit.plotting`).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import gc
import io
import json
import math
import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from .benchmark import hardware_info, measure_latency, sliced_copy
from .budget import model_shape
from .errors import SnapViTError, SweepError
from .evaluation import EvaluationResult, Evaluator, LinearProbeConfig
from .files import atomic_file, write_text_atomic
from .ranking import ElasticRanking

ACCURACY_METRICS: tuple[tuple[str, str], ...] = (
    ("top1", "top-1 (model's head)"),
    ("knn_top1", "k-NN top-1"),
    ("linear_top1", "linear-probe top-1"),
    ("retention", "retention (cosine to dense)"),
)
CSV_COLUMNS: tuple[str, ...] = (
    "method", "requested_sparsity", "sparsity", "num_params", "total_params", "gflops", "top1", "knn_top1",
    "linear_top1", "retention", "linear_best_epoch", "latency_ms", "dense_latency_ms", "speedup",
    "theoretical_speedup", "ranking_seconds",
)



@dataclass
class SweepResult:
    """What :func:`run_sweep` measured and wrote.

    Args:
        dense: The dense model's row (sparsity 0).
        rows: One row per (method, sparsity): every metric, parameters, GFLOPs, latency and speedups.
        methods: Per method: where its ranking came from, its ranking time and provenance, skipped sparsities.
        settings: The sweep's settings (sparsities, metrics, k, probe, latency protocol).
        hardware: Machine and library versions.
        files: Name → path of every file written.
    """

    dense: dict[str, Any]
    rows: list[dict[str, Any]]
    methods: dict[str, dict[str, Any]]
    settings: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable values."""
        return {"dense": self.dense, "rows": self.rows, "methods": self.methods, "settings": self.settings,
                "hardware": self.hardware, "files": self.files}

    def to_markdown(self, metrics: Sequence[str] = ("top1", "knn_top1")) -> str:
        """A README-ready table: one line per method, ``metric @ s1 / s2 / ...`` in percent, plus ranking time."""
        sparsities = sorted({row["requested_sparsity"] for row in self.rows})
        present = [m for m in metrics if self.dense.get(m) is not None]
        names = dict(ACCURACY_METRICS)
        grid = " / ".join(f"{s:.0%}" for s in sparsities)
        header = "| method | ranking time | " + " | ".join(f"{names[m]} @ {grid}" for m in present) + " |"
        lines = [header, "|" + "---|" * (2 + len(present))]
        lines.append("| dense | | " + " | ".join(_percent(self.dense[m]) for m in present) + " |")
        for method, info in self.methods.items():
            rows = {row["requested_sparsity"]: row for row in self.rows if row["method"] == method}
            seconds = info.get("ranking_seconds")
            cells = [" / ".join(_percent(rows[s][m]) if s in rows else "-" for s in sparsities) for m in present]
            lines.append(f"| {method} | {'' if seconds is None else f'{seconds:.0f} s'} | " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _resolve(entry: ElasticRanking | str | os.PathLike, model: PreTrainedModel, name: str
             ) -> tuple[PreTrainedModel, ElasticRanking, dict[str, Any]]:
    """The dense model a ranking applies to, the ranking, and where it came from."""
    if isinstance(entry, ElasticRanking):
        try:
            entry.check_matches(model_shape(model))
        except SnapViTError as error:
            raise SweepError(f"The ranking of method {name!r} does not fit the model: {error}") from error
        return model, entry, {"source": "in memory"}
    if isinstance(entry, (str, os.PathLike)):
        from .modeling import ElasticViTModel

        # An elastic checkpoint stores its weights permuted into rank order; its own dense model is the one its
        # ranking indexes (same function as the original model).
        base = ElasticViTModel.from_pretrained(entry)
        stored = getattr(base.config, "elastic_ranking", None)
        if stored is None:
            raise SweepError(f"{str(entry)!r} (method {name!r}) is a sliced checkpoint without an elastic_ranking; "
                             "give the dense elastic checkpoint written by hf_snapvit.save_elastic.")
        ranking = ElasticRanking.from_dict(stored)
        base.to(next(model.parameters()).device)
        return base, ranking, {"source": str(entry)}
    raise SweepError(f"rankings[{name!r}] is a {type(entry).__name__}; give an ElasticRanking of the model or the "
                     "path of an elastic checkpoint.")


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
        ranking_info: Method → extra facts to record, e.g. ``{"ranking_seconds": 412.0, "phases": {...}}`` from
            :func:`hf_snapvit.benchmark.timed_rank`.
        plots: Write the PNG plots.
        show_progress: Show progress bars.

    Returns:
        The :class:`SweepResult` (also in ``output_dir/sweep.json``).
    """
    if not rankings:
        raise SweepError("rankings is empty; give at least one method, e.g. {'magnitude': hf_snapvit.rank(model)}.")
    sparsities = [float(s) for s in sparsities]
    if not sparsities or any(not 0.0 < s < 1.0 for s in sparsities):
        raise SweepError(f"sparsities={sparsities} must be a non-empty list of values in (0, 1), e.g. 0.1 ... 0.6.")
    bad = [name for name in rankings if not re.fullmatch(r"[\w.+-]+", name)]
    if bad:
        raise SweepError(f"Method names {bad} must be non-empty and use only letters, digits, '_', '.', '+', '-' "
                         "(they become file names).")
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    model.eval()
    started = time.perf_counter()
    evaluator = Evaluator(eval_data, bank_data=bank_data, eval_labels=eval_labels, bank_labels=bank_labels,
                          dense_model=model, processor=processor, metrics=metrics, k=k, probe=probe,
                          batch_size=batch_size, show_progress=show_progress)
    dense = _row("dense", 0.0, evaluator.evaluate(model, name="dense"))
    dense["theoretical_speedup"] = 1.0
    dense_latency = []

    def time_pair(sliced: PreTrainedModel) -> dict[str, Any]:
        timed = measure_latency({"dense": model, "sliced": sliced}, [latency_batch_size], repeats=latency_repeats,
                                warmup=latency_warmup)
        key = str(latency_batch_size)
        dense_ms, sliced_ms = timed["dense"][key]["median_ms"], timed["sliced"][key]["median_ms"]
        dense_latency.append(dense_ms)
        return {"latency_ms": sliced_ms, "dense_latency_ms": dense_ms, "speedup": dense_ms / sliced_ms,
                "throughput": timed["sliced"][key]["throughput"]}

    rows: list[dict[str, Any]] = []
    methods: dict[str, dict[str, Any]] = {}
    kept_rankings: dict[str, ElasticRanking] = {}
    for name, entry in rankings.items():
        base, ranking, info = _resolve(entry, model, name)
        kept_rankings[name] = ranking
        extra = dict((ranking_info or {}).get(name, {}))
        info.update(extra)
        info.setdefault("ranking_seconds", extra.get("wall_seconds"))
        info.update(mode=ranking.mode, max_sparsity=ranking.max_sparsity, provenance=ranking.provenance, skipped=[])
        methods[name] = info
        for sparsity in sparsities:
            if sparsity > ranking.max_sparsity:
                warnings.warn(f"Method {name!r}: sparsity {sparsity} exceeds the ranking's maximum "
                              f"{ranking.max_sparsity:.4f} (per-block floors); skipped.", stacklevel=2)
                info["skipped"].append(sparsity)
                continue
            sliced = sliced_copy(base, ranking, sparsity)
            row = _row(name, sparsity, evaluator.evaluate(sliced, name=f"{name}@{sparsity:g}"))
            row["theoretical_speedup"] = dense["gflops"] / row["gflops"]
            row["ranking_seconds"] = info.get("ranking_seconds")
            if latency:
                row.update(time_pair(sliced))
            rows.append(row)
            del sliced
            gc.collect()
        if base is not model:
            del base
            gc.collect()
    if latency and dense_latency:
        dense["latency_ms"] = float(torch.tensor(dense_latency).median())
        dense["dense_latency_ms"] = dense["latency_ms"]
        dense["speedup"] = 1.0

    result = SweepResult(
        dense=dense,
        rows=rows,
        methods=methods,
        settings={
            "sparsities": sparsities, "metrics": list(metrics) if metrics else None, "k": k,
            "probe": dataclasses.asdict(probe or LinearProbeConfig()), "batch_size": batch_size,
            "num_eval": dense["num_eval"],
            "num_bank": dense["num_bank"], "eval_data": evaluator.eval_set.description,
            "bank_data": evaluator.bank_set.description if evaluator.bank_set is not None else None,
            "latency": {"enabled": latency, "batch_size": latency_batch_size, "repeats": latency_repeats,
                        "warmup": latency_warmup, "input": "seeded random pixels", "interleaved_with_dense": True,
                        "threads": torch.get_num_threads()},
            "model": getattr(model.config, "_name_or_path", None),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": None,
        },
        hardware=hardware_info(torch.get_num_threads(), next(model.parameters()).device),
    )
    result.files["csv"] = str(output / "sweep.csv")
    write_text_atomic(output / "sweep.csv", _csv([dense, *rows]))
    if plots:
        result.files.update(_write_plots(result, kept_rankings, output))
    result.files["json"] = str(output / "sweep.json")
    result.settings["wall_seconds"] = time.perf_counter() - started
    write_text_atomic(output / "sweep.json", json.dumps(result.to_dict(), indent=2, default=_json_default))
    return result


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _row(method: str, sparsity: float, result: EvaluationResult) -> dict[str, Any]:
    row = {"method": method, "requested_sparsity": sparsity, **result.to_dict()}
    row["linear_best_epoch"] = (result.linear_probe or {}).get("best_epoch")
    return row


def _csv(rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------------- plots


def _figure(panels: int):
    # A bare Figure on an Agg canvas: no pyplot state and no global backend switch, so it works headless.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(panels, 2)
    rows = math.ceil(panels / columns)
    figure = Figure(figsize=(5.2 * columns, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for extra in axes[panels:]:
        extra.set_visible(False)
    return figure, axes[:panels]


def _save_png(figure, path: Path) -> None:
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=120)


def _method_rows(result: SweepResult) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in result.rows:
        grouped.setdefault(row["method"], []).append(row)
    return {name: sorted(rows, key=lambda r: r["sparsity"]) for name, rows in grouped.items()}


def plot_accuracy(result: SweepResult, path: str | os.PathLike, x: str = "sparsity") -> list[str]:
    """Accuracy of every method against ``x`` (``"sparsity"`` or ``"gflops"``), one panel per metric present.

    Every line starts at the dense model. Returns the metrics drawn.
    """
    present = [(key, label) for key, label in ACCURACY_METRICS if result.dense.get(key) is not None]
    if not present:
        return []
    figure, axes = _figure(len(present))
    grouped = _method_rows(result)
    for axis, (key, label) in zip(axes, present):
        for method, rows in grouped.items():
            points = [result.dense, *rows]
            xs = [100 * p["sparsity"] if x == "sparsity" else p["gflops"] for p in points]
            axis.plot(xs, [100 * p[key] if p[key] is not None else float("nan") for p in points], marker="o",
                      markersize=3, label=method)
        axis.set_title(label, fontsize=10)
        axis.set_xlabel("sparsity (% of backbone parameters removed)" if x == "sparsity" else "GFLOPs per image")
        axis.set_ylabel("%")
        axis.grid(alpha=0.3)
        if x == "gflops":
            axis.invert_xaxis()  # left to right: from the dense model to the smallest
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{result.settings.get('model') or 'model'}: {result.dense['num_eval']} evaluation images",
                    fontsize=10)
    _save_png(figure, Path(path))
    return [key for key, _ in present]


def plot_latency(result: SweepResult, path: str | os.PathLike) -> None:
    """Measured latency (left; the dense median over the sweep divided by each pair's measured speedup) and realised
    vs theoretical speedup (right) against sparsity, one line per method."""
    figure, axes = _figure(2)
    grouped = _method_rows(result)
    colors = {}
    for method, rows in grouped.items():
        xs = [0.0, *(100 * r["sparsity"] for r in rows)]
        # Each sliced model was timed against its own dense run; scaling by that pair's ratio removes the drift of
        # a shared machine between pairs (the raw numbers are in sweep.json).
        dense_ms = result.dense["latency_ms"]
        line, = axes[0].plot(xs, [dense_ms, *(dense_ms / r["speedup"] for r in rows)], marker="o", markersize=3,
                             label=method)
        colors[method] = line.get_color()
        axes[1].plot(xs, [1.0, *(r["speedup"] for r in rows)], marker="o", markersize=3, color=colors[method],
                     label=f"{method} (measured)")
        axes[1].plot(xs, [1.0, *(r["theoretical_speedup"] for r in rows)], linestyle="--", color=colors[method],
                     alpha=0.6, label=f"{method} (GFLOP ratio)")
    latency = result.settings["latency"]
    threads = f"{latency['threads']} thread" + ("s" if latency["threads"] != 1 else "")
    axes[0].set_title(f"forward latency, batch {latency['batch_size']}, {threads}", fontsize=10)
    axes[0].set_ylabel("ms: dense median / measured speedup")
    axes[1].set_title("speedup over dense: measured vs theoretical", fontsize=10)
    axes[1].set_ylabel("x dense")
    for axis in axes:
        axis.set_xlabel("sparsity (% of backbone parameters removed)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=7)
    _save_png(figure, Path(path))


def _write_plots(result: SweepResult, rankings: Mapping[str, ElasticRanking], output: Path) -> dict[str, str]:
    files = {}
    if plot_accuracy(result, output / "accuracy_vs_sparsity.png", x="sparsity"):
        files["accuracy_vs_sparsity"] = str(output / "accuracy_vs_sparsity.png")
        plot_accuracy(result, output / "accuracy_vs_gflops.png", x="gflops")
        files["accuracy_vs_gflops"] = str(output / "accuracy_vs_gflops.png")
    if result.rows and all(r.get("latency_ms") is not None for r in result.rows):
        plot_latency(result, output / "latency_vs_sparsity.png")
        files["latency_vs_sparsity"] = str(output / "latency_vs_sparsity.png")
    try:
        from .plotting import plot_allocation
    except ImportError:  # the heatmap module is optional here
        return files
    for name, ranking in rankings.items():
        grid = [s for s in result.settings["sparsities"] if s <= ranking.max_sparsity]
        if grid:
            path = output / f"allocation_{name}.png"
            plot_allocation(ranking, path, sparsities=grid)
            files[f"allocation_{name}"] = str(path)
    return files


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
        preset: SnapViT preset, also setting the gradient baselines' image counts.
        seed: Seed of the rankings and of the subsets.
        mode: Ranking mode (default: each method's).
        ranking_info: Extra facts per method (e.g. the recorded ranking time of a checkpoint).
        show_progress: Show progress bars.
        **sweep_kwargs: Passed to :func:`run_sweep` (``metrics``, ``k``, ``probe``, ``latency``, ...).

    Returns:
        The :class:`SweepResult`.
    """
    from transformers import AutoImageProcessor

    from .benchmark import timed_rank
    from .evaluation import load_model, load_split

    if not methods and not checkpoints:
        raise SweepError("Give at least one ranking: methods=[...] to rank now and/or checkpoints={name: path}.")
    path = None
    if not isinstance(model, PreTrainedModel):
        path, model = str(model), load_model(model)
    processor = sweep_kwargs.pop("processor", None) or AutoImageProcessor.from_pretrained(
        path or model.config._name_or_path)
    eval_data = load_split(data, eval_split, num_samples=num_eval, seed=seed)
    bank_data = None if bank_split is None else load_split(data, bank_split, num_samples=num_bank, seed=seed + 1)
    rankings: dict[str, ElasticRanking | str | os.PathLike] = {}
    info: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (ranking_info or {}).items()}
    calibration = None
    for method in methods:
        if calibration is None:
            calibration = load_split(data, calibration_split)
        rankings[method], timing = timed_rank(model, method, calibration, preset=preset, seed=seed, mode=mode,
                                              processor=processor, show_progress=show_progress)
        info[method] = {**timing, **info.get(method, {})}
    for name, checkpoint in (checkpoints or {}).items():
        if name in rankings:
            raise SweepError(f"{name!r} is both a method to rank and a checkpoint; give the checkpoint another name.")
        rankings[name] = checkpoint
    return run_sweep(model, rankings, sparsities, eval_data, bank_data=bank_data, processor=processor,
                     output_dir=output_dir, ranking_info=info, show_progress=show_progress, **sweep_kwargs)
