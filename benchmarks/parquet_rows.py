"""A reproducible random share of a parquet file's rows, kept in their file order.

The GPU machine receives at most 64 MiB with the checkout (``../shared/docs/gpu-device.md``), too little for the
shared model beside its full parquets, and the shared train parquet is sorted by class, so its first rows hold a few
classes only. This draws ``--rows`` rows with ``--seed`` and writes them through ``datasets``:

    python benchmarks/parquet_rows.py ../shared/data/tiny-imagenet-200/train.parquet .acc/data/train.parquet \\
        --rows 3000
"""

from __future__ import annotations

import sys
from pathlib import Path

import datasets
import numpy as np

from _harness import parser
from hf_snapvit.utils.files import atomic_file


def draw_rows(table: datasets.Dataset, rows: int, seed: int) -> datasets.Dataset:
    """``rows`` of ``table``'s rows, drawn without replacement with ``seed``, in the table's order."""
    if not 1 <= rows <= len(table):
        raise SystemExit(f"--rows {rows}: give 1 to {len(table)}, the rows the source has")
    return table.select(np.sort(np.random.default_rng(seed).choice(len(table), rows, replace=False)))


def main(argv: list[str] | None = None) -> int:
    options = parser(__doc__, shared=False)
    options.add_argument("source", type=Path)
    options.add_argument("output", type=Path)
    options.add_argument("--rows", type=int, required=True, help="how many rows to keep")
    options.add_argument("--seed", type=int, default=0)
    args = options.parse_args(argv)
    kept = draw_rows(datasets.Dataset.from_parquet(str(args.source)), args.rows, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.output, "wb") as handle:
        kept.to_parquet(handle)
    print(f"wrote {len(kept)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
