"""benchmarks/recovery_processes.py through its GPU step (h100_checks.sh step 24) dry run on CPU: one and two
accelerate processes recover a tiny ViT to the same weights, through DDP on two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two accelerate launches
def test_the_gpu_step_dry_runs_on_cpu_and_two_processes_match_one(tmp_path):
    env = dict(os.environ, DEV="cpu", B="tiny", S="tiny", OUT=str(tmp_path / "out"), R=str(tmp_path / "r"),
               STEPS="24", RPSTEPS="2", RPWORK=str(tmp_path / "work"),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    done = subprocess.run(["bash", "benchmarks/h100_checks.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0 and "== step 24 rc=0" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "r" / "recovery_processes.json").read_text())
    one, two = result["runs"]
    assert (one["processes"], two["processes"], result["steps"]) == (1, 2, 2)
    assert [r["wrapper"] for r in one["ranks"]] == ["Distilled"]
    assert [r["wrapper"] for r in two["ranks"]] == ["DistributedDataParallel"] * 2
    assert one["max_abs_diff"] == 0 and 0 <= two["max_abs_diff"] < 1e-4
    assert all(r["peak_bytes"] > 0 and r["seconds"] > 0 for r in one["ranks"] + two["ranks"])
    assert abs(one["ranks"][0]["final_loss"] - two["ranks"][0]["final_loss"]) < 1e-6
    assert (tmp_path / "out" / "results.tar").exists()
