"""Discovery: a vision transformer no registry knows (a user's own PreTrainedModel, I-JEPA) is ranked, saved and
loaded sliced by its discovered, proven spec alone; what discovery cannot match, or what fails the proof, is refused
before anything is written, naming the modules."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModel

import hf_snapvit as hs
from hf_snapvit.surgery import proof
from hf_snapvit.architectures import discovery as registry, get_spec
from helpers import masked_copy
from support.discovered import FAMILIES, CustomConfig, CustomModel


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def _custom(**options) -> CustomModel:
    torch.manual_seed(0)
    model = CustomModel(CustomConfig(**options)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


def _pixels(batch=2):
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("gated, fused", [(False, False), (True, False), (False, True)],
                         ids=["plain", "gated", "fused-qkv"])
def test_a_model_no_registry_knows_is_ranked_saved_and_loaded_by_its_discovered_spec(tmp_path, gated, fused):
    model = _custom(gated=gated, fused=fused)
    spec = get_spec(model)
    assert (spec.layers, spec.attention, spec.q_proj, spec.k_proj, spec.v_proj, spec.o_proj) == (
        "trunk", "mixer", *(("qkv",) * 3 if fused else ("to_q", "to_k", "to_v")), "proj")
    assert spec.qkv_blocks == ((0, 1, 2) if fused else (0, 0, 0))
    assert (spec.mlp, spec.mlp_variants[0]) == (("ff", hs.MlpSpec(("w_gate", "w_in"), "w_out")) if gated else
                                                ("ff", hs.MlpSpec(("0",), "2")))
    assert spec.head_width == "head_size" and spec.head_count_attrs == ("n_heads",)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored_ranking = hs.save_elastic(model, ranking, tmp_path)  # what loading resolves budgets with
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the caller's model is untouched
    stored = json.loads((tmp_path / "config.json").read_text())["elastic_spec"]
    assert stored["layers"] == "trunk" and stored["num_patches"] == 16 and stored["extra_tokens"] == 1
    assert stored["qkv_blocks"] == list(spec.qkv_blocks)

    registry._DISCOVERED.clear()  # loading reads the spec from config.json, as a fresh process does
    pixels = _pixels()
    dense = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.0)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert type(sliced) is CustomModel and sum(p.numel() for p in sliced.parameters()) < sum(
        p.numel() for p in model.parameters())
    with torch.no_grad():
        reference = model(pixel_values=pixels).last_hidden_state
        torch.testing.assert_close(dense(pixel_values=pixels).last_hidden_state, reference, rtol=1e-5, atol=1e-5)
        keep = ranking.keep_indices(stored_ranking.keep_counts(0.3))
        masked = masked_copy(model, keep)(pixel_values=pixels).last_hidden_state
        torch.testing.assert_close(sliced(pixel_values=pixels).last_hidden_state, masked, rtol=1e-4, atol=1e-5)
        switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
        assert isinstance(switchable, CustomModel)
        switchable.set_budget(sparsity=0.3)
        torch.testing.assert_close(switchable(pixel_values=pixels).last_hidden_state,
                                   sliced(pixel_values=pixels).last_hidden_state, rtol=1e-4, atol=1e-5)
    # The stock loader reads the elastic checkpoint dense, as it would any checkpoint of the user's class.
    stock = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(stock(pixel_values=pixels).last_hidden_state, reference, rtol=1e-5, atol=1e-5)


def test_ijepa_a_transformers_family_without_a_spec_works_by_discovery(tmp_path):
    torch.manual_seed(0)
    config = transformers.IJepaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=48, image_size=32, patch_size=8)
    model = transformers.IJepaModel(config).eval()
    assert "ijepa" not in hs.supported_model_types()
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored_ranking = hs.save_elastic(model, ranking, tmp_path)
    assert "`ijepa`, 4 heads and 48 FFN neurons per block" in (tmp_path / "README.md").read_text()  # the card
    registry._DISCOVERED.clear()
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert isinstance(sliced, transformers.IJepaModel)  # (its sliced twin, as for every stock class)
    pixels = _pixels()
    with torch.no_grad():
        masked = masked_copy(model, ranking.keep_indices(stored_ranking.keep_counts(0.3)))
        torch.testing.assert_close(sliced(pixel_values=pixels).last_hidden_state,
                                   masked(pixel_values=pixels).last_hidden_state, rtol=1e-4, atol=1e-5)
        switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
        switchable.set_budget(sparsity=0.3)
        torch.testing.assert_close(switchable(pixel_values=pixels).last_hidden_state,
                                   sliced(pixel_values=pixels).last_hidden_state, rtol=1e-4, atol=1e-5)
    # The sliced model saved by path loads without hf_snapvit's registry, through its loading module.
    sliced.save_pretrained(tmp_path / "sliced")
    registry._DISCOVERED.clear()
    remote = transformers.AutoModel.from_pretrained(tmp_path / "sliced", trust_remote_code=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(remote(pixel_values=pixels).last_hidden_state,
                                   sliced(pixel_values=pixels).last_hidden_state, rtol=0, atol=0)


def test_a_wrong_guess_fails_its_proof_and_the_next_guess_is_taken():
    model = _custom()
    spec = get_spec(model)
    # A wrong guess: the key projection named as the output projection. Slicing then cuts the wrong matrix.
    wrong = hs.ArchitectureSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, "o_proj": "to_k"})
    registry.adopt_discovered(wrong, model)
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        proof.prove_spec(model, wrong)
    assert "(to_q, to_k, to_v, to_k)" in str(info.value) and "register_architecture" in str(info.value)
    assert proof.ensure_proven(model).o_proj == "proj"  # discovery's own guess passes and is kept
    assert get_spec(model).o_proj == "proj"


def test_a_model_whose_heads_cannot_be_sliced_keeps_them_all_and_prunes_its_ffn(tmp_path):
    from hf_snapvit.architectures.embedding import dummy_inputs
    from hf_snapvit.surgery.proof import _output

    model = _custom(head_gate=True)
    with torch.no_grad():
        model.trunk[0].mixer.gate.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))  # distinct heads: a moved one shows
    with pytest.warns(UserWarning, match="keeps every attention head and prunes FFN neurons only"):
        ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    counts = stored.keep_counts(0.2)
    assert counts.heads == [4, 4] and sum(counts.neurons) < 96
    assert json.loads((tmp_path / "config.json").read_text())["elastic_spec"]["prune_heads"] is False
    registry._DISCOVERED.clear()
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.2)
    inputs = dummy_inputs(model, 2, seed=3)
    masked = masked_copy(model, ranking.keep_indices(counts))
    torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


def test_a_model_no_guess_can_slice_is_refused_naming_the_modules_and_forgotten(tmp_path):
    model = _custom(head_gate=True, ffn_norm=True)
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        hs.save_elastic(model, None, tmp_path / "out")
    message = str(info.value)
    # The one reason nothing can be pruned: the norm over the FFN's features (no spec would slice around it).
    assert "attention mixer (to_q, to_k, to_v, proj)" in message and "register_architecture" not in message
    assert "its FFN's 48 hidden features pass through trunk.0.ff.2 (LayerNorm)" in message
    assert not (tmp_path / "out").exists() and registry.discovered_spec(model) is None


@pytest.mark.parametrize("bad, named", [("not a dict", "JSON object"), ({"format": 9}, "format 9"),
                                        ("missing-layers", "'layers'"), ("negative-tokens", "extra_tokens"),
                                        ("fused-separate", "names different q_proj")])
def test_a_tampered_stored_spec_gets_a_clear_error(tmp_path, bad, named):
    model = _custom()
    hs.save_elastic(model, hs.rank(model, method="magnitude", show_progress=False), tmp_path, model_card=False)
    config = json.loads((tmp_path / "config.json").read_text())
    spec = dict(config["elastic_spec"])
    if bad == "missing-layers":
        del spec["layers"]
    elif bad == "negative-tokens":
        spec["extra_tokens"] = -1
    elif bad == "fused-separate":  # separate projections read as the row blocks of one fused qkv
        spec["qkv_blocks"] = [0, 1, 2]
    else:
        spec = bad
    (tmp_path / "config.json").write_text(json.dumps({**config, "elastic_spec": spec}))
    registry._DISCOVERED.clear()
    with pytest.raises(hs.UnsupportedArchitectureError, match=named):
        hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_transformers_families_without_a_spec_load_sliced_equal_to_masking(family, tmp_path):
    from hf_snapvit.architectures.embedding import dummy_inputs
    from hf_snapvit.surgery.proof import _output

    torch.manual_seed(0)
    model = FAMILIES[family](transformers).eval()
    assert model.config.model_type not in hs.supported_model_types()
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    assert "elastic_spec" in json.loads((tmp_path / "config.json").read_text())
    registry._DISCOVERED.clear()
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert isinstance(sliced, type(model)) and sum(p.numel() for p in sliced.parameters()) < sum(
        p.numel() for p in model.parameters())
    inputs = dummy_inputs(model, 2, seed=3)
    masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(0.3)))
    torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["snapvit", "snip"])
def test_data_driven_methods_rank_a_discovered_model_from_pixels(method):
    from hf_snapvit.pruning.scoring import ScoreConfig
    from hf_snapvit.data.views import MultiCropConfig

    config = hs.SnapViTConfig.preset("fast", num_gradient_images=3, num_fitness_images=6, max_generations=1,
                                     scores=ScoreConfig(crops=MultiCropConfig(num_local=2)))
    model = _custom()
    ranking = hs.rank(model, method=method, data=torch.randn(12, 3, 32, 32), config=config, show_progress=False)
    counts = ranking.keep_counts(0.3)
    assert ranking.provenance["method"] == method and sum(counts.heads) < 8 and sum(counts.neurons) < 96


def test_snapvit_ranks_a_video_model_on_clips_its_own_processor_makes():
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    model = FAMILIES["videomae"](transformers).eval()
    processor = transformers.VideoMAEImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    rng = np.random.default_rng(0)
    videos = [[rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(4)] for _ in range(12)]
    clips = processor(videos, return_tensors="pt")["pixel_values"]
    assert clips.shape == (12, 4, 3, 32, 32)
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=3, num_fitness_images=6, max_generations=1,
                                     scores=ScoreConfig(crops=MultiCropConfig(num_local=2)))
    for method in ("snapvit", "snip"):
        ranking = hs.rank(model, method=method, data=clips, config=config, show_progress=False)
        assert ranking.provenance["method"] == method and 0.2 < ranking.keep_counts(0.3).sparsity < 0.4


def test_a_video_model_given_images_is_told_to_give_clips():
    model = FAMILIES["videomae"](transformers).eval()
    with pytest.raises(hs.ConfigError, match=r"video clips.*\[1, 4, 3, 32, 32\].*\[N, T, C, H, W\] tensor of clips"):
        hs.rank(model, method="snapvit", data=torch.randn(12, 3, 32, 32), show_progress=False)


def test_the_crops_of_a_clip_share_one_box_across_its_frames():
    from hf_snapvit.data.views import MultiCropConfig, multi_crops

    frame = torch.rand(1, 3, 40, 48)
    clip = frame + torch.arange(4.0).view(4, 1, 1, 1)  # frame t is frame 0 plus t: equal boxes keep the offsets
    global_views, local_views = multi_crops([clip], MultiCropConfig(num_global=2, num_local=3), None, 32,
                                            np.random.default_rng(0))
    assert global_views.shape == (1, 2, 4, 3, 32, 32) and local_views.shape == (1, 3, 4, 3, 32, 32)
    for views in (global_views, local_views):
        offsets = views - views[:, :, :1]
        torch.testing.assert_close(offsets, torch.arange(4.0).view(1, 1, 4, 1, 1, 1).expand_as(offsets))
