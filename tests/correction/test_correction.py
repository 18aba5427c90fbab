"""Post-pruning weight correction: the OBS update against its closed form, the block-by-block model pass against plain
hooked forwards, held-back reconstruction error, damping of singular Hessians, and the from_pretrained round trip."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import hf_snapvit
from hf_snapvit.data.sampling import key_order
from hf_snapvit.errors import DataError
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.architectures import get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.correction import (
    CorrectionConfig,
    CorrectionError,
    compensate_removed_columns,
    correct_model_,
    reconstruction_error,
)

from helpers import CASES, output_of

FAST = {c.name: c for c in CASES}


def closed_form(weight: torch.Tensor, hessian: torch.Tensor, keep: np.ndarray, damping: float) -> torch.Tensor:
    """Least squares on the damped Hessian: W_K' = W H[:, K] H[K, K]^-1 (dead inputs get a unit diagonal)."""
    H = hessian.double().clone()
    dead = torch.diagonal(H) == 0
    H[dead, dead] = 1.0
    H += damping * torch.eye(H.shape[0], dtype=H.dtype)
    return weight.double() @ H[:, keep] @ torch.linalg.inv(H[np.ix_(keep, keep)])


def random_layer(out_features=7, in_features=48, tokens=400, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(in_features, in_features, generator=generator)  # correlated inputs, as in real activations
    X = mixing @ torch.randn(in_features, tokens, generator=generator)
    W = torch.randn(out_features, in_features, generator=generator)
    return W, X


# ----------------------------------------------------------------------------------------------------- the update
@pytest.mark.parametrize("block_size", [128, 5, 1])
@pytest.mark.parametrize("damping", ["mean", "max", "percentile"])
def test_update_equals_closed_form_least_squares(block_size, damping):
    W, X = random_layer()
    H = X @ X.T / X.shape[1]
    keep = np.random.default_rng(1).permutation(48)[:21]  # any order: the kept set is what matters
    config = CorrectionConfig(block_size=block_size, damping=damping, damping_fraction=0.05)
    new, lam = compensate_removed_columns(W, H, keep, config)
    diagonal = torch.diagonal(H).double()
    expected_lam = 0.05 * {"mean": diagonal.mean(), "max": diagonal.max(),
                           "percentile": torch.quantile(diagonal, 0.95)}[damping]
    assert lam == pytest.approx(float(expected_lam), rel=1e-9)
    removed = np.setdiff1d(np.arange(48), keep)
    assert torch.all(new[:, removed] == 0)
    torch.testing.assert_close(new[:, keep].double(), closed_form(W, H, keep, lam), rtol=1e-4, atol=1e-4)


def test_nothing_removed_is_identity():
    W, X = random_layer()
    new, lam = compensate_removed_columns(W, X @ X.T, np.random.default_rng(0).permutation(48))
    assert torch.equal(new, W) and lam == 0.0


def test_correction_reduces_error_on_held_back_inputs():
    W, X = random_layer(tokens=2000)
    fit, held = X[:, :1000], X[:, 1000:]
    keep = np.arange(0, 48, 2)
    new, _ = compensate_removed_columns(W, fit @ fit.T / 1000, keep)
    dropped = W.clone()
    dropped[:, 1::2] = 0
    H_held = held @ held.T / 1000
    assert reconstruction_error(W, new, H_held) < reconstruction_error(W, dropped, H_held)


def test_singular_hessian_is_damped():
    W, X = random_layer(in_features=12, tokens=200)
    X[3] = X[1]          # duplicated feature: H is singular
    X[5] = 2.0 * X[1]    # and a multiple of it
    X[7] = 0.0           # dead feature: zero row and column
    H = X @ X.T / 200
    assert torch.linalg.matrix_rank(H.double()) < 12
    keep = np.array([0, 1, 2, 4, 6, 7, 9, 11])  # keeps the dead feature 7; removes its duplicates 3 and 5
    new, lam = compensate_removed_columns(W, H, keep)
    assert lam > 0 and torch.isfinite(new).all()
    torch.testing.assert_close(new[:, 7], W[:, 7])  # a dead input carries no information: its column stays
    torch.testing.assert_close(new[:, keep].double(), closed_form(W, H, keep, lam), rtol=1e-4, atol=1e-4)
    dropped = W.clone()
    dropped[:, np.setdiff1d(np.arange(12), keep)] = 0
    assert reconstruction_error(W, new, H) < reconstruction_error(W, dropped, H)


def test_all_zero_inputs_do_not_break():
    W = torch.randn(4, 6)
    new, lam = compensate_removed_columns(W, torch.zeros(6, 6), [0, 2, 4])
    assert torch.isfinite(new).all() and lam > 0
    torch.testing.assert_close(new[:, [0, 2, 4]], W[:, [0, 2, 4]])  # nothing to compensate with


@pytest.mark.parametrize("kwargs, word", [
    ({"damping": "median"}, "damping"),
    ({"damping_fraction": 0.0}, "damping_fraction"),
    ({"damping_fraction": float("nan")}, "damping_fraction"),
    ({"percentile": 1.5}, "percentile"),
    ({"block_size": 0}, "block_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"num_samples": 0}, "num_samples"),
    ({"propagation": "parallel"}, "propagation"),
    ({"guard": "yes"}, "guard"),
    ({"held_out_fraction": 0.0}, "held_out_fraction"),
    ({"held_out_fraction": 1.0}, "held_out_fraction"),
])
def test_bad_config_raises(kwargs, word):
    with pytest.raises(CorrectionError, match=word):
        CorrectionConfig(**kwargs)
    assert issubclass(CorrectionError, ValueError)


def test_config_round_trips_through_dict():
    config = CorrectionConfig(damping="max", damping_fraction=0.1, propagation="sequential", num_samples=None)
    assert CorrectionConfig.from_dict(config.to_dict()) == config
    with pytest.raises(CorrectionError, match="Unknown"):
        CorrectionConfig.from_dict({"dampening": 0.1})


# -------------------------------------------------------------------------------------------------- on the model
def half_keep(model, seed=0):
    """Random half of the heads and neurons of every block, in random order."""
    spec = get_spec(model)
    rng = np.random.default_rng(seed)
    keep = []
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        heads = get_projection(attention, spec.q_proj).out_features // head_dim(attention, spec)
        mlp, variant = get_mlp(layer, spec)
        neurons = get_projection(mlp, variant.out_proj).in_features
        keep.append((rng.permutation(heads)[: heads // 2], rng.permutation(neurons)[: neurons // 2]))
    return keep


def targets(model, keep):
    """Per block: [(o_proj, its kept input columns), (fc2, its kept columns)]."""
    spec = get_spec(model)
    out = []
    for layer, (heads, neurons) in zip(get_layers(model, spec), keep):
        attention = get_attention(layer, spec)
        hd = head_dim(attention, spec)
        mlp, variant = get_mlp(layer, spec)
        out.append([(get_projection(attention, spec.o_proj), (heads[:, None] * hd + np.arange(hd)).reshape(-1)),
                    (get_projection(mlp, variant.out_proj), np.asarray(neurons))])
    return out


def hessians(model, inputs, linears):
    """XXᵀ/n of each linear's inputs, from an ordinary full forward pass with hooks."""
    sums = {id(m): [0, 0] for m in linears}

    def hook(module, args, output):
        x = args[0].reshape(-1, args[0].shape[-1]).double()
        sums[id(module)][0] = sums[id(module)][0] + x.T @ x
        sums[id(module)][1] += x.shape[0]

    handles = [m.register_forward_hook(hook) for m in linears]
    with torch.no_grad():
        model(**inputs)
    for h in handles:
        h.remove()
    return [sums[id(m)][0] / sums[id(m)][1] for m in linears]


def calibration(case, n, seed=0):
    inputs = case.inputs(n) if seed == 0 else case.inputs(n, seed)
    return inputs, (inputs if len(inputs) > 1 else inputs["pixel_values"])


def expand(weight, columns, in_features):
    """A sliced weight (kept columns in ``columns`` order) back at full width, zeros elsewhere."""
    full = torch.zeros(weight.shape[0], in_features, dtype=torch.float64)
    full[:, columns] = weight.double()
    return full


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_dense_propagation_matches_hooked_forward(case):
    """Block-by-block replay with captured block arguments = Hessians of a plain forward of the dense model."""
    model = case.build()
    dense = copy.deepcopy(model)
    keep = half_keep(model)
    inputs, data = calibration(case, 12)
    config = CorrectionConfig(num_samples=None, batch_size=5, guard=False)  # the guard would hold out images
    summary = correct_model_(model, keep, data, config=config, show_progress=False)
    plan = targets(dense, keep)
    H = hessians(dense, inputs, [linear for block in plan for linear, _ in block])
    corrected = targets(model, [(np.arange(len(h)), np.arange(len(f))) for h, f in keep])
    for (block, new_block), (H_o, H_f) in zip(zip(plan, corrected), zip(H[0::2], H[1::2])):
        for (linear, columns), (sliced, _), hessian in zip(block, new_block, (H_o, H_f)):
            expected, _ = compensate_removed_columns(linear.weight.data.double(), hessian, columns, config)
            torch.testing.assert_close(expand(sliced.weight.data, columns, linear.in_features), expected,
                                       rtol=2e-4, atol=2e-5)
    assert summary.num_images == 12 and summary.num_removed > 0
    assert all(layer.error_after < layer.error_before for layer in summary.layers)


@pytest.mark.parametrize("name", ["vit", "dinov3", "siglip2-vision"])
def test_sequential_propagation_uses_pruned_inputs(name):
    """Block 1 is fitted on the inputs of a model whose block 0 is already corrected and pruned."""
    case = FAST[name]
    model = case.build()
    reference = copy.deepcopy(model)
    keep = half_keep(model, seed=3)
    inputs, data = calibration(case, 10)
    config = CorrectionConfig(num_samples=None, propagation="sequential", guard=False)
    correct_model_(model, keep, data, config=config, show_progress=False)

    plan = targets(reference, keep)
    for block in plan:  # correct each block on the inputs the previous corrected blocks produce, zeroing the rest
        H = hessians(reference, inputs, [linear for linear, _ in block])
        for (linear, columns), hessian in zip(block, H):
            new, _ = compensate_removed_columns(linear.weight.data, hessian, columns, config)
            linear.weight.data.copy_(new)
    corrected = targets(model, [(np.arange(len(h)), np.arange(len(f))) for h, f in keep])
    for block, new_block in zip(plan, corrected):
        for (linear, columns), (sliced, _) in zip(block, new_block):
            torch.testing.assert_close(expand(sliced.weight.data, columns, linear.in_features),
                                       linear.weight.data.double(), rtol=2e-4, atol=2e-5)
    torch.testing.assert_close(output_of(model, inputs), output_of(reference, inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["vit-cls", "dinov2-swiglu", "clip-vision", "dinov3-gated"])
def test_no_removed_units_is_identity(name):
    case = FAST[name]
    model = case.build()
    dense = copy.deepcopy(model)
    spec = get_spec(model)
    rng = np.random.default_rng(0)
    keep = []  # every unit, in a random order
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        mlp, variant = get_mlp(layer, spec)
        keep.append((rng.permutation(get_projection(attention, spec.q_proj).out_features // head_dim(attention, spec)),
                     rng.permutation(get_projection(mlp, variant.out_proj).in_features)))
    inputs, data = calibration(case, 6)
    summary = correct_model_(model, keep, data, config=CorrectionConfig(num_samples=None), show_progress=False)
    assert summary.num_removed == 0 and all(layer.error_after == 0 for layer in summary.layers)
    reordered = slice_model_(copy.deepcopy(dense), keep)
    for a, b in zip(model.state_dict().values(), reordered.state_dict().values()):
        assert torch.equal(a, b)
    torch.testing.assert_close(output_of(model, inputs), output_of(dense, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["vit", "deit-cls-teacher", "dinov2", "siglip-vision", "dinov3"])
def test_per_layer_error_drops_on_held_back_inputs(name):
    case = FAST[name]
    model = case.build()
    dense = copy.deepcopy(model)
    keep = half_keep(model, seed=1)
    _, data = calibration(case, 48)
    correct_model_(model, keep, data, config=CorrectionConfig(num_samples=None, guard=False), show_progress=False)
    held, _ = calibration(case, 24, seed=7)
    plan = targets(dense, keep)
    H = hessians(dense, held, [linear for block in plan for linear, _ in block])
    corrected = targets(model, [(np.arange(len(h)), np.arange(len(f))) for h, f in keep])
    pairs = [(linear, columns, sliced) for block, new in zip(plan, corrected) for (linear, columns), (sliced, _) in
             zip(block, new)]
    for (linear, columns, sliced), hessian in zip(pairs, H):
        dropped = linear.weight.data.clone()
        dropped[:, np.setdiff1d(np.arange(linear.in_features), columns)] = 0
        before = reconstruction_error(linear.weight.data, dropped, hessian)
        after = reconstruction_error(linear.weight.data, expand(sliced.weight.data, columns, linear.in_features),
                                     hessian)
        assert after < before


def test_bad_keep_and_missing_processor_raise():
    case = FAST["vit"]
    model = case.build()
    keep = half_keep(model)
    pixels = case.inputs(4)["pixel_values"]
    with pytest.raises(CorrectionError, match="2 blocks"):
        correct_model_(model, keep[:1], pixels, show_progress=False)
    bad = [(np.array([0, 9]), keep[0][1]), keep[1]]
    with pytest.raises(CorrectionError, match=r"\[0, 4\)"):
        correct_model_(model, bad, pixels, show_progress=False)
    images = [Image.new("RGB", (32, 32), (i, 2 * i, 3 * i)) for i in range(4)]
    with pytest.raises(DataError, match="processor"):
        correct_model_(model, keep, images, show_progress=False)


# ------------------------------------------------------------------------------------------------------ the guard
def split_draw(total=40, batch_size=8, seed=0):
    """Which images of a ``{"pixel_values": ...}`` draw of ``total`` are fitted on and which held out by the guard:
    the draw is the rows in key order (hf_snapvit.data.sampling), and the last quarter of its batches is held out."""
    order = key_order(total, seed)
    num_batches = -(-total // batch_size)
    num_fit = (num_batches - max(1, round(0.25 * num_batches))) * batch_size
    return order[:num_fit], order[num_fit:]


def test_guard_reverts_corrections_that_hurt_held_out_images():
    """Fitted on near-copies of one image, the corrections do not carry over to different images: all are reverted,
    and the model is exactly the uncorrected slice."""
    case = FAST["clip-vision"]
    model = case.build()
    plain = slice_model_(copy.deepcopy(model), half_keep(model))
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(1, 3, 32, 32, generator=generator) + 1e-3 * torch.randn(40, 3, 32, 32, generator=generator)
    _, held = split_draw()
    pixels[held] = 3 * torch.randn(len(held), 3, 32, 32, generator=generator)
    summary = correct_model_(model, half_keep(model), {"pixel_values": pixels},
                             config=CorrectionConfig(num_samples=None, batch_size=8), show_progress=False)
    assert all(layer.error_after < layer.error_before for layer in summary.layers)  # on the images it was fitted on
    assert not any(layer.kept for layer in summary.layers)
    assert all(layer.held_out_error_after == layer.held_out_error_before for layer in summary.layers)
    record = summary.guard_record()
    assert record["num_held_out_images"] == 8
    assert record["kept"] == {"attention_output": [False, False], "ffn_output": [False, False]}
    assert record["end_to_end"]["kept"] is False  # nothing left to check
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name


def test_guard_keeps_corrections_that_help_and_fits_on_the_rest():
    """On images of one distribution every correction helps on the held-out ones and is kept; the weights are those
    of an unguarded correction fitted on the non-held-out images alone."""
    case = FAST["dinov2"]
    model, unguarded = case.build(), case.build()
    keep = half_keep(model, seed=2)
    pixels = case.inputs(40)["pixel_values"]
    fit, held = split_draw()
    summary = correct_model_(model, keep, {"pixel_values": pixels}, show_progress=False,
                             config=CorrectionConfig(num_samples=None, batch_size=8))
    assert all(layer.kept for layer in summary.layers)
    assert all(layer.held_out_error_after < layer.held_out_error_before for layer in summary.layers)
    assert summary.num_images == 40 and summary.extra["num_held_out_images"] == len(held) == 8
    correct_model_(unguarded, keep, {"pixel_values": pixels[fit]}, show_progress=False,
                   config=CorrectionConfig(num_samples=None, batch_size=8, guard=False))
    inputs = {"pixel_values": pixels[:5]}
    torch.testing.assert_close(output_of(model, inputs), output_of(unguarded, inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["vit", "siglip2-vision", "dinov3"])
@pytest.mark.parametrize("propagation", ["dense", "sequential"])
def test_guard_never_raises_held_out_error_and_reverted_layers_are_plain(name, propagation):
    case = FAST[name]
    model = case.build()
    keep = half_keep(model, seed=4)
    plain = slice_model_(copy.deepcopy(model), keep)
    _, data = calibration(case, 24)
    summary = correct_model_(model, keep, data, show_progress=False,
                             config=CorrectionConfig(num_samples=None, batch_size=4, propagation=propagation))
    assert all(layer.held_out_error_after <= layer.held_out_error_before for layer in summary.layers)
    sliced = targets(model, [(np.arange(len(h)), np.arange(len(f))) for h, f in keep])
    reference = targets(plain, [(np.arange(len(h)), np.arange(len(f))) for h, f in keep])
    layers = [(a, b) for block, ref in zip(sliced, reference) for (a, _), (b, _) in zip(block, ref)]
    for layer, (corrected, uncorrected) in zip(summary.layers, layers):
        assert torch.equal(corrected.weight, uncorrected.weight) != layer.kept


def distance_to_dense(model, dense, pixels):
    """KL(dense ‖ model) of the class distributions for a classifier, else the embeddings' relative squared error."""
    with torch.no_grad():
        out, ref = model(pixel_values=pixels), dense(pixel_values=pixels)
    if getattr(ref, "logits", None) is not None:
        log_p, log_q = ref.logits.double().log_softmax(-1), out.logits.double().log_softmax(-1)
        return float((log_p.exp() * (log_p - log_q)).sum(-1).mean()), "logits_kl"
    spec = get_spec(model)
    with torch.no_grad():
        a, b = (image_embedding(m, {"pixel_values": pixels}, spec).double() for m in (model, dense))
    return float(((a - b) ** 2).sum() / (b**2).sum()), "embedding_mse"


@pytest.mark.parametrize("name", ["vit", "dinov2", "vit-cls", "deit-cls-teacher"])
def test_guarded_model_is_never_further_from_the_dense_one_than_the_plain_slice_on_held_out_images(name):
    case = FAST[name]
    model = case.build()
    dense = copy.deepcopy(model)
    keep = half_keep(model, seed=3)
    plain = slice_model_(copy.deepcopy(model), keep)
    pixels = case.inputs(40)["pixel_values"]
    _, held = split_draw()
    summary = correct_model_(model, keep, {"pixel_values": pixels}, show_progress=False,
                             config=CorrectionConfig(num_samples=None, batch_size=8))
    check = summary.guard_record()["end_to_end"]
    (corrected, measure), (uncorrected, _) = (distance_to_dense(m, dense, pixels[held]) for m in (model, plain))
    assert check["measure"] == measure == ("logits_kl" if "cls" in name else "embedding_mse")
    assert corrected <= uncorrected
    assert check["held_out_error_uncorrected"] == pytest.approx(uncorrected, rel=1e-4, abs=1e-12)
    if check["kept"]:
        assert check["held_out_error_corrected"] == pytest.approx(corrected, rel=1e-4, abs=1e-12)
    assert check["kept"] == any(layer.kept for layer in summary.layers)


def test_whole_model_check_puts_back_corrections_that_move_the_outputs_away():
    """The check itself, on a real model: a 'correction' that moves the outputs away from the dense model's is put
    back; one that brings them closer stays."""
    from hf_snapvit.correction.guard import final_outputs, guard_model
    from hf_snapvit.correction.config import LayerCorrection

    case = FAST["vit-cls"]
    model = case.build()
    spec = get_spec(model)
    batches = [{"pixel_values": case.inputs(4, seed=s)["pixel_values"]} for s in (1, 2)]
    dense = final_outputs(model, spec, batches, None)
    assert dense[1] == "logits_kl"
    mlp, variant = get_mlp(get_layers(model, spec)[0], spec)
    linear = get_projection(mlp, variant.out_proj)
    original = linear.weight.data.clone()
    report = LayerCorrection("fc2", 0, "ffn_output", 8, 4, 0.0, 1.0, 0.5)

    linear.weight.data.add_(torch.randn_like(original))  # the "corrected" weight: far from the dense function
    layers, result = guard_model(model, spec, batches, None, dense, [(linear, original.clone(), report)], [report])
    assert result["kept"] is False and result["held_out_error_uncorrected"] == 0.0
    assert result["held_out_error_corrected"] > 0 and torch.equal(linear.weight.data, original)
    assert layers[0].kept is False and report.kept is True  # a new record; the caller's is left as it was

    bad = original + torch.randn_like(original)  # now the uncorrected fallback is the far one
    layers, result = guard_model(model, spec, batches, None, dense, [(linear, bad, report)], [report])
    assert result["kept"] is True and result["held_out_error_corrected"] == 0.0
    assert result["held_out_error_uncorrected"] > 2 * result["standard_error"]
    assert torch.equal(linear.weight.data, original) and layers == [report]


def test_guard_needs_two_images_and_splits_a_single_batch():
    case = FAST["vit"]
    model = case.build()
    keep = half_keep(model)
    with pytest.raises(CorrectionError, match="at least 2"):
        correct_model_(model, keep, case.inputs(1)["pixel_values"], show_progress=False)
    summary = correct_model_(model, keep, case.inputs(6)["pixel_values"], show_progress=False)  # one batch of 16
    assert summary.extra["num_held_out_images"] == 3 and summary.num_tokens == 3 * 17


# ------------------------------------------------------------------------------------------ from_pretrained path
def tiny_processor():
    return transformers.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def tiny_images(n, seed=0):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.fixture(scope="module")
def elastic_dir(tmp_path_factory):
    model = FAST["vit-cls"].build()
    path = tmp_path_factory.mktemp("elastic") / "vit-elastic"
    ranking = hf_snapvit.rank(model, method="magnitude")
    hf_snapvit.save_elastic(model, ranking, path, image_processor=tiny_processor())
    return path


def test_correct_loads_corrects_then_slices_and_round_trips(elastic_dir, tmp_path):
    import datasets

    images = tiny_images(20)
    dataset = datasets.Dataset.from_dict({"image": images}).cast_column("image", datasets.Image())
    config = CorrectionConfig(num_samples=16, batch_size=6, seed=3)
    corrected = hf_snapvit.correct(elastic_dir, sparsity=0.4, data=dataset, config=config)
    # The deprecated door gives the same model, and its warning names the verb.
    with pytest.warns(FutureWarning, match=r"correction_data=, correction=\) is deprecated.*hf_snapvit\.correct\("):
        old = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.4, correction_data=dataset,
                                                         correction=config)
    assert type(old) is type(corrected) and old.config.to_dict() == corrected.config.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), corrected.state_dict().values()))
    plain = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.4)
    record = corrected.config.elastic_correction
    assert record["settings"] == config.to_dict() and record["num_images"] == 16
    assert record["mean_error_after"] < record["mean_error_before"]
    assert record["num_held_out_images"] == 4 and len(record["kept"]["ffn_output"]) == 2  # 16 images, batches of 6
    assert corrected.config.elastic_layout == plain.config.elastic_layout

    # Reference: the dense elastic model corrected by hand with the same images, processor and keep indices.
    dense = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir)
    ranking = hf_snapvit.ElasticRanking.from_dict(dense.config.elastic_ranking)
    keep = ranking.keep_indices(ranking.keep_counts(0.4))
    correct_model_(dense, keep, dataset, tiny_processor(), config, show_progress=False)
    pixels = {"pixel_values": FAST["vit-cls"].inputs(5)["pixel_values"]}
    torch.testing.assert_close(output_of(corrected, pixels), output_of(dense, pixels))
    assert not torch.allclose(output_of(corrected, pixels), output_of(plain, pixels), atol=1e-4)

    corrected.save_pretrained(tmp_path / "saved")
    reloaded = hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "saved")
    assert reloaded.config.elastic_correction == record
    for (name, a), b in zip(corrected.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), name
    torch.testing.assert_close(output_of(reloaded, pixels), output_of(corrected, pixels), rtol=0, atol=0)

    with pytest.raises(hf_snapvit.BudgetError, match="weight-corrected"):
        hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "saved", sparsity=0.5)
    with pytest.raises(CorrectionError, match="already sliced"):
        hf_snapvit.correct(tmp_path / "saved", sparsity=0.5, data=images)
    with pytest.raises(CorrectionError, match="needs calibration images: pass data="):
        hf_snapvit.correct(elastic_dir, sparsity=0.5, data=None)


def test_from_pretrained_with_pixels_and_pil_list(elastic_dir, tmp_path):
    pixels = tiny_processor()(images=tiny_images(8), return_tensors="pt")["pixel_values"]
    config = CorrectionConfig(num_samples=None, propagation="sequential")
    from_pixels = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3, correction_data=pixels,
                                                             correction=config)
    # PIL images go through the checkpoint's own processor when none is given: same pixels, same images, same model.
    from_images = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3,
                                                             correction_data=tiny_images(8), correction=config)
    # Each source is drawn in a seeded order of its own; with all images used the Hessians are equal up to rounding.
    inputs = {"pixel_values": pixels[:3]}
    torch.testing.assert_close(output_of(from_pixels, inputs), output_of(from_images, inputs), rtol=1e-4, atol=1e-4)
    assert from_pixels.config.elastic_correction["settings"]["propagation"] == "sequential"
    with pytest.raises(CorrectionError, match="correction_data"):
        hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3, correction=config)
    from_pixels.save_pretrained(tmp_path / "sliced")
    with pytest.raises(CorrectionError, match="already sliced"), pytest.warns(FutureWarning):
        hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "sliced", sparsity=0.3, correction_data=pixels)
