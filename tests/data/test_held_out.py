"""The one held-out split: the last part of a seeded, prefix-ordered draw is held out and never fitted on; the
correction's guard (a fraction, an error when too short) and recovery's check (a count, a reason) are its callers."""

from __future__ import annotations

import pytest
import torch

from hf_snapvit.data.held_out import fraction_count, hold_out_end


def _reason(count):
    return f"only {count}"


def test_a_count_is_held_out_after_the_wanted_items_or_off_the_end_when_the_draw_runs_short():
    draw = list(range(20))
    assert hold_out_end(draw, count=4, wanted=10, too_few=_reason) == (list(range(10)), [10, 11, 12, 13], None)
    assert hold_out_end(draw[:12], count=4, wanted=10, min_fitted=4, too_few=_reason) == (
        list(range(8)), [8, 9, 10, 11], None)
    assert hold_out_end(draw[:7], count=4, wanted=10, min_fitted=4, too_few=_reason) == (draw[:7], None, "only 7")
    fitted, held, _ = hold_out_end(torch.arange(6), count=2, too_few=_reason)  # a tensor slices the same way
    assert fitted.tolist() == [0, 1, 2, 3] and held.tolist() == [4, 5]


def test_a_fraction_holds_out_at_least_one_and_at_most_all_but_one_and_an_error_policy_raises():
    assert [fraction_count(0.25, n) for n in (1, 2, 4, 10, 100)] == [0, 1, 1, 2, 25]
    assert fraction_count(0.9, 4) == 3 and fraction_count(0.01, 10) == 1
    assert hold_out_end(list(range(8)), fraction=0.25, too_few=_reason, error=ValueError) == (
        list(range(6)), [6, 7], None)
    with pytest.raises(KeyError, match="only 1"):
        hold_out_end([0], fraction=0.25, too_few=_reason, error=KeyError)
    with pytest.raises(ValueError, match="exactly one of count and fraction"):
        hold_out_end([0, 1], count=1, fraction=0.5, too_few=_reason)
