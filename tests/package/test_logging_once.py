"""Every hf_snapvit log line appears once per launch (issue 64): under ``accelerate launch`` on 2 processes each
process runs the same program, and a line about the shared inputs is printed by the main process only; a line about
one process's own work is printed by each, naming it.

The module is also the worker: ``accelerate launch ... tests/test_logging_once.py INPUTS OUT`` runs ``hf-snapvit
prune`` on a tiny model and a calibration file with corrupt images, on every process; ``python
tests/test_logging_once.py INPUTS OUT`` is the one-process reference.
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from hf_snapvit.logs import get_logger

PER_PROCESS = "this process's own line"


@pytest.fixture
def no_accelerate_state(monkeypatch):
    from accelerate.state import PartialState

    monkeypatch.setattr(PartialState, "_shared_state", {})  # as before a launched process's first collective
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def logged(caplog, rank: int | None, monkeypatch) -> list[str]:
    if rank is not None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
    logger = get_logger("hf_snapvit.test")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_snapvit"):
        logger.warning("shared %d", 1)
        logger.info("shared info")
        logger.warning(PER_PROCESS, main_process_only=False)
    return [record.getMessage() for record in caplog.records]


def test_one_process_logs_every_line_as_it_is(caplog, monkeypatch, no_accelerate_state):
    assert logged(caplog, None, monkeypatch) == ["shared 1", "shared info", PER_PROCESS]
    records = caplog.records
    assert records[0].name == "hf_snapvit.test" and records[0].filename == Path(__file__).name  # the caller's line


def test_a_launched_process_logs_shared_lines_on_the_main_process_only(caplog, monkeypatch, no_accelerate_state):
    assert logged(caplog, 0, monkeypatch) == ["shared 1", "shared info", f"[process 0 of 2] {PER_PROCESS}"]
    assert logged(caplog, 1, monkeypatch) == [f"[process 1 of 2] {PER_PROCESS}"]


def test_the_level_still_filters(caplog, monkeypatch, no_accelerate_state):
    logger = get_logger("hf_snapvit.test")
    with caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        logger.info("not shown")
        logger.debug("not shown either", main_process_only=False)
    assert caplog.records == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_inputs(work: Path) -> tuple[Path, Path]:
    """A tiny ViT classifier folder and a parquet of 16 images of which 2 are corrupt."""
    import datasets
    import numpy as np
    import transformers
    from PIL import Image

    from helpers import tiny_vit_classifier

    model_dir = work / "model"
    tiny_vit_classifier().save_pretrained(model_dir)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(model_dir)
    rng, rows = np.random.default_rng(0), []
    for i in range(16):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(buffer, format="PNG")
        rows.append({"image": {"bytes": b"not an image" if i in (3, 9) else buffer.getvalue(), "path": None},
                     "label": i % 5})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=5)})
    data = work / "calibration.parquet"
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(data))
    return model_dir, data


def worker(inputs: Path, out: Path) -> None:
    """What every launched process runs: two prunes that log lines about their inputs, then a line of its own."""
    from hf_snapvit.cli import main
    from hf_snapvit.distributed import finish_processes

    for method in ("snip", "magnitude"):
        code = main(["prune", "--model", str(inputs / "model"), "--data", str(inputs / "calibration.parquet"),
                     "--method", method, "--preset", "fast", "--num-samples", "8", "--output", str(out / method),
                     "--no-prefix-correction", "-q"])
        assert code == 0
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    get_logger("hf_snapvit.test").warning(PER_PROCESS, main_process_only=False)
    finish_processes()


def log_lines(stderr: str) -> list[str]:
    """hf_snapvit's log lines in ``stderr``, sorted, without the objects' addresses (which differ by process)."""
    return sorted(re.sub(r" at 0x[0-9a-f]+", "", line) for line in stderr.splitlines()
                  if re.match(r"(DEBUG|INFO|WARNING|ERROR) hf_snapvit", line))


@pytest.mark.slow  # launches two accelerate processes
def test_every_log_line_appears_once_under_accelerate_launch(tmp_path):
    from helpers import run_at_once

    write_inputs(tmp_path)
    env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", PYTHONWARNINGS="ignore")
    launch = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
              __file__, str(tmp_path), str(tmp_path / "two")]
    alone = [sys.executable, __file__, str(tmp_path), str(tmp_path / "one")]
    two, one = (log_lines(r.stderr) for r in run_at_once([launch, alone], [env, env], timeout=600))
    # The lines the prunes log about their inputs: the corrupt images skipped, a data-free method given data.
    assert any("Skipping corrupt image" in line for line in one) and any("is data-free" in line for line in one)
    shared = [line for line in one if PER_PROCESS not in line]
    assert [line for line in two if PER_PROCESS not in line] == shared  # once each, as one process prints them
    assert [line for line in two if PER_PROCESS in line] == [
        f"WARNING hf_snapvit.test: [process {i} of 2] {PER_PROCESS}" for i in (0, 1)]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
