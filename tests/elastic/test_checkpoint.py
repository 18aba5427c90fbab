"""Elastic checkpoints: stock loading, sliced loading, round trips, atomic writes and every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModel, AutoModelForImageClassification

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.elastic.ranking import FORMAT_VERSION
from hf_snapvit.elastic.checkpoint import CheckpointReader
from helpers import CASES, hub_cache_copy, masked_copy, output_of

CASE = {c.name: c for c in CASES}


def stock_class(model):
    return AutoModelForImageClassification if hasattr(model, "classifier") else AutoModel


@pytest.fixture
def case_checkpoint(tmp_path, case):
    model = case.build()
    ranking = hs.rank(model, method="random", seed=7)
    # These tests load the checkpoint; the card has its own tests, and drawing its heatmap is most of a save's time
    # (about 0.5 s, over 250 saves here).
    stored = hs.save_elastic(model, ranking, tmp_path / "elastic", model_card=False)
    return case, model, ranking, stored, tmp_path / "elastic"


def test_stock_transformers_loads_elastic_checkpoint_as_dense(case_checkpoint):
    case, model, _, _, path = case_checkpoint
    inputs = case.inputs(2)
    loaded = getattr(transformers, type(model).__name__).from_pretrained(path)
    assert type(loaded) is type(model)
    torch.testing.assert_close(output_of(loaded, inputs), output_of(model, inputs), atol=1e-5, rtol=0)


def test_sparsity_zero_equals_untouched_base_model(case_checkpoint):
    case, model, _, _, path = case_checkpoint
    inputs = case.inputs(2)
    loaded = hs.ElasticViTModel.from_pretrained(path, sparsity=0.0)
    assert type(loaded) is type(model)
    assert not hasattr(loaded.config, "elastic_layout")
    torch.testing.assert_close(output_of(loaded, inputs), output_of(model, inputs), atol=1e-5, rtol=0)


def test_save_elastic_leaves_the_model_unchanged(case, tmp_path):
    model = case.build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # reliability/test_untouched_inputs.py saves this ranking too: the session draws its card's heatmap once (see
    # conftest).
    hs.save_elastic(model, hs.rank(model, method="random", seed=3), tmp_path / "out")
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert getattr(model.config, "elastic_ranking", None) is None


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_sliced_load_equals_masked_original(case_checkpoint, attn):
    """Independent reference: the original (unpermuted) model with the same units zeroed."""
    case, model, ranking, stored, path = case_checkpoint
    inputs = case.inputs(2)
    sparsity = 0.7 * stored.max_sparsity
    loaded = hs.ElasticViTModel.from_pretrained(path, sparsity=sparsity, attn_implementation=attn)
    counts = stored.keep_counts(sparsity)
    assert layer_widths(loaded) == (counts.heads, counts.neurons)
    # The stored ranking orders units like the in-memory one (up to the compact encoding of neuron scores).
    reference = masked_copy(model, ranking.keep_indices(counts))
    torch.testing.assert_close(output_of(loaded, inputs), output_of(reference, inputs), atol=1e-5, rtol=1e-4)
    assert loaded.config._attn_implementation == attn


def test_round_trip_through_save_pretrained(case_checkpoint, tmp_path):
    case, model, _, stored, path = case_checkpoint
    inputs = case.inputs(2)
    sparsity = 0.5 * stored.max_sparsity
    sliced = hs.ElasticViTModel.from_pretrained(path, sparsity=sparsity)
    sliced.save_pretrained(tmp_path / "sliced")
    config = json.loads((tmp_path / "sliced" / "config.json").read_text())
    assert config["elastic_layout"]["num_heads"] == layer_widths(sliced)[0]
    assert config["elastic_layout"]["intermediate_size"] == layer_widths(sliced)[1]
    shutil.rmtree(path)  # the reload must not need the dense weights
    again = hs.ElasticViTModel.from_pretrained(tmp_path / "sliced")
    assert layer_widths(again) == layer_widths(sliced)
    torch.testing.assert_close(output_of(again, inputs), output_of(sliced, inputs), atol=0, rtol=0)
    # A sliced checkpoint can be sliced further, but cannot grow back.
    smaller = hs.ElasticViTModel.from_pretrained(tmp_path / "sliced", sparsity=stored.max_sparsity)
    assert sum(layer_widths(smaller)[1]) < sum(layer_widths(sliced)[1])
    with pytest.raises(hs.BudgetError, match="cannot grow back"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "sliced", sparsity=0.0)


def test_sharded_checkpoint_is_read_slice_by_slice(tmp_path):
    case = CASE["vit-cls"]
    model = case.build()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    inputs = case.inputs(2)
    dense = hs.ElasticViTModel.from_pretrained(tmp_path / "sharded")
    torch.testing.assert_close(output_of(dense, inputs), output_of(model, inputs), atol=1e-5, rtol=0)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path / "sharded", sparsity=0.3)
    assert sum(layer_widths(sliced)[1]) < 2 * 37


def test_reader_reads_only_prefixes(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    reader = CheckpointReader(tmp_path / "e")
    key = next(k for k in reader.keys() if k.endswith("intermediate.dense.weight"))
    assert reader.shape(key) == (37, 32)
    assert reader.read(key, (5, 32)).shape == (5, 32)


def test_dtype_and_device_pass_through(case_checkpoint):
    _, _, _, stored, path = case_checkpoint
    model = hs.ElasticViTModel.from_pretrained(path, sparsity=0.3 * stored.max_sparsity, dtype=torch.bfloat16,
                                               device_map="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    legacy = hs.ElasticViTModel.from_pretrained(path, torch_dtype="float16")
    assert {p.dtype for p in legacy.parameters()} == {torch.float16}


def test_hub_kwargs_resolve_through_the_hub_cache(tmp_path):
    """A repo id is resolved by huggingface_hub from its cache; revision and cache_dir pass through."""
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    hub_cache_copy(tmp_path / "e", tmp_path / "cache", "org/tiny-elastic", "0123456789abcdef0123456789abcdef01234567")
    loaded = hs.ElasticViTModel.from_pretrained(
        "org/tiny-elastic", sparsity=0.3, cache_dir=tmp_path / "cache", revision="main", local_files_only=True
    )
    assert sum(layer_widths(loaded)[1]) < 2 * 37
    with pytest.raises(OSError):
        hs.ElasticViTModel.from_pretrained("org/tiny-elastic", sparsity=0.3, cache_dir=tmp_path / "cache",
                                           revision="v9", local_files_only=True)


def test_unknown_kwargs_are_rejected(case_checkpoint):
    _, _, _, _, path = case_checkpoint
    with pytest.raises(TypeError, match="not_an_option"):
        hs.ElasticViTModel.from_pretrained(path, not_an_option=3)


@pytest.mark.parametrize("task", ["image-feature-extraction", "image-classification"])
def test_transformers_pipeline(tmp_path, task):
    from PIL import Image
    from transformers import AutoImageProcessor, ViTImageProcessor, pipeline

    case = CASE["vit-cls" if task == "image-classification" else "vit"]
    model = case.build()
    processor = ViTImageProcessor(size={"height": 32, "width": 32})
    hs.save_elastic(model, hs.rank(model), tmp_path / "e", image_processor=processor)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8))
    # As for any model object, transformers needs the processor passed in; it was saved beside the checkpoint.
    result = pipeline(task, model=sliced, image_processor=AutoImageProcessor.from_pretrained(tmp_path / "e"))(image)
    if task == "image-classification":
        assert len(result) == 5 and {"label", "score"} <= set(result[0])
        expected = sliced(**processor(image, return_tensors="pt")).logits.softmax(-1).max().item()
        assert result[0]["score"] == pytest.approx(expected, rel=1e-5)
    else:
        expected = sliced(**processor(image, return_tensors="pt")).last_hidden_state
        assert np.allclose(np.asarray(result)[0], expected[0].detach().numpy(), atol=1e-5)


# ------------------------------------------------------------------------------------------ bad input
def test_interrupted_save_loses_nothing(tmp_path, monkeypatch):
    model = CASE["vit"].build()
    ranking = hs.rank(model)
    target = tmp_path / "e"
    hs.save_elastic(model, ranking, target)
    (target / "README.md").write_text("my card")
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def crash(self, *args, **kwargs):
        (Path(args[0]) / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(type(model), "save_pretrained", crash)
    with pytest.raises(KeyboardInterrupt):
        hs.save_elastic(model, hs.rank(model, method="random"), target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["e"]  # no staging folder left behind
    monkeypatch.undo()
    hs.save_elastic(model, hs.rank(model, method="random"), target)
    assert (target / "README.md").read_text() == "my card"  # files that are not the checkpoint are kept


def test_missing_ranking(tmp_path):
    model = CASE["vit"].build()
    model.save_pretrained(tmp_path / "plain")
    with pytest.raises(hs.RankingFormatError, match="not an elastic checkpoint.*save_elastic"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "plain", sparsity=0.3)


def _edit_ranking(path, edit):
    config_path = Path(path) / "config.json"
    config = json.loads(config_path.read_text())
    edit(config["elastic_ranking"])
    config_path.write_text(json.dumps(config))


def test_newer_format_version(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    _edit_ranking(tmp_path / "e", lambda r: r.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(hs.RankingFormatError, match=r"newer hf_snapvit.*upgrade hf_snapvit"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["scores"].pop("heads"), "corrupt.*heads"),
        (lambda r: r["scores"]["heads"][0].reverse(), "not in rank order"),
        (lambda r: r.update(mode="sideways"), "mode='sideways'"),
        (lambda r: r["scores"]["neurons"][0].update(index=[0, 5]), "knots"),
        (lambda r: r.update(format_version="one"), "format_version='one'"),
    ],
)
def test_corrupt_ranking(tmp_path, edit, message):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model, method="random"), tmp_path / "e")
    _edit_ranking(tmp_path / "e", edit)
    with pytest.raises(hs.RankingFormatError, match=message):
        hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)


def test_ranking_of_another_architecture(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "e" / "config.json").write_text(json.dumps(config))
    with pytest.raises(hs.RankingFormatError, match="num_layers=2.*num_layers=3"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)


def test_save_elastic_rejects_mismatched_ranking(tmp_path):
    ranking = hs.rank(CASE["vit"].build())
    with pytest.raises(hs.RankingFormatError, match="does not match this model"):
        hs.save_elastic(CASE["dinov2"].build(), ranking, tmp_path / "e")


def test_unsupported_architecture(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)) \
        .save_pretrained(tmp_path / "bert")
    with pytest.raises(hs.UnsupportedArchitectureError, match=r"model_type='bert'.*vit.*register_architecture"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "bert", sparsity=0.3)


@pytest.mark.parametrize("bad", [-0.1, 0.99, 2])
def test_out_of_range_sparsity(case_checkpoint, bad):
    _, _, _, stored, path = case_checkpoint
    with pytest.raises(hs.BudgetError, match=rf"sparsity={bad!r} is out of range.*<= {stored.max_sparsity:.4f}"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=bad)


@pytest.mark.parametrize("bad, message", [(float("nan"), "must be a finite number"),
                                          ("0.3", r"must be a real number \(int, float or a NumPy scalar\), got str")])
def test_sparsity_that_is_no_number(case_checkpoint, bad, message):
    with pytest.raises(hs.BudgetError, match=rf"sparsity={bad!r} {message}"):
        hs.ElasticViTModel.from_pretrained(case_checkpoint[4], sparsity=bad)


def test_tensors_missing_from_the_checkpoint_are_initialised_with_a_warning(tmp_path):
    from transformers import ViTModel

    base = CASE["vit"].build()
    headless = ViTModel(base.config, add_pooling_layer=False)
    headless.load_state_dict({k: v for k, v in base.state_dict().items() if not k.startswith("pooler")})
    hs.save_elastic(headless, hs.rank(headless), tmp_path / "e")
    with pytest.warns(UserWarning, match=r"newly initialized: \['pooler.dense.weight', 'pooler.dense.bias'\]"):
        loaded = hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)
    inputs = CASE["vit"].inputs(2)
    assert torch.isfinite(output_of(loaded, inputs)).all()
    assert loaded.pooler.dense.weight.device.type == "cpu"


def test_returned_ranking_is_what_from_pretrained_resolves(case_checkpoint):
    _, _, _, stored, path = case_checkpoint
    for fraction in (0.2, 0.5, 0.9):
        sparsity = fraction * stored.max_sparsity
        counts = stored.keep_counts(sparsity)
        loaded = hs.ElasticViTModel.from_pretrained(path, sparsity=sparsity)
        assert layer_widths(loaded) == (counts.heads, counts.neurons)
        assert loaded.config.elastic_layout["num_params"] == counts.num_params
