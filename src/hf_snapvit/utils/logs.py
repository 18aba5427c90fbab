"""hf_snapvit's loggers: transformers' ``get_logger`` with accelerate's multi-process rule, so that a program
launched on N processes (``accelerate launch``, torchrun) prints each line once, on the main process.

Every process of a launch runs the same program on the same inputs (:mod:`hf_snapvit.utils.distributed`), so a line
about them (a skipped corrupt image, a data-free method given data, a bf16 warning) would otherwise appear N times.
A line about one process's own work (its gradient step that did not fit in memory, its read that failed and was
retried) is logged with ``main_process_only=False``: every process prints it, prefixed with its index, as
``accelerate.logging.get_logger`` does. The process is accelerate's ``PartialState`` once one exists, else the one
the launcher's environment names (``RANK`` / ``WORLD_SIZE``), so lines logged before the first collective are
filtered too.

The loggers are the standard ones of the ``hf_snapvit`` tree (``logging.getLogger(name)``): handlers, levels and
``caplog`` work as usual; ``hf-snapvit`` sets them from ``--verbose`` / ``--quiet``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from transformers.utils import logging as hf_logging


def _process() -> tuple[int, int]:
    """``(index, count)`` of this process in its launch; ``(0, 1)`` without one."""
    from accelerate.state import PartialState

    if PartialState._shared_state:
        state = PartialState()
        return int(state.process_index), int(state.num_processes)
    try:
        return int(os.environ.get("RANK", 0)), max(1, int(os.environ.get("WORLD_SIZE", 1)))
    except ValueError:  # a RANK that is not a number belongs to something else than a launcher
        return 0, 1


class ProcessLogger(logging.LoggerAdapter):
    """A logger whose calls take ``main_process_only`` (default ``True``), as accelerate's ``MultiProcessAdapter``
    does, without needing an accelerate state: with one process every line is logged. (``warning``, ``info``,
    ... of ``logging.LoggerAdapter`` call :meth:`log`.)"""

    def log(self, level: int, msg: object, *args: Any, main_process_only: bool = True, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        index, count = _process()
        if count > 1:
            if main_process_only and index != 0:
                return
            if not main_process_only:
                msg = f"[process {index} of {count}] {msg}"
        kwargs.setdefault("stacklevel", 2)  # the caller's file and line, not this one's
        self.logger.log(level, msg, *args, **kwargs)


def get_logger(name: str) -> ProcessLogger:
    """The logger ``name`` (a module's ``__name__``) of the ``hf_snapvit`` tree, printing once per launch."""
    return ProcessLogger(hf_logging.get_logger(name), {})


__all__ = ["ProcessLogger", "get_logger"]
