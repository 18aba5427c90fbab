"""The baseline rankings share the framework: same entry point, same floors and format, sensible scores."""

from __future__ import annotations

from dataclasses import replace

import datasets
import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.cards.sections import provenance_lines
from hf_snapvit.pruning.methods.baselines import _lamp
from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores
from helpers import CASES, FEW_CROPS, PROCESSOR, images

CASE = {c.name: c for c in CASES}


def labelled(n: int = 6) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"image": images(n), "label": [i % 5 for i in range(n)]}).cast_column(
        "image", datasets.Image())


def test_lamp_matches_its_definition():
    w = torch.tensor([[3.0, -1.0], [2.0, 0.5]])
    squares = {9.0: 9.0 / 9.0, 1.0: 1.0 / (1 + 4 + 9), 4.0: 4.0 / (4 + 9), 0.25: 0.25 / 14.25}
    expected = torch.tensor([[squares[9.0], squares[1.0]], [squares[4.0], squares[0.25]]], dtype=torch.float64)
    torch.testing.assert_close(_lamp(w), expected)


@pytest.mark.parametrize("method", ["magnitude", "random", "lamp"])
def test_data_free_methods_ignore_data(method):
    model = CASE["vit"].build()
    a = hs.rank(model, method=method, seed=1)
    b = hs.rank(model, method=method, data=["not", "used"], preset="fast", seed=1)
    assert np.array_equal(a.neuron_scores, b.neuron_scores)
    assert a.provenance["method"] == method


def test_snip_is_weight_times_gradient():
    model = CASE["vit"].build()
    config = ScoreConfig(definition="snip", batch_size=2, crops=FEW_CROPS.crops)
    _, snip = gradient_scores(model, images(2), PROCESSOR, config, show_progress=False)
    _, squared = gradient_scores(model, images(2), PROCESSOR, ScoreConfig(definition="accumulated", batch_size=2,
                                                                          crops=FEW_CROPS.crops), show_progress=False)
    fc1 = model.layers[0].mlp.fc1.weight.detach().double()
    # |w·g| and g² come from the same accumulated gradient g: |g| = sqrt(g²) elementwise, so per row
    # mean|w·g| <= sqrt(mean w²) · sqrt(mean g²) (Cauchy-Schwarz), with equality impossible for random w.
    bound = np.sqrt((fc1**2).mean(1).numpy() * squared[0])
    assert np.all(snip[0] <= bound + 1e-12) and np.all(snip[0] > 0)


def test_gradient_baselines_through_rank():
    model = CASE["vit-cls"].build()
    data = labelled()
    snip = hs.rank(model, method="snip", data=data, processor=PROCESSOR, preset="fast", show_progress=False)
    taylor = hs.rank(model, method="taylor-ce", data=data, processor=PROCESSOR, preset="fast", show_progress=False)
    for ranking in (snip, taylor):
        counts = ranking.keep_counts(0.3)
        assert min(counts.heads) >= ranking.floors()[0] and min(counts.neurons) >= ranking.floors()[1]
        assert ranking.provenance["calibration_data"]["num_gradient"] == 6
    assert taylor.provenance["calibration_data"]["label_column"] == "label"
    assert snip.provenance["settings"]["preset"] == "fast" and snip.provenance["method"] == "snip"
    assert taylor.provenance["settings"]["scores"]["loss"] == "ce"


def test_cross_entropy_needs_labels_and_a_head():
    with pytest.raises(hs.SnapViTError, match="needs calibration images"):
        hs.rank(CASE["vit-cls"].build(), method="taylor-ce")
    with pytest.raises(hs.SnapViTError, match="has none"):
        hs.rank(CASE["vit-cls"].build(), method="taylor-ce", data=images(4), processor=PROCESSOR)
    with pytest.raises(hs.SnapViTError, match="ViTModel has none; use loss='dino'"):
        gradient_scores(CASE["vit"].build(), images(2), PROCESSOR, ScoreConfig(loss="ce"),
                        labels=torch.tensor([0, 1]), show_progress=False)
    with pytest.raises(hs.SnapViTError, match="label_column='y' is not among"):
        hs.rank(CASE["vit-cls"].build(), method="taylor-ce", data=labelled(), processor=PROCESSOR, label_column="y")


def test_every_method_is_listed():
    assert set(hs.available_methods()) == {"lamp", "magnitude", "random", "snapvit", "snip", "taylor-ce"}


def calibration_line(ranking: hs.ElasticRanking) -> str:
    """The "Calibration data" line of the ranking's model card."""
    return dict(provenance_lines(ranking, "a base model"))["Calibration data"]


@pytest.fixture
def registry(monkeypatch):
    """The method registry, restored after the test."""
    from hf_snapvit.pruning.methods import registry

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    return registry


def test_register_a_data_free_method(registry):
    with pytest.raises(ValueError, match="already registered"), pytest.warns(FutureWarning):
        hs.register_method("snip", lambda model, shape, seed: None)
    with pytest.warns(FutureWarning, match=r"register_method\('depth', DataFreeConfig"):
        hs.register_method("depth", lambda model, shape, seed: (
            np.full((shape.num_layers, shape.num_heads), 1e9),  # heads far more important than any neuron
            np.tile(np.arange(shape.num_layers, 0, -1.0)[:, None], (1, shape.intermediate_size))))
    assert not registry.ranking_method("depth").needs_data and "depth" in hs.available_methods()
    ranking = hs.rank(CASE["vit"].build(), method="depth", preset="fast", seed=2)
    counts = ranking.keep_counts(0.2)
    assert counts.neurons[1] < counts.neurons[0]  # the later block scores lower, so it loses neurons first
    assert ranking.provenance["method"] == "depth" and ranking.provenance["seed"] == 2
    # The card (a stage below the registry) reads what the method reads from the ranking, not from a list of names.
    assert ranking.provenance["needs_data"] is False and ranking.provenance["needs_labels"] is False
    assert calibration_line(ranking) == "none (data-free method)"
    old = {k: v for k, v in ranking.provenance.items() if not k.startswith("needs_")}  # ranked before the record
    assert calibration_line(replace(ranking, provenance=old)) == "not recorded"
    assert calibration_line(replace(ranking, provenance={**old, "method": "magnitude"})) == "none (data-free method)"
    labelled_images = {"calibration_data": {"name": "pets", "label_column": "y"}}
    assert calibration_line(replace(ranking, provenance={**ranking.provenance, **labelled_images, "needs_data": True,
                                                         "needs_labels": True})) == "from `pets` labels from `y`"
    assert calibration_line(replace(ranking, provenance={**old, **labelled_images})) == "from `pets`"
    assert calibration_line(replace(ranking, provenance={**old, **labelled_images, "method": "taylor-ce"})) == (
        "from `pets` labels from `y`")


def test_a_method_from_outside_the_package_ranks_saves_and_loads(registry, tmp_path):
    """Issue 66: a user's method is a config class and a ranker class, registered once; rank(), its settings, the
    refusals, save_elastic and the sliced load then treat it as a built-in one."""
    from dataclasses import dataclass

    from hf_snapvit.architectures.budget import layer_widths
    from hf_snapvit.pruning.methods import RankingConfig, ScoreRanker

    @dataclass(frozen=True)
    class DepthConfig(RankingConfig):
        late_weight: float = 0.5  # how much a later block's units count, relative to the block before

        def __post_init__(self):
            super().__post_init__()
            self._check_real("late_weight", 0, 1, low_open=True)

    class DepthRanker(ScoreRanker):
        def scores(self, model, shape, data, **run):
            self.settings_ = {"late_weight": self.config.late_weight, "images": len(data)}
            weight = self.config.late_weight ** np.arange(shape.num_layers, dtype=float)[:, None]
            return (np.ones((shape.num_layers, shape.num_heads)) * weight * shape.params_per_head,
                    np.ones((shape.num_layers, shape.intermediate_size)) * weight * shape.params_per_neuron)

    with pytest.raises(hs.ConfigError, match="RankingConfig"):
        hs.register_method("depth", dict, DepthRanker, needs_data=True)
    with pytest.raises(hs.ConfigError, match="needs_data"):
        hs.register_method("depth", DepthConfig, DepthRanker)
    hs.register_method("depth", DepthConfig, DepthRanker, needs_data=True)
    model = CASE["vit"].build()
    with pytest.raises(hs.DataError, match="needs calibration images"):
        hs.rank(model, "depth")
    with pytest.raises(hs.ConfigError, match="method='depth' has no setting 'max_generations'; its settings .DepthConfig.: late_weight, "):
        hs.rank(model, "depth", images(2), max_generations=3)
    with pytest.raises(hs.ConfigError, match="late_weight=2"):
        hs.rank(model, "depth", images(2), late_weight=2)
    ranking = hs.rank(model, "depth", images(2), config=DepthConfig(late_weight=0.25), mode="paired", seed=4)
    assert ranking.mode == "paired" and ranking.provenance["method"] == "depth" and ranking.provenance["needs_data"]
    assert ranking.provenance["settings"] == {"late_weight": 0.25, "images": 2} and ranking.provenance["seed"] == 4
    stored = hs.save_elastic(model, ranking, tmp_path / "e", model_card=False)
    assert stored.provenance["method"] == "depth"
    loaded = hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)
    heads, neurons = layer_widths(loaded)
    assert neurons[1] < neurons[0]  # the later block counts less, so it loses more
    assert loaded.config.elastic_ranking["provenance"]["method"] == "depth"


def test_every_config_speaks_one_dialect():
    """Issue 66: one base for every settings class: JSON round trips (nested settings and tuples included), unknown
    keys refused with the known ones, each wing's own error; the baselines' presets are SnapViT's gradient phase."""
    import json
    import warnings

    from hf_snapvit.correction import CorrectionConfig
    from hf_snapvit.errors import CorrectionError, EvaluationError, RecoveryError
    from hf_snapvit.evaluation.probe import LinearProbeConfig
    from hf_snapvit.pruning.methods import DataFreeConfig, GradientBaselineConfig, ranking_method

    fast = hs.SnapViTConfig.preset("fast", seed=3, fitness_sparsities=[0.2, 0.4])
    for config, error in ((fast, hs.ConfigError), (GradientBaselineConfig.preset("paper"), hs.ConfigError),
                          (DataFreeConfig(mode="paired"), hs.ConfigError), (hs.MultiCropConfig(), hs.ConfigError),
                          (CorrectionConfig(num_samples=None), CorrectionError),
                          (hs.RecoveryConfig(crop_scale=[0.3, 0.9]), RecoveryError),
                          (LinearProbeConfig(epochs=3), EvaluationError)):
        assert type(config).from_dict(json.loads(json.dumps(config.to_dict()))) == config
        with pytest.raises(error, match=r"Unknown \w+ settings \['sedd'\]; known: \['\w+', '"):
            type(config).from_dict({**config.to_dict(), "sedd": 1})
    assert fast.preset_name() is None and isinstance(fast.scores.crops, hs.MultiCropConfig)
    assert hs.SnapViTConfig.preset("fast", seed=3, mode="paired").preset_name() == "fast"  # seed, mode: no preset
    baseline = GradientBaselineConfig.preset("fast")
    snapvit = hs.SnapViTConfig.preset("fast")
    assert (baseline.num_gradient_images, baseline.scores) == (snapvit.num_gradient_images, snapvit.scores)
    assert baseline.images_needed == 128 and snapvit.images_needed == 256 and DataFreeConfig().images_needed == 0
    # The calls before the registry: a SnapViTConfig for a gradient baseline, precision for a method without it.
    with pytest.warns(FutureWarning, match="num_gradient_images, scores taken from it"):
        assert ranking_method("snip").config(snapvit) == baseline
    with pytest.warns(FutureWarning, match="precision='bf16' has no effect on method='magnitude'"):
        assert ranking_method("magnitude").config(precision="bf16", preset="paper") == DataFreeConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ranking_method("snip").config(precision="auto", mode=None, max_generations=None) == \
            GradientBaselineConfig()
    with pytest.raises(hs.ConfigError, match="config must be a GradientBaselineConfig for method='snip'"):
        ranking_method("snip").config(CorrectionConfig())
