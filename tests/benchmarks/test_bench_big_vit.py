"""benchmarks/big_vit.py (issue 65's 7 B ViT on one GPU) dry-runs as steps 25 and 26 of benchmarks/h100_checks.sh on
a CPU with the tiny shape of the same family: a ranking with its phases (step 26: of the model placed by accelerate
with part of it offloaded), the elastic checkpoint, and a sliced load per sparsity with its bytes and host memory:
step 25's in the script's own process (BIG_LOAD_HERE; a fresh process costs more than a tiny load), step 26's in a
fresh one, as on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # starts the script twice and one process for step 26's load
def test_steps_25_and_26_rank_save_and_load_the_tiny_shape_on_a_cpu(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"  # the script calls python3, as on the GPU machine: this test's interpreter
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT / "src"),
           "DEV": "cpu", "BIG": "tiny", "BIG_IMAGES": "4", "BIG_CAP": "0.4", "BIG_LOAD_HERE": "1", "STEPS": "25 26",
           "OUT": str(tmp_path / "out"), "R": str(tmp_path / "r"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "benchmarks/h100_checks.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    steps = "== step 25 rc=0" in done.stdout and "== step 26 rc=0" in done.stdout
    assert steps, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "out" / "results.tar").is_file()
    report = json.loads((tmp_path / "r" / "big_vit.json").read_text())
    assert report["shape"]["use_gated_mlp"] and report["settings"]["shape"] == "tiny"
    assert report["ranking"]["num_gradient_images"] == 4 and report["ranking"]["phases"]["gradients"] > 0
    loads = {row["sparsity"]: row for row in report["loads"]}
    assert set(loads) == {0.0, 0.3, 0.5}
    assert loads[0.0]["loaded_parameters"] == report["parameters"]
    assert loads[0.5]["loaded_bytes"] < loads[0.3]["loaded_bytes"] < loads[0.0]["loaded_bytes"]
    assert all(row["devices"] == ["cpu"] and row["peak_device_bytes"] is None for row in loads.values())
    assert not any(row["fresh_process"] for row in loads.values())
    # Step 25: ranked with the blocks that do not fit offloaded (to disk on a CPU), then saved and loaded as well.
    offloaded = json.loads((tmp_path / "r" / "big_vit_offloaded.json").read_text())
    assert offloaded["device_map"].get("disk", 0) > 0 and offloaded["device_map"].get("cpu", 0) > 0
    assert offloaded["ranking"]["phases"]["search"] > 0
    assert [(row["sparsity"], row["fresh_process"]) for row in offloaded["loads"]] == [(0.3, True)]
    assert offloaded["loads"][0]["loaded_bytes"] == loads[0.3]["loaded_bytes"]
