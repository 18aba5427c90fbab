"""benchmarks/defaults_vit_tiny.py: configuration specs map onto the fast preset at sigma 1 (the committed grid's base)
with exactly the named changes."""

from __future__ import annotations

import dataclasses

import pytest

import hf_snapvit
from hf_snapvit.methods.search_state import CHECKPOINT_SETTINGS
from hf_snapvit.methods.snapvit import FITNESS_BATCH_SIZE

from helpers import BENCHMARKS, load_benchmark

defaults = load_benchmark("defaults_vit_tiny")
FAST = hf_snapvit.SnapViTConfig.preset("fast")


def test_plain_spec_changes_definition_mode_and_budget_only():
    name, config = defaults.parse_config("fisher:paired:6", seed=3)
    assert name == "fisher-paired"
    expected = dataclasses.replace(FAST, scores=dataclasses.replace(FAST.scores, definition="fisher"), mode="paired",
                                   max_generations=6, seed=3, sigma=1.0)
    assert config == expected


def test_specs_reproduce_the_committed_rows():
    """Every committed fit records its settings; the script's config for its spec must be exactly those."""
    import json

    rankings = BENCHMARKS / "results" / "defaults_vit_tiny" / "rankings"
    fits = sorted(rankings.glob("*.fit.json"))
    assert fits
    for path in fits:
        fit = json.loads(path.read_text())
        name, config = defaults.parse_config(fit["spec"], seed=fit["settings"]["seed"])
        assert path.name == f"{name}.fit.json"
        # Fits recorded before the precision setting existed ran in CPU float32, which is what "auto" runs there.
        settings = {"precision": "auto", **fit["settings"]}
        expected = json.loads(json.dumps(config.to_dict(), default=str))
        for key in CHECKPOINT_SETTINGS:  # where the search state is saved is not a setting the fit records
            del expected[key]
        # The settings record the search batch that ran; left to the device (None), a CPU runs FITNESS_BATCH_SIZE's.
        if expected["fitness_batch_size"] is None:
            expected["fitness_batch_size"] = FITNESS_BATCH_SIZE["cpu"]
        assert expected == settings, path.name


def test_options_reach_the_search_and_the_scores():
    name, config = defaults.parse_config("obd:global:3:covariance=cka:sigma=0.5:head_rows=qkv:init=1.0,1.0", seed=0)
    assert name == "obd-global-covariancecka-sigma0.5-head_rowsqkv-init1.0_1.0"
    assert (config.covariance, config.sigma, config.init_mean) == ("cka", 0.5, (1.0, 1.0))
    assert config.scores.head_rows == "qkv" and config.scores.crops == FAST.scores.crops


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(SystemExit, match="unknown option 'temperature'.*covariance"):
        defaults.parse_config("obd:global:3:temperature=2", seed=0)
