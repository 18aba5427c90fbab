"""Elastic checkpoints written by earlier versions keep loading, to the same widths and outputs.

``tests/fixtures/pre_reorg_elastic.json`` holds the ``config.json`` that hf_snapvit wrote before the package was
reorganised (commit bebd34f) for the tiny ``vit-cls`` model of ``tests/helpers.py`` ranked by magnitude, and the
widths and summed logits that version loaded at four sparsities.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from helpers import CASES

FIXTURE = json.loads((Path(__file__).parents[1] / "fixtures" / "pre_reorg_elastic.json").read_text())


@pytest.fixture(scope="module")
def old_checkpoint(tmp_path_factory):
    model = {c.name: c for c in CASES}["vit-cls"].build()
    folder = tmp_path_factory.mktemp("old")
    # Today's save permutes the weights; the stored config is then replaced by the one the old version wrote.
    hs.save_elastic(model, hs.rank(model, method="magnitude"), folder)
    (folder / "config.json").write_text(json.dumps(FIXTURE["config"]))
    return folder


@pytest.mark.parametrize("sparsity", sorted(FIXTURE["loaded"]))
def test_a_checkpoint_of_the_previous_layout_loads_to_the_same_model(old_checkpoint, sparsity):
    expected = FIXTURE["loaded"][sparsity]
    # Written before weight-order fingerprints existed: it loads, and says that its order cannot be verified.
    with pytest.warns(UserWarning, match="no weights fingerprint"):
        model = hs.ElasticViTModel.from_pretrained(old_checkpoint, sparsity=float(sparsity))
    assert list(layer_widths(model)) == [expected["heads"], expected["neurons"]]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        total = float(model(pixel_values=x).logits.double().sum())
    assert total == pytest.approx(expected["logits_sum"], rel=1e-5, abs=1e-6)
