"""The hostile zoo's case table (tests/architectures/test_hostile_zoo.py): tiny module trees that almost look like
ViTs, each with what is correct for it.

``works``: must rank, save and load, equal to the independent mask. ``refuse``: must raise an hf_snapvit error that
fits a few lines and matches ``reason``, writing nothing. ``works_or_refuse``: either, never a silent wrong slice;
keeping every head and pruning FFN neurons only is a correct outcome wherever heads cannot be sliced, and so is
pruning one of several stacks with a warning that says so. Wrong parameter or GFLOP counts are wrong results too.
A corrupt ``elastic_spec`` (an edit of a saved working case's config.json) must be refused naming ``elastic_spec`` and
the field (``reason``), or load a correct slice.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from support import zoo

PROOF = r"differ|mask"  # what a refusal from a failed proof says
TIED = r"tie|shar"
NON_FINITE = r"finite|inf|nan"
REUSED = r"loop|more than once|twice|times|called|reus"
DELETE = object()  # an edit that removes elastic_spec altogether


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    zoo: dict = field(default_factory=dict)
    expect: str = "works"  # "works" | "refuse" | "works_or_refuse"
    reason: str = ""  # a refusal's message must match this regex (case-insensitive)
    config: dict = field(default_factory=dict)  # config entries set (None: removed) over the standard ones
    prune_heads: bool = False  # "works": the ranking must be able to drop heads
    method: str = "magnitude"
    any_size: bool = False  # the model runs at any image size: GFLOPs are checked at the size hf_snapvit chose
    base: str = ""  # corrupt specs: the case whose saved checkpoint is edited
    edit: Callable[[Any], Any] | None = None  # corrupt specs: elastic_spec -> the edited one (or DELETE)

    def __repr__(self) -> str:
        return self.name

    @property
    def options(self) -> dict:
        return zoo.merge(zoo.DEFAULTS, self.zoo)

    def config_entries(self) -> dict:
        z = self.options
        entries = dict(hidden_size=z["width"], num_hidden_layers=z["depth"], num_attention_heads=z["attn"]["heads"],
                       intermediate_size=z["ffn"]["width"], image_size=z["image"], patch_size=z["patch"],
                       num_channels=z["channels"])
        if z["frames"]:
            entries["num_frames"] = z["frames"]
        if z["embed"] == "ids":
            entries = dict(hidden_size=z["width"], num_hidden_layers=z["depth"], vocab_size=100,
                           num_attention_heads=z["attn"]["heads"], intermediate_size=z["ffn"]["width"])
        entries.update(self.config)
        return {k: v for k, v in entries.items() if v is not None}

    def build(self):
        """The case's model, seeded by its name: each case ranks (and so keeps) different units."""
        return zoo.build(self.name, self.zoo, self.config_entries(), seed=zlib.crc32(self.name.encode()))

    def inputs(self, batch: int, seed: int = 1) -> dict:
        z, generator = self.options, torch.Generator().manual_seed(seed)
        if z["embed"] == "ids":
            return {"input_ids": torch.randint(0, 100, (batch, 12), generator=generator)}
        shape = (batch, z["channels"], z["image"], z["image"])
        if z["embed"] == "clip":
            shape = (batch, z["frames"], *shape[1:])
        elif z["frames"]:  # frames flattened into the batch
            shape = (batch * z["frames"], *shape[1:])
        asked = {"output_hidden_states": True} if z["capture"] else {}
        return {"pixel_values": torch.randn(shape, generator=generator), **asked}


def works(name, kind, zoo=None, heads=True, **kw):
    return Case(name, kind, zoo or {}, "works", prune_heads=heads, **kw)


def either(name, kind, reason, zoo=None, **kw):
    return Case(name, kind, zoo or {}, "works_or_refuse", reason, **kw)


def refuse(name, kind, reason, zoo=None, **kw):
    return Case(name, kind, zoo or {}, "refuse", reason, **kw)


def _attn(**a):
    return {"attn": a}


def _ffn(**f):
    return {"ffn": f}


def _block(**b):
    return {"block": b}


NO_BIAS = (False, False, False, False)
PLAIN = [
    works("plain", "plain"),
    works("plain-manual-attention", "plain", _attn(impl="manual")),
    works("plain-random-ranking", "plain", method="random"),
    works("no-bias-anywhere", "plain", {**_attn(bias=NO_BIAS), **_ffn(bias=(False, False))}),
    works("no-bias-q-k", "plain", _attn(bias=(False, False, True, True))),
    works("no-bias-v-o", "plain", _attn(bias=(True, True, False, False))),
    works("no-bias-ffn-out", "plain", _ffn(bias=(True, False))),
    works("names-query-key-value-dense", "plain", _attn(names=("query", "key", "value", "dense"))),
    works("names-to-q-to-out", "plain", _attn(names=("to_q", "to_k", "to_v", "to_out"))),
    works("names-q-proj-out-proj", "plain", _attn(names=("q_proj", "k_proj", "v_proj", "out_proj"))),
    works("names-odd", "plain", _attn(names=("alpha", "beta", "gamma", "delta"))),
    # q, k and v are symmetric for slicing: a forward that uses them in another order slices the same.
    works("names-odd-value-first", "plain", _attn(names=("alpha", "beta", "gamma", "delta"), order=(2, 0, 1))),
    works("names-clear-key-first", "plain", _attn(order=(1, 2, 0))),
    works("fused-qkv", "plain", _attn(fused=True, names=("qkv", "qkv", "qkv", "proj"))),
    works("fused-qkv-no-bias", "plain", _attn(fused=True, names=("qkv", "qkv", "qkv", "proj"), bias=NO_BIAS)),
    works("gated-ffn", "plain", _ffn(kind="gated", names=("w_gate", "w_up", "w_down"), act="silu")),
    works("gated-ffn-no-bias", "plain", _ffn(kind="gated", names=("w1", "w3", "w2"), act="silu",
                                             bias=(False, False))),
    works("packed-ffn", "plain", _ffn(kind="packed", act="silu")),
    works("sequential-ffn", "plain", _ffn(sequential=True)),
    works("post-norm", "plain", _block(norm="post")),
    works("rms-norm", "plain", _block(norm_kind="rms")),
    works("layer-scale", "plain", _block(layer_scale=True)),
    works("no-cls-token", "plain", {"cls": 0}),
    works("registers", "plain", {"registers": 4}),
    works("distillation-token", "plain", {"cls": 2}),
    works("no-position-embedding", "plain", {"pos": False}),
    works("parallel-block", "plain", _block(parallel=True)),
    works("act-relu", "plain", _ffn(act="relu")),
    works("act-silu", "plain", _ffn(act="silu")),
    works("act-tanh", "plain", _ffn(act="tanh")),
    works("act-quick-gelu", "plain", _ffn(act="quick_gelu")),
    works("heads-8", "plain", _attn(heads=8)),
    works("heads-2", "plain", _attn(heads=2)),
    works("depth-3", "plain", {"depth": 3}),
    works("width-16", "plain", {"width": 16, **_attn(heads=2), **_ffn(width=24)}),
    works("width-24-heads-3", "plain", {"width": 24, **_attn(heads=3), **_ffn(width=40)}),
    works("image-16", "plain", {"image": 16}),
    works("patch-4", "plain", {"patch": 4}),
    works("classifier-head", "plain", {"classifier": 5}),
    works("stack-named-layers", "plain", {"stack": "layers"}),
    works("modules-named-self-attention", "plain", _block(attn_name="self_attention", ffn_name="feed_forward")),
    works("split-by-head-count", "plain", _attn(split="count_attr")),
    works("split-by-both-attributes", "plain", _attn(split="both_attr")),
    works("merge-by-all-head-size", "plain", _attn(size_attr="all_head_size", merge="all_head_size")),
    # The forward reshapes to an embed_dim (no "head" in its name) that must follow the heads: discovery's 2nd guess.
    works("merge-by-embed-dim", "plain", _attn(size_attr="embed_dim", merge="embed_dim")),
    works("qk-norm-per-head", "plain", _attn(qk_norm="head")),
    works("non-persistent-buffer", "plain", {"buffer": True}),
    # A hybrid's stem must load (issue 63: meta tensors left after loading); its FLOPs count in the dense GFLOPs.
    works("hybrid-conv-stem", "plain", {"embed": "stem"}),
]
HEAD_DIM = [
    works("head-dim-16-wider-than-model", "head-dim", _attn(head_dim=16)),
    works("head-dim-4-narrower-than-model", "head-dim", _attn(heads=2, head_dim=4)),
    # One head's width equals the head count: the attributes' values alone cannot tell which is which.
    works("head-dim-equals-head-count", "head-dim", _attn(head_dim=4)),
    works("head-dim-12", "head-dim", _attn(head_dim=12)),
    works("head-size-and-n-heads-names", "head-dim", _attn(head_dim=16, width_attr="head_size", count_attr="n_heads")),
    # No attribute names one head's width: the traced reshape of q into heads does (issue 63, point 5).
    works("head-width-only-in-forward", "head-dim", _attn(count_attr=None, width_attr=None, split="const_width")),
    works("head-count-nowhere", "head-dim", _attn(count_attr=None, width_attr=None, split="const_width"),
          config={"num_attention_heads": None}),
    works("head-count-attribute-only", "head-dim", _attn(width_attr=None, split="count_attr")),
]
PER_HEAD = [  # heads that cannot be sliced by the q/k/v/o projections alone: keeping every head is correct
    either("talking-heads-after-softmax", "per-head", PROOF + "|talk|mix", _attn(talking="post")),
    either("talking-heads-before-softmax", "per-head", PROOF + "|talk|mix", _attn(talking="pre")),
    either("head-gates", "per-head", PROOF + "|gate", _attn(gate=True)),
    either("per-head-temperature", "per-head", PROOF + "|temperature", _attn(temperature=True)),
    either("per-head-output-bias", "per-head", PROOF + "|bias", _attn(head_bias=True)),
    either("per-head-position-table", "per-head", PROOF + "|table", _attn(table=True)),
    either("qk-norm-over-all-heads", "per-head", PROOF + "|norm", _attn(qk_norm="full")),
    # The forward splits into a fixed number of heads: with fewer it runs, with heads of the wrong width.
    either("head-count-fixed-in-forward", "per-head", PROOF, _attn(split="const_count")),
    # The forward merges heads back to a fixed width (timm's EVA): with fewer heads it cannot run.
    either("merge-to-fixed-width", "per-head", PROOF, _attn(merge="const")),
    either("gqa-2-kv-heads", "per-head", PROOF + r"|key|value|k/v|group|query", _attn(kv_heads=2)),
    either("mqa-1-kv-head", "per-head", PROOF + r"|key|value|k/v|group|query", _attn(kv_heads=1)),
    # Keys and values from a fixed memory: slices cleanly, but its FLOPs are not a self-attention's.
    either("cross-attention-to-memory", "per-head", PROOF + r"|memory|cross|token|flop", _attn(memory=8)),
]
FFN_NORM = [  # a norm over the FFN's hidden features: its statistics change when a neuron goes
    either("ffn-layernorm", "ffn-norm", PROOF + "|norm", _ffn(norm="layer")),
    either("ffn-rmsnorm", "ffn-norm", PROOF + "|norm", _ffn(norm="rms")),
    either("gated-ffn-layernorm", "ffn-norm", PROOF + "|norm",
           _ffn(kind="gated", names=("g", "u", "d"), norm="layer")),
    either("sequential-ffn-layernorm", "ffn-norm", PROOF + "|norm", _ffn(sequential=True, norm="layer")),
    # Without weights the norm runs at any width: only the values show that a slice is not the mask.
    either("ffn-norm-without-weights", "ffn-norm", PROOF + "|norm", _ffn(norm="free")),
    # Neither heads (gates) nor neurons (norm) can go: a refusal, unless per-head gates are sliced with the heads.
    either("ffn-norm-and-head-gates", "ffn-norm", PROOF + "|norm|gate", {**_ffn(norm="layer"), **_attn(gate=True)}),
]
TIED_CASES = [  # a unit tied across blocks must be kept (or dropped) in both, or the model refused
    either("tied-q-module", "tied", TIED, {"tie": "q"}),
    either("tied-q-declared", "tied", TIED, {"tie": "q_declared"}),
    either("tied-q-parameter", "tied", TIED, {"tie": "q_param"}),
    either("tied-fc1-parameter", "tied", TIED, {"tie": "fc1_param"}),
    either("tied-ffn-module", "tied", TIED, {"tie": "ffn"}),
    either("tied-o-module", "tied", TIED, {"tie": "o"}),
    either("tied-attention-module", "tied", TIED, {"tie": "attn"}),
    # One matrix is both the attention's output projection and the FFN's: heads and neurons cut the same columns.
    either("o-proj-shared-with-ffn", "tied", TIED + r"|FFN|output projection|could not match",
           {"tie": "o_ffn", **_attn(heads=6, head_dim=8), **_ffn(width=48)}),
]
REUSE = [  # slicing equals masking, but FLOPs run more than once: GFLOP budgets must count what runs
    either("looped-block-3-times", "reuse", REUSED, {"layout": "loop"}),
    either("looped-block-depth-3", "reuse", REUSED, {"layout": "loop", "depth": 3}),
    either("ffn-called-twice", "reuse", REUSED, _block(ffn_twice=True)),
    either("attention-called-twice", "reuse", REUSED, _block(attn_twice=True)),
]
OUTPUTS = [
    works("output-dict", "outputs", {"output": "dict"}),
    works("output-tuple", "outputs", {"output": "tuple"}),
    works("output-list", "outputs", {"output": "list"}),
    works("output-nested", "outputs", {"output": "nested"}),
    works("output-with-integers", "outputs", {"output": "int_extra"}),
    # hidden_states recorded by transformers' output-capturing hooks, keyed by the model's class (issue 63, point 1).
    works("output-hidden-states-recorded", "outputs", {"capture": True}),
    works("output-hidden-states-recorded-fused", "outputs",
          {"capture": True, **_attn(fused=True, names=("qkv", "qkv", "qkv", "proj"))}),
    refuse("output-integers-only", "outputs", r"float", {"output": "int_only"}),
    refuse("output-no-tensor", "outputs", r"float|tensor", {"output": "no_tensor"}),
    # Non-finite outputs on normal inputs: refused, or compared where finite (never a proof fooled by inf - inf).
    either("output-inf-mask", "non-finite", NON_FINITE, {"output": "inf_extra"}),
    either("output-nan-score", "non-finite", NON_FINITE, {"output": "nan_extra"}),
    either("output-inf-in-pooled", "non-finite", NON_FINITE, {"output": "inf_pooled"}),
    refuse("output-all-nan", "non-finite", NON_FINITE, {"output": "nan_all"}),  # nothing to compare: unprovable
    # inf beside talking heads: a proof that compares inf - inf (NaN) would pass a wrong head slice.
    either("output-inf-with-talking-heads", "non-finite", NON_FINITE + "|" + PROOF,
           {"output": "inf_extra", **_attn(talking="post")}),
    either("output-nan-with-head-gates", "non-finite", NON_FINITE + "|" + PROOF,
           {"output": "nan_extra", **_attn(gate=True)}),
    # ... and beside structures that run when sliced wrongly, where only the values can tell.
    either("output-inf-with-fixed-head-count", "non-finite", NON_FINITE + "|" + PROOF,
           {"output": "inf_extra", **_attn(split="const_count")}),
    either("output-inf-with-ffn-norm-without-weights", "non-finite", NON_FINITE + "|" + PROOF,
           {"output": "inf_pooled", **_ffn(norm="free")}),
    either("output-nan-with-ffn-norm-without-weights", "non-finite", NON_FINITE + "|" + PROOF,
           {"output": "nan_extra", **_ffn(norm="free")}),
]
SHAPES = [
    either("blocks-differ-in-ffn-width", "hetero", r"differ|width",
           {"per_block": [_ffn(width=48), _ffn(width=64)]}),
    either("blocks-differ-in-heads", "hetero", r"differ|head",
           {"per_block": [_attn(heads=4), _attn(heads=2)]}),
    either("blocks-differ-in-head-dim", "hetero", r"differ|head|width",
           {"per_block": [_attn(head_dim=8), _attn(head_dim=16)]}),
    # Several stacks: every stack pruned, or one with a warning (issue 63, point 5); GFLOPs still count them all.
    either("hierarchical-stages", "stacks", r"hierarch|stage|plain ViT|stack", {"layout": "stages", "cls": 0}),
    either("no-repeated-block-stack", "stacks", r"stack|repeated", {"layout": "no_stack"}),
    # A larger stack the forward never calls: pruning it would remove parameters and no computation. Borderline: a
    # refusal must say the stack is not used (pruning the stack the forward does use is better still).
    either("unused-larger-stack", "stacks", r"unused|not used|never|stack", {"layout": "unused"}),
    either("two-block-stacks", "stacks", r"stack", {"layout": "two_stacks"}),
    # Not vision transformers: out of scope, refused for the reason (not an AttributeError on a missing patch_size).
    refuse("text-model-input-ids", "not-a-vit", r"pixel_values|input_ids|image", {"embed": "ids", "pos": True}),
    refuse("conv-only", "not-a-vit", r"attention|transformer|nn\.Linear|projection",
           {"layout": "conv_only", "cls": 0}),
    refuse("mlp-mixer", "not-a-vit", r"attention|transformer|nn\.Linear|projection|could not match",
           {"layout": "mixer"}),
]
CONFIGS = [
    # The position embedding fixes the size; the config does not name it (issue 63, point 4).
    either("no-image-size-in-config", "config", r"image_size|image size", config={"image_size": None}),
    works("no-patch-size-in-config", "config", config={"patch_size": None}),
    works("no-sizes-any-resolution", "config", {"pos": False}, config={"image_size": None, "patch_size": None},
          any_size=True),
    works("sizes-as-lists", "config", config={"image_size": [32, 32], "patch_size": [8, 8]}),
    either("linear-patch-embedding-no-patch-size", "config", r"patch_size|patch size", {"embed": "linear"},
           config={"patch_size": None}),
    # The config's head count is not the model's (8 heads of 4 vs the modules' 4 of 8): the modules decide.
    either("config-head-count-lies", "config", PROOF + "|head", config={"num_attention_heads": 8}),
    works("config-without-head-count", "config", config={"num_attention_heads": None}),
    # A video tower that takes every clip's frames flattened into the batch, [B*T, C, H, W] (X-CLIP's).
    either("video-frames-in-batch", "video", r"num_frames|frames|video|clip", {"frames": 2}),
    works("video-clip-one-sequence", "video", {"embed": "clip", "frames": 2}, config={"tubelet_size": 1}),
]


def _set(**changes):
    return lambda spec: {**spec, **changes}


def _spec(name, edit, reason, expect="works_or_refuse", base="spec-base"):
    return Case(f"spec-{name}", "corrupt-spec", expect=expect, reason=reason, base=base, edit=edit)


SPEC_BASES = [
    works("spec-base", "corrupt-spec-base", _attn(split="both_attr")),
    works("spec-base-fused", "corrupt-spec-base", _attn(fused=True, names=("qkv", "qkv", "qkv", "proj"))),
]
SPECS = [
    # Every edit is refused naming elastic_spec and the field, or loads a correct slice; these two cannot load.
    _spec("not-an-object", lambda spec: [spec], r"object|dict", expect="refuse"),
    _spec("deleted", lambda spec: DELETE, r"elastic_spec"),
    _spec("deleted-second-guess", lambda spec: DELETE, r"elastic_spec", base="merge-by-embed-dim"),
    _spec("format-newer", _set(format=2), r"format", expect="refuse"),
    _spec("unknown-field", _set(frobnicate=1), r"frobnicate"),
    _spec("layers-missing", _set(layers="nope"), r"layers"),
    _spec("layers-not-a-list", _set(layers="embed"), r"layers"),
    _spec("layers-one-block", _set(layers="blocks.0"), r"layers"),
    _spec("layers-the-model", _set(layers=""), r"layers"),
    _spec("layers-integer", _set(layers=5), r"layers"),
    _spec("attention-missing", _set(attention="nope"), r"attention"),
    _spec("attention-is-ffn", _set(attention="mlp"), r"attention|q_proj"),
    _spec("q-missing", _set(q_proj="nope"), r"q_proj"),
    _spec("q-is-the-attention", _set(q_proj=""), r"q_proj"),
    _spec("q-k-swapped", _set(q_proj="k", k_proj="q"), r"q_proj|k_proj"),
    _spec("k-is-q", _set(k_proj="q"), r"k_proj|q_proj"),
    _spec("v-is-o", _set(v_proj="o"), r"v_proj|o_proj"),
    _spec("o-is-q", _set(o_proj="q"), r"o_proj|q_proj"),
    _spec("o-is-v", _set(o_proj="v"), r"o_proj|v_proj"),
    _spec("o-is-fc2", _set(o_proj="fc2"), r"o_proj"),
    _spec("mlp-is-attention", _set(mlp="attn"), r"mlp"),
    _spec("mlp-missing", _set(mlp="nope"), r"mlp"),
    _spec("mlp-in-is-out", _set(mlp_in=["fc2"]), r"mlp_in"),
    _spec("mlp-out-is-in", _set(mlp_out="fc1"), r"mlp_out"),
    _spec("mlp-in-out-swapped", _set(mlp_in=["fc2"], mlp_out="fc1"), r"mlp_in|mlp_out"),
    _spec("mlp-in-twice", _set(mlp_in=["fc1", "fc1"]), r"mlp_in"),
    _spec("mlp-in-missing", _set(mlp_in=["nope"]), r"mlp_in"),
    _spec("mlp-in-a-string", _set(mlp_in="fc1"), r"mlp_in"),
    _spec("head-width-missing", _set(head_width="nope"), r"head_width"),
    _spec("head-width-is-the-count", _set(head_width="num_heads"), r"head_width"),
    _spec("head-count-attrs-wrong", _set(head_count_attrs=["head_dim"]), r"head_count_attrs"),
    # The forward splits by num_heads: a spec that no longer updates it cannot load a correct slice.
    _spec("head-count-attrs-empty", _set(head_count_attrs=[]), r"head_count_attrs"),
    _spec("head-size-attrs-wrong", _set(head_size_attrs=["num_heads"]), r"head_size_attrs"),
    _spec("extra-tokens-wrong", _set(extra_tokens=5), r"extra_tokens"),
    _spec("extra-tokens-fraction", _set(extra_tokens=1.5), r"extra_tokens"),
    _spec("num-patches-wrong", _set(num_patches=64), r"num_patches"),
    _spec("num-patches-zero", _set(num_patches=0), r"num_patches"),
    _spec("qkv-blocks-short", _set(qkv_blocks=[0, 0]), r"qkv_blocks"),
    _spec("qkv-blocks-fused-on-separate", _set(qkv_blocks=[0, 1, 2]), r"qkv_blocks"),
    _spec("prune-heads-a-string", _set(prune_heads="no"), r"prune_heads"),
    # A ranking that drops heads under a spec that says heads cannot go: refused, or a correct (all-heads) load.
    _spec("prune-heads-false", _set(prune_heads=False), r"prune_heads"),
    _spec("embedding-unknown", _set(embedding="mean"), r"embedding"),
    _spec("backbone-missing", _set(backbone="nope"), r"backbone"),
    _spec("excluded-the-blocks", _set(excluded_from_budget=["blocks"]), r"excluded_from_budget"),
    _spec("excluded-missing", _set(excluded_from_budget=["nope"]), r"excluded_from_budget"),
    _spec("grid-inputs-on-pixels", _set(grid_inputs=True), r"grid_inputs"),
    _spec("fused-v-is-proj", _set(v_proj="proj"), r"v_proj|qkv", base="spec-base-fused"),
    _spec("fused-qkv-blocks-zero", _set(qkv_blocks=[0, 0, 0]), r"qkv_blocks", base="spec-base-fused"),
]

CASES = [*PLAIN, *HEAD_DIM, *PER_HEAD, *FFN_NORM, *TIED_CASES, *REUSE, *OUTPUTS, *SHAPES, *CONFIGS, *SPEC_BASES,
         *SPECS]
BY_NAME = {case.name: case for case in CASES}
assert len(BY_NAME) == len(CASES), "zoo case names must be unique"
