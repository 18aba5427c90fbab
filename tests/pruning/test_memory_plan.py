"""A memory budget for every phase: micro-batches planned from the shapes, the same ranking under any budget.

The large shapes are planned on the meta device (no weights): the ``default`` preset of DINOv3 ViT-7B, ViT-g/14 and
SigLIP so400m at 384 and 512 px gets a plan under 80 GB in bf16. On a tiny model a budget that forces micro-batches
of one or two images gives the unbudgeted scores and orders; a budget below one image is refused before any work.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.errors import ConfigError
from hf_snapvit.pruning.memory_plan import ModelDims, default_budget, parse_memory, plan_memory
from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}
GB = 10**9


def _meta(cls, config) -> torch.nn.Module:
    with torch.device("meta"):
        return cls(config).to(torch.bfloat16)


LARGE = {
    "dinov3-vit7b-224": lambda: _meta(transformers.DINOv3ViTModel, transformers.DINOv3ViTConfig(
        hidden_size=4096, num_hidden_layers=40, num_attention_heads=32, intermediate_size=8192, use_gated_mlp=True,
        patch_size=16, image_size=224, num_register_tokens=4)),
    "vit-g14-224": lambda: _meta(transformers.Dinov2Model, transformers.Dinov2Config(
        hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, mlp_ratio=4, patch_size=14, image_size=224)),
    **{f"so400m-{side}": (lambda side=side: _meta(transformers.SiglipVisionModel, transformers.SiglipVisionConfig(
        hidden_size=1152, num_hidden_layers=27, num_attention_heads=16, intermediate_size=4304, patch_size=14,
        image_size=side))) for side in (384, 512)},
}


@pytest.mark.parametrize("value, expected", [("40GiB", 40 * 2**30), ("512MB", 512 * 10**6), ("1.5 gb", 15 * 10**8),
                                             (4096, 4096), ("3e9", 3 * 10**9), ("2KiB", 2048)])
def test_budgets_parse_from_bytes_and_units(value, expected):
    assert parse_memory(value) == expected


@pytest.mark.parametrize("value", ["40 parsecs", "", "-3GB", 0, True, None, [1]])
def test_a_bad_budget_is_refused_by_name(value):
    with pytest.raises(ConfigError, match="max_memory=") as error:
        parse_memory(value)
    assert "'40GiB'" in str(error.value)  # the fix: an example of a valid size


def test_the_default_budget_of_a_cpu_is_a_share_of_the_host_memory():
    with open("/proc/meminfo") as status:
        total = int(next(line for line in status if line.startswith("MemTotal")).split()[1]) * 1024
    assert 0 < default_budget("cpu") <= total // 2 + 1


@pytest.mark.parametrize("name", sorted(LARGE))
def test_the_default_preset_of_every_large_shape_plans_under_80_gb_in_bf16(name):
    model = LARGE[name]()
    plan = plan_memory(model, hs.SnapViTConfig.preset("default"), max_memory=80 * GB, device="cuda",
                       precision="bf16", search_batch=256)
    assert plan.peak <= 80 * GB
    for phase in (plan.gradient, plan.search, plan.correction, plan.evaluation):
        assert 1 <= phase.batch <= phase.wanted and phase.peak <= 80 * GB
    # A 16-image step of every crop at the input size does not fit at once: the plan splits it.
    assert plan.gradient.batch < 16
    dims = ModelDims.from_model(model)
    if name.startswith("dinov3"):  # 196 patches, a class token and 4 registers; a gated FFN's two input matrices
        assert dims.tokens(224) == 201 and dims.ffn_rows == 2 * 8192 and dims.num_params > 6.5e9


def test_a_larger_budget_never_plans_smaller_micro_batches():
    model = LARGE["so400m-384"]()
    config = hs.SnapViTConfig.preset("default")
    batches = [plan_memory(model, config, max_memory=budget * GB, device="cuda", precision="bf16",
                           search_batch=256).gradient.batch for budget in (40, 80, 160, 400)]
    assert batches == sorted(batches) and batches[0] >= 1 and batches[-1] == 16


def _tiny_config() -> hs.SnapViTConfig:
    return hs.SnapViTConfig.preset("fast", num_gradient_images=8, num_fitness_images=8, max_generations=1)


def test_a_budget_forcing_tiny_micro_batches_gives_the_unbudgeted_ranking():
    model = CASE["vit"].build()
    data = images(16)
    dense = hs.rank(model, "snapvit", data, config=_tiny_config(), processor=PROCESSOR, show_progress=False)
    plan = dense.provenance["memory_plan"]
    assert plan["budget_bytes"] is None and plan["budget"] == "default (cpu)"  # the free memory is not recorded
    # Room for the fixed part of every phase and two images of a gradient step.
    budget = max(plan[name]["fixed"] for name in ("gradient", "search", "correction")) \
        + 2 * plan["gradient"]["per_image"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    budgeted = hs.rank(model, "snapvit", data, config=_tiny_config(), processor=PROCESSOR, show_progress=False,
                       max_memory=budget)
    ran = budgeted.provenance["memory_plan"]
    assert ran["budget_bytes"] == budget and ran["gradient"]["batch"] == 2 and ran["estimated_peak_bytes"] <= budget
    # What the search ran is what the plan says (a gradient image needs more than the fitness's 8 images do).
    assert budgeted.provenance["settings"]["fitness_batch_size"] == ran["search"]["batch"] >= 8
    np.testing.assert_allclose(budgeted.head_scores, dense.head_scores, rtol=1e-6, atol=0)
    np.testing.assert_allclose(budgeted.neuron_scores, dense.neuron_scores, rtol=1e-6, atol=0)
    for (h1, n1), (h2, n2) in zip(budgeted.orders(), dense.orders()):
        assert h1.tolist() == h2.tolist() and n1.tolist() == n2.tolist()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the caller's model unchanged


def test_a_gradient_baseline_runs_in_planned_parts_with_the_same_scores():
    model = CASE["vit"].build()
    kwargs = dict(method="snip", data=images(8), preset="fast", processor=PROCESSOR, show_progress=False)
    dense = hs.rank(model, **kwargs)
    plan = dense.provenance["settings"]["memory_plan"]["gradient"]
    budgeted = hs.rank(model, **kwargs, max_memory=plan["fixed"] + plan["per_image"])
    assert budgeted.provenance["settings"]["memory_plan"]["gradient"]["batch"] == 1
    # SNIP's |w · Σ g| sums float32 batch-mean gradients of the parts: float32 rounding, up to a few 1e-6 here.
    np.testing.assert_allclose(budgeted.neuron_scores, dense.neuron_scores, rtol=1e-5, atol=0)
    np.testing.assert_allclose(budgeted.head_scores, dense.head_scores, rtol=1e-5, atol=0)


def test_a_budget_below_one_image_is_refused_with_the_figure_before_any_work():
    model = CASE["vit"].build()
    with pytest.raises(ConfigError, match=r"max_memory=.* is below what one image of the \w+ phase needs") as error:
        hs.rank(model, "snapvit", images(16), config=_tiny_config(), processor=PROCESSOR, show_progress=False,
                max_memory="64KiB")
    assert "Give max_memory of at least" in str(error.value) and "fast" in str(error.value)
    assert all(p.grad is None for p in model.parameters())


def test_checkpointing_is_planned_only_where_one_image_would_not_fit_and_it_pays():
    model = LARGE["dinov3-vit7b-224"]()
    plans = {preset: plan_memory(model, hs.SnapViTConfig.preset(preset), max_memory=60 * GB, device="cuda",
                                 precision="bf16", search_batch=256).gradient for preset in ("default", "paper")}
    # The paper preset's batch-mean gradients keep a float64 sum and a gradient per scored weight (34 GB): in 60 GB
    # one image fits only checkpointed.
    assert plans["paper"].checkpoint and plans["paper"].batch >= 1 and plans["paper"].peak <= 60 * GB
    roomy = plan_memory(model, hs.SnapViTConfig.preset("paper"), max_memory=141 * GB, device="cuda",
                        precision="bf16", search_batch=256).gradient
    assert not roomy.checkpoint and roomy.batch >= 1  # where an image fits whole, no block is recomputed
    # OBD's per-image products keep every scored layer's input and output: recomputing the rest would not pay.
    assert not plans["default"].checkpoint and plans["default"].batch >= 1


@pytest.mark.parametrize("definition", ["obd", "accumulated"])
def test_checkpointed_blocks_give_the_same_scores_and_restore_the_blocks(definition):
    from hf_snapvit.architectures import get_layers
    from hf_snapvit.pruning.scoring import ScoreConfig, gradient_scores
    from helpers import FEW_CROPS

    model = CASE["vit"].build()
    config = ScoreConfig(definition=definition, batch_size=4, crops=FEW_CROPS.crops)
    plain = gradient_scores(model, images(4), PROCESSOR, config, show_progress=False, micro_batch=2)
    recomputed = gradient_scores(model, images(4), PROCESSOR, config, show_progress=False, micro_batch=2,
                                 checkpoint=True)
    for a, b in zip(recomputed, plain):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    assert all("forward" not in layer.__dict__ for layer in get_layers(model))


def test_the_cli_takes_a_budget_and_refuses_a_bad_one_before_loading_anything():
    import argparse

    from hf_snapvit.cli.prune import _settings

    args = argparse.Namespace(method="snapvit", generations=None, preset="fast", mode=None, seed=0, precision="auto",
                              max_memory="2GiB")
    assert _settings(args)["max_memory"] == 2 * 2**30
    with pytest.raises(ConfigError, match=r"--max-memory='2 gallons' is not a memory size"):
        _settings(argparse.Namespace(**{**vars(args), "max_memory": "2 gallons"}))


def test_processes_on_one_host_share_the_default_cpu_budget(monkeypatch):
    one = default_budget("cpu")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert default_budget("cpu") <= one / 4 * 1.2  # the free memory moves a little between the two reads


def test_a_video_model_plans_the_tokens_of_every_tubelet():
    model = _meta(transformers.VideoMAEModel, transformers.VideoMAEConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, num_frames=8, tubelet_size=2))
    assert ModelDims.from_model(model).tokens(224) == 196 * 4
