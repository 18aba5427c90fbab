"""Every hf_snapvit log line appears once per launch (issue 64): under ``accelerate launch`` on 2 processes each
process runs the same program, and a line about the shared inputs is printed by the main process only; a line about
one process's own work is printed by each, naming it.

The launched prunes are tests/launched.py's ``logging`` scenario: in the session's launch of 2 processes every process
runs ``hf-snapvit prune`` on a tiny model and a calibration file with corrupt images, and its one-process reference
run does the same.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from hf_snapvit.utils.logs import get_logger

from launched import PER_PROCESS


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


def log_lines(stderr: str) -> list[str]:
    """hf_snapvit's log lines in ``stderr``, sorted, without the objects' addresses (which differ by process)."""
    return sorted(re.sub(r" at 0x[0-9a-f]+", "", line) for line in stderr.splitlines()
                  if re.match(r"(DEBUG|INFO|WARNING|ERROR) hf_snapvit", line))


@pytest.mark.slow  # reads the session's launch of two accelerate processes
@pytest.mark.launched("logging")
def test_every_log_line_appears_once_under_accelerate_launch(launched):
    two, one = log_lines(launched.output("two")), log_lines(launched.output("one"))
    # The lines the prunes log about their inputs: the corrupt images skipped, a data-free method given data.
    assert any("Skipping corrupt image" in line for line in one) and any("is data-free" in line for line in one)
    shared = [line for line in one if PER_PROCESS not in line]
    assert [line for line in two if PER_PROCESS not in line] == shared  # once each, as one process prints them
    assert [line for line in two if PER_PROCESS in line] == [
        f"WARNING hf_snapvit.test: [process {i} of 2] {PER_PROCESS}" for i in (0, 1)]
