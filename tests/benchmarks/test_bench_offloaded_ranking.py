"""benchmarks/offloaded_ranking.py runs as is on a CPU with the tiny shape: the plain, disk-offloaded and
cpu_offload rankings, each in a fresh process, with their memory, and the offloaded ones equal to the plain one."""

from __future__ import annotations

import json

import pytest

from helpers import load_benchmark


@pytest.mark.slow  # three processes, each ranking the tiny ViT
def test_the_offloaded_rankings_equal_the_plain_one(tmp_path):
    script = load_benchmark("offloaded_ranking")
    output = tmp_path / "offloaded.json"
    # cpu_offload's ranking equals the plain one in tests/loading/test_placement.py; here the script's two-process
    # comparison.
    assert script.main(["--shape", "tiny", "--images", "4", "--generations", "1", "--modes", "plain", "disk",
                        "--output", str(output)]) == 0
    rows = {row["mode"]: row for row in json.loads(output.read_text())["rows"]}
    assert set(rows) == {"plain", "disk"}
    assert rows["plain"]["meta_parameters"] == 0 < rows["disk"]["meta_parameters"]  # blocks on disk
    for row in rows.values():
        assert row["same_keep_counts"] and row["max_relative_score_difference"] < 1e-6
        assert row["peak_anon_bytes"] >= row["anon_before_bytes"] > 0 and row["wall_seconds"] > 0
