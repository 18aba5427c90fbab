"""A gradient step that does not fit in memory runs in parts, with the scores of the whole step.

The out-of-memory error is injected (the one fault this test cannot cause for real on a CPU): the model's forward
raises PyTorch's CUDA message for any batch of more than ``fits`` images.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores
from helpers import CASES, FEW_CROPS, PROCESSOR, images

CASE = {c.name: c for c in CASES}


def _failing_above(model: torch.nn.Module, fits: int, seen: list[int]):
    """Make ``model``'s forward raise an out-of-memory error for batches of more than ``fits`` images (each image
    is embedded in its global crops, a batch of ``2 * images`` rows)."""
    forward = model.forward

    def limited(*args, **kwargs):
        rows = kwargs["pixel_values"].shape[0]
        seen.append(rows)
        if rows > 2 * fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 960.00 MiB. GPU 0 has a total "
                                         "capacity of 139.80 GiB of which 915.12 MiB is free.")
        return forward(*args, **kwargs)

    model.forward = limited


@pytest.mark.parametrize("definition", ["obd", "accumulated"])
def test_a_step_too_large_for_memory_is_run_in_parts_with_the_same_scores(definition, caplog):
    model = CASE["vit"].build()
    config = ScoreConfig(definition=definition, batch_size=4, crops=FEW_CROPS.crops)
    expected = gradient_scores(model, images(8), PROCESSOR, config, show_progress=False)
    seen: list[int] = []
    _failing_above(model, fits=1, seen=seen)
    with caplog.at_level(logging.WARNING, logger="hf_snapvit.pruning.scoring"):
        heads, neurons = gradient_scores(model, images(8), PROCESSOR, config, show_progress=False)
    np.testing.assert_allclose(heads, expected[0], rtol=1e-5, atol=0)
    np.testing.assert_allclose(neurons, expected[1], rtol=1e-5, atol=0)
    # 4 images failed, then 2, then every step ran in parts of 1 image: 8 parts, each a teacher and a student pass.
    assert max(seen) == 2 * 4 and seen[-16:] == [2] * 16
    assert "did not fit in memory; running it in parts of 1 images" in caplog.text
    assert all(p.grad is None for p in model.parameters())


def test_a_step_of_one_image_that_does_not_fit_raises_the_memory_error():
    model = CASE["vit"].build()
    _failing_above(model, fits=0, seen=[])
    with pytest.raises(torch.OutOfMemoryError, match="gradient scores of one image do not fit") as error:
        gradient_scores(model, images(2), PROCESSOR, ScoreConfig(batch_size=2, crops=FEW_CROPS.crops),
                        show_progress=False)
    assert "Tried to allocate 960.00 MiB" in str(error.value.__context__)  # the device's own message is kept
