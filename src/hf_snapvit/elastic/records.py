"""What a checkpoint's config records of a fitting (``elastic_correction``, ``elastic_recovery``), as loading reads it:
whether the weights were fitted to their saved size, and whether a size lies outside the range an elastic recovery
trained. The records are written by :mod:`hf_snapvit.correction` and :mod:`hf_snapvit.recovery`; loading reads them
here, so it imports neither.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

__all__ = ["fitted_to_size", "warn_if_untrained"]


def fitted_to_size(config: Any) -> bool:
    """Whether the checkpoint's weights were corrected or recovered for its saved size (so it cannot shrink)."""
    recovery = getattr(config, "elastic_recovery", None)
    return getattr(config, "elastic_correction", None) is not None or (
        isinstance(recovery, dict) and not recovery.get("elastic", False))


_WARNED: set[tuple[str, tuple[float, ...]]] = set()


def warn_if_untrained(config: Any, sparsity: float) -> None:
    """Warn, once per checkpoint, when an elastically recovered checkpoint is used at a size outside the sparsity
    range its recovery trained (its ``config.elastic_recovery["sparsities"]``): that size was not recovered, and
    sharing weights with the trained sizes may have made it worse than before."""
    record = getattr(config, "elastic_recovery", None)
    span = record.get("sparsities") if isinstance(record, Mapping) and record.get("elastic") else None
    # A budget lands within one width group of what it asks for, as the trained ends did.
    if not span or len(span) != 2 or span[0] - 0.01 <= sparsity <= span[1] + 0.01:
        return
    key = (str(getattr(config, "_name_or_path", "")), tuple(span))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"This checkpoint was recovered for sparsities {span[0]:g} to {span[1]:g}; sparsity {sparsity:.3g} "
                  "was not trained and may be worse than before recovery (config.elastic_recovery['held_out'] has "
                  "what was measured). Use a size in that range, or recover with an elastic_range that covers it.",
                  UserWarning, stacklevel=3)
