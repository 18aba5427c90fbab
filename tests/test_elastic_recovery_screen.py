"""benchmarks/elastic_recovery_screen.py on a tiny random ViT: each variant changes the one setting it names, the
switchable anchors start as the model's own parameters and train only the anchors the views use, and the patches
the screen makes to the recovery module are undone."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_snapvit
import hf_snapvit.recovery as recovery

from helpers import CASES, load_benchmark, recovery_benchmark_inputs


@pytest.fixture(scope="module")
def screen():
    return load_benchmark("elastic_recovery_screen")


def test_each_variant_changes_one_setting(screen):
    base = screen.settings("elastic", 60, 32).to_dict()
    assert base["elastic"] and base["elastic_range"] == [0.0, 0.6] and base["steps"] == 60
    changes = [("elastic-samples2", "elastic_samples", 2), ("elastic-from0.1", "elastic_range", [0.1, 0.6]),
               ("elastic-0.3to0.5", "elastic_range", [0.3, 0.5]), ("elastic-lr6e-4", "lr", 6e-4),
               ("elastic-lr1e-4", "lr", 1e-4), ("elastic-no-hidden", "hidden_weight", 0.0)]
    for name, key, value in changes:
        changed = screen.settings(name, 60, 32).to_dict()
        assert {k for k in base if base[k] != changed[k]} == {key} and changed[key] == value
    reference = screen.settings("recovery@0.5", 60, 32)
    assert not reference.elastic and reference.batch_size == 32


def test_switchable_anchors_start_as_the_model_and_train_only_the_views_anchors(screen):
    model = CASES[1].build().eval()  # vit-cls
    pixels = torch.randn(3, 3, 32, 32)
    before = model(pixel_values=pixels).logits
    parts = screen.SwitchableParts(model)
    with parts.anchor(0.3):
        assert torch.allclose(model(pixel_values=pixels).logits, before, atol=1e-6)
    with parts.anchor(0.3):
        model(pixel_values=pixels).logits.sum().backward()
    norm = next(m for m in model.modules() if isinstance(m, torch.nn.LayerNorm))
    assert norm.weight.grad is None  # the shared copy is bypassed while an anchor is in use
    assert norm.anchor_weight["a3"].grad is not None and norm.anchor_weight["a2"].grad is None

    clone = copy.deepcopy(model)  # recover() trains a deep copy: its hooks must follow the same anchor switch
    with torch.no_grad():
        next(m for m in clone.modules() if isinstance(m, torch.nn.LayerNorm)).anchor_bias["a3"].add_(1.0)
    assert torch.allclose(clone(pixel_values=pixels).logits, before, atol=1e-6)
    with parts.anchor(0.3):
        assert not torch.allclose(clone(pixel_values=pixels).logits, before, atol=1e-3)


@pytest.mark.slow  # three tiny trainings and their evaluations
def test_variants_run_and_leave_the_recovery_module_as_it_was(screen, tmp_path):
    elastic, calibration, val, bank = recovery_benchmark_inputs(tmp_path, 8)
    patched = (recovery.per_image_loss, recovery.prefix_view, recovery._step_views,
               hf_snapvit.ElasticRanking.check_matches)
    for name, sparsities in [("recovery@0.5", {"0.5"}), ("elastic-balanced", {"0.0", "0.3", "0.5"}),
                             ("elastic-switchable", {"0.0", "0.3", "0.5"}),
                             ("elastic-weighted", {"0.0", "0.3", "0.5"})]:
        top1 = screen.run_variant(name, str(elastic), calibration, val, bank, steps=2, batch_size=4, k=3)
        assert set(top1) == sparsities and all(0.0 <= v <= 1.0 for v in top1.values())
    assert (recovery.per_image_loss, recovery.prefix_view, recovery._step_views,
            hf_snapvit.ElasticRanking.check_matches) == patched


def test_sparsity_weighting_scales_each_view_by_its_sparsity_over_the_steps_mean(screen):
    seen = []
    plain_loss, plain_views = recovery.per_image_loss, recovery._step_views
    recovery.per_image_loss = lambda student, teacher, config: torch.ones(2)
    recovery._step_views = lambda *args: [(0.0, None), (0.6, None), (0.3, None)]
    try:
        with screen.sparsity_weighted_views():
            chosen = recovery._step_views()
            seen = [float(recovery.per_image_loss(None, None, None)[0]) for _ in chosen]
    finally:
        recovery.per_image_loss, recovery._step_views = plain_loss, plain_views
    assert seen == pytest.approx([0.0, 2.0, 1.0])  # mean sparsity 0.3


class _Ranking:
    def keep_counts(self, sparsity):
        return sparsity


def test_stratified_views_cover_each_half_and_the_top(screen):
    config = hf_snapvit.RecoveryConfig(elastic=True, steps=40, seed=0)
    plain = recovery._step_views
    with screen.drawn_views("stratified"):
        for step in range(20):
            (a, _), (b, _), (c, _) = recovery._step_views([(0.0, _Ranking()), (0.6, _Ranking())], config, step)
            assert 0.0 <= a <= 0.3 <= b <= 0.6 and c == 0.6
    assert recovery._step_views is plain


def test_progressive_views_grow_the_top_over_the_first_half(screen):
    config = hf_snapvit.RecoveryConfig(elastic=True, steps=40, seed=0)
    with screen.drawn_views("progressive"):
        tops = [recovery._step_views([(0.0, _Ranking()), (0.6, _Ranking())], config, step) for step in range(40)]
    assert tops[0][1][0] == pytest.approx(0.2) and tops[10][1][0] == pytest.approx(0.4)
    assert all(views[1][0] == pytest.approx(0.6) for views in tops[20:])
    assert all(0.0 <= views[2][0] <= views[1][0] for views in tops)


def test_cascade_distils_each_view_half_from_the_view_before(screen):
    from hf_snapvit.recovery.forward import Outputs

    def outputs(value):
        return Outputs([torch.full((1, 2, 2), value)], torch.full((1, 2), value), None)

    config = hf_snapvit.RecoveryConfig(logits_weight=0.0)
    teacher = outputs(1.0)
    plain_views = recovery._step_views
    recovery._step_views = lambda *args: [(0.6, None), (0.0, None), (0.3, None)]
    try:
        with screen.cascade_views():
            order = [s for s, _ in recovery._step_views()]
            losses = [float(recovery.per_image_loss(outputs(v), teacher, config)[0]) for v in (1.0, 3.0, 5.0)]
    finally:
        recovery._step_views = plain_views
    assert order == [0.0, 0.3, 0.6]
    # relative errors: 0 against the teacher for the first; then (4/1 + 4/1) and (16/1 + 4/9) per term, halved
    assert losses == pytest.approx([0.0, 0.5 * 8 + 0.5 * 8, 0.5 * 32 + 0.5 * (2 * 4 / 9)])
