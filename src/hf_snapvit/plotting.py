"""Deprecated home of the plots: they live in :mod:`hf_snapvit.plots` (``from hf_snapvit.plots import
plot_allocation``; ``hf_snapvit.plot_allocation`` is unchanged). Each name read from here is the same object as
there, with a ``FutureWarning``; this module goes in a later release."""

from __future__ import annotations

import warnings
from typing import Any

from . import plots

_MOVED = ("DEFAULT_SPARSITIES", "allocation_table", "plot_allocation", "plot_latency_table")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"hf_snapvit.plotting is deprecated and will be removed in a later release; import {name} from "
                      f"hf_snapvit.plots instead (the same function, e.g. `from hf_snapvit.plots import {name}`).",
                      FutureWarning, stacklevel=2)
        return getattr(plots, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MOVED))
