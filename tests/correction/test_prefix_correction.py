"""PrefixCorrection: one fit gives, at every prefix of the rank order, the per-size least-squares correction."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hf_snapvit.data.sampling import key_order
from hf_snapvit.architectures import get_layers, get_spec
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.correction import CorrectionConfig, CorrectionError, correct_model_
from hf_snapvit.correction.prefix import PrefixCorrection, output_projections
from hf_snapvit.surgery.slicing import slice_model_

from helpers import CASES, corrected_checkpoint, data_of, hub_cache_copy, output_of

FAST = {c.name: c for c in CASES}


def random_orders(model, seed=0):
    """Per block, a random (head order, neuron order): what a ranking's ``orders()`` gives."""
    rng = np.random.default_rng(seed)
    return [(rng.permutation(heads), rng.permutation(neurons)) for heads, neurons in zip(*layer_widths(model))]


def prefix_keep(orders, seed):
    """Per block, a random non-empty prefix of each order (sometimes all of it)."""
    rng = np.random.default_rng(seed)
    return [(heads[: rng.integers(1, len(heads) + 1)], neurons[: rng.integers(1, len(neurons) + 1)])
            for heads, neurons in orders]


@pytest.mark.parametrize("name", ["vit", "dinov2-swiglu", "clip-vision", "dinov3"])
def test_every_prefix_equals_the_per_size_correction(name):
    """The independent reference: correct_model_ (dense propagation, no guard) refits each size from its Hessians."""
    case = FAST[name]
    model = case.build().eval()
    orders = random_orders(model, seed=1)
    inputs, data = data_of(case, 10)
    config = CorrectionConfig(num_samples=None, batch_size=4, guard=False)
    correction = PrefixCorrection.fit(model, data, config=config, orders=orders, show_progress=False)
    probe, _ = data_of(case, 3, seed=5)
    for seed in range(3):
        keep = prefix_keep(orders, seed)
        ours = copy.deepcopy(model)
        correction.correct_(ours, keep)
        slice_model_(ours, keep)
        reference = copy.deepcopy(model)
        correct_model_(reference, keep, data, config=config, show_progress=False)
        for a, b in zip(ours.state_dict().values(), reference.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)
        torch.testing.assert_close(output_of(ours, probe), output_of(reference, probe), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["vit-cls", "siglip-vision"])
def test_full_size_is_the_untouched_model_and_fitting_changes_nothing(name):
    case = FAST[name]
    model = case.build().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    orders = random_orders(model, seed=2)
    inputs, data = data_of(case, 8)
    correction = PrefixCorrection.fit(model, data, config=CorrectionConfig(num_samples=None), orders=orders,
                                       show_progress=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    full = copy.deepcopy(model)
    correction.correct_(full, orders)  # every unit kept
    for (attention, ffn), (dense_attention, dense_ffn) in zip(
            [output_projections(layer, get_spec(full)) for layer in get_layers(full, get_spec(full))],
            [output_projections(layer, get_spec(model)) for layer in get_layers(model, get_spec(model))]):
        torch.testing.assert_close(attention.weight, dense_attention.weight, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ffn.weight, dense_ffn.weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(output_of(full, inputs), output_of(model, inputs), rtol=1e-4, atol=1e-4)


def test_units_stored_in_rank_order_need_no_orders_and_one_kind_leaves_the_other_layer():
    case = FAST["vit"]
    model = case.build().eval()
    _, data = data_of(case, 8)
    correction = PrefixCorrection.fit(model, data, config=CorrectionConfig(num_samples=None), show_progress=False)
    identity = [(np.arange(len(h)), np.arange(len(f))) for h, f in random_orders(model)]
    keep = [(heads[:1], neurons[: len(neurons) // 2]) for heads, neurons in identity]
    ffn_only = copy.deepcopy(model)
    correction.correct_(ffn_only, keep, kinds=("ffn_output",))
    both = copy.deepcopy(model)
    correction.correct_(both, keep)
    spec = get_spec(model)
    for dense, one, two in zip(*(get_layers(m, spec) for m in (model, ffn_only, both))):
        (attention, ffn), (attention_1, ffn_1), (attention_2, ffn_2) = (output_projections(x, spec)
                                                                        for x in (dense, one, two))
        assert torch.equal(attention_1.weight, attention.weight)  # not corrected
        torch.testing.assert_close(ffn_1.weight, ffn_2.weight)
        assert not torch.allclose(attention_2.weight, attention.weight)  # corrected: kept columns moved


def test_bad_keep_kinds_and_models_are_refused_naming_the_fix():
    case = FAST["vit"]
    model = case.build().eval()
    orders = random_orders(model, seed=3)
    _, data = data_of(case, 6)
    correction = PrefixCorrection.fit(model, data, config=CorrectionConfig(num_samples=None), orders=orders,
                                       show_progress=False)
    not_prefix = [(heads[1:], neurons) for heads, neurons in orders]
    with pytest.raises(CorrectionError, match="not the first .* ranking.keep_indices"):
        correction.correct_(copy.deepcopy(model), not_prefix)
    with pytest.raises(CorrectionError, match="keep has 1 entries"):
        correction.correct_(copy.deepcopy(model), orders[:1])
    with pytest.raises(CorrectionError, match="Unknown kinds"):
        correction.correct_(copy.deepcopy(model), orders, kinds=("fc2",))
    with pytest.raises(CorrectionError, match="orders has 1 entries"):
        PrefixCorrection.fit(model, data, orders=orders[:1], show_progress=False)
    with pytest.raises(CorrectionError, match="each of the layer's"):
        PrefixCorrection.fit(model, data, orders=[(h[:1], f) for h, f in orders], show_progress=False)
    sliced = slice_model_(copy.deepcopy(model), [(h[:1], f) for h, f in orders])
    with pytest.raises(CorrectionError, match="fitted on"):
        correction.correct_(sliced, [(h[:1], f) for h, f in orders])
    with pytest.raises(CorrectionError, match="out of range"):
        correction.factors[0][1].weight(0)


# ------------------------------------------------------------------------------------- stored in a checkpoint
import shutil  # noqa: E402

import hf_snapvit as hs  # noqa: E402
from hf_snapvit import ElasticViTModel  # noqa: E402
from hf_snapvit.errors import BudgetError, CheckpointError  # noqa: E402
from hf_snapvit.correction.prefix_file import PREFIX_FILE  # noqa: E402


def per_size_reference(folder, data, widths):
    """The independent reference: the dense elastic model corrected for these widths by correct_model_."""
    dense = ElasticViTModel.from_pretrained(folder, prefix_correction=False)
    keep = [(np.arange(h), np.arange(f)) for h, f in zip(*widths)]
    correct_model_(dense, keep, data, config=CorrectionConfig(num_samples=None, batch_size=4, guard=False),
                   show_progress=False)
    return dense


@pytest.mark.parametrize("name", ["vit", "dinov2-swiglu", "siglip-vision", "vit-cls"])
def test_a_stored_prefix_correction_serves_every_size_sliced_and_switched(tmp_path, name):
    case = FAST[name]
    folder, data, record = corrected_checkpoint(tmp_path, case)
    assert (folder / PREFIX_FILE).is_file() and record["method"] == "prefix" and record["num_images"] == 10
    inputs = case.inputs(3, 4)
    dense = ElasticViTModel.from_pretrained(folder, prefix_correction=False)
    switchable = ElasticViTModel.from_pretrained(folder, switchable=True)
    for sparsity in (0.3, 0.0, 0.5):
        sparsity = min(sparsity, switchable.max_sparsity())
        sliced = ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
        plain = ElasticViTModel.from_pretrained(folder, sparsity=sparsity, prefix_correction=False)
        switchable.set_budget(sparsity=sparsity)
        torch.testing.assert_close(output_of(switchable, inputs), output_of(sliced, inputs), rtol=1e-5, atol=1e-5)
        if sparsity == 0.0:  # full size: the untouched model, bit for bit
            assert all(torch.equal(a, b) for a, b in zip(sliced.state_dict().values(), dense.state_dict().values()))
            assert getattr(sliced.config, "elastic_correction", None) is None
            continue
        reference = per_size_reference(folder, data, layer_widths(sliced))
        torch.testing.assert_close(output_of(sliced, inputs), output_of(reference, inputs), rtol=1e-4, atol=1e-4)
        assert not torch.allclose(output_of(plain, inputs), output_of(sliced, inputs), atol=1e-4)
        assert sliced.config.elastic_correction["method"] == "prefix"
        copy_ = switchable.to_sliced()
        torch.testing.assert_close(output_of(copy_, inputs), output_of(sliced, inputs), rtol=1e-5, atol=1e-5)
        assert copy_.config.elastic_correction == sliced.config.elastic_correction


def test_a_corrected_size_saves_reloads_at_its_size_only_and_whole_saves_keep_the_factors(tmp_path):
    case = FAST["vit"]
    folder, _, _ = corrected_checkpoint(tmp_path, case)
    inputs = case.inputs(2, 3)
    sliced = ElasticViTModel.from_pretrained(folder, sparsity=0.4)
    sliced.save_pretrained(tmp_path / "small")
    again = ElasticViTModel.from_pretrained(tmp_path / "small")
    torch.testing.assert_close(output_of(again, inputs), output_of(sliced, inputs))
    with pytest.raises(BudgetError, match="corrected or recovered for its saved size"):
        ElasticViTModel.from_pretrained(tmp_path / "small", sparsity=0.5)
    with pytest.raises(CorrectionError, match="is sliced"):
        ElasticViTModel.from_pretrained(tmp_path / "small", prefix_correction=True)
    switchable = ElasticViTModel.from_pretrained(folder, switchable=True)
    switchable.save_pretrained(tmp_path / "whole", whole=True)
    assert (tmp_path / "whole" / PREFIX_FILE).is_file()
    reloaded = ElasticViTModel.from_pretrained(tmp_path / "whole", sparsity=0.4)
    torch.testing.assert_close(output_of(reloaded, inputs), output_of(sliced, inputs))


def test_stale_missing_and_corrupt_factors_are_refused_naming_the_fix(tmp_path):
    case = FAST["vit"]
    folder, data, _ = corrected_checkpoint(tmp_path, case)
    kept = tmp_path / "factors.safetensors"
    shutil.copyfile(folder / PREFIX_FILE, kept)
    # A new save of the weights replaces the factors with the checkpoint: they belonged to the old weights.
    model = ElasticViTModel.from_pretrained(folder, prefix_correction=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    ranking = hs.ElasticRanking.from_dict(model.config.elastic_ranking)
    hs.save_elastic(model, ranking, folder)
    assert not (folder / PREFIX_FILE).exists()
    ElasticViTModel.from_pretrained(folder, sparsity=0.4)  # the plain slice
    with pytest.raises(CorrectionError, match="has no prefix_correction.safetensors.*add_prefix_correction"):
        ElasticViTModel.from_pretrained(folder, sparsity=0.4, prefix_correction=True)
    shutil.copyfile(kept, folder / PREFIX_FILE)  # factors of other weights put back by hand
    with pytest.raises(CheckpointError, match="made for other weights.*add_prefix_correction"):
        ElasticViTModel.from_pretrained(folder, sparsity=0.4)
    assert ElasticViTModel.from_pretrained(folder, sparsity=0.4, prefix_correction=False) is not None
    (folder / PREFIX_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="not a readable safetensors file.*prefix_correction=False"):
        ElasticViTModel.from_pretrained(folder, sparsity=0.4)
    with pytest.raises(CorrectionError, match="both fit the weights"):
        hs.correct(folder, sparsity=0.4, data=data, prefix_correction=True)
    with pytest.raises(CorrectionError, match="must be True, False or None"):
        ElasticViTModel.from_pretrained(folder, sparsity=0.4, prefix_correction="yes")
    with pytest.raises(CheckpointError, match="not a local checkpoint folder"):
        hs.add_prefix_correction(tmp_path / "nowhere", data)


# ----------------------------------------------------------------------------------------------- the size check
from hf_snapvit.correction.guard import distances  # noqa: E402
from hf_snapvit.correction.prefix_sizes import agreement, neighbours, outputs_of  # noqa: E402
from hf_snapvit.correction.prefix import applies_at, first_band  # noqa: E402


def split_draw(total=40, batch_size=8, seed=0):
    """Which images of a ``{"pixel_values": ...}`` draw are fitted on and which held out (the last quarter of the
    draw's batches in key order, as for the per-size guard)."""
    order = key_order(total, seed)
    num_batches = -(-total // batch_size)
    num_fit = (num_batches - max(1, round(0.25 * num_batches))) * batch_size
    return order[:num_fit], order[num_fit:]


def test_applies_at_needs_help_on_both_sides_and_nothing_beyond_the_last_checked_size():
    record = {"sizes": [{"sparsity": s, "kept": k} for s, k in ((0.1, True), (0.2, True), (0.3, False),
                                                                 (0.4, True))]}
    # 0.4 helped on its own check, but past 0.3, where the correction did not help: not trusted.
    assert [applies_at(record, s) for s in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45)] == \
        [True, True, True, True, False, False, False, False, False]
    late = {"sizes": [{"sparsity": s, "kept": k} for s, k in ((0.1, False), (0.2, True), (0.3, True), (0.4, False))]}
    assert [applies_at(late, s) for s in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35)] == \
        [False, False, False, True, True, True, False]
    assert applies_at({"method": "prefix"}, 0.9)  # not checked: every size


def test_the_first_band_keeps_the_first_run_of_helped_sizes_only():
    assert first_band([False, True, True, False, True, True]) == [False, True, True, False, False, False]
    assert first_band([True, True]) == [True, True] and first_band([False, False]) == [False, False]
    assert first_band([]) == []


def test_the_size_check_turns_the_correction_off_where_it_does_not_carry_over(tmp_path):
    """Fitted on near-copies of one image, the correction does not help on different held-out images at most sizes:
    there it is not applied, sliced or switched (the loads are the plain slices bit for bit); where it did help it
    is."""
    case = FAST["clip-vision"]
    folder = tmp_path / "elastic"
    model = case.build().eval()
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), folder)
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(1, 3, 32, 32, generator=generator) + 1e-3 * torch.randn(40, 3, 32, 32, generator=generator)
    _, held = split_draw()
    pixels[held] = 3 * torch.randn(len(held), 3, 32, 32, generator=generator)
    record = hs.add_prefix_correction(folder, {"pixel_values": pixels}, show_progress=False,
                                      config=CorrectionConfig(num_samples=None, batch_size=8))
    kept = [s["kept"] for s in record["sizes"]]
    assert record["num_held_out_images"] == 8 and sum(kept) < len(kept) / 2
    switchable = ElasticViTModel.from_pretrained(folder, switchable=True)
    inputs = case.inputs(2, 3)
    for size in record["sizes"]:
        loaded = ElasticViTModel.from_pretrained(folder, sparsity=size["requested"])
        plain = ElasticViTModel.from_pretrained(folder, sparsity=size["requested"], prefix_correction=False)
        same = all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), plain.state_dict().values()))
        assert same == (not applies_at(record, size["sparsity"]))
        assert (getattr(loaded.config, "elastic_correction", None) is None) == same
        switchable.set_budget(sparsity=size["requested"])
        torch.testing.assert_close(output_of(switchable, inputs), output_of(loaded, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["vit-cls", "dinov2"])
def test_no_size_is_further_from_the_dense_model_on_held_out_images_than_its_plain_slice(tmp_path, name):
    """The promise of the size check, from outside: at every checked size the loaded model's held-out outputs (class
    distributions, embeddings, embedding neighbours) are at least as close to the dense model's as the plain slice's
    (closer where it applies)."""
    case = FAST[name]
    folder = tmp_path / "elastic"
    model = case.build().eval()
    hs.save_elastic(model, hs.rank(model, method="random", seed=2), folder)
    # inputs on which the check applies the correction at some size, so that the test compares something
    pixels = case.inputs(40, {"vit-cls": 6, "dinov2": 10}[name])["pixel_values"]
    record = hs.add_prefix_correction(folder, {"pixel_values": pixels}, show_progress=False,
                                      config=CorrectionConfig(num_samples=None, batch_size=8))
    _, held = split_draw()
    batches = [{"pixel_values": pixels[held]}]
    dense = ElasticViTModel.from_pretrained(folder)
    spec = get_spec(dense)
    reference = outputs_of(dense, spec, batches)
    assert set(reference) == ({"logits_kl", "embedding_mse"} if name == "vit-cls" else {"embedding_mse"})
    wanted = neighbours(reference["embedding_mse"])
    applied = 0
    for size in record["sizes"]:
        loaded = ElasticViTModel.from_pretrained(folder, sparsity=size["requested"])
        plain = ElasticViTModel.from_pretrained(folder, sparsity=size["requested"], prefix_correction=False)
        ours, theirs = outputs_of(loaded, spec, batches), outputs_of(plain, spec, batches)
        gaps = {m: float(distances(theirs[m], r, m).mean() - distances(ours[m], r, m).mean())
                for m, r in reference.items()}
        gaps["embedding_neighbours"] = float(agreement(neighbours(ours["embedding_mse"]), wanted).mean()
                                             - agreement(neighbours(theirs["embedding_mse"]), wanted).mean())
        assert set(gaps) == set(size["gain"])
        for measure, gap in gaps.items():
            assert gap >= -1e-12, (size, measure)
            if size["kept"]:
                assert gap > 0 and size["gain"][measure] == pytest.approx(gap, rel=1e-4, abs=1e-9)
            else:
                assert gap == 0
        if size["kept"]:
            applied += 1
            assert loaded.config.elastic_correction["sizes"] == record["sizes"]
    assert applied > 0  # on these images the correction helps somewhere, so the test compares something


def test_neighbour_agreement_is_one_for_the_same_embeddings_and_lower_for_shuffled_ones():
    embeddings = [torch.randn(30, 8, generator=torch.Generator().manual_seed(0))]
    reference = neighbours(embeddings)
    assert reference.shape == (30, 7)  # (30 - 1) // 4 neighbours when fewer than 40 images are held out
    assert torch.equal(agreement(neighbours([2.0 * embeddings[0]]), reference), torch.ones(30, dtype=torch.float64))
    shuffled = agreement(neighbours([embeddings[0][torch.randperm(30, generator=torch.Generator().manual_seed(1))]]),
                         reference)
    assert float(shuffled.mean()) < 0.5


@pytest.mark.parametrize("case", [c for c in CASES if c.name.endswith(("-cls", "-cls-teacher"))], ids=repr)
def test_a_classifiers_embeddings_read_in_its_forward_equal_image_embedding(case):
    from hf_snapvit.architectures.embedding import image_embedding

    model = case.build().eval()
    inputs = case.inputs(3)
    outputs = outputs_of(model, get_spec(model), [inputs])
    assert set(outputs) == {"logits_kl", "embedding_mse"}
    torch.testing.assert_close(outputs["embedding_mse"][0], image_embedding(model, inputs), rtol=1e-6, atol=1e-6)


def test_the_elastic_card_says_where_the_stored_correction_applies(tmp_path):
    from hf_snapvit.cards.elastic import make_model_card
    from hf_snapvit.cards.results import percent

    case = FAST["vit-cls"]
    folder = tmp_path / "elastic"
    model = case.build().eval()
    hs.save_elastic(model, hs.rank(model, method="random", seed=2), folder)
    assert "Weight correction for every size" not in str(make_model_card(folder))
    record = hs.add_prefix_correction(folder, {"pixel_values": case.inputs(40, 6)["pixel_values"]},
                                      show_progress=False, config=CorrectionConfig(num_samples=None, batch_size=8))
    card = str(make_model_card(folder))
    assert "## Weight correction for every size" in card and "on 40 unlabelled images" in card
    assert f"A check on {record['num_held_out_images']} held-out images" in card
    helped = [s for s in record["sizes"] if s["kept"]]
    assert helped and all(percent(s['sparsity']) in card for s in helped)


def test_an_offline_load_warns_when_it_cannot_tell_whether_the_repository_has_a_correction(tmp_path):
    import warnings

    folder, _, _ = corrected_checkpoint(tmp_path, FAST["vit"])
    (folder / PREFIX_FILE).unlink()  # cached without its correction: as if only the other files were downloaded
    root, commit = hub_cache_copy(folder, tmp_path / "cache", "acme/elastic-vit")
    load = dict(sparsity=0.3, cache_dir=tmp_path / "cache", local_files_only=True)
    with pytest.warns(UserWarning, match=f"Could not check whether 'acme/elastic-vit' has a {PREFIX_FILE}"):
        model = ElasticViTModel.from_pretrained("acme/elastic-vit", **load)
    assert getattr(model.config, "elastic_correction", None) is None  # the plain slice
    # The Hub said earlier that the repository has none (huggingface_hub keeps that in .no_exist): no warning.
    (root / ".no_exist" / commit).mkdir(parents=True)
    (root / ".no_exist" / commit / PREFIX_FILE).touch()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Could not check")
        ElasticViTModel.from_pretrained("acme/elastic-vit", **load)
    # A local folder without the file is simply uncorrected.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Could not check")
        ElasticViTModel.from_pretrained(folder, sparsity=0.3)


def test_an_offline_load_finds_a_cached_correction(tmp_path):
    folder, _, _ = corrected_checkpoint(tmp_path, FAST["vit"])
    hub_cache_copy(folder, tmp_path / "cache", "acme/elastic-vit")
    model = ElasticViTModel.from_pretrained("acme/elastic-vit", sparsity=0.3, cache_dir=tmp_path / "cache",
                                            local_files_only=True)
    local = ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    assert model.config.elastic_correction == local.config.elastic_correction and local.config.elastic_correction


def test_refresh_card_rewrites_only_a_generated_card_and_is_off_by_default(tmp_path):
    case = FAST["vit-cls"]
    model = case.build().eval()
    ranking = hs.rank(model, method="random", seed=2)
    pixels = {"pixel_values": case.inputs(12, 6)["pixel_values"]}
    config = CorrectionConfig(num_samples=None, batch_size=8, guard=False)
    folders = {name: tmp_path / name for name in ("default", "refreshed", "hand")}
    for folder in folders.values():
        hs.save_elastic(model, ranking, folder)
    (folders["hand"] / "README.md").write_text("# my own card\n")
    hs.add_prefix_correction(folders["default"], pixels, config=config, show_progress=False)
    for name in ("refreshed", "hand"):
        hs.add_prefix_correction(folders[name], pixels, config=config, refresh_card=True, show_progress=False)
    section = "## Weight correction for every size"
    assert section not in (folders["default"] / "README.md").read_text()  # left as it was
    assert section in (folders["refreshed"] / "README.md").read_text()
    assert (folders["hand"] / "README.md").read_text() == "# my own card\n"
