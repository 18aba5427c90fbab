"""What a sweep measured: :class:`SweepResult` (rows, dense reference, per-method facts) and its CSV, JSON and
markdown forms."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..plots import ACCURACY_METRICS  # the metrics and their titles, which the plots of a sweep draw too
from .evaluator import EvaluationResult

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
        files: Name → file name (in the sweep's output folder) of every file written.
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


def result_row(method: str, sparsity: float, result: EvaluationResult) -> dict[str, Any]:
    """One sweep row: the method, the requested sparsity, every field of ``result`` and the probe's chosen epoch."""
    row = {"method": method, "requested_sparsity": sparsity, **result.to_dict()}
    row["linear_best_epoch"] = (result.linear_probe or {}).get("best_epoch")
    return row


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as CSV with the :data:`CSV_COLUMNS` (missing values left empty)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(CSV_COLUMNS), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
    return buffer.getvalue()


def json_text(result: SweepResult) -> str:
    """``result`` as indented JSON (arrays and tensors as lists, anything else unknown as its string)."""
    return json.dumps(result.to_dict(), indent=2, default=_json_default)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
