"""benchmarks/parquet_rows.py: a seeded random share of a parquet's rows, in file order, through datasets."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import load_benchmark

parquet_rows = load_benchmark("parquet_rows")


def _source(path, count=40):
    # Sorted by label like the shared train split, so the first rows would be one class.
    pq.write_table(pa.table({"value": list(range(count)), "label": [i // 10 for i in range(count)]}), path)
    return path


def test_draws_the_same_rows_for_a_seed_in_file_order_and_other_rows_for_another(tmp_path):
    source = _source(tmp_path / "train.parquet")
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        assert parquet_rows.main([str(source), str(tmp_path / name / "out.parquet"), "--rows", "12",
                                  "--seed", str(seed)]) == 0
    a, b, c = (pq.read_table(tmp_path / name / "out.parquet").to_pydict() for name in "abc")
    assert a == b and a != c
    assert a["value"] == sorted(set(a["value"])) and len(a["value"]) == 12
    assert set(a["value"]) <= set(range(40)) and a["label"] == [v // 10 for v in a["value"]]
    assert len(set(a["label"])) > 1  # spread over the file, not its first rows


@pytest.mark.parametrize("rows", [0, 41])
def test_refuses_a_row_count_the_source_cannot_give(tmp_path, rows):
    source = _source(tmp_path / "train.parquet")
    with pytest.raises(SystemExit, match=f"--rows {rows}: give 1 to 40"):
        parquet_rows.main([str(source), str(tmp_path / "out.parquet"), "--rows", str(rows)])
    assert not (tmp_path / "out.parquet").exists()
