"""A reproducible random share of a parquet file's rows, kept in their file order.

The GPU machine receives at most 64 MiB with the checkout (``../shared/docs/gpu-device.md``), too little for the shared
model beside its full parquets, and the shared train parquet is sorted by class, so its first rows hold a few classes
only. This draws ``--rows`` rows with ``--seed`` and writes them through ``datasets``:

    python benchmarks/parquet_rows.py ../shared/data/tiny-imagenet-200/train.parquet .acc/data/train.parquet --rows 3000
    python benchmarks/parquet_rows.py ../shared/data/tiny-imagenet-200/validation.parquet \\
        .acc/data/validation.parquet --rows 2000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import datasets
import numpy as np

from hf_snapvit.files import atomic_file


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--rows", type=int, required=True, help="how many rows to keep")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def draw_rows(table: datasets.Dataset, rows: int, seed: int) -> datasets.Dataset:
    """``rows`` of ``table``'s rows, drawn without replacement with ``seed``, in the table's order."""
    if not 1 <= rows <= len(table):
        raise SystemExit(f"--rows {rows}: give 1 to {len(table)}, the rows the source has")
    return table.select(np.sort(np.random.default_rng(seed).choice(len(table), rows, replace=False)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kept = draw_rows(datasets.Dataset.from_parquet(str(args.source)), args.rows, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(args.output, "wb") as handle:
        kept.to_parquet(handle)
    print(f"wrote {len(kept)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
