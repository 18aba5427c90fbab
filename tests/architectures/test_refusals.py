"""Refusals a person can act on: models that are no plain ViT (a text model, a CNN, hierarchical or grouped stages)
are refused by rank and save_elastic in a few lines that name the model, the modules found and the one reason, with
nothing written; configs without an image or patch size are read from the model; a head count no attribute names is
read from the forward's split of the query into heads. What is no transformers model with its weights (a compiled
or PEFT wrapper, meta weights, a plain module, no blocks) and an edited config.json are refused in a line naming what
to pass or which entry is wrong."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn as nn
import transformers as T
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

import hf_snapvit as hs
from hf_snapvit.architectures import ArchitectureSpec, MlpSpec, discovery, get_spec, registry
from hf_snapvit.architectures.budget import model_shape
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery.proof import _output
from helpers import masked_copy

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)


def _timm(architecture, **model_args):
    return lambda: T.TimmWrapperForImageClassification(T.TimmWrapperConfig(
        architecture=architecture, model_args=model_args, pretrained_cfg={"input_size": [3, 32, 32]}, num_labels=5))


NOT_PLAIN_VITS = {  # (model, what the refusal says)
    "bert": (lambda: T.BertModel(T.BertConfig(**_SMALL, vocab_size=100)), "takes no images"),
    "pix2struct": (lambda: T.Pix2StructVisionModel(T.Pix2StructVisionConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, d_ff=48, d_kv=8, patch_embed_hidden_size=48)),
        "takes no images"),
    "resnet": (lambda: T.ResNetModel(T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])),
               "differ in width"),
    "segformer": (lambda: T.SegformerModel(T.SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2])), "differ in width"),
    "swin": (lambda: T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                              num_heads=[2, 4], window_size=4)), "hierarchical stages"),
    "hiera": (lambda: T.HieraModel(T.HieraConfig(
        image_size=[64, 64], embed_dim=16, depths=[1, 1], num_heads=[1, 2], num_query_pool=1)), "stages"),
    "groupvit": (lambda: T.GroupViTVisionModel(T.GroupViTVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, depths=[1, 1], num_group_tokens=[4, 0],
        num_output_groups=[4, 4], num_attention_heads=4, image_size=32, patch_size=8)), "stages"),
    "timm-swin": (_timm("swin_tiny_patch4_window7_224", img_size=32, patch_size=4, embed_dim=16, depths=(1, 1),
                        num_heads=(2, 4), window_size=4), "hierarchical stages"),
}


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def _readable(message: str, reason: str) -> None:
    """A few lines naming the reason, no clause said twice, no advice to describe a non-ViT with a spec."""
    assert reason in message and len(message) <= 400, message
    clauses = [c.strip() for c in re.split(r"[.;:]\s", message) if len(c.strip()) > 20]
    assert len(clauses) == len(set(clauses)), message
    assert "ArchitectureSpec" not in message, message


@pytest.mark.parametrize("name", list(NOT_PLAIN_VITS))
def test_a_model_that_is_no_plain_vit_is_refused_in_a_few_lines_with_nothing_written(name, tmp_path):
    build, reason = NOT_PLAIN_VITS[name]
    torch.manual_seed(0)
    model = build().eval()
    with pytest.raises(hs.UnsupportedArchitectureError) as ranked:
        hs.rank(model, method="magnitude", show_progress=False)
    _readable(str(ranked.value), reason)
    assert type(model).__name__ in str(ranked.value)
    with pytest.raises(hs.UnsupportedArchitectureError) as saved:
        hs.save_elastic(model, None, tmp_path / "out")  # refused before the ranking is looked at
    assert str(saved.value) == str(ranked.value)
    assert not (tmp_path / "out").exists()


def test_a_timm_model_whose_config_has_no_pretrained_cfg_is_sized_from_its_model_args(tmp_path):
    config = T.TimmWrapperConfig(architecture="vit_tiny_patch16_224", num_labels=5, model_args=dict(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=1.5))
    assert getattr(config, "pretrained_cfg", None) is None
    torch.manual_seed(0)
    model = T.TimmWrapperForImageClassification(config).eval()
    assert dummy_inputs(model, 1)["pixel_values"].shape[-1] == 32
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    discovery._DISCOVERED.clear()
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    inputs = dummy_inputs(model, 2, seed=1)
    masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(0.3)))
    torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


class SplitConfig(PretrainedConfig):
    model_type = "hf_snapvit_test_split_heads"

    def __init__(self, width=32, depth=2, ffn=48, image_size=32, patch_size=8, **kwargs):
        super().__init__(**kwargs)
        self.width, self.depth, self.ffn, self.image_size, self.patch_size = width, depth, ffn, image_size, patch_size


class SplitAttention(nn.Module):
    """Keeps one head's width only; its forward splits the query into as many heads as fit (``view(..., -1, 8)``)."""

    def __init__(self, width):
        super().__init__()
        self.head_dim = 8
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, -1, self.head_dim).transpose(1, 2)  # noqa: E731
        y = nn.functional.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(y.transpose(1, 2).flatten(2))


class SplitBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm, self.attention = nn.LayerNorm(config.width), SplitAttention(config.width)
        self.fc1, self.fc2 = nn.Linear(config.width, config.ffn), nn.Linear(config.ffn, config.width)

    def forward(self, x):
        x = x + self.attention(self.norm(x))
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


class SplitModel(PreTrainedModel):
    config_class = SplitConfig
    main_input_name = "pixel_values"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Conv2d(3, config.width, config.patch_size, config.patch_size)
        self.layers = nn.ModuleList(SplitBlock(config) for _ in range(config.depth))
        self.post_init()

    def forward(self, pixel_values, **kwargs):
        x = self.embed(pixel_values).flatten(2).transpose(1, 2)
        for layer in self.layers:
            x = layer(x)
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=x.mean(1))


AutoConfig.register(SplitConfig.model_type, SplitConfig, exist_ok=True)
AutoModel.register(SplitConfig, SplitModel, exist_ok=True)


def test_a_head_count_no_attribute_names_is_read_from_the_forwards_split_of_the_query(tmp_path):
    torch.manual_seed(0)
    model = SplitModel(SplitConfig()).eval()
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    assert ranking.shape.num_heads == 4 and ranking.shape.head_dim == 8
    spec = get_spec(model)
    assert (spec.head_width, spec.head_count_attrs) == ("head_dim", ())
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    assert json.loads((tmp_path / "config.json").read_text())["elastic_spec"]["head_width"] == "head_dim"
    discovery._DISCOVERED.clear()
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.4)
    assert sum(p.numel() for p in sliced.parameters()) < sum(p.numel() for p in model.parameters())
    inputs = dummy_inputs(model, 2, seed=1)
    masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(0.4)))
    torch.testing.assert_close(_output(sliced, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


def _swin_spec() -> ArchitectureSpec:
    """A spec a user might register for Swin: its stages as the blocks (each stage's first block pruned)."""
    return ArchitectureSpec(
        model_type="swin", layers="encoder.layers", attention="blocks.0.attention", q_proj="q_proj", k_proj="k_proj",
        v_proj="v_proj", o_proj="o_proj", mlp="blocks.0.mlp", mlp_variants=(MlpSpec(("fc1",), "fc2"),),
        head_count_attrs=("num_attention_heads",), head_size_attrs=())

def test_blocks_of_different_widths_by_config_are_not_a_plain_vit_while_a_sliced_model_is_already_sliced(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "swin", _swin_spec())
    swin = NOT_PLAIN_VITS["swin"][0]().eval()
    for call in (lambda: hs.rank(swin, method="magnitude", show_progress=False), lambda: model_shape(swin)):
        with pytest.raises(hs.UnsupportedArchitectureError) as info:
            call()
        _readable(str(info.value), "not a plain ViT")
        assert "different widths (heads [2, 4]" in str(info.value) and "already sliced" not in str(info.value)
    from hf_snapvit.surgery.slicing import slice_model_

    vit = T.ViTModel(T.ViTConfig(**_SMALL, image_size=32, patch_size=8)).eval()
    slice_model_(vit, [([0, 1], list(range(10))), ([0], list(range(20)))])
    for call in (lambda: hs.rank(vit, method="magnitude", show_progress=False), lambda: model_shape(vit)):
        with pytest.raises(hs.ConfigError, match="already sliced") as info:
            call()
        assert "not a plain ViT" not in str(info.value)


def _vit():
    torch.manual_seed(0)
    return T.ViTForImageClassification(T.ViTConfig(**_SMALL, image_size=32, patch_size=8, num_labels=3)).eval()


def _peft(model):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))


def _on_meta(model):
    with torch.device("meta"):
        return T.ViTForImageClassification(model.config)


@pytest.mark.parametrize("wrap, named", [
    (torch.compile, r"torch.compile'd model .*pass the model it compiles \(model._orig_mod\)"),  # before: CHANGED
    (_peft, r"PEFT model .*merge_and_unload\(\)"),  # before: AttributeError: LoraModel has no attribute `layers`
    (_on_meta, r"weights on the meta device"),  # before: NotImplementedError: Cannot copy out of meta tensor
    (lambda m: nn.Sequential(m), r"got Sequential; pass the ViTForImageClassification it holds"),  # before: 577 chars
    (lambda m: None, r"PreTrainedModel .*got NoneType"),
    (lambda m: T.ViTModel(T.ViTConfig(**{**_SMALL, "num_hidden_layers": 0})), r"has no blocks"),  # "already sliced"
])
def test_what_is_no_transformers_model_with_its_weights_is_refused_in_a_line(wrap, named, tmp_path):
    model = wrap(_vit())
    for call in (lambda: hs.rank(model, method="magnitude", show_progress=False),
                 lambda: hs.save_elastic(model, None, tmp_path / "out")):
        with pytest.raises(hs.UnsupportedArchitectureError, match=named) as info:
            call()
        assert "\n" not in str(info.value) and len(str(info.value)) <= 300
    assert not (tmp_path / "out").exists()


def test_save_elastic_without_a_ranking_says_what_it_needs(tmp_path):
    with pytest.raises(hs.ConfigError, match="needs the ElasticRanking hf_snapvit.rank returns"):  # before: AttributeError
        hs.save_elastic(_vit(), None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _clip():
    torch.manual_seed(0)
    return T.CLIPVisionModel(T.CLIPVisionConfig(**_SMALL, image_size=32, patch_size=8)).eval()


@pytest.mark.parametrize("build, edit, named", [
    (_vit, lambda c: {**c, "model_type": "no_such_type"}, r"transformers cannot read its config.json .*model_type"),
    (_vit, lambda c: {k: v for k, v in c.items() if k != "model_type"}, r"transformers cannot read its config.json"),
    (_clip, lambda c: {**c, "num_attention_heads": 3}, r"cannot read its config.json .*not a multiple of the number"),
    (_vit, lambda c: {**c, "elastic_ranking": {**c["elastic_ranking"], "provenance": "x"}},
     r"provenance must be a JSON object"),
])
def test_an_edited_config_json_is_refused_naming_the_entry(build, edit, named, tmp_path):
    model = build()
    hs.save_elastic(model, hs.rank(model, method="magnitude", show_progress=False), tmp_path, model_card=False)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(edit(config)))
    # Before: transformers' ValueError (an unknown model type) or its config class's StrictDataclassError (a head
    # count that does not divide the width); a raw "dictionary update sequence" error for the provenance.
    with pytest.raises(hs.SnapViTError, match=named) as info:
        hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert len(str(info.value)) <= 500


@pytest.mark.parametrize("build, named", [
    (lambda: T.VisionTextDualEncoderModel(T.VisionTextDualEncoderConfig.from_vision_text_configs(
        T.ViTConfig(**_SMALL, image_size=32, patch_size=8), T.BertConfig(**_SMALL, vocab_size=50), projection_dim=16)),
     r"needs input_ids besides pixel_values: rank its vision tower \(vision_model\) instead"),
    (lambda: T.SegGptModel(T.SegGptConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_dim=48,
                                          image_size=[32, 32], patch_size=8, pretrain_image_size=32, merge_index=0,
                                          intermediate_hidden_state_indices=[0, 1], decoder_hidden_size=8)),
     r"needs prompt_pixel_values, prompt_masks besides pixel_values: hf_snapvit ranks models that take images"),
])
def test_a_model_whose_forward_needs_more_than_images_is_told_so(build, named, tmp_path):
    # Before: "Check that config.image_size, num_channels are the input the model takes" (the config was right).
    torch.manual_seed(0)
    with pytest.raises(hs.UnsupportedArchitectureError, match=named) as info:
        hs.save_elastic(build().eval(), None, tmp_path / "out")
    assert "config.image_size" not in str(info.value) and not (tmp_path / "out").exists()
