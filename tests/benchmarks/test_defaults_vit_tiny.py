"""benchmarks/defaults_vit_tiny.py: configuration specs map onto the fast preset at sigma 1 (the committed grid's base)
with exactly the named changes."""

from __future__ import annotations

import dataclasses
import json

import pytest

import hf_snapvit
from hf_snapvit.pruning.methods.snapvit.search_state import CHECKPOINT_SETTINGS
from hf_snapvit.pruning.methods.snapvit import FITNESS_BATCH_SIZE

from helpers import BENCHMARKS, load_benchmark

defaults = load_benchmark("defaults_vit_tiny")
# The grid's base: the fast preset in the scores' own unit order with the best candidate as the result and the four
# fitness sparsities (defaults.BASE_ORDER, BASE_SOLUTION, BASE_SPARSITIES); specs add the sigma.
FAST = hf_snapvit.SnapViTConfig.preset("fast", unit_order=defaults.BASE_ORDER, solution=defaults.BASE_SOLUTION,
                                       fitness_sparsities=defaults.BASE_SPARSITIES)


def test_plain_spec_changes_definition_mode_and_budget_only():
    name, config = defaults.parse_config("fisher:paired:6", seed=3)
    assert name == "fisher-paired"
    expected = dataclasses.replace(FAST, scores=dataclasses.replace(FAST.scores, definition="fisher"), mode="paired",
                                   max_generations=6, seed=3, sigma=1.0)
    assert config == expected


def test_specs_reproduce_the_committed_rows():
    """Every committed fit records its settings; the script's config for its spec must be exactly those."""

    rankings = BENCHMARKS / "results" / "defaults_vit_tiny" / "rankings"
    fits = sorted(rankings.glob("*.fit.json"))
    # The per-seed studies in its subfolders (one each, seedS.fit.json) ran the same script.
    studies = sorted((BENCHMARKS / "results" / "defaults_vit_tiny").glob("*/seed*.fit.json"))
    assert fits and len(studies) >= 30
    for path in fits + studies:
        fit = json.loads(path.read_text())
        name, config = defaults.parse_config(fit["spec"], seed=fit["settings"]["seed"])
        assert path.name == f"{name}.fit.json" or path in studies
        # Fits recorded before the precision setting existed ran in CPU float32, which is what "auto" runs there.
        settings = {"precision": "auto", **defaults.NEWER_SETTINGS, **fit["settings"]}
        expected = json.loads(json.dumps(config.to_dict(), default=str))
        for key in CHECKPOINT_SETTINGS:  # where the search state is saved is not a setting the fit records
            del expected[key]
        # The settings record the search batch that ran; left to the device (None), a CPU runs FITNESS_BATCH_SIZE's.
        if expected["fitness_batch_size"] is None:
            expected["fitness_batch_size"] = FITNESS_BATCH_SIZE["cpu"]
        assert expected == settings, path


def test_options_reach_the_search_and_the_scores():
    name, config = defaults.parse_config("obd:global:3:covariance=cka:sigma=0.5:head_rows=qkv:init=1.0,1.0", seed=0)
    assert name == "obd-global-covariancecka-sigma0.5-head_rowsqkv-init1.0_1.0"
    assert (config.covariance, config.sigma, config.init_mean) == ("cka", 0.5, (1.0, 1.0))
    assert config.scores.head_rows == "qkv" and config.scores.crops == FAST.scores.crops


def test_options_set_the_fitness_images_the_measure_and_the_unit_order_only():
    name, config = defaults.parse_config("obd:global:3:sigma=0.5:fitness=256", seed=1)
    assert name == "obd-global-sigma0.5-fitness256"
    assert config == dataclasses.replace(FAST, max_generations=3, seed=1, sigma=0.5, num_fitness_images=256)
    name, config = defaults.parse_config("obd:global:3:sigma=0.5:measure=cka", seed=0)
    assert name == "obd-global-sigma0.5-measurecka"
    assert config == dataclasses.replace(FAST, max_generations=3, sigma=0.5, fitness_measure="cka")
    name, config = defaults.parse_config("obd:global:3:sigma=0.5:order=obs", seed=2)
    assert name == "obd-global-sigma0.5-orderobs"
    assert config == dataclasses.replace(FAST, max_generations=3, seed=2, sigma=0.5, unit_order="obs")
    name, config = defaults.parse_config("obd:global:20:sigma=0.5:order=output:sparsities=0.1,0.3,0.5", seed=0)
    assert name == "obd-global-sigma0.5-orderoutput-sparsities0.1_0.3_0.5"
    assert config == dataclasses.replace(FAST, max_generations=20, sigma=0.5, unit_order="output",
                                         fitness_sparsities=(0.1, 0.3, 0.5))
    name, config = defaults.parse_config("obd:global:20:sigma=0.5:order=output:solution=mean", seed=0)
    assert name == "obd-global-sigma0.5-orderoutput-solutionmean"
    assert config == dataclasses.replace(FAST, max_generations=20, sigma=0.5, unit_order="output", solution="mean")


def test_the_preset_option_takes_another_presets_images_and_crops():
    name, config = defaults.parse_config("obd:global:3:sigma=0.5:order=output:preset=default", seed=1)
    assert name == "obd-global-sigma0.5-orderoutput-presetdefault"
    # The benchmark's base solution stays the best candidate, so its committed fits still reproduce.
    assert config == hf_snapvit.SnapViTConfig(seed=1, solution="best") and config.preset_name() is None
    name, config = defaults.parse_config("obd:global:3:sigma=0.5:order=output:solution=mean:preset=default", seed=1)
    assert config == hf_snapvit.SnapViTConfig(seed=1) and config.preset_name() == "default"
    assert defaults.BASE_SOLUTION == "best" != hf_snapvit.SnapViTConfig().solution


def test_the_split_option_deals_the_fitness_images_out_among_the_sparsities():
    spec = "obd:global:3:sigma=0.5:order=output:solution=mean:preset=default:split=1"
    name, config = defaults.parse_config(spec, seed=2)
    assert name == "obd-global-sigma0.5-orderoutput-solutionmean-presetdefault-split1"
    assert config == hf_snapvit.SnapViTConfig(seed=2, split_fitness_images=True) and config.preset_name() is None
    assert not defaults.parse_config("obd:global:3:split=0", seed=0)[1].split_fitness_images
    with pytest.raises(SystemExit, match="give 1 or 0, not 'yes'"):
        defaults.parse_config("obd:global:3:split=yes", seed=0)


def test_the_rotate_option_scores_one_fitness_sparsity_per_generation():
    spec = "obd:global:20:sigma=0.5:order=output:solution=mean:sparsities=0.3,0.5,0.1:rotate=1"
    name, config = defaults.parse_config(spec, seed=1)
    assert name == "obd-global-sigma0.5-orderoutput-solutionmean-sparsities0.3_0.5_0.1-rotate1"
    assert config == hf_snapvit.SnapViTConfig.preset("fast", seed=1, max_generations=20,
                                                     fitness_sparsities=(0.3, 0.5, 0.1), rotate_fitness_sparsities=True)
    with pytest.raises(hf_snapvit.SnapViTError, match="use solution='mean'"):
        defaults.parse_config("obd:global:3:rotate=1", seed=0)  # the sweep's base keeps the best candidate


def test_crop_options_change_only_the_gradient_crops():
    name, config = defaults.parse_config("obd:global:0:solution=mean:preset=default:local_size=96:num_local=4", seed=0)
    assert name == "obd-global-solutionmean-presetdefault-local_size96-num_local4"
    preset = hf_snapvit.SnapViTConfig.preset("default")
    assert config.scores.crops == dataclasses.replace(preset.scores.crops, local_size=96, num_local=4)
    assert config.scores.definition == "obd" and config.num_gradient_images == preset.num_gradient_images


def test_unknown_option_names_the_valid_ones():
    with pytest.raises(SystemExit, match="unknown option 'temperature'.*covariance"):
        defaults.parse_config("obd:global:3:temperature=2", seed=0)


def test_early_stop_reads_the_stop_generation_off_a_history():
    history = [{"best_fitness": b, "partial": False} for b in (0.60, 0.60, 0.59, 0.589, 0.589, 0.589, 0.55)]
    assert defaults.early_stop(history, 2, 0.0) == 6  # 0.589 at 4, no gain at 5 and 6
    assert defaults.early_stop(history, 2, 0.005) == 5  # 0.589 is no gain over 0.59 at this threshold
    assert defaults.early_stop(history, 1, 0.0) == 2
    assert defaults.early_stop(history, 5, 0.0) == 7  # never: the whole history


def test_reused_search_rebuilds_the_recorded_rankings(tmp_path):
    """--reuse-search recomputes the scores only, takes the recorded history, and refuses a fit of other settings."""
    from helpers import CASES, PROCESSOR, images

    model = next(c for c in CASES if c.name == "vit").build()
    config = dataclasses.replace(FAST, num_gradient_images=3, num_fitness_images=6, pca_components=8,
                                 fitness_sparsities=(0.1, 0.3), max_generations=2, fitness_batch_size=4)
    path = tmp_path / "x.fit.json"
    searched, fit = defaults.fitted("spec", config, path, False, model, images(12), PROCESSOR)
    reused, again = defaults.fitted("spec", config, path, True, model, images(12), PROCESSOR)
    assert again["history"] == fit["history"] and reused.history_ == json.loads(path.read_text())["history"]
    for g in (0, 1, 2):
        defaults.write_ranking(tmp_path / f"a{g}.json", "spec", g, searched, fit)
        defaults.write_ranking(tmp_path / f"b{g}.json", "spec", g, reused, again)
        assert (tmp_path / f"a{g}.json").read_text() == (tmp_path / f"b{g}.json").read_text()
    with pytest.raises(SystemExit, match="other settings"):
        defaults.fitted("spec", dataclasses.replace(config, sigma=0.7), path, True, model, images(12), PROCESSOR)
    # The solution picks from the recorded history: a fit recorded with the best sample serves the mean, whose
    # rankings are the recorded means.
    mean_config = dataclasses.replace(config, solution="mean")
    mean, mean_fit = defaults.fitted("spec", mean_config, path, True, model, images(12), PROCESSOR)
    defaults.write_ranking(tmp_path / "m2.json", "spec", 2, mean, mean_fit)
    expected = mean.ranking_from_factors(fit["history"][1]["mean_factors"])
    assert json.loads((tmp_path / "m2.json").read_text())["neuron_scores"] == expected.neuron_scores.tolist()
    assert (tmp_path / "m2.json").read_text() != (tmp_path / "a2.json").read_text()
    # --also-mean: the best sample's fit writes the same mean ranking.
    defaults.write_ranking(tmp_path / "s2.json", "spec", 2, searched, fit, solution="mean")
    assert (tmp_path / "s2.json").read_text() == (tmp_path / "m2.json").read_text()
    old = {**fit, "history": [{k: v for k, v in r.items() if k != "mean_factors"} for r in fit["history"]]}
    with pytest.raises(SystemExit, match="recorded before the search's mean"):
        defaults.write_ranking(tmp_path / "o2.json", "spec", 2, searched, old, solution="mean")
