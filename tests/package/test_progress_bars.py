"""Every progress bar of ranking, correction and recovery knows its total, so it shows the time left (issue 64:
a first run on a laptop CPU takes minutes; its bars must say how many)."""

from __future__ import annotations

import copy
import importlib
import io

import huggingface_hub.utils
import numpy as np
import pytest
import torch
from tqdm.auto import tqdm as plain_tqdm

import hf_snapvit as hs
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.recovery import RecoveryConfig, recover
from hf_snapvit.surgery.slicing import slice_model_

from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}
# The modules that draw hf_snapvit's bars on the long phases (each imports huggingface_hub's tqdm by name).
MODULES = ["hf_snapvit.pruning.methods.snapvit.pruner", "hf_snapvit.pruning.scoring", "hf_snapvit.correction.per_size",
           "hf_snapvit.correction.inputs", "hf_snapvit.correction.prefix_sizes", "hf_snapvit.recovery.distillation"]


@pytest.fixture
def bars(monkeypatch) -> list:
    """The bars drawn while the test runs: plain tqdm bars writing to a buffer (huggingface_hub's, which the modules
    use, are turned off in the tests, conftest.py)."""
    drawn = []

    class Recorded(plain_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own argument
            super().__init__(*args, **{**kwargs, "file": io.StringIO()})
            if not kwargs.get("disable"):
                drawn.append(self)

    for name in MODULES:
        monkeypatch.setattr(importlib.import_module(name), "tqdm", Recorded)
    monkeypatch.setattr(huggingface_hub.utils, "tqdm", Recorded)  # imported inside functions (the image draw)
    return drawn


def assert_time_left_shown(drawn: list, expected: set[str]) -> None:
    seen = {bar.desc.split(" (")[0] for bar in drawn}
    assert expected <= seen, seen
    for bar in drawn:
        assert bar.total, f"the bar {bar.desc!r} has no total, so it cannot say how long is left"
        meter = bar.format_meter(**bar.format_dict)
        assert "<" in meter and "?" not in meter.split("<")[1].split(",")[0], meter  # [elapsed<left, rate]


def test_a_snapvit_ranking_says_how_long_is_left(bars):
    model = CASE["vit"].build()
    config = hs.SnapViTConfig(num_gradient_images=4, num_fitness_images=4, max_generations=2, max_evaluations=None,
                              fitness_sparsities=(0.1, 0.3), pca_components=4)
    hs.SnapViTPruner(config).fit(model, images(8), processor=PROCESSOR, show_progress=True)
    assert_time_left_shown(bars, {"gradient scores", "xNES search"})
    search = next(bar for bar in bars if bar.desc == "xNES search")
    # counted in candidates, so the first generation already moves it: 2 generations of the population
    assert search.unit == "candidate" and search.n == search.total and search.total % 2 == 0 and search.total > 2


def test_a_stored_correction_and_recovery_say_how_long_is_left(bars, tmp_path):
    model = CASE["vit"].build().eval()
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), tmp_path / "e")
    hs.add_prefix_correction(tmp_path / "e", images(12), PROCESSOR, config=CorrectionConfig(batch_size=4))
    student = slice_model_(copy.deepcopy(model), [(np.arange(2), np.arange(10))] * 2)
    recover(student, model, torch.randn(8, 3, 32, 32), RecoveryConfig(steps=3, batch_size=4, warmup_steps=1,
                                                                      held_out_images=0))
    assert_time_left_shown(bars, {"correction: embed calibration images", "elastic correction",
                                  "prefix correction: sizes", "recovery"})
