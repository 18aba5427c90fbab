"""GFLOPs that match what runs (issue 63): ``ModelShape.other_flops`` measures what one forward computes beyond the
paper's formulas (a convolutional stem, a second block stack), on the model's meta-device twin, so that the layout's
``gflops``, ``keep_counts(target_gflops=...)``, ``estimate_gflops`` and the model card agree with torch's FLOP counter
run on the loaded models; the share of a model with several block stacks that is pruned is said once, and carded."""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import ModelCard
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import hf_snapvit as hs
from hf_snapvit.architectures import discovery, flops as measuring, prunable
from hf_snapvit.architectures.budget import ModelShape, model_shape
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.architectures.skeleton import skeleton
from hf_snapvit.errors import RankingFormatError
from hf_snapvit.surgery import proof
from helpers import CASES
from support.zoo_cases import BY_NAME

CASE = {c.name: c for c in CASES}


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


def _run(model, inputs) -> int:
    """What one forward computes, counted independently of hf_snapvit (attention by torch's own formula)."""
    model = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(**inputs)
    return counter.get_total_flops()


@pytest.mark.parametrize("name", ["vit", "dinov2-registers", "clip-vision", "beit", "siglip2-vision"])
def test_the_meta_device_count_is_the_count_of_the_model_itself(name):
    model = CASE[name].build().eval()
    inputs = dummy_inputs(model, 1)
    counted = measuring.forward_flops(model)  # shapes-only (siglip2's .item() runs it with the weights)
    assert counted.total == _run(model, inputs) > 0
    assert measuring.forward_flops(model, expected=1e6) == counted  # a small forward, run with the weights
    assert counted.modules[""] == counted.total and any(path.startswith(("encoder.", "vision_model.", "layers"))
                                                        for path in counted.modules)


def test_a_bfloat16_model_is_counted_shapes_only_as_in_float32(monkeypatch):
    model = CASE["vit"].build().to(torch.bfloat16)
    expected = _run(model.float(), dummy_inputs(model, 1))
    model = model.to(torch.bfloat16)
    monkeypatch.setattr(measuring, "_with_weights", None)  # shapes-only, or not at all
    assert measuring.forward_flops(model).total == expected


def test_a_forward_that_needs_values_is_counted_with_the_weights_and_leaves_the_model_as_it_was():
    model = CASE["siglip2-vision"].build().train()  # its forward calls .item(): no meta-device twin runs it
    fired = []
    model.register_forward_hook(lambda *args: fired.append(1))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert measuring.forward_flops(model).total == _run(model.eval(), dummy_inputs(model, 1))
    model.train()
    assert measuring.forward_flops(model).total > 0
    assert model.training and all(m.training for m in model.modules())  # its modes, weights and random state kept
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(torch.get_rng_state(), rng) and len(fired) == 1  # the caller's hook: only _run's forward


def test_the_count_sees_every_patch_of_a_masked_autoencoder_and_fires_no_hook_of_the_callers():
    config = transformers.ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                                       image_size=32, patch_size=8, mask_ratio=0.75)
    model = transformers.ViTMAEModel(config).eval()
    fired = []
    model.embeddings.register_forward_hook(lambda *args: fired.append(args[2][0].shape[1]))
    shape = measuring.measured_shape(model)
    assert not fired and model.config.mask_ratio == 0.75  # the twin ran, with its own config
    assert shape.other_flops == 0  # every patch, as it serves images (masked: a quarter of the tokens)


@pytest.fixture(scope="module")
def stem(tmp_path_factory):
    """The zoo's hybrid (a convolution stem before the patch embedding), ranked and saved once."""
    proof._PROVEN.clear()
    case = BY_NAME["hybrid-conv-stem"]
    model = case.build()
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    folder = tmp_path_factory.mktemp("stem") / "elastic"
    stored = hs.save_elastic(model, ranking, folder)
    discovery._DISCOVERED.clear()
    return case, model, stored, folder


def test_a_stems_flops_are_in_the_layouts_gflops(stem):
    case, model, stored, folder = stem
    inputs = case.inputs(1)
    shape = stored.shape
    stem_flops = _run(model.stem, {"input": inputs["pixel_values"]})
    assert stem_flops > 0.15 * _run(model, inputs) and shape.other_flops >= stem_flops  # before: left out
    assert shape.flops() == _run(model, inputs) + shape.softmax_flops()  # exactly, the softmax aside
    for sparsity in (0.1, 0.3):
        sliced = hs.ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
        counts = stored.keep_counts(sparsity)
        assert shape.flops(counts.heads, counts.neurons) == _run(sliced, inputs) + shape.softmax_flops(counts.heads)
        layout = sliced.config.elastic_layout
        assert layout["gflops"] == pytest.approx(counts.gflops, abs=1e-6)
        assert hs.estimate_gflops(sliced) == pytest.approx(counts.gflops, rel=1e-9)
        again = hs.ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
        again.save_pretrained(folder.parent / f"sliced-{sparsity}")
        reloaded = hs.ElasticViTModel.from_pretrained(folder.parent / f"sliced-{sparsity}")
        assert reloaded.config.elastic_layout["gflops"] == layout["gflops"]
    card = ModelCard.load(folder / "README.md").text
    dense_row = next(line for line in card.splitlines() if line.startswith("| 0 % (dense)"))
    assert float(dense_row.split("|")[3]) == pytest.approx(shape.gflops(), rel=5e-3)  # 3 significant digits


def test_gflop_budgets_are_met_within_one_unit_on_a_model_with_a_stem(stem):
    case, model, stored, folder = stem
    inputs = case.inputs(1)
    shape = stored.shape
    head = sum(shape.unit_flops()[:2]) + 3 * shape.num_tokens ** 2
    dense, smallest = shape.gflops(), stored.keep_counts(stored.max_sparsity_for(1), width_multiple=1).gflops
    for fraction in (0.3, 0.6, 0.9):
        target = smallest + fraction * (dense - smallest)
        sliced = hs.ElasticViTModel.from_pretrained(folder, target_gflops=target, width_multiple=1)
        heads = sliced.config.elastic_layout["num_heads"]
        ran = _run(sliced, inputs) + shape.softmax_flops(heads)  # what runs, the softmax the counter skips added
        assert abs(ran - target * 1e9) <= head, (ran, target * 1e9)


def test_rankings_stored_without_the_measured_term_load_and_it_never_refuses_a_checkpoint(stem, tmp_path):
    case, model, stored, folder = stem
    data = stored.to_dict()
    del data["shape"]["other_flops"]
    old = hs.ElasticRanking.from_dict(data)
    assert old.shape.other_flops == 0 and old.shape.flops() == stored.shape.flops() - stored.shape.other_flops
    old.check_matches(stored.shape)  # measured, not structural: no mismatch
    assert model_shape(model).mismatch(stored.shape) == ""
    for bad in (1.5, "12", True, -stored.shape.flops()):
        data["shape"]["other_flops"] = bad
        with pytest.raises(RankingFormatError, match="other_flops"):
            hs.ElasticRanking.from_dict(data)


def test_the_paper_table_holds_because_nothing_runs_beyond_a_vits_formula():
    for hidden, layers, heads in ((384, 12, 6), (768, 12, 12)):
        config = transformers.ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                        intermediate_size=4 * hidden, num_labels=1000,
                                        architectures=["ViTForImageClassification"])
        assert measuring.measured_shape(skeleton(config)).other_flops == 0  # nothing runs beyond the formula
    deit = transformers.DeiTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, num_labels=1000,
                                   intermediate_size=1536, architectures=["DeiTForImageClassificationWithTeacher"])
    assert measuring.measured_shape(skeleton(deit)).other_flops == 0  # its two classifiers are the formula's


def test_a_forward_that_cannot_be_counted_keeps_the_formula_with_a_warning(monkeypatch):
    model = CASE["vit"].build()

    def fails(*args, **kwargs):
        raise RuntimeError("no forward here")

    monkeypatch.setattr(measuring, "forward_flops", fails)
    with pytest.warns(UserWarning, match="could not be counted .*no forward here"):
        shape = measuring.measured_shape(model)
    assert shape == model_shape(model) and shape.other_flops == 0


def test_a_second_block_stack_is_counted_warned_about_once_and_carded(tmp_path):
    case = BY_NAME["two-block-stacks"]
    model = case.build()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranking = hs.rank(model, method="magnitude", show_progress=False)
        stored = hs.save_elastic(model, ranking, tmp_path / "out")
    partial = [str(w.message) for w in caught if "prunable" in str(w.message)]
    assert len(partial) == 1, partial  # rank() said it; save_elastic does not repeat it
    assert re.search(r"only the block stack blocks \(2 blocks\) is prunable: it holds \d+% of the backbone's "
                     r"parameters and \d+% of its FLOPs; blocks2 \(2 blocks\) stays dense", partial[0])
    share = prunable.PrunableShare.from_dict(stored.provenance["prunable"])
    inputs = case.inputs(1)
    tokens = torch.zeros(1, stored.shape.num_tokens, stored.shape.hidden_size)
    total, pruned = _run(model, inputs), sum(_run(block, {"x": tokens}) for block in model.blocks)
    assert share.flops == pytest.approx(pruned / total, rel=1e-6)
    assert share.params == pytest.approx(sum(p.numel() for p in model.blocks.parameters()) / stored.shape.num_params())
    assert stored.shape.flops() == total + stored.shape.softmax_flops()  # the dense stack's FLOPs counted too
    card = (tmp_path / "out" / "README.md").read_text()
    assert f"**Prunable share**: only the block stack `blocks` (2 blocks) is prunable: it holds {share.params:.0%}" \
           in card and "`blocks2` (2 blocks) stays dense at every sparsity" in card


def test_a_single_stack_model_records_no_share_and_counts_no_extra_forward(monkeypatch):
    model = CASE["vit"].build()
    counts = []
    monkeypatch.setattr(prunable, "forward_flops", lambda *a, **k: counts.append(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of a partial model
        ranking = hs.rank(model, method="magnitude", show_progress=False)
    assert "prunable" not in ranking.provenance and prunable.other_stacks(model) == [] and not counts
    assert prunable.PrunableShare.from_dict({"blocks": "x", "num_blocks": 2, "params": 2.0, "flops": None,
                                             "dense": [["y", 2]]}) is None  # not a share: ignored, not trusted


def test_shapes_without_the_field_and_with_it_compare_equal_in_everything_else():
    shape = model_shape(CASE["vit"].build())
    measured = ModelShape.from_dict({**shape.to_dict(), "other_flops": 1234})
    assert shape.mismatch(measured) == "" and measured.flops() == shape.flops() + 1234
    assert np.isclose(measured.gflops(), shape.gflops() + 1.234e-6)
