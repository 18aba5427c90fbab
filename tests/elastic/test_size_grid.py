"""The grid of checked sparsities, shared by recovery's held-out check and the prefix correction's size check."""

from __future__ import annotations

import pytest

from hf_snapvit.correction.prefix_sizes import default_grid
from hf_snapvit.elastic.size_grid import sparsity_grid


def test_the_grid_holds_every_multiple_of_the_step_between_its_ends():
    assert sparsity_grid(0.4, 0.1, low=0.05) == [0.05, 0.1, 0.2, 0.3, 0.4]
    assert sparsity_grid(0.6, 0.1, low=0.0) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert sparsity_grid(0.3000001, 0.1, low=0.1) == [0.1, 0.2, 0.3000001]  # a multiple this close is the end
    assert sparsity_grid(0.32, 0.05) == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.32]  # no low: sparsity 0 is not checked
    assert default_grid(0.3) == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3] and default_grid(0.04) == [0.04]
    with pytest.raises(ValueError, match="step greater than 0, got 0"):
        sparsity_grid(0.5, 0)
