"""The per-layer allocation heatmap (hf_snapvit.plots.allocation), and its deprecated module name."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import transformers

import hf_snapvit
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.errors import ConfigError
from hf_snapvit.plots import allocation_table, plot_allocation


@pytest.fixture(scope="module")
def model_and_ranking():
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=37,
                                    image_size=32, patch_size=8, num_labels=5)
    model = transformers.ViTForImageClassification(config).eval()
    return model, hf_snapvit.rank(model, method="random", seed=1)


def test_panels_show_the_fractions_of_models_actually_sliced(model_and_ranking, tmp_path):
    model, ranking = model_and_ranking
    folder = tmp_path / "elastic"
    hf_snapvit.save_elastic(model, ranking, folder)
    sparsities = (0.1, 0.3, 0.5)
    figure = plot_allocation(ranking, sparsities=sparsities)
    head_panel, neuron_panel = figure.axes[:2]
    heads_shown = np.asarray(head_panel.images[0].get_array())
    neurons_shown = np.asarray(neuron_panel.images[0].get_array())
    for row, sparsity in enumerate(sparsities):
        heads, neurons = layer_widths(hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=sparsity))
        np.testing.assert_allclose(heads_shown[row], np.array(heads) / 4)
        np.testing.assert_allclose(neurons_shown[row], np.array(neurons) / 37)
    assert [t.get_text() for t in head_panel.get_yticklabels()] == ["10%", "30%", "50%"]
    assert len(neuron_panel.get_xticks()) == 4


def test_fractions_shrink_with_sparsity_and_meet_the_budget(model_and_ranking):
    _, ranking = model_and_ranking
    sparsities = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    heads, neurons = allocation_table(ranking, sparsities)
    assert heads.shape == neurons.shape == (6, 4)
    assert np.all(np.diff(heads, axis=0) <= 0) and np.all(np.diff(neurons, axis=0) <= 0)
    shape = ranking.shape
    for row, sparsity in enumerate(sparsities):
        kept = shape.num_params(np.rint(heads[row] * shape.num_heads).astype(int),
                                np.rint(neurons[row] * shape.intermediate_size).astype(int))
        # Within one head (the largest unit) of the requested budget.
        assert abs(kept - (1 - sparsity) * shape.num_params()) <= shape.params_per_head


def test_png_is_written_atomically(model_and_ranking, tmp_path, monkeypatch):
    _, ranking = model_and_ranking
    path = tmp_path / "plots" / "allocation.png"
    plot_allocation(ranking, path)
    first = path.read_bytes()
    assert first.startswith(b"\x89PNG")

    from matplotlib.figure import Figure

    def broken(self, *args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        plot_allocation(ranking, path, sparsities=(0.2,))
    assert path.read_bytes() == first  # the old plot survives a failed write
    assert sorted(p.name for p in path.parent.iterdir()) == ["allocation.png"]  # no temp file left


def test_draws_into_given_axes_and_writes_nothing_without_path(model_and_ranking, tmp_path, monkeypatch):
    _, ranking = model_and_ranking
    monkeypatch.chdir(tmp_path)
    from matplotlib.figure import Figure

    figure = Figure()
    axes = figure.subplots(1, 2)
    assert plot_allocation(ranking, ax=axes, sparsities=(0.2, 0.4)) is figure
    assert axes[0].images and axes[1].images and list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="exactly two axes"):
        plot_allocation(ranking, ax=[axes[0]])


def test_out_of_range_sparsity_names_the_range(model_and_ranking):
    _, ranking = model_and_ranking
    with pytest.raises(hf_snapvit.BudgetError, match="out of range.*sparsity <="):
        plot_allocation(ranking, sparsities=(0.1, 0.99))
    with pytest.raises(hf_snapvit.BudgetError, match="empty"):
        plot_allocation(ranking, sparsities=())


def test_the_old_module_name_warns_and_gives_the_same_functions():
    import hf_snapvit.plotting as old
    from hf_snapvit import plots

    for name in ("allocation_table", "plot_allocation", "plot_latency_table", "DEFAULT_SPARSITIES"):
        with pytest.warns(FutureWarning, match=rf"hf_snapvit\.plotting is deprecated.*import {name} from "
                                               r"hf_snapvit\.plots"):
            assert getattr(old, name) is getattr(plots, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert hf_snapvit.plot_allocation is plots.plot_allocation  # the documented name: no warning
    with pytest.raises(AttributeError, match="no attribute 'plot_sweep'"):
        old.plot_sweep  # noqa: B018
