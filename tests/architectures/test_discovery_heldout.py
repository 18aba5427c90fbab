"""What a sweep of families and inputs the other tests do not build showed (issue 63, the check from outside), each
defect class held to its fix: square sizes given as pairs load and rectangles are refused; a timm model's channels
and patch size are read from its config; the block stack is a stack of transformer blocks (not a list of small
mergers, patch embeddings or stages); blocks that take channels-first grids (ViTDet) and FFNs as wide as the model
are discovered; a norm over the FFN's features is named instead of the shape error it causes; one dense block left
beside the pruned stack is warned about; a model that ran a forward is counted like a fresh one. Every slice is
compared with a mask built from the family's own module names, not from hf_snapvit's spec."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers as T

import hf_snapvit as hs
from hf_snapvit.architectures import discovery
from hf_snapvit.architectures.budget import model_shape
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery.proof import _output

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
TIMM = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=1.5)


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def _perturbed(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    return model.eval()


def _timm(architecture: str, channels: int = 3, side=(32, 32), **arguments):
    torch.manual_seed(0)
    return _perturbed(T.TimmWrapperForImageClassification(T.TimmWrapperConfig(
        architecture=architecture, model_args={**TIMM, **arguments}, pretrained_cfg={"input_size": [channels, *side]},
        num_labels=5)))


def _masked(model, blocks: str, o_proj: str, ffn_out: str, heads: int, keep):
    """``model`` with the dropped heads' columns of each block's ``o_proj`` and the dropped neurons' columns of its
    ``ffn_out`` zeroed: the module names are the family's own."""
    masked = copy.deepcopy(model)
    with torch.no_grad():
        for block, (kept_heads, kept_neurons) in zip(masked.get_submodule(blocks), keep):
            o, out = block.get_submodule(o_proj), block.get_submodule(ffn_out)
            width = o.in_features // heads
            for head in set(range(heads)) - set(kept_heads.tolist()):
                o.weight[:, head * width:(head + 1) * width] = 0
            out.weight[:, sorted(set(range(out.in_features)) - set(kept_neurons.tolist()))] = 0
    return masked


def _sliced_equals_mask(model, folder, blocks: str, o_proj: str, ffn_out: str, heads: int, prune_heads=True):
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, folder, model_card=False)
    discovery._DISCOVERED.clear()  # loading reads the stored spec, as a new process does
    inputs = dummy_inputs(model, 2, seed=1)
    for fraction in (0.35, 0.85):
        sparsity = fraction * stored.max_sparsity_for(None)
        counts = stored.keep_counts(sparsity)
        assert not prune_heads or sum(counts.heads) < heads * len(counts.heads)
        sliced = hs.ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
        masked = _masked(model, blocks, o_proj, ffn_out, heads, ranking.keep_indices(counts))
        torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)
    return stored


def test_square_sizes_given_as_pairs_load_sliced_and_a_rectangle_is_refused_in_a_line(tmp_path):
    # Before: TypeError (list // int) from the registry's patch count.
    model = _perturbed(T.ViTModel(T.ViTConfig(**SMALL, image_size=[32, 32], patch_size=[8, 8])))
    _sliced_equals_mask(model, tmp_path / "square", "layers", "attention.o_proj", "mlp.fc2", 4)
    rectangle = _perturbed(T.ViTModel(T.ViTConfig(**SMALL, image_size=[32, 48], patch_size=8)))
    with pytest.raises(hs.UnsupportedArchitectureError, match=r"image_size=\[32, 48\], which is not square"):
        hs.rank(rectangle, method="magnitude", show_progress=False)


def test_a_timm_models_channels_and_patch_size_come_from_its_config(tmp_path):
    # Before: a blank 3-channel image for a 1-channel model ("could not run one forward"); NaFlexViT's patch size
    # (model_args only, its patch embedding a linear layer) was "missing".
    gray = _timm("vit_tiny_patch16_224", channels=1, in_chans=1)
    _sliced_equals_mask(gray, tmp_path / "gray", "timm_model.blocks", "attn.proj", "mlp.fc2", 4)
    flexible = _timm("naflexvit_base_patch16_gap")
    assert hs.rank(flexible, method="magnitude", show_progress=False).shape.patch_size == 8
    with pytest.raises(hs.UnsupportedArchitectureError, match=r"input_size\[-2:\]=\[32, 48\], which is not square"):
        hs.rank(_timm("vit_tiny_patch16_224", side=(32, 48), img_size=(32, 48)), method="magnitude")


def test_the_block_stack_is_one_of_transformer_blocks_not_of_small_mergers(tmp_path):
    # Qwen3-VL's deepstack mergers (one ModuleList of two-layer MLPs) hold more parameters than its tiny blocks.
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    torch.manual_seed(0)
    model = _perturbed(T.Qwen3VLVisionModel(Qwen3VLVisionConfig(
        depth=2, hidden_size=32, num_heads=4, intermediate_size=48, out_hidden_size=32, spatial_merge_size=2,
        temporal_patch_size=2, patch_size=8, num_position_embeddings=16, deepstack_visual_indexes=[0])))
    assert sum(p.numel() for p in model.deepstack_merger_list.parameters()) > sum(
        p.numel() for p in model.blocks.parameters())
    _sliced_equals_mask(model, tmp_path, "blocks", "attn.proj", "mlp.linear_fc2", 4)


@pytest.mark.parametrize("architecture, arguments, reason", [
    # Stages as a list of lists (before: the last stage's blocks were "found", refused for its FLOPs in 590 chars).
    ("twins_svt_small", dict(img_size=32, embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4)),
     r"the stages of timm_model.blocks \(4 lists of blocks\) differ in width \(16, 32, 48, 64\)"),
    # Two branches in one block (before: the patch embeddings were the "blocks"; then "patch_size=[8, 16] is not
    # square").
    ("crossvit_tiny_240", dict(img_size=[32, 32], patch_size=[8, 16], embed_dim=[16, 32], depth=[[1, 1, 0]],
                               num_heads=[2, 4], mlp_ratio=[2, 2, 1]),
     r"block 0 of timm_model.blocks \(MultiScaleBlock\) holds stacks of blocks of its own"),
])
def test_stages_and_branches_inside_one_block_are_no_plain_vit(architecture, arguments, reason, tmp_path):
    torch.manual_seed(0)
    model = T.TimmWrapperForImageClassification(T.TimmWrapperConfig(
        architecture=architecture, model_args=arguments, pretrained_cfg={"input_size": [3, 32, 32]}, num_labels=5))
    with pytest.raises(hs.UnsupportedArchitectureError, match=reason) as info:
        hs.save_elastic(model.eval(), None, tmp_path / "out")
    assert len(str(info.value)) <= 400 and "ArchitectureSpec" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_blocks_that_take_channels_first_grids_are_discovered(tmp_path):
    # ViTDet's blocks take [B, C, H, W] (before: "runs 0 nn.Linear layers of its width").
    config = T.VitDetConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32,
                            pretrain_image_size=32, patch_size=8, window_size=2, window_block_indices=[0],
                            use_relative_position_embeddings=True)
    torch.manual_seed(0)
    model = _perturbed(T.VitDetModel(config))
    _sliced_equals_mask(model, tmp_path, "encoder.layer", "attention.proj", "mlp.fc2", 4)


def test_an_ffn_as_wide_as_the_model_is_found(tmp_path):
    # Before: "found no FFN (32 -> n -> 32)", its projections all keeping the hidden width (GLM-4V's at some sizes).
    torch.manual_seed(0)
    model = _perturbed(T.IJepaModel(T.IJepaConfig(**{**SMALL, "intermediate_size": 32}, image_size=32, patch_size=8)))
    _sliced_equals_mask(model, tmp_path, "layers", "attention.o_proj", "mlp.fc2", 4)


def test_a_norm_over_the_ffns_features_is_named_not_the_shape_error_it_causes(tmp_path):
    model = _timm("vit_tiny_patch16_224", scale_mlp_norm=True)
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        hs.save_elastic(model, None, tmp_path / "out")
    message = str(info.value)
    # Before: "slicing with it failed (shape '[1, 17, 32]' is invalid ...). Keeping every head does not help: ...
    # (RuntimeError: Given normalized_shape=[48] ...)", 511 characters, and advice to register an ArchitectureSpec.
    assert "its FFN's 48 hidden features pass through timm_model.blocks.0.mlp.norm (LayerNorm)" in message
    assert "slicing with it failed" not in message and "ArchitectureSpec" not in message and len(message) <= 500
    assert not (tmp_path / "out").exists()


def test_one_dense_block_beside_the_pruned_stack_is_warned_about():
    # CaiT with one class-attention block: before, only stacks of two or more blocks were seen, and nothing was said.
    model = _timm("cait_xxs24_224", depth_token_only=1)
    with pytest.warns(UserWarning, match=r"prunes part of it.*timm_model.blocks_token_only \(1 blocks\) stays dense"):
        ranking = hs.rank(model, method="magnitude", show_progress=False)
    assert ranking.provenance["prunable"]["dense"] == [["timm_model.blocks_token_only", 1]]


def test_a_model_that_ran_a_forward_is_counted_as_a_fresh_one():
    # transformers installs its output-recording hooks at the first forward; the counting twin dropped them, so a
    # segmentation head that reads the hidden states failed to count (a warning, and GFLOPs 0.05x of what runs).
    config = T.BeitConfig(**{**SMALL, "num_hidden_layers": 4}, image_size=32, patch_size=8, out_indices=[1, 2, 3, 4],
                          use_relative_position_bias=True, num_labels=3, auxiliary_channels=8, pool_scales=[1, 2],
                          use_auxiliary_head=False)
    torch.manual_seed(0)
    model = T.BeitForSemanticSegmentation(config).eval()
    fresh = hs.rank(model, method="magnitude", show_progress=False).shape.other_flops
    with torch.no_grad():
        model(**dummy_inputs(model, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # before: "its forward could not be counted (IndexError: ...)"
        after = hs.rank(model, method="magnitude", show_progress=False).shape.other_flops
    shape = model_shape(model)
    assert after == fresh > 10 * (shape.flops() - shape.other_flops)  # the head's FLOPs dwarf the blocks'
