"""The proof cannot pass a wrong guess: tiny module trees that a naive proof would pass (non-finite or integer
outputs, unit norms that hide a wrong slice, tied projections, a block or FFN run twice, a stem that dwarfs the
blocks) are refused in a few lines, before anything is ranked or written; the counts a budget is resolved with are
those the forward computes; and ``save_elastic`` loads what it staged before moving it into place."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn as nn
import transformers
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling

import hf_snapvit as hs
from hf_snapvit.architectures import discovery, get_spec
from hf_snapvit.architectures.budget import model_shape
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery import proof
from hf_snapvit.surgery.slicing import slice_model_
from helpers import CASES, masked_copy
from support.task_models import TASKS


class ProofConfig(PretrainedConfig):
    model_type = "hf_snapvit_test_proof"

    def __init__(self, width=32, depth=2, heads=4, ffn=48, image_size=32, patch_size=8, num_channels=3, hostile="",
                 **kwargs):
        self.width, self.depth, self.num_attention_heads, self.ffn = width, depth, heads, ffn
        self.image_size, self.patch_size, self.num_channels = image_size, patch_size, num_channels
        self.hostile = hostile  # which traps the model sets, comma-separated (see Mixer, Block and ProofModel)
        super().__init__(**kwargs)


def _traps(config) -> set[str]:
    return set(config.hostile.split(","))


class Mixer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads, self.head_size = config.num_attention_heads, config.width // config.num_attention_heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(config.width, config.width) for _ in range(3))
        self.proj = nn.Linear(config.width, config.width)
        # A per-head scale read by position (its first n entries for n heads): all ones, it hides that slicing
        # keeps the wrong entries.
        self.scale = nn.Parameter(torch.ones(config.num_attention_heads)) if "head-scale" in _traps(config) else None
        # One gate per head, read whole: a forward with fewer heads fails.
        self.gate = nn.Parameter(torch.ones(config.num_attention_heads)) if "head-gate" in _traps(config) else None
        # Keys and values from a learned memory of 8 tokens (cross-attention): its heads cost less than the formula's.
        self.memory = nn.Parameter(torch.randn(1, 8, config.width)) if "memory" in _traps(config) else None

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.view(b, y.shape[1], -1, self.head_size).transpose(1, 2)  # noqa: E731
        source = x if self.memory is None else self.memory.expand(b, -1, -1)
        out = nn.functional.scaled_dot_product_attention(split(self.to_q(x)), split(self.to_k(source)),
                                                         split(self.to_v(source)))
        if self.scale is not None:
            out = out * self.scale[None, :out.shape[1], None, None]
        if self.gate is not None:
            out = out * self.gate[None, :, None, None]
        return self.proj(out.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(config.width), nn.LayerNorm(config.width)
        self.mixer = Mixer(config)
        norm = [nn.LayerNorm(config.ffn)] if "ffn-norm" in _traps(config) else []  # over the FFN's features
        self.ff = nn.Sequential(nn.Linear(config.width, config.ffn), nn.GELU(), *norm,
                                nn.Linear(config.ffn, config.width))
        self.twice = "ffn-twice" in _traps(config)
        self.attention_runs = 2 if "attention-twice" in _traps(config) else 1
        self.gain = 1.0  # a plain attribute: save_pretrained does not keep it

    def forward(self, x):
        for _ in range(self.attention_runs):
            x = x + self.mixer(self.n1(x))
        x = x + self.gain * self.ff(self.n2(x))
        return x + self.ff(self.n2(x)) if self.twice else x


class ProofModel(PreTrainedModel):
    config_class = ProofConfig
    base_model_prefix = "proof"
    main_input_name = "pixel_values"

    def __init__(self, config):
        super().__init__(config)
        traps = _traps(config)
        # A heavy convolution over the pixels before the patches: the blocks are a small part of the FLOPs.
        self.stem = nn.Conv2d(config.num_channels, config.num_channels, 15, padding=7) if "stem" in traps else None
        self.patchify = nn.Conv2d(config.num_channels, config.width, config.patch_size, config.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, config.width))
        self.trunk = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.width)
        if "built-by-running" in traps:  # sizes itself by running layers, as timm's hybrid patch embedding does
            self.stem = nn.GroupNorm(1, config.num_channels)
            with torch.no_grad():
                self.grid = self.patchify(self.stem(torch.zeros(1, config.num_channels, config.image_size,
                                                                config.image_size))).shape[-1]
        if "cached-norm" in traps:  # a tensor computed from the weights while the model is built, never saved
            self.register_buffer("patch_norm", self.patchify.weight.detach().norm(), persistent=False)
        self.post_init()

    def forward(self, pixel_values, **kwargs):
        traps = _traps(self.config)
        if self.stem is not None:
            pixel_values = self.stem(pixel_values)
        x = self.patchify(pixel_values).flatten(2).transpose(1, 2)
        if "cached-norm" in traps:
            x = x / self.patch_norm
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1)
        for _ in range(3 if "looped" in traps else 1):
            for block in self.trunk:
                x = block(x)
        x = self.norm(x)
        if "integer" in traps:
            return (x.argmax(-1),)
        if "infinite" in traps:  # a masked logit as some heads return it: one -inf per image
            return BaseModelOutputWithPooling(last_hidden_state=torch.cat([x[:, :1] - float("inf"), x[:, 1:]], 1),
                                              pooler_output=x[:, 0])
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=x[:, 0])


class TiedProofModel(ProofModel):
    """Declares block 1's query projection tied to block 0's, as a class sharing weights across depth would."""

    _tied_weights_keys = {"trunk.1.mixer.to_q.weight": "trunk.0.mixer.to_q.weight"}


class TiedProofConfig(ProofConfig):
    model_type = "hf_snapvit_test_proof_tied"

    def __init__(self, **kwargs):  # (transformers gives a config subclass without an __init__ a generated one)
        super().__init__(**kwargs)


TiedProofModel.config_class = TiedProofConfig
for _config, _model in ((ProofConfig, ProofModel), (TiedProofConfig, TiedProofModel)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def _model(hostile: str = "", cls=ProofModel, config=ProofConfig, **options) -> ProofModel:
    torch.manual_seed(0)
    model = cls(config(hostile=hostile, **options)).eval()
    with torch.no_grad():
        for parameter in model.trunk.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    return model


def _wrong(model) -> hs.ArchitectureSpec:
    """Discovery's spec with the key projection named as the output projection: slicing cuts the wrong matrix."""
    spec = get_spec(model)
    wrong = dataclasses.replace(spec, o_proj="to_k")
    discovery.adopt_discovered(wrong, model)
    return wrong


def _refused(call, *args, limit: int = 500, **kwargs) -> str:
    """The message of the UnsupportedArchitectureError ``call`` raises, checked to fit a few lines (``limit``
    characters; before, 600 to 900)."""
    with pytest.raises(hs.UnsupportedArchitectureError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert len(message.splitlines()) <= 4 and len(message) <= limit, message
    assert "ProofModel" in message and "Found blocks trunk.*, attention mixer" in message  # the model, the modules
    return message


def test_a_wrong_guess_is_refused_in_a_few_lines_naming_the_modules_the_reason_and_the_fix():
    model = _model()
    message = _refused(proof.prove_spec, model, _wrong(model))
    first, found, fix = message.splitlines()
    assert first == ("hf_snapvit cannot prune this ProofModel ('hf_snapvit_test_proof'): slicing with it failed "
                     "(RuntimeError: mat1 and mat2 shapes cannot be multiplied (17x32 and 24x24)).")
    assert found == "Found blocks trunk.*, attention mixer (to_q, to_k, to_v, to_k), FFN ff (0 -> 2)."
    assert "register_architecture" in fix


def test_a_model_with_infinite_outputs_is_refused_whatever_the_guess(tmp_path):
    model = _model("infinite,head-scale")  # discovery's guess misses the per-head scale: it cannot be right
    # Before: the differences were NaN, the threshold infinite, and this wrong guess passed.
    message = _refused(proof.prove_spec, model, get_spec(model))
    assert "32 of its 576 output values on seeded random inputs are infinite or NaN" in message
    discovery.forget_discovered(model.config.model_type)
    _refused(hs.save_elastic, model, None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_model_without_floating_point_outputs_is_refused_by_name():
    message = _refused(hs.rank, _model("integer"), method="magnitude", show_progress=False)
    assert "returns no floating-point tensor (it returned tuple)" in message and "torch.cat" not in message


def test_the_proof_runs_on_perturbed_weights_so_unit_norms_cannot_hide_a_wrong_slice():
    model = _model("head-scale")
    for block in model.trunk:
        block.mixer.scale.data.fill_(1.0)  # as initialised: all ones
    spec = get_spec(model)
    keep = [(np.array([0, 2, 3]), np.arange(48))] * 2
    inputs = dummy_inputs(model, 1)
    sliced = slice_model_(copy.deepcopy(model), keep)  # keeps the scale's first three entries, not 0, 2 and 3
    torch.testing.assert_close(proof.float_output(sliced, inputs),
                               proof.float_output(masked_copy(model, keep), inputs))  # the trap: equal here
    state, before = torch.get_rng_state(), {k: v.clone() for k, v in model.state_dict().items()}
    message = _refused(proof.prove_spec, model, spec)
    assert "differs from the masked one" in message
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state and model are untouched
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with pytest.warns(UserWarning, match="keeps every attention head"):
        assert proof.ensure_proven(model).prune_heads is False  # the FFN alone can still be pruned


def _tie(model, block: int = 1) -> None:
    model.trunk[block].mixer.to_q.weight = model.trunk[0].mixer.to_q.weight


@pytest.mark.parametrize("how", ["declared", "shared", "same-block"])
def test_projections_shared_between_units_are_refused_before_anything_is_ranked_or_written(tmp_path, how):
    if how == "declared":
        model = _model(cls=TiedProofModel, config=TiedProofConfig, tie_word_embeddings=True)
        assert model.trunk[1].mixer.to_q.weight is model.trunk[0].mixer.to_q.weight  # transformers tied them
        named = "trunk.1.mixer.to_q.weight = trunk.0.mixer.to_q.weight (declared in _tied_weights_keys)"
    elif how == "shared":  # tied by hand, declared nowhere: before, ranked and saved, then refused at load
        model = _model()
        _tie(model)
        named = "trunk.0.mixer.to_q.weight = trunk.1.mixer.to_q.weight (one tensor)"
    else:  # one block listed twice in the stack
        model = _model()
        model.trunk[1] = model.trunk[0]
        named = "serves block 0 to_q and block 1 to_q"
    message = _refused(hs.rank, model, method="magnitude", show_progress=False)
    assert named in message and "shared with other modules" in message and "Untie them" in message
    _refused(hs.save_elastic, model, None, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_registered_specs_are_checked_for_shared_projections_and_shared_other_weights_are_fine():
    vit = CASES[0].build()  # a stock ViTModel with a query weight tied across blocks by its user
    spec = get_spec(vit)
    layers = vit.get_submodule(spec.layers)
    query = lambda index: layers[index].get_submodule(f"{spec.attention}.{spec.q_proj}")  # noqa: E731
    query(1).weight = query(0).weight
    with pytest.raises(hs.UnsupportedArchitectureError, match=f"{spec.layers}.0.{spec.attention}.{spec.q_proj}"
                                                              f".weight = {spec.layers}.1"):
        hs.rank(vit, method="magnitude", show_progress=False)
    model = _model()
    model.trunk[1].n1.weight = model.trunk[0].n1.weight  # norms are never sliced: sharing them is harmless
    assert proof.ensure_proven(model) is get_spec(model)


@pytest.mark.parametrize("hostile, saves", [("looped", 6528), ("ffn-twice", 4352)])
def test_forwards_that_run_a_block_or_an_ffn_more_than_once_are_refused(tmp_path, hostile, saves):
    model = _model(hostile)
    message = _refused(hs.save_elastic, model, None, tmp_path / "out")
    assert (f"removing one FFN neuron saves {saves} FLOPs per input where hf_snapvit's formula counts 2176 for 17 "
            "tokens: its forward runs a block or an FFN more than once") in message
    assert not (tmp_path / "out").exists()


def test_a_heavy_stem_is_no_reason_to_refuse_and_budgets_count_its_flops():
    model = _model("stem")  # before: refused, its blocks "a small part of it"; budgets now measure what runs
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    _, dense = proof._counted(copy.deepcopy(model).requires_grad_(False), dummy_inputs(model, 1))
    shape = ranking.shape
    assert shape.other_flops > 2 * (shape.flops() - shape.other_flops)  # the stem is most of it
    assert shape.flops() == dense + shape.softmax_flops()


@pytest.mark.parametrize("hostile, why", [
    # Keys and values from an 8-token memory: one head saves 0.86 of its q/k/v/o rows' FLOPs, which passed before.
    ("memory", "where its q/k/v/o rows alone cost 3.482e+04: some see fewer tokens"),
    ("attention-twice", "counts at most 44064: its forward runs attention more than once"),
])
def test_heads_whose_flops_are_not_the_formulas_are_kept_with_a_warning_and_the_dense_count_is_measured(hostile, why):
    model = _model(hostile)
    with pytest.warns(UserWarning, match="keeps every attention head and prunes FFN neurons only") as caught:
        ranking = hs.rank(model, method="magnitude", show_progress=False)
    assert any(why in str(w.message) and len(str(w.message)) < 400 for w in caught), [str(w.message) for w in caught]
    assert ranking.floors()[0] == ranking.shape.num_heads
    _, dense = proof._counted(copy.deepcopy(model).requires_grad_(False), dummy_inputs(model, 1))
    assert ranking.shape.flops() == dense + ranking.shape.softmax_flops()


def test_windowed_attention_whose_projections_see_every_token_prunes_heads():
    from support.fused import perturbed, sam

    model = perturbed(sam())  # SAM: windowed attention in block 0, global in block 1
    assert proof.ensure_proven(model).prune_heads


def test_when_neither_heads_nor_neurons_slice_the_one_reason_is_named_not_the_shape_errors():
    message = _refused(hs.rank, _model("head-gate,ffn-norm"), method="magnitude", show_progress=False)
    first = message.splitlines()[0]
    # Before: the two slices' shape errors, as the reasons. The norm over the FFN's features stops every guess.
    assert "its FFN's 48 hidden features pass through trunk.0.ff.2 (LayerNorm)" in first
    assert "slicing with it failed" not in message and "Keeping every head" not in message
    # One reason named once: with a per-head scale read by position, slicing runs and only the norm fails.
    message = _refused(hs.rank, _model("head-scale,ffn-norm"), method="magnitude", show_progress=False)
    assert message.count("trunk.0.ff.2 (LayerNorm)") == 1 and "Keeping every head" not in message


def test_snapvit_pruner_fit_proves_the_model_first(tmp_path):
    from helpers import PROCESSOR, TINY_SNAPVIT, images

    tied = _model()
    _tie(tied)
    message = _refused(hs.SnapViTPruner(hs.SnapViTConfig(**TINY_SNAPVIT)).fit, tied, images(12),
                       processor=PROCESSOR, show_progress=False)
    assert "tied or shared with other modules" in message  # before: ranked, and refused only when loaded
    model = _model("head-scale")  # discovery's first guess cannot slice heads: every one is kept
    with pytest.warns(UserWarning, match="keeps every attention head"):
        ranking = hs.SnapViTPruner(hs.SnapViTConfig(**TINY_SNAPVIT)).fit(model, images(12), processor=PROCESSOR,
                                                                         show_progress=False)
    assert ranking.min_head_keep_ratio == 1.0 and ranking.shape.other_flops is not None


def test_a_mobilevit_whose_transformer_sees_fewer_tokens_than_its_pixels_is_refused_by_its_flop_counts():
    torch.manual_seed(0)  # before: ranked, with GFLOPs 40x what its forward computes
    model = transformers.MobileViTModel(transformers.MobileViTConfig(
        image_size=64, patch_size=2, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 40, 48, 64]))
    message = str(pytest.raises(hs.UnsupportedArchitectureError, hs.rank, model.eval(), method="magnitude",
                                show_progress=False).value)
    assert "for 3 blocks of 1024 tokens counts" in message
    assert "its blocks see fewer tokens than the image has patches (hierarchical stages" in message


def test_sliced_flops_and_parameters_are_what_the_model_shape_predicts():
    model = _model()
    shape = model_shape(model)
    inputs = dummy_inputs(model, 1)
    _, dense = proof._counted(model.requires_grad_(False), inputs)
    sliced = slice_model_(copy.deepcopy(model), [(np.arange(3), np.arange(20))] * 2)
    _, small = proof._counted(sliced, inputs)
    proj, attention, neuron = shape.unit_flops()
    # Every matrix product is counted, the CPU's scaled-dot-product attention included; the softmax is not.
    assert dense == shape.flops() - shape.softmax_flops()
    assert dense - small == 2 * (proj + attention) + 2 * 28 * neuron
    assert sum(p.numel() for p in sliced.parameters()) == shape.num_params([3, 3], [20, 20])


@pytest.mark.parametrize("case", [*CASES, *TASKS], ids=str)
def test_every_registered_family_and_task_model_passes_the_proof_with_its_counts(case):
    """Registered specs are not proven at run time (only checked for shared projections): here, their parameter and
    FLOP counts too. A task model's proof runs on its vision encoder, as for a discovered one."""
    model = case.build() if case in CASES else case.model()
    encoder = model.get_submodule(get_spec(model).encoder)
    differences = proof.prove_spec(encoder, get_spec(encoder))
    assert max(differences.values()) < 1e-4


def test_a_checkpoint_that_does_not_load_back_is_not_written(tmp_path):
    model = _model("cached-norm")  # loading builds the model on the meta device: the cached norm has no value
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    with pytest.raises(hs.CheckpointError, match="save_elastic wrote nothing to .* does not load back at sparsity"):
        hs.save_elastic(model, ranking, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_that_loads_as_another_model_is_not_written(tmp_path):
    model = _model()
    model.trunk[0].gain = 0.5  # set after it was built: a model built from its config.json has 1.0
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    with pytest.raises(hs.CheckpointError, match=r"outputs differ from the masked model's"):
        hs.save_elastic(model, ranking, tmp_path / "out", model_card=False)
    assert not (tmp_path / "out").exists()


def test_a_model_that_runs_a_layer_while_it_is_built_loads_at_every_size(tmp_path):
    model = _model("built-by-running")  # before: every load failed ("Tensor on device meta ...")
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    discovery._DISCOVERED.clear()
    inputs = dummy_inputs(model, 2, seed=3)
    for sparsity in (0.1, 0.3):
        sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=sparsity)
        masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(sparsity)))
        torch.testing.assert_close(proof.float_output(sliced, inputs), proof.float_output(masked, inputs),
                                   rtol=1e-4, atol=1e-5)


def _hybrid(width: int = 32) -> transformers.PreTrainedModel:
    pytest.importorskip("timm", reason="timm is part of the [test] extra")
    torch.manual_seed(0)
    config = transformers.TimmWrapperConfig(architecture="vit_tiny_r_s16_p8_224", num_labels=5,
                                            model_args=dict(img_size=32, embed_dim=width, depth=2, num_heads=4),
                                            pretrained_cfg={"input_size": [3, 32, 32]})
    return transformers.TimmWrapperForImageClassification(config).eval()


def test_a_timm_hybrid_vit_counts_the_tokens_its_stem_leaves():
    # (32 / 8)² = 16 patches by the formula; the ResNet stem's stride 4 leaves one 8-px patch: the patch embedding
    # gives 1, and the blocks see it with the class token. GFLOP budgets are counted with those 2 tokens.
    model = _hybrid()
    spec = get_spec(model)
    assert (spec.num_patches(model.config), spec.extra_tokens(model.config)) == (1, 1)
    assert model_shape(model).num_tokens == 2


def test_a_timm_hybrid_vit_with_a_resnet_stem_loads_sliced_equal_to_masking(tmp_path):
    model = _hybrid(width=192)  # wide enough that its blocks, not its stem, do most of the work
    ranking = hs.rank(model, method="magnitude", show_progress=False)  # proven, counts included, with its own spec
    stored = hs.save_elastic(model, ranking, tmp_path, model_card=False)  # its load round trip passes
    discovery._DISCOVERED.clear()
    inputs = dummy_inputs(model, 2, seed=3)
    assert stored.floors()[0] < stored.shape.num_heads  # heads are pruned, not only neurons
    for sparsity in (0.1, 0.3):
        sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=sparsity)
        masked = masked_copy(model, ranking.keep_indices(stored.keep_counts(sparsity)))
        torch.testing.assert_close(proof.float_output(sliced, inputs), proof.float_output(masked, inputs),
                                   rtol=1e-4, atol=1e-5)
