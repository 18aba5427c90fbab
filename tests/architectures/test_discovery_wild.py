"""More of the wild (issue 63, point 5): video towers that take a clip's frames in the batch (X-CLIP), attention
with a relative-position MLP of one output row per head (timm's ``vit_relpos_*``, and a model of ours whose heads can
go), two attentions in one block (TimeSformer's temporal and spatial ones), and the parallel blocks discovery refuses
in a line (timm's ``*_18x2_*`` and ``*_xp_*``). Each is ranked, saved and loaded as a user would, the sliced and the
switchable model held to the masked dense one, or refused naming the reason with nothing written."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
import transformers
from transformers import PreTrainedModel

import hf_snapvit as hs
from hf_snapvit.architectures import discovery, get_spec
from hf_snapvit.architectures.embedding import dummy_inputs, image_embedding
from hf_snapvit.elastic.remote_code import remote_module_source
from hf_snapvit.surgery import proof
from hf_snapvit.surgery.slicing import slice_model_
from helpers import masked_copy
from support import zoo_cases
from support.discovered import perturbed, relpos_model

SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=32,
             patch_size=8)


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def xclip() -> PreTrainedModel:
    torch.manual_seed(0)
    return perturbed(transformers.XCLIPVisionModel(transformers.XCLIPVisionConfig(**SMALL, num_frames=2)))


def timesformer() -> PreTrainedModel:
    torch.manual_seed(0)
    return perturbed(transformers.TimesformerModel(transformers.TimesformerConfig(**SMALL, num_frames=2)))


def timm_vit(architecture: str, **arguments) -> PreTrainedModel:
    pytest.importorskip("timm", reason="timm is part of the [test] extra")
    torch.manual_seed(0)
    config = transformers.TimmWrapperConfig(architecture=architecture, num_labels=5, pretrained_cfg={
        "input_size": [3, 32, 32]}, model_args=dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4,
                                                    mlp_ratio=1.5, **arguments))
    return perturbed(transformers.TimmWrapperForImageClassification(config))


def _outputs(model, inputs) -> torch.Tensor:
    return proof.float_output(model, inputs)


def _rank_save_load(model, folder):
    """Rank and save ``model``; its loads at two sparsities (a third and two thirds of the largest the ranking
    allows) sliced and switchable, each compared with the masked dense model on the inputs it takes."""
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, folder, model_card=False)
    discovery._DISCOVERED.clear()
    sparsities = tuple(round(f * stored.max_sparsity_for(None), 4) for f in (1 / 3, 2 / 3))
    inputs = dummy_inputs(model, 2, seed=3)
    switchable = hs.ElasticViTModel.from_pretrained(folder, switchable=True)
    for sparsity in (*sparsities, sparsities[0], 0.0):  # down, further down, up, back to dense
        masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(sparsity)))
        want = _outputs(masked, inputs)
        if sparsity in sparsities:
            sliced = hs.ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
            torch.testing.assert_close(_outputs(sliced, inputs), want, rtol=1e-4, atol=1e-5)
        switchable.set_budget(sparsity=sparsity)
        torch.testing.assert_close(_outputs(switchable, inputs), want, rtol=1e-4, atol=1e-5)
        if sparsity:  # its standalone copy at this size
            torch.testing.assert_close(_outputs(switchable.to_sliced(), inputs), want, rtol=1e-4, atol=1e-5)
    return ranking, stored


def test_xclip_takes_each_clips_frames_in_its_batch_and_loads_sliced_equal_to_masking(tmp_path):
    model = xclip()
    spec = get_spec(model)
    # Its config has num_frames, but its forward takes [B·T, C, H, W]; its own attention, not the message one.
    assert (spec.frames_in_batch, spec.attention) == (2, "self_attn")
    assert dummy_inputs(model, 3)["pixel_values"].shape == (6, 3, 32, 32)
    clips = torch.randn(3, 2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():  # clips are flattened at the call, and each clip's embedding is its frames' mean
        frames = model(pixel_values=clips.flatten(0, 1)).pooler_output
        torch.testing.assert_close(image_embedding(model, {"pixel_values": clips}), frames.view(3, 2, -1).mean(1))
    ranking, stored = _rank_save_load(model, tmp_path)
    assert stored.floors()[0] < stored.shape.num_heads and stored.shape.frames == 2
    # The ranking's data come as clips: a data-driven method calibrates on [N, T, C, H, W].
    assert hs.rank(model, method="snip", data=clips, show_progress=False).shape == stored.shape


@pytest.mark.parametrize("architecture", ["vit_relpos_small_patch16_224", "vit_relpos_base_patch16_cls_224"])
def test_timm_relative_position_vits_keep_their_heads_and_load_sliced_equal_to_masking(architecture, tmp_path):
    model = timm_vit(architecture)
    spec = get_spec(model)
    assert spec.head_rows == ("attn.rel_pos.mlp.fc2",) and spec.q_proj == "qkv" and spec.o_proj == "proj"
    with pytest.warns(UserWarning, match="keeps every attention head"):  # its forward merges heads to the width
        _, stored = _rank_save_load(model, tmp_path)
    assert stored.floors()[0] == stored.shape.num_heads


def test_a_relative_position_mlp_is_sliced_with_the_heads(tmp_path):
    model = relpos_model()
    spec = get_spec(model)
    assert spec.head_rows == ("attn.rel_pos.mlp.fc2",) and "rel_pos.bias_shape[-1]" in spec.head_count_attrs
    ranking, stored = _rank_save_load(model, tmp_path)
    assert stored.floors()[0] < stored.shape.num_heads  # heads are pruned, each with its bias row
    # A head's parameters: its q/k/v rows and biases, its output columns, and its row of the MLP's last layer.
    assert stored.shape.params_per_head == 3 * 8 * 33 + 32 * 8 + 16 + 1
    sparsity = round(stored.max_sparsity_for(None) / 2, 4)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=sparsity)
    kept = stored.keep_counts(sparsity).heads
    assert [b.attn.rel_pos.mlp.fc2.out_features for b in sliced.blocks] == kept
    assert [b.attn.rel_pos.bias_shape[-1] for b in sliced.blocks] == kept


def test_the_remote_code_module_slices_per_head_rows_as_hf_snapvit_does():
    model = relpos_model()
    spec = get_spec(model)
    namespace: dict = {}
    exec(compile(remote_module_source(spec, {"AutoModel": "ViTModel"}), "remote", "exec"), namespace)
    keep = [(np.array([2, 0]), np.arange(0, 48, 2)), (np.array([3, 1, 0]), np.arange(20))]
    ours, theirs = slice_model_(copy.deepcopy(model), keep), namespace["slice_model_"](copy.deepcopy(model), keep)
    inputs = dummy_inputs(model, 2, seed=1)
    torch.testing.assert_close(_outputs(theirs, inputs), _outputs(ours, inputs))
    torch.testing.assert_close(_outputs(ours, inputs), _outputs(masked_copy(model, keep), inputs), rtol=1e-4,
                               atol=1e-5)


def test_timesformer_prunes_its_spatial_attention_blocks_ffn_and_keeps_the_temporal_one(tmp_path):
    model = timesformer()
    spec = get_spec(model)
    # Two attentions per block: the spatial one attends over each frame's patches, the temporal one over each
    # patch's two frames; the block's FFN follows the spatial one.
    assert (spec.attention, spec.mlp, spec.mlp_variants[0].in_proj) == ("attention", "", ("intermediate.dense",))
    with pytest.warns(UserWarning, match="keeps every attention head"):  # it splits the input width into heads
        _, stored = _rank_save_load(model, tmp_path)
    assert stored.floors()[0] == stored.shape.num_heads


@pytest.mark.parametrize("architecture, reason", [
    ("vit_small_patch16_18x2_224", r"two attention modules in one block \(attns\.0\.attn, attns\.1\.attn\) over "
                                   "the same tokens"),
    ("vit_base_patch16_xp_224", r"one projection \(in_proj, 32 -> 144\) computes q, k, v and the FFN input"),
])
def test_parallel_blocks_are_refused_in_a_line_naming_why(architecture, reason, tmp_path):
    model = timm_vit(architecture)
    error = pytest.raises(hs.UnsupportedArchitectureError, hs.rank, model, method="magnitude", show_progress=False)
    message = str(error.value)
    assert len(message) <= 400 and "\n" not in message and "ArchitectureSpec" not in message, message
    assert re.search(reason, message), message
    assert not any(tmp_path.iterdir())


def test_a_forward_that_splits_q_into_a_constant_head_count_keeps_every_head(tmp_path):
    # No attribute names the heads; the forward splits q into (4, -1): the width the trace shows (8) is a guess that
    # the proof refuses (with fewer heads the split gives heads of another width), so every head is kept.
    case = zoo_cases.Case("const-count-no-attributes", "head-dim",
                          {"attn": dict(count_attr=None, width_attr=None, split="const_count")})
    model = case.build()
    assert get_spec(model).head_width == 8
    with pytest.warns(UserWarning, match="keeps every attention head"):
        _, stored = _rank_save_load(model, tmp_path)
    assert stored.floors()[0] == stored.shape.num_heads


def test_a_config_without_image_size_whose_model_fixes_one_is_refused_naming_it():
    model = relpos_model()
    del model.config.image_size  # its relative-position MLP fixes 4 x 4 patches; no position embedding says so
    message = str(pytest.raises(hs.UnsupportedArchitectureError, hs.rank, model, method="magnitude",
                                show_progress=False).value)
    assert "[1, 3, 224, 224]" in message and "set config.image_size" in message and len(message) <= 500, message
