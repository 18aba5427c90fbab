"""A spec a checkpoint stores (``config.json["elastic_spec"]``) is data from outside: every field edited in many ways
is either refused by name before anything is sliced (an error naming elastic_spec and the field, never an
AttributeError, TypeError or shape error at forward time), or harmless (the load equals the masked model); with the
spec deleted, the loader refuses rather than guess."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn
import transformers
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

import hf_snapvit as hs
from hf_snapvit.architectures import discovery
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.loading import modeling
from hf_snapvit.surgery.proof import _output
from helpers import masked_copy


class StoredConfig(PretrainedConfig):
    model_type = "hf_snapvit_test_stored"

    def __init__(self, width=32, depth=2, heads=4, ffn=48, image_size=32, patch_size=8, num_channels=3, fused=False,
                 gated=False, **kwargs):
        super().__init__(**kwargs)
        self.width, self.depth, self.heads, self.ffn, self.fused, self.gated = width, depth, heads, ffn, fused, gated
        self.image_size, self.patch_size, self.num_channels = image_size, patch_size, num_channels


class Attention(nn.Module):
    """Every head attribute matters: the forward splits by n_heads and head_size and merges to all_head_size."""

    def __init__(self, config):
        super().__init__()
        self.n_heads, self.head_size = config.heads, config.width // config.heads
        self.all_head_size = config.width
        if config.fused:
            self.qkv = nn.Linear(config.width, 3 * config.width)
        else:
            self.to_q, self.to_k, self.to_v = (nn.Linear(config.width, config.width) for _ in range(3))
        self.out = nn.Linear(config.width, config.width)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, -1) if hasattr(self, "qkv") else (self.to_q(x), self.to_k(x), self.to_v(x))
        split = lambda y: y.view(b, t, self.n_heads, self.head_size).transpose(1, 2)  # noqa: E731
        y = nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
        return self.out(y.transpose(1, 2).reshape(b, t, self.all_head_size))


class Block(nn.Module):
    """A plain FFN in its own module, or a gated one whose projections the block holds itself (the spec's mlp "")."""

    def __init__(self, config):
        super().__init__()
        self.n1, self.n2, self.attn = nn.LayerNorm(config.width), nn.LayerNorm(config.width), Attention(config)
        if config.gated:
            self.w_gate, self.w_in = nn.Linear(config.width, config.ffn), nn.Linear(config.width, config.ffn)
            self.w_out = nn.Linear(config.ffn, config.width)
        else:
            self.ffn = nn.Sequential(nn.Linear(config.width, config.ffn), nn.GELU(),
                                     nn.Linear(config.ffn, config.width))

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        h = self.n2(x)
        return x + (self.w_out(nn.functional.silu(self.w_gate(h)) * self.w_in(h)) if hasattr(self, "w_gate")
                    else self.ffn(h))


class StoredModel(PreTrainedModel):
    """Its blocks in an nn.Sequential (as timm keeps them), a class token and two register tokens before the
    patches."""

    config_class = StoredConfig
    main_input_name = "pixel_values"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Conv2d(config.num_channels, config.width, config.patch_size, config.patch_size)
        self.tokens = nn.Parameter(torch.zeros(1, 3, config.width))
        self.blocks = nn.Sequential(*(Block(config) for _ in range(config.depth)))
        self.post_init()

    def forward(self, pixel_values, **kwargs):
        patches = self.embed(pixel_values).flatten(2).transpose(1, 2)
        x = self.blocks(torch.cat([self.tokens.expand(len(patches), -1, -1), patches], 1))
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=x[:, 0])


AutoConfig.register(StoredConfig.model_type, StoredConfig, exist_ok=True)
AutoModel.register(StoredConfig, StoredModel, exist_ok=True)


def _timm():
    config = transformers.TimmWrapperConfig(
        architecture="vit_tiny_patch16_224", pretrained_cfg={"input_size": [3, 32, 32]}, num_labels=5,
        model_args=dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=1.5))
    return transformers.TimmWrapperForImageClassification(config)


BASES = {"plain": lambda: StoredModel(StoredConfig()), "fused": lambda: StoredModel(StoredConfig(fused=True)),
         "gated": lambda: StoredModel(StoredConfig(gated=True)),
         "timm": _timm}


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each base model, its ranking as stored and its elastic checkpoint, saved once."""
    made = {}
    for name, build in BASES.items():
        torch.manual_seed(0)
        model = build().eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.05)
        ranking = hs.rank(model, method="magnitude", show_progress=False)
        folder = tmp_path_factory.mktemp(name)
        stored = hs.save_elastic(model, ranking, folder, model_card=False)
        made[name] = (model, ranking, stored, folder)
    discovery._DISCOVERED.clear()
    return made


def _deleted(field):
    return lambda spec: {k: v for k, v in spec.items() if k != field}


def _set(**fields):
    return lambda spec: {**spec, **fields}


# (base, edit id, edit, the fields a refusal may name; () where the edit is harmless)
EDITS = [
    ("plain", "layers-missing", _set(layers="trunk"), ("layers",)),
    ("plain", "layers-one-block", _set(layers="blocks.0"), ("layers",)),
    ("plain", "layers-a-conv", _set(layers="embed"), ("layers",)),
    ("plain", "layers-the-model", _set(layers=""), ("layers",)),
    ("plain", "layers-mixed-stack", _set(layers="blocks.0.ffn"), ("layers",)),
    ("plain", "layers-int", _set(layers=5), ("layers",)),
    ("plain", "layers-deleted", _deleted("layers"), ("layers",)),
    ("plain", "attention-missing", _set(attention="mixer"), ("attention",)),
    ("plain", "attention-the-ffn", _set(attention="ffn"), ("q_proj",)),
    ("plain", "attention-the-block", _set(attention=""), ("q_proj",)),
    ("plain", "attention-a-linear", _set(attention="attn.to_q"), ("q_proj",)),
    ("plain", "attention-null", _set(attention=None), ("attention",)),
    ("plain", "q-missing", _set(q_proj="query"), ("q_proj",)),
    ("plain", "q-is-o", _set(q_proj="out"), ("q_proj", "o_proj")),
    ("plain", "q-is-k", _set(q_proj="to_k"), ("q_proj",)),
    ("plain", "q-the-attention", _set(q_proj=""), ("q_proj",)),
    ("plain", "q-an-int", _set(q_proj="n_heads"), ("q_proj",)),
    ("plain", "q-o-swapped", _set(q_proj="out", o_proj="to_q"), ("o_proj",)),
    ("plain", "q-k-swapped", _set(q_proj="to_k", k_proj="to_q"), ("q_proj/k_proj/v_proj",)),
    ("plain", "q-v-swapped", _set(q_proj="to_v", v_proj="to_q"), ("q_proj/k_proj/v_proj",)),
    ("plain", "q-list", _set(q_proj=["to_q"]), ("q_proj",)),
    ("plain", "k-missing", _set(k_proj="key"), ("k_proj",)),
    ("plain", "k-is-o", _set(k_proj="out"), ("o_proj",)),
    ("plain", "k-o-swapped", _set(k_proj="out", o_proj="to_k"), ("o_proj",)),
    ("plain", "v-missing", _set(v_proj="value"), ("v_proj",)),
    ("plain", "v-outside-attention", _set(v_proj="ffn.0"), ("v_proj",)),
    ("plain", "v-o-swapped", _set(v_proj="out", o_proj="to_v"), ("o_proj",)),
    ("plain", "o-missing", _set(o_proj="proj"), ("o_proj",)),
    ("plain", "o-is-q", _set(o_proj="to_q"), ("o_proj",)),
    ("plain", "o-the-attention", _set(o_proj=""), ("o_proj",)),
    ("plain", "mlp-missing", _set(mlp="mlp"), ("mlp",)),
    ("plain", "mlp-the-attention", _set(mlp="attn"), ("mlp_in",)),
    ("plain", "mlp-the-block", _set(mlp=""), ("mlp_in",)),
    ("plain", "mlp-in-empty", _set(mlp_in=[]), ("mlp_in",)),
    ("plain", "mlp-in-missing", _set(mlp_in=["5"]), ("mlp_in",)),
    ("plain", "mlp-in-the-activation", _set(mlp_in=["1"]), ("mlp_in",)),
    ("plain", "mlp-in-is-out", _set(mlp_in=["2"]), ("mlp_in", "mlp_out")),
    ("plain", "mlp-in-twice", _set(mlp_in=["0", "0"]), ("mlp_in",)),
    ("plain", "mlp-in-a-string", _set(mlp_in="0"), ("mlp_in",)),
    ("plain", "mlp-out-missing", _set(mlp_out="3"), ("mlp_out",)),
    ("plain", "mlp-out-is-in", _set(mlp_out="0"), ("mlp_out",)),
    ("plain", "mlp-out-the-activation", _set(mlp_out="1"), ("mlp_out",)),
    ("plain", "mlp-in-out-swapped", _set(mlp_in=["2"], mlp_out="0"), ("mlp_in", "mlp_out")),
    ("plain", "head-width-missing", _set(head_width="head_dim"), ("head_width",)),
    ("plain", "head-width-the-count", _set(head_width="n_heads"), ("head_width", "head_count_attrs")),
    ("plain", "head-width-the-size", _set(head_width="all_head_size"), ("head_width", "head_count_attrs")),
    ("plain", "head-width-a-linear", _set(head_width="to_q"), ("head_width",)),
    # An integer head_width is the width itself (a forward that splits by a constant): 8 is this model's; 5 is none.
    ("plain", "head-width-int", _set(head_width=8), ()),
    ("plain", "head-width-wrong-int", _set(head_width=5), ("head_width",)),
    ("plain", "head-width-negative", _set(head_width=-8), ("head_width",)),
    ("plain", "head-rows-a-norm", _set(head_rows=["n1"]), ("head_rows",)),
    ("plain", "frames-in-batch-of-an-image-model", _set(frames_in_batch=2), ("frames_in_batch",)),
    ("plain", "head-width-from-the-count", _set(head_width=""), ()),  # rows over n_heads: the same width
    ("plain", "head-count-renamed", _set(head_count_attrs=["num_heads"]), ("head_count_attrs",)),
    ("plain", "head-count-empty", _set(head_count_attrs=[]), ("head_count_attrs",)),
    ("plain", "head-count-the-width", _set(head_count_attrs=["head_size"]), ("head_count_attrs",)),
    ("plain", "head-count-one-extra", _set(head_count_attrs=["n_heads", "heads"]), ("head_count_attrs",)),
    ("plain", "head-count-a-string", _set(head_count_attrs="n_heads"), ("head_count_attrs",)),
    ("plain", "head-size-empty", _set(head_size_attrs=[]), ("head_size_attrs",)),
    ("plain", "head-size-the-width", _set(head_size_attrs=["head_size"]), ("head_size_attrs",)),
    ("plain", "head-size-renamed", _set(head_size_attrs=["all_head_dim"]), ("head_size_attrs",)),
    ("plain", "extra-tokens-plus-one", _set(extra_tokens=4), ("extra_tokens",)),
    ("plain", "extra-tokens-minus-one", _set(extra_tokens=2), ("extra_tokens",)),
    ("plain", "extra-tokens-none", _set(extra_tokens=0), ("extra_tokens",)),
    ("plain", "extra-tokens-negative", _set(extra_tokens=-1), ("extra_tokens",)),
    ("plain", "extra-tokens-a-string", _set(extra_tokens="1"), ("extra_tokens",)),
    ("plain", "extra-tokens-bool", _set(extra_tokens=True), ("extra_tokens",)),
    ("plain", "num-patches-plus-one", _set(num_patches=17), ("num_patches",)),
    ("plain", "num-patches-minus-one", _set(num_patches=15), ("num_patches",)),
    ("plain", "num-patches-zero", _set(num_patches=0), ("num_patches",)),
    ("plain", "num-patches-float", _set(num_patches=16.0), ("num_patches",)),
    ("plain", "qkv-blocks-fused", _set(qkv_blocks=[0, 1, 2]), ("qkv_blocks",)),
    ("plain", "qkv-blocks-odd", _set(qkv_blocks=[0, 0, 1]), ("qkv_blocks",)),
    ("plain", "qkv-blocks-an-int", _set(qkv_blocks=0), ("qkv_blocks",)),
    ("plain", "qkv-blocks-deleted", _deleted("qkv_blocks"), ()),  # specs saved before it: separate projections
    ("plain", "grid-inputs-flipped", _set(grid_inputs=True), ("grid_inputs",)),
    ("plain", "grid-inputs-a-string", _set(grid_inputs="no"), ("grid_inputs",)),
    ("plain", "backbone-the-model", _set(backbone=""), ()),  # this model's base model is the model itself
    ("plain", "backbone-a-path", _set(backbone="blocks"), ("backbone",)),
    ("plain", "prune-heads-flipped", _set(prune_heads=False), ("prune_heads",)),
    ("plain", "prune-heads-a-string", _set(prune_heads="yes"), ("prune_heads",)),
    ("plain", "excluded-missing", _set(excluded_from_budget=["pooler"]), ("excluded_from_budget",)),
    ("plain", "excluded-the-embedding", _set(excluded_from_budget=["embed"]), ("excluded_from_budget",)),
    ("plain", "excluded-a-block", _set(excluded_from_budget=["blocks.0"]), ("excluded_from_budget",)),
    ("plain", "excluded-the-backbone", _set(excluded_from_budget=[""]), ("excluded_from_budget",)),
    ("plain", "excluded-a-string", _set(excluded_from_budget="norm"), ("excluded_from_budget",)),
    ("plain", "excluded-deleted", _deleted("excluded_from_budget"), ()),  # specs saved before it: none
    ("plain", "embedding-cls", _set(embedding="cls"), ()),  # what represents an image: not what is sliced
    ("plain", "embedding-cls-dist-mean", _set(embedding="cls_dist_mean"), ()),
    ("plain", "embedding-unknown", _set(embedding="mean"), ("embedding",)),
    ("plain", "format-newer", _set(format=2), ("format",)),
    ("plain", "unknown-field", _set(head_tables=["bias"]), ("head_tables",)),
    ("plain", "a-list", lambda spec: [spec], ("JSON object",)),
    ("fused", "qkv-blocks-separate", _set(qkv_blocks=[0, 0, 0]), ("qkv_blocks",)),
    ("fused", "qkv-is-o", _set(q_proj="out", k_proj="out", v_proj="out"), ("o_proj", "qkv_blocks")),
    ("fused", "qkv-o-swapped", _set(q_proj="out", k_proj="out", v_proj="out", o_proj="qkv"), ("o_proj",)),
    ("fused", "one-of-qkv-renamed", _set(v_proj="to_v"), ("qkv_blocks",)),
    ("fused", "head-count-off", _set(head_count_attrs=["head_size"]), ("head_count_attrs",)),
    ("gated", "mlp-a-module", _set(mlp="ffn"), ("mlp",)),
    ("gated", "mlp-the-attention", _set(mlp="attn"), ("mlp_in",)),
    ("gated", "mlp-in-reordered", _set(mlp_in=["w_in", "w_gate"]), ("mlp_in/mlp_out",)),
    ("gated", "mlp-in-one-left-out", _set(mlp_in=["w_gate"]), ("mlp_in",)),
    ("gated", "mlp-in-the-output", _set(mlp_in=["w_gate", "w_out"]), ("mlp_in",)),
    ("gated", "mlp-out-an-input", _set(mlp_out="w_in"), ("mlp_out",)),
    ("timm", "backbone-the-base-model", _set(backbone=None), ("backbone",)),
    ("timm", "layers-one-block", _set(layers="timm_model.blocks.0"), ("layers",)),
    ("timm", "excluded-emptied", _set(excluded_from_budget=[]), ("excluded_from_budget",)),
    ("timm", "excluded-the-norm", _set(excluded_from_budget=["timm_model.norm"]), ("excluded_from_budget",)),
    ("timm", "excluded-missing", _set(excluded_from_budget=["timm_model.fc"]), ("excluded_from_budget",)),
    ("timm", "head-size-left-out", _set(head_size_attrs=[]), ("head_size_attrs",)),  # the forward reshapes to it
    ("timm", "head-count-renamed", _set(head_count_attrs=["heads"]), ("head_count_attrs",)),
    ("timm", "extra-tokens-plus-one", _set(extra_tokens=2), ("extra_tokens",)),
    ("timm", "prune-heads-flipped", _set(prune_heads=False), ("prune_heads",)),
]


def _edited_copy(saved, base, edit, tmp_path):
    folder = tmp_path / base
    shutil.copytree(saved[base][3], folder)
    config = json.loads((folder / "config.json").read_text())
    config["elastic_spec"] = edit(config["elastic_spec"])
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("base, name, edit, fields", EDITS, ids=[f"{b}-{n}" for b, n, _, _ in EDITS])
def test_an_edited_stored_spec_is_refused_by_name_before_slicing_or_loads_as_masked(saved, base, name, edit, fields,
                                                                                   tmp_path, monkeypatch):
    folder = _edited_copy(saved, base, edit, tmp_path)
    sliced = []
    load_weights = modeling.load_weights
    monkeypatch.setattr(modeling, "load_weights", lambda *args: (sliced.append(1), load_weights(*args))[1])
    if fields:
        with pytest.raises(hs.UnsupportedArchitectureError) as info:  # anything else (AttributeError...) fails
            hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
        message = str(info.value)
        assert "elastic_spec" in message and any(field in message for field in fields), message
        assert "Re-save" in message and len(message) < 700, message
        assert not sliced  # refused before the skeleton was cut or a weight read
        return
    model, ranking, stored, _ = saved[base]
    loaded = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    reference = hs.ElasticViTModel.from_pretrained(saved[base][3], sparsity=0.3)
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in reference.parameters())
    inputs = dummy_inputs(model, 2, seed=3)
    masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(0.3)))
    torch.testing.assert_close(_output(loaded, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


def test_the_edits_cover_every_field_of_the_stored_spec(saved):
    stored = json.loads((saved["plain"][3] / "config.json").read_text())["elastic_spec"]
    edited = set()
    for _, _, edit, _ in EDITS:
        changed = edit(stored)
        if isinstance(changed, dict):
            edited |= {key for key in {*stored, *changed} if stored.get(key, ...) != changed.get(key, ...)}
    assert set(stored) <= edited and len(EDITS) >= 60


def test_an_unedited_spec_loads_every_base(saved):
    for base, (model, ranking, stored, folder) in saved.items():
        loaded = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
        inputs = dummy_inputs(model, 2, seed=3)
        masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(0.3)))
        torch.testing.assert_close(_output(loaded, inputs), _output(masked, inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("known", [False, True], ids=["fresh-process", "structure-known-in-process"])
def test_a_deleted_spec_is_refused_naming_it_never_guessed(saved, tmp_path, monkeypatch, known):
    model, _, _, _ = saved["plain"]
    folder = _edited_copy(saved, "plain", lambda spec: spec, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["elastic_spec"]
    (folder / "config.json").write_text(json.dumps(config))
    if known:  # this process discovered (and proved) the structure: still not what the weights were saved with
        hs.rank(model, method="magnitude", show_progress=False)
    monkeypatch.setattr(discovery, "discover_spec", lambda *a, **k: pytest.fail("the loader guessed a spec"))
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    message = str(info.value)
    assert "no 'elastic_spec'" in message and "save_elastic" in message and "hf_snapvit_test_stored" in message
    assert len(message.replace(str(folder), "")) < 400


def test_a_model_read_with_transformers_has_its_edited_spec_refused_before_ranking(saved, tmp_path):
    folder = _edited_copy(saved, "plain", _set(head_count_attrs=["num_heads"]), tmp_path)
    model = AutoModel.from_pretrained(folder)  # dense, with the tampered spec in its config
    with pytest.raises(hs.UnsupportedArchitectureError, match="elastic_spec.*head_count_attrs"):
        hs.rank(model, method="magnitude", show_progress=False)
