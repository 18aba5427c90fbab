"""Held-out images: the last part of a seeded draw, which fitting never sees.

A draw is seeded and its order is a prefix (a longer draw starts with the shorter one), so holding out its end leaves
the fitted items exactly the ones a run without a held-out check would use. The per-size correction's guard and the
prefix correction's size check (:func:`hf_snapvit.correction.guard.split_held_out`: a fraction of the calibration
batches, an error when there are too few) and recovery's check (:func:`hf_snapvit.recovery.held_out.split_held_out`:
a number of images, a reason when there are too few) both split through :func:`hold_out_end`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def fraction_count(fraction: float, total: int) -> int:
    """How many of ``total`` items ``fraction`` holds out: rounded, at least one and at most all but one (so both
    sides keep an item whenever ``total`` is at least 2)."""
    return min(total - 1, max(1, round(fraction * total)))


def hold_out_end(draw: Any, *, count: int | None = None, fraction: float | None = None, wanted: int | None = None,
                 min_fitted: int = 1, too_few: Callable[[int], str], error: type[Exception] | None = None
                 ) -> tuple[Any, Any, str | None]:
    """``(fitted items, held-out items or None, why there are none)`` of a seeded, prefix-ordered ``draw``.

    The ``count`` items (or :func:`fraction_count` of ``fraction``) after the first ``wanted`` are held out (``wanted``
    ``None``: every item before them, so the held-out ones are the draw's last). When the draw is shorter than
    ``wanted + count``, the held-out items come off its end, as long as ``min_fitted`` are left to fit on.

    Args:
        draw: Anything sliced like a list (a list, a tensor, a ``datasets.Dataset``).
        count, fraction: How many to hold out, exactly one of them: a number, or a share of the draw.
        wanted: How many items a run without the check fits on.
        min_fitted: The fewest items left to fit on for a split to be made.
        too_few: The reason no split was made, given the draw's length.
        error: Raise this with ``too_few``'s reason when no split can be made; ``None``: return
            ``(draw[:wanted], None, reason)``.
    """
    if (count is None) == (fraction is None):
        raise ValueError(f"hold_out_end takes exactly one of count and fraction; got count={count!r}, "
                         f"fraction={fraction!r}.")
    total = len(draw)
    held = count if fraction is None else fraction_count(fraction, total)
    fitted = total - held if wanted is None else wanted
    if held >= 1 and total >= fitted + held:
        return draw[:fitted], draw[fitted:fitted + held], None
    if held >= 1 and total - held >= min_fitted:
        return draw[:total - held], draw[total - held:], None
    if error is not None:
        raise error(too_few(total))
    return draw[:wanted], None, too_few(total)


__all__ = ["fraction_count", "hold_out_end"]
