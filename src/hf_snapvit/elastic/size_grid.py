"""The sparsities a check measures across an elastic model's range: a grid of multiples of a step, with its ends.

Recovery's held-out check (both ends of ``elastic_range`` and every tenth between them,
:func:`hf_snapvit.recovery.held_out.held_out_sizes`) and the prefix correction's size check (every 5 % up to the
ranking's maximum, :func:`hf_snapvit.correction.prefix_sizes.default_grid`) both take their sizes from
:func:`sparsity_grid`.
"""

from __future__ import annotations

import math

#: A multiple of the step this close to an end is that end, not a size of its own.
TOLERANCE = 1e-6


def sparsity_grid(high: float, step: float, *, low: float | None = None) -> list[float]:
    """Every multiple of ``step`` above ``low`` (above 0 when ``low`` is ``None``) and below ``high``, then ``high``;
    ``low`` itself first when given. Multiples within :data:`TOLERANCE` of an end are left out.

    Args:
        high: The largest sparsity, always the last one.
        step: The grid's spacing (``0.1``: every tenth), greater than 0.
        low: The smallest sparsity, the first one; ``None``: the grid starts at ``step`` (sparsity 0, the dense
            model, is not a size to check).
    """
    if not step > 0:
        raise ValueError(f"sparsity_grid needs a step greater than 0, got {step!r}.")
    start = 0.0 if low is None else float(low)
    inner = [round(i * step, 6) for i in range(1, math.floor(high / step) + 2)
             if start + TOLERANCE < i * step < high - TOLERANCE]
    return ([] if low is None else [start]) + inner + [float(high)]


__all__ = ["TOLERANCE", "sparsity_grid"]
