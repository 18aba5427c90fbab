"""Gradient scores: the DINO loss, both score definitions, crops and normalisation, on tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_snapvit.data.views import MultiCropConfig, Normalizer, multi_crops, seeded_multi_crops
from hf_snapvit.pruning.scoring import ScoreConfig, dino_loss, gradient_scores
from helpers import CASES, FEW_CROPS, PROCESSOR, images

CASE = {c.name: c for c in CASES}
# Every architecture: SigLIP2's patch-sequence backbone gets [B, C, H, W] crops patchified (test_siglip2.py).
PIXEL_CASES = CASES


def test_dino_loss_matches_its_definition():
    torch.manual_seed(0)
    teacher, student = torch.randn(3, 2, 8), torch.randn(3, 5, 8)
    expected = 0.0
    for b in range(3):
        for t in range(2):
            p = torch.softmax(torch.nn.functional.normalize(teacher[b, t], dim=0), 0)
            for s in range(5):
                if s != t:
                    expected += -(p * torch.log_softmax(torch.nn.functional.normalize(student[b, s], dim=0), 0)).sum()
    torch.testing.assert_close(dino_loss(teacher, student), expected / 3)


def test_normaliser_uses_the_models_statistics():
    normalizer = Normalizer(PROCESSOR)
    pixels = torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 1, 2).expand(1, 3, 1, 2)
    torch.testing.assert_close(normalizer(pixels)[0, :, 0], torch.tensor([[-1.0, 1.0]] * 3))


def test_crops_are_independent_and_seeded():
    config = MultiCropConfig(num_global=2, num_local=3)
    g, l = multi_crops(images(2), config, Normalizer(PROCESSOR), 32, np.random.default_rng(0))
    assert g.shape == (2, 2, 3, 32, 32) and l.shape == (2, 3, 3, 32, 32)
    assert not torch.equal(g[0, 0], g[0, 1]) and not torch.equal(l[0, 0], l[0, 1])
    g2, l2 = multi_crops(images(2), config, Normalizer(PROCESSOR), 32, np.random.default_rng(0))
    assert torch.equal(g, g2) and torch.equal(l, l2)


def test_crops_made_on_a_device_take_the_same_boxes_as_pil_crops():
    # The accelerator path (uint8 sent to the device, resized there), exercised on the CPU: same shapes, same seeded
    # boxes, pixels within the small difference of two bilinear resamplers, and still deterministic.
    config = MultiCropConfig(num_global=2, num_local=3, local_size=16)
    pil = multi_crops(images(3), config, Normalizer(PROCESSOR), 32, np.random.default_rng(4))
    on_device = multi_crops(images(3), config, Normalizer(PROCESSOR), 32, np.random.default_rng(4), device="cpu")
    again = multi_crops(images(3), config, Normalizer(PROCESSOR), 32, np.random.default_rng(4), device="cpu")
    for a, b, c in zip(pil, on_device, again):
        assert a.shape == b.shape and b.dtype == torch.float32
        assert (a - b).abs().mean() < 0.05 and torch.equal(b, c)
    other = multi_crops(images(3), config, Normalizer(PROCESSOR), 32, np.random.default_rng(5), device="cpu")
    assert (other[0] - on_device[0]).abs().mean() > 0.1  # other boxes: the seed still drives them


def test_seeded_crops_do_not_depend_on_the_batch_an_image_came_in():
    # What makes scores independent of the step size and of the split across processes: image i's crops come from
    # generator [seed, i] whether it is crops of 4 images at once or of 1 + 3 starting at index 1.
    config = MultiCropConfig(num_global=2, num_local=2, local_size=16)
    normalizer = Normalizer(PROCESSOR)
    pictures = images(4)
    whole = seeded_multi_crops(pictures, 0, 7, config, normalizer, 32)
    first = seeded_multi_crops(pictures[:1], 0, 7, config, normalizer, 32)
    rest = seeded_multi_crops(pictures[1:], 1, 7, config, normalizer, 32)
    for group, (a, b) in enumerate(zip(first, rest)):
        assert whole[group].shape[:2] == (4, 2) and torch.equal(whole[group], torch.cat([a, b]))
    alone = multi_crops(pictures[2:3], config, normalizer, 32, np.random.default_rng([7, 2]))
    assert torch.equal(whole[0][2:3], alone[0]) and torch.equal(whole[1][2:3], alone[1])
    shifted = seeded_multi_crops(pictures[1:], 0, 7, config, normalizer, 32)  # wrong first index: other boxes
    assert not torch.equal(shifted[0], rest[0])
    assert seeded_multi_crops(pictures[:1], 0, 7, MultiCropConfig(num_global=1, num_local=0), normalizer, 32)[1] is None


@pytest.mark.parametrize("case", PIXEL_CASES, ids=lambda c: c.name)
def test_scores_are_finite_non_negative_and_leave_the_model_unchanged(case):
    model = case.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    heads, neurons = gradient_scores(model, images(3), PROCESSOR, FEW_CROPS, show_progress=False)
    layers = len(heads)
    assert heads.shape[0] == neurons.shape[0] == layers == 2
    assert np.all(np.isfinite(heads)) and np.all(heads >= 0) and heads.max() > 0
    assert np.all(np.isfinite(neurons)) and np.all(neurons >= 0) and neurons.max() > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert flags == [p.requires_grad for p in model.parameters()]
    assert all(p.grad is None for p in model.parameters())


def test_scores_are_deterministic_for_a_seed():
    model = CASE["vit"].build()
    a = gradient_scores(model, images(3), PROCESSOR, FEW_CROPS, seed=1, show_progress=False)
    b = gradient_scores(model, images(3), PROCESSOR, FEW_CROPS, seed=1, show_progress=False)
    c = gradient_scores(model, images(3), PROCESSOR, FEW_CROPS, seed=2, show_progress=False)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])


def test_definitions_agree_on_a_single_image_and_differ_on_several():
    model = CASE["vit"].build()
    fisher = ScoreConfig(definition="fisher", crops=FEW_CROPS.crops)
    accumulated = ScoreConfig(definition="accumulated", batch_size=1, crops=FEW_CROPS.crops)
    one = images(1)
    a = gradient_scores(model, one, PROCESSOR, fisher, show_progress=False)
    b = gradient_scores(model, one, PROCESSOR, accumulated, show_progress=False)
    np.testing.assert_allclose(a[1], b[1], rtol=1e-5)
    several = images(4)
    a = gradient_scores(model, several, PROCESSOR, fisher, show_progress=False)
    b = gradient_scores(model, several, PROCESSOR, accumulated, show_progress=False)
    assert not np.allclose(a[1], b[1])


def test_a_unit_that_cannot_affect_the_output_scores_zero():
    """Zeroing a head's o_proj columns and a neuron's fc2 column cuts them off: their gradients are exactly 0."""
    model = CASE["vit"].build()
    attention, mlp = model.layers[0].attention, model.layers[0].mlp
    with torch.no_grad():
        attention.o_proj.weight[:, 8:16] = 0  # head 1 (head_dim 8)
        mlp.fc2.weight[:, 5] = 0
    heads, neurons = gradient_scores(model, images(2), PROCESSOR, FEW_CROPS, show_progress=False)
    assert heads[0, 1] == 0 and neurons[0, 5] == 0
    assert heads[0, 0] > 0 and neurons[0, 4] > 0


def test_qkv_rows_option_changes_head_scores_only():
    model = CASE["vit"].build()
    v = gradient_scores(model, images(2), PROCESSOR, FEW_CROPS, show_progress=False)
    qkv = gradient_scores(model, images(2), PROCESSOR, ScoreConfig(head_rows="qkv", crops=FEW_CROPS.crops),
                          show_progress=False)
    np.testing.assert_allclose(v[1], qkv[1])
    assert not np.allclose(v[0], qkv[0])


def test_tensor_inputs_are_cropped_too():
    model = CASE["vit"].build()
    pixels = torch.randn(3, 3, 40, 40)
    heads, neurons = gradient_scores(model, pixels, None, FEW_CROPS, show_progress=False)
    assert heads.max() > 0 and neurons.max() > 0


def test_obd_is_fisher_times_squared_weight():
    model = CASE["vit"].build()
    with torch.no_grad():  # every fc1 weight of magnitude 0.3: OBD must be exactly 0.09 × Fisher for the neurons
        fc1 = model.layers[0].mlp.fc1.weight
        fc1.copy_(0.3 * torch.sign(torch.randn_like(fc1)))
    fisher = gradient_scores(model, images(2), PROCESSOR, FEW_CROPS, show_progress=False)
    obd = gradient_scores(model, images(2), PROCESSOR, ScoreConfig(definition="obd", crops=FEW_CROPS.crops),
                          show_progress=False)
    np.testing.assert_allclose(obd[1][0], 0.09 * fisher[1][0], rtol=1e-5)


def _per_image_reference(model, pictures, config, labels=None):
    """Fisher scores from one ordinary backward pass per image: image ``i`` alone as gradient step ``i`` (so it gets
    its own crops), scored as the square of its gradient, and averaged over the images."""
    from hf_snapvit.data.calibration import GradientSteps

    single = ScoreConfig(loss=config.loss, definition="accumulated", batch_size=1, crops=config.crops)
    total = None
    for i in range(len(pictures)):
        step = [(i, pictures[i:i + 1], None if labels is None else labels[i:i + 1])]
        heads, neurons = gradient_scores(model, GradientSteps(step, len(pictures), 1), PROCESSOR, single, seed=3,
                                         show_progress=False)
        total = (heads, neurons) if total is None else (total[0] + heads, total[1] + neurons)
    return total[0] / len(pictures), total[1] / len(pictures)


# ViT and a gated FFN run in the quick suite; the other layouts (distilled tokens, patch sequences, pooled heads)
# with the slow tests.
BATCHED_CASES = [pytest.param(c, id=c.name, marks=[] if c.name in ("vit", "dinov2-swiglu") else [pytest.mark.slow])
                 for c in CASES if c.name in ("vit", "dinov2-swiglu", "siglip2-vision", "dinov3-gated")]


@pytest.mark.parametrize("case", BATCHED_CASES)
def test_batched_per_image_scores_match_one_backward_pass_per_image(case):
    """Per-image squared gradients of a whole batch (per-sample gradients of the scored layers) equal those of one
    backward pass per image, for both per-image definitions and the multi-crop loss."""
    model = case.build()
    with torch.no_grad():  # every weight of magnitude 0.15: OBD is then exactly 0.0225 x Fisher, unit by unit
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(0.15 * torch.where(module.weight >= 0, 1.0, -1.0))
    pictures = images(5)
    crops = MultiCropConfig(num_global=2, num_local=2)
    reference = _per_image_reference(model, pictures, ScoreConfig(crops=crops))
    for definition, factor in (("fisher", 1.0), ("obd", 0.15**2)):
        # batch_size 3: a full step and a partial one
        batched = gradient_scores(model, pictures, PROCESSOR, ScoreConfig(definition=definition, batch_size=3,
                                                                          crops=crops), seed=3, show_progress=False)
        for got, expected in zip(batched, reference):
            assert expected.max() > 0
            np.testing.assert_allclose(got, factor * expected, rtol=2e-4, atol=1e-6 * factor * expected.max())


def test_batched_per_image_scores_match_with_the_classifier_loss():
    model = CASE["vit-cls"].build()
    pictures, labels = images(4), torch.tensor([0, 3, 1, 3])
    config = ScoreConfig(loss="ce", definition="fisher", batch_size=4)
    batched = gradient_scores(model, pictures, PROCESSOR, config, labels=labels, show_progress=False)
    reference = _per_image_reference(model, pictures, config, labels)
    for got, expected in zip(batched, reference):
        np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6 * expected.max())
