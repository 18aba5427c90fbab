"""A ranking in bf16: how close it comes to the float32 one (CPU bf16 autocast, tiny model), the search's copy, and
the setting through rank() and the CLI (tests/utils/test_precision.py: how the setting resolves)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.data.views import MultiCropConfig
from helpers import CASES, PROCESSOR, images, spearman

CASE = {c.name: c for c in CASES}


def _fit(model, precision, generations=0):
    config = hs.SnapViTConfig(num_gradient_images=8, num_fitness_images=8, pca_components=8,
                              max_generations=generations, fitness_sparsities=(0.3,),
                              scores=ScoreConfig(definition="obd", batch_size=4,
                                                 crops=MultiCropConfig(num_global=2, num_local=2)),
                              precision=precision, unit_order="scores")
    # The scores' own order: the unit-order pass (methods/block_order.py) runs the dense model in float32 whatever
    # the precision, its covariance sums being what it measures, and would show among the recorded dtypes.
    return hs.SnapViTPruner(config).fit(model, images(16), processor=PROCESSOR, show_progress=False)


@pytest.mark.slow
def test_bf16_scores_rank_units_like_float32(no_accelerator):
    """Without search (the starting factors), the bf16 ranking orders the units and sizes the blocks as float32."""
    model = CASE["vit"].build()
    dtypes: list[torch.dtype] = []
    model.layers[0].mlp.fc1.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    full = _fit(model, "fp32")
    assert set(dtypes) == {torch.float32} and full.provenance["precision"] == "fp32"
    dtypes.clear()
    half = _fit(model, "bf16")
    assert set(dtypes) == {torch.bfloat16} and half.provenance["precision"] == "bf16"
    assert half.provenance["settings"]["precision"] == "bf16"
    for a, b in ((full.head_scores, half.head_scores), (full.neuron_scores, half.neuron_scores)):
        assert not np.array_equal(a, b)
        assert spearman(a, b) > 0.95
    # A 2-block model with 4 heads and 37 neurons per block: one unit is a large step, so allow a head and 10 % of a
    # block's neurons either way.
    for sparsity in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        sparsity = min(sparsity, full.max_sparsity, half.max_sparsity)
        a, b = full.keep_counts(sparsity), half.keep_counts(sparsity)
        assert np.abs(np.subtract(a.neurons, b.neurons)).max() <= 0.1 * full.shape.intermediate_size, sparsity
        assert np.abs(np.subtract(a.heads, b.heads)).max() <= 1, sparsity


def test_the_search_objective_in_bf16_is_close_to_float32():
    """The fitness of candidate rankings under bf16 forwards differs from float32 far less than candidates differ."""
    from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness

    model = CASE["vit"].build()
    # Twice as many images as PCA components: with as many, the PCA basis is fitted to the very images it projects,
    # and bf16's rounding moved one loss by a tenth of the candidates' spread on an AMX CPU (under 1 % with 16).
    pixels = PROCESSOR(images=images(16), return_tensors="pt")["pixel_values"]
    candidates = [hs.rank(model, method="random", seed=s) for s in range(4)] + [hs.rank(model, method="magnitude")]
    losses = {}
    for precision in ("no", "bf16"):
        fitness = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3, 0.5, 0.6), pca_components=8,
                                   precision=precision)
        losses[precision] = np.array([fitness.loss(r) for r in candidates])
    assert not np.array_equal(losses["no"], losses["bf16"])
    assert np.abs(losses["no"] - losses["bf16"]).max() < 0.05 * np.ptp(losses["no"])
    assert np.array_equal(np.argsort(losses["no"]), np.argsort(losses["bf16"]))  # the search would choose alike


def test_the_bf16_search_runs_on_a_bf16_copy_and_leaves_the_model_as_it_was():
    from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness

    model = CASE["vit"].build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pixels = PROCESSOR(images=images(16), return_tensors="pt")["pixel_values"]
    fitness = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=8, precision="bf16")
    assert fitness.work.dtype == fitness.model.dtype == fitness._inputs.dtype == torch.bfloat16
    assert fitness.pixel_values.dtype == torch.float32  # as given: the CKA covariance reads them with the model
    assert 0 < fitness.loss(hs.rank(model, method="magnitude")) < 1
    assert all(v.dtype == torch.float32 and torch.equal(v, before[k]) for k, v in model.state_dict().items()
               if v.is_floating_point())
    plain = EmbeddingFitness(model, pixels, sparsities=(0.3,), pca_components=8, precision="no")
    assert plain.model is model and plain.work.dtype == torch.float32


def test_rank_and_the_cli_take_the_precision(capsys):
    from hf_snapvit.cli import build_parser

    from hf_snapvit.pruning.methods import ranking_method

    # Issue 66: a precision beside a full config replaces its field; a bad one is refused by the config.
    assert ranking_method("snapvit").config(hs.SnapViTConfig(), precision="bf16").precision == "bf16"
    with pytest.raises(hs.ConfigError, match="SnapViTConfig.*precision='fp16'.*'auto', 'fp32', 'bf16'"):
        hs.rank(CASE["vit"].build(), method="snapvit", data=images(4), precision="fp16")
    common = ["prune", "--model", "m", "--output", "o", "--data", "d"]
    assert build_parser("prune").parse_args(common).precision == "auto"
    assert build_parser("prune").parse_args([*common, "--precision", "bf16"]).precision == "bf16"
    with pytest.raises(SystemExit):
        build_parser("prune").parse_args([*common, "--precision", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


@pytest.mark.slow
def test_rank_records_the_precision_that_ran(no_accelerator):
    model = CASE["vit"].build()
    config = dict(num_gradient_images=2, num_fitness_images=4, pca_components=4, max_generations=1,
                  scores=ScoreConfig(batch_size=2, crops=MultiCropConfig(num_global=1, num_local=0)))
    ranking = hs.rank(model, method="snapvit", data=images(6), processor=PROCESSOR, show_progress=False,
                      config=hs.SnapViTConfig(**config, precision="bf16"))
    assert ranking.provenance["precision"] == "bf16" and ranking.provenance["settings"]["precision"] == "bf16"
