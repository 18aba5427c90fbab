"""Hardware-aligned FFN widths: kept widths are multiples of ``width_multiple``, budgets still land within one group,
the ranking's order decides which groups go, and the aligned sliced model equals the masked dense one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.architectures.budget import DEFAULT_WIDTH_MULTIPLE, layer_widths, model_shape, resolve_width_multiple, skeleton
from hf_snapvit.cli import main as cli_main
from helpers import CASES, masked_copy, output_of

SPARSITIES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def aligned(widths, multiple, dense):
    return all(w == dense or w % multiple == 0 for w in widths)


def wide_vit(intermediate_size: int = 256) -> transformers.ViTModel:
    """A tiny ViT whose FFN is wide enough for the default multiple (256 = 4 x 64)."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, image_size=32,
                                    patch_size=8, intermediate_size=intermediate_size)
    model = transformers.ViTModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("multiple", [2, 8, 16])
@pytest.mark.parametrize("mode", ["global", "paired"])
def test_kept_widths_are_multiples_and_budgets_land_within_one_group(case, multiple, mode):
    model = case.build()
    ranking = hs.rank(model, method="random", seed=3, mode=mode)
    shape = ranking.shape
    group = max(shape.params_per_head, multiple * shape.params_per_neuron)
    for sparsity in SPARSITIES:
        if sparsity > ranking.max_sparsity_for(multiple):
            continue
        counts = ranking.keep_counts(sparsity, width_multiple=multiple)
        assert aligned(counts.neurons, multiple, shape.intermediate_size), (sparsity, counts.neurons)
        assert min(counts.neurons) >= ranking.floors(multiple)[1]
        target = (1 - sparsity) * shape.num_params()
        # Global mode walks one group at a time; paired mode also removes heads in lockstep with the neurons.
        slack = group if mode == "global" else group + shape.params_per_head * shape.num_layers
        assert abs(counts.num_params - target) <= slack


def test_the_default_multiple_is_64_for_real_widths_and_exact_for_toy_ones():
    assert resolve_width_multiple(None, 3072) == DEFAULT_WIDTH_MULTIPLE == 64
    assert resolve_width_multiple(None, 768) == 64  # ViT-Ti/16
    assert resolve_width_multiple(None, 256) == 64
    assert resolve_width_multiple(None, 37) == 1
    assert resolve_width_multiple(8, 37) == 8


@pytest.mark.parametrize("bad", [0, -8, 2.5, "8", True, 38])
def test_bad_multiples_name_the_value_and_the_valid_range(bad):
    ranking = hs.rank(CASES[0].build(), method="magnitude")
    with pytest.raises(hs.BudgetError, match=rf"width_multiple={bad!r}.*(integer|between 1)"):
        ranking.keep_counts(0.3, width_multiple=bad)


def test_vit_b_shapes_keep_multiples_of_64_by_default_and_exact_widths_on_request():
    shape = model_shape(skeleton(transformers.ViTConfig()))  # ViT-B/16
    rng = np.random.default_rng(0)
    ranking = hs.ElasticRanking(10.0 ** rng.normal(-8, 1, (12, 12)), 10.0 ** rng.normal(-8, 1, (12, 3072)), shape)
    for sparsity in (0.1, 0.3, 0.5, 0.6):
        counts = ranking.keep_counts(sparsity)
        assert all(n % 64 == 0 for n in counts.neurons), counts.neurons
        exact = ranking.keep_counts(sparsity, width_multiple=1)
        assert not all(n % 64 == 0 for n in exact.neurons)
        # Alignment moves the budget by less than one group of 64 neurons plus one head.
        assert abs(counts.num_params - exact.num_params) <= 64 * shape.params_per_neuron + shape.params_per_head


def test_the_ranking_decides_which_groups_go():
    """A block whose neurons all score low loses its groups first; a strong block keeps its full width."""
    model = wide_vit()
    shape = model_shape(model)
    heads = np.full((3, 4), 1e6)
    neurons = np.stack([np.full(256, 1.0), np.full(256, 1e-6), np.linspace(2e-3, 1e-3, 256)])
    ranking = hs.ElasticRanking(heads, neurons, shape)
    counts = ranking.keep_counts(0.2)
    assert counts.neurons[0] == 256 and counts.neurons[1] < counts.neurons[2] <= 256
    assert aligned(counts.neurons, 64, 256)


@pytest.mark.parametrize("sparsity", [0.2, 0.4])
def test_aligned_slices_equal_the_masked_dense_model(tmp_path, sparsity):
    model = wide_vit()
    ranking = hs.rank(model, method="random", seed=1)
    hs.save_elastic(model, ranking, tmp_path)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=sparsity)
    stored = hs.ElasticRanking.from_dict(json.loads((tmp_path / "config.json").read_text())["elastic_ranking"])
    counts = stored.keep_counts(sparsity)
    assert layer_widths(sliced) == (counts.heads, counts.neurons)
    assert aligned(counts.neurons, 64, 256) and sliced.config.elastic_layout["width_multiple"] == 64
    dense = transformers.ViTModel.from_pretrained(tmp_path).eval()
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    torch.testing.assert_close(output_of(sliced, inputs), output_of(masked_copy(dense, stored.keep_indices(counts)),
                                                                    inputs), rtol=1e-4, atol=1e-5)


def test_the_layout_records_the_multiple_and_survives_a_save(tmp_path):
    model = wide_vit()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path / "elastic")
    exact = hs.ElasticViTModel.from_pretrained(tmp_path / "elastic", sparsity=0.3, width_multiple=1)
    assert exact.config.elastic_layout["width_multiple"] == 1
    small = hs.ElasticViTModel.from_pretrained(tmp_path / "elastic", sparsity=0.3, width_multiple=32)
    assert small.config.elastic_layout["width_multiple"] == 32
    assert aligned(layer_widths(small)[1], 32, 256)
    small.save_pretrained(tmp_path / "sliced")
    again = hs.ElasticViTModel.from_pretrained(tmp_path / "sliced")
    assert again.config.elastic_layout == small.config.elastic_layout


def test_an_aligned_sliced_model_compiles_and_runs_with_sdpa(tmp_path):
    model = wide_vit()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path)
    small = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3, attn_implementation="sdpa")
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))}
    compiled = torch.compile(small, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).last_hidden_state, output_of(small, inputs))


def test_inspect_and_export_show_and_apply_the_multiple(tmp_path, capsys):
    model = wide_vit()
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path / "elastic", image_processor=processor)
    assert cli_main(["inspect", str(tmp_path / "elastic"), "--sparsities", "0.3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ranking"]["width_multiple"] == 64 and aligned(report["grid"][0]["neurons"], 64, 256)
    assert cli_main(["inspect", str(tmp_path / "elastic"), "--sparsities", "0.3", "--width-multiple", "1",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ranking"]["width_multiple"] == 1
    assert cli_main(["export", "--model", str(tmp_path / "elastic"), "--sparsity", "0.3", "--width-multiple", "16",
                     "--output", str(tmp_path / "out"), "--json", "-q"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["width_multiple"] == 16 and aligned(exported["neurons"], 16, 256)
    assert cli_main(["export", "--model", str(tmp_path / "elastic"), "--sparsity", "0.3", "--width-multiple", "512",
                     "--output", str(tmp_path / "bad"), "-q"]) == 2
    assert "width_multiple=512 is out of range" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_the_model_card_table_shows_the_aligned_widths(tmp_path):
    from hf_snapvit.cards.elastic import make_model_card

    model = wide_vit()
    ranking = hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path)
    card = make_model_card(tmp_path, sparsities=(0.3,))
    counts = ranking.keep_counts(0.3)
    assert aligned(counts.neurons, 64, 256)
    assert f"| {sum(counts.heads)} / 12 | {sum(counts.neurons)} / 768 |" in card.text  # kept heads / neurons
    assert "multiple of 64 FFN neurons" in card.text


@pytest.mark.parametrize("multiple, expected", [(None, 64), (1, 1), (32, 32)])
def test_the_search_scores_candidates_at_the_widths_users_load(monkeypatch, multiple, expected):
    from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness

    model = wide_vit()
    fitness = EmbeddingFitness(model, torch.randn(4, 3, 32, 32), sparsities=(0.3, 0.5), pca_components=8,
                               width_multiple=multiple)
    seen = []
    embed = fitness.embed
    monkeypatch.setattr(fitness, "embed",
                        lambda keep, *rows: seen.append([len(n) for _, n in keep]) or embed(keep, *rows))
    fitness.loss(hs.rank(model, method="random", seed=2))
    assert len(seen) == 2 and all(aligned(widths, expected, 256) for widths in seen)
    if expected > 1:
        assert any(w != 256 for widths in seen for w in widths)
