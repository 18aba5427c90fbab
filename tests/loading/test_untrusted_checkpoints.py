"""Issue 16, what the loader trusts: stored rankings (cost model, types, sizes), elastic layouts, stored tensor shapes,
budget types and damaged files. Every bad input gives an error of ours that names the field or file, the value and
the fix; nothing is decoded or allocated at a size the model does not have."""

from __future__ import annotations

import copy
import json
import shutil
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import ViTConfig

import hf_snapvit as hs
from hf_snapvit.architectures.budget import ModelShape, model_shape
from hf_snapvit.architectures.skeleton import skeleton
from hf_snapvit.elastic.checkpoint import CheckpointReader
from helpers import CASES

CASE = {c.name: c for c in CASES}
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
FC1 = "encoder.layer.0.intermediate.dense.weight"  # the historical names stock transformers writes
QUERY = "encoder.layer.0.attention.attention.query.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A dense elastic checkpoint of the tiny ViT, its sliced save, and a sharded one (built once, copied per test)."""
    root = tmp_path_factory.mktemp("saved")
    model = CASE["vit"].build()
    stored = hs.save_elastic(model, hs.rank(model, method="magnitude"), root / "elastic")
    hs.ElasticViTModel.from_pretrained(root / "elastic", sparsity=0.5 * stored.max_sparsity) \
        .save_pretrained(root / "sliced")
    hs.save_elastic(model, hs.rank(model, method="magnitude"), root / "sharded", max_shard_size="20KB")
    return root


@pytest.fixture
def copy_of(saved, tmp_path):
    def make(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(saved / name, target)
        return target
    return make


def edit_config(path: Path, edit) -> None:
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def edit_tensor(path: Path, key: str, make) -> None:
    tensors = load_file(path / WEIGHTS)
    tensors[key] = make(tensors[key])
    save_file(tensors, path / WEIGHTS, metadata={"format": "pt"})


def stored_ranking() -> dict:
    model = CASE["vit"].build()
    return json.loads(json.dumps(hs.rank(model, method="magnitude").sorted().to_dict()))


# ------------------------------------------------------------------------ item 2: the ranking's cost model
def test_a_ranking_from_a_64_px_model_is_refused_on_a_32_px_one(copy_of):
    path = copy_of("elastic")
    edit_config(path, lambda c: c["elastic_ranking"]["shape"].update(num_tokens=65, num_patches=64))
    message = r"num_tokens=65.*num_tokens=17.*image or patch size.*num_patches=16.*hf_snapvit.rank"
    with pytest.raises(hs.RankingFormatError, match=message):
        hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)


@pytest.mark.parametrize("field", ["params_per_head", "params_per_neuron", "fixed_params", "num_tokens",
                                   "num_patches", "patch_size", "num_channels", "ffn_matrices", "head_flops"])
def test_every_field_of_the_cost_model_must_match(copy_of, field):
    path = copy_of("elastic")
    expected = model_shape(CASE["vit"].build()).to_dict()[field]
    wrong = 3 if field == "ffn_matrices" else expected * 10 if expected else 7
    edit_config(path, lambda c: c["elastic_ranking"]["shape"].update({field: wrong}))
    with pytest.raises(hs.RankingFormatError, match=rf"{field}={wrong}.*{field}={expected}.*hf_snapvit.rank"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)


def test_a_qkv_bias_mismatch_is_refused(copy_of):
    path = copy_of("elastic")
    edit_config(path, lambda c: c.update(qkv_bias=False))
    with pytest.raises(hs.RankingFormatError, match=r"params_per_head=1048.*params_per_head=1024.*bias"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)


def test_save_elastic_refuses_a_ranking_of_another_cost_model(tmp_path):
    model = CASE["vit"].build()
    ranking = hs.rank(model)
    other = hs.ElasticRanking(ranking.head_scores, ranking.neuron_scores,
                              ModelShape.from_dict({**ranking.shape.to_dict(), "head_flops": 999}))
    with pytest.raises(hs.RankingFormatError, match="head_flops=999"):
        hs.save_elastic(model, other, tmp_path / "e")


@pytest.mark.parametrize("field, value, message", [
    ("num_layers", "2", r"shape.num_layers='2'.*integer"),
    ("num_heads", -4, r"shape.num_heads=-4.*>= 1"),
    ("num_heads", True, r"shape.num_heads=True.*integer"),
    ("params_per_head", float("nan"), r"shape.params_per_head=nan.*integer"),
    ("params_per_neuron", 65.5, r"shape.params_per_neuron=65.5.*integer"),
    ("fixed_params", -1, r"shape.fixed_params=-1.*>= 0"),
    ("head_flops", -320, r"shape.head_flops=-320.*>= 0"),
    ("model_type", 3, r"shape.model_type=3.*string"),
])
def test_shape_types_and_signs_are_checked_while_decoding(field, value, message):
    data = stored_ranking()
    data["shape"][field] = value
    with pytest.raises(hs.RankingFormatError, match=message):
        hs.ElasticRanking.from_dict(data)


def test_a_missing_shape_field_is_named():
    data = stored_ranking()
    del data["shape"]["params_per_head"]
    with pytest.raises(hs.RankingFormatError, match=r"shape.*params_per_head"):
        hs.ElasticRanking.from_dict(data)


@pytest.mark.parametrize("value", ["0.2", True, None])
def test_floors_must_be_numbers(value):
    data = stored_ranking()
    data["min_head_keep_ratio"] = value
    with pytest.raises(hs.RankingFormatError, match=rf"min_head_keep_ratio={value!r} must be numbers in \[0, 1\)"):
        hs.ElasticRanking.from_dict(data)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["heads"][0].__setitem__(1, "0.5"), r"scores.heads\[0\]\[1\]='0.5'.*number"),
    (lambda s: s["heads"][1].__setitem__(0, float("nan")), r"scores.heads\[1\]\[0\]=nan.*finite"),
    (lambda s: s["heads"][0].append(-1.0), r"scores.heads\[0\] has 5 scores.*4"),
    (lambda s: s["heads"].pop(), r"scores.heads has 1 blocks.*2"),
    (lambda s: s["neurons"].pop(), r"scores.neurons has 1 blocks.*2"),
    (lambda s: s["neurons"][0]["log10"].__setitem__(0, float("inf")), r"scores.neurons\[0\].log10.*finite"),
    (lambda s: s["neurons"][0]["log10"].__setitem__(0, 400.0), r"scores.neurons\[0\].log10.*400"),
    (lambda s: s["neurons"][0].update(index=[0.0] + s["neurons"][0]["index"][1:]), r"neurons\[0\].index.*integer"),
    (lambda s: s["neurons"].__setitem__(0, [1, 2]), r"scores.neurons\[0\].*object"),
    (lambda s: s.update(heads="loud"), r"scores.heads.*list"),
])
def test_score_types_are_checked_while_decoding(edit, message):
    data = stored_ranking()
    edit(data["scores"])
    with pytest.raises(hs.RankingFormatError, match=message):
        hs.ElasticRanking.from_dict(data)


@pytest.mark.parametrize("field", ["intermediate_size", "num_layers", "num_heads"])
def test_a_huge_stored_shape_is_refused_before_decoding(field):
    data = stored_ranking()
    data["shape"][field] = 10**12
    if field == "intermediate_size":  # a consistent hostile ranking: knots that end at the claimed width
        for row in data["scores"]["neurons"]:
            row["index"][-1] = 10**12 - 1
    with pytest.raises(hs.RankingFormatError, match=rf"shape.{field}=1000000000000.*too large"):
        hs.ElasticRanking.from_dict(data)


@pytest.mark.parametrize("field, value", [("intermediate_size", 10**12), ("num_hidden_layers", 10**9),
                                          ("hidden_size", 10**9), ("num_attention_heads", -4)])
def test_a_huge_config_is_refused_before_the_model_is_built(copy_of, field, value):
    path = copy_of("sliced")  # no ranking: nothing else would stop it
    edit_config(path, lambda c: c.update({field: value}))
    with pytest.raises(hs.CheckpointError, match=rf"config.*{field}={value}.*corrupt"):
        hs.ElasticViTModel.from_pretrained(path)
    with pytest.raises(hs.CheckpointError, match=field):  # the same check guards every skeleton (estimate_gflops)
        skeleton(ViTConfig(**{field: value}))


# ------------------------------------------------------------------------ item 4: layouts and stored tensors
@pytest.mark.parametrize("edit, message", [
    (lambda l: l.update(num_heads=[-1, 4]), r"elastic_layout.num_heads\[0\]=-1.*between 1 and 4"),
    (lambda l: l.update(num_heads=[0, 4]), r"elastic_layout.num_heads\[0\]=0.*between 1 and 4"),
    (lambda l: l.update(num_heads=[5, 4]), r"elastic_layout.num_heads\[0\]=5.*between 1 and 4"),
    (lambda l: l.update(num_heads=["2", 4]), r"elastic_layout.num_heads\[0\]='2'.*integer"),
    (lambda l: l.update(num_heads=[2.0, 4]), r"elastic_layout.num_heads\[0\]=2.0.*integer"),
    (lambda l: l.update(intermediate_size=[True, 30]), r"elastic_layout.intermediate_size\[0\]=True.*integer"),
    (lambda l: l.update(intermediate_size=[38, 30]), r"intermediate_size\[0\]=38.*between 1 and 37"),
    (lambda l: l.update(num_heads="4,4"), r"elastic_layout.num_heads='4,4'.*list of 2"),
    (lambda l: l.update(num_heads=[4]), r"elastic_layout.num_heads.*1 .*2 blocks"),
    (lambda l: l.pop("intermediate_size"), r"elastic_layout.*no 'intermediate_size'"),
    (lambda l: l.update(width_multiple="64"), r"elastic_layout.width_multiple='64'"),
])
def test_a_corrupt_layout_is_named(copy_of, edit, message):
    path = copy_of("sliced")
    edit_config(path, lambda c: edit(c["elastic_layout"]))
    with pytest.raises(hs.RankingFormatError, match=message):
        hs.ElasticViTModel.from_pretrained(path)


def test_a_layout_that_is_not_an_object_is_named(copy_of):
    path = copy_of("sliced")
    edit_config(path, lambda c: c.update(elastic_layout=[4, 4]))
    with pytest.raises(hs.RankingFormatError, match="elastic_layout.*JSON object"):
        hs.ElasticViTModel.from_pretrained(path)


def test_a_layout_listing_fewer_neurons_than_the_tensors_hold_is_refused(copy_of):
    path = copy_of("sliced")
    layout = json.loads((path / "config.json").read_text())["elastic_layout"]
    stored = layout["intermediate_size"][0]
    edit_config(path, lambda c: c["elastic_layout"]["intermediate_size"].__setitem__(0, stored - 1))
    with pytest.raises(hs.CheckpointError, match=rf"{FC1}.*\({stored}, 32\).*elastic_layout.*\({stored - 1}, 32\)"):
        hs.ElasticViTModel.from_pretrained(path)


@pytest.mark.parametrize("sparsity", [None, 0.3])
def test_a_prunable_tensor_with_an_oversized_other_dimension_is_refused(copy_of, sparsity):
    path = copy_of("elastic")
    edit_tensor(path, QUERY, lambda t: torch.cat([t, t[:, :8]], dim=1))  # (32, 40): stock transformers refuses it
    with pytest.raises(hs.CheckpointError, match=rf"{QUERY}.*\(32, 40\).*\(32, 32\)"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=sparsity)


def test_a_dense_checkpoint_with_a_too_small_tensor_is_refused_whatever_the_budget(copy_of):
    path = copy_of("elastic")
    edit_tensor(path, FC1, lambda t: t[:30].clone())
    stored = hs.ElasticRanking.from_dict(json.loads((path / "config.json").read_text())["elastic_ranking"])
    assert max(stored.keep_counts(stored.max_sparsity, width_multiple=1).neurons) < 30  # the budget needs fewer
    with pytest.raises(hs.CheckpointError, match=rf"{FC1}.*\(30, 32\).*\(37, 32\)"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=stored.max_sparsity, width_multiple=1)


def test_a_sliced_checkpoint_with_a_wrong_bias_is_refused(copy_of):
    path = copy_of("sliced")
    key = "encoder.layer.1.intermediate.dense.bias"
    edit_tensor(path, key, lambda t: torch.cat([t, t[:1]]))
    with pytest.raises(hs.CheckpointError, match=rf"{key}.*elastic_layout"):
        hs.ElasticViTModel.from_pretrained(path)


def test_valid_layouts_still_load(copy_of):
    path = copy_of("sliced")
    model = hs.ElasticViTModel.from_pretrained(path)
    layout = json.loads((path / "config.json").read_text())["elastic_layout"]
    assert model.config.elastic_layout["intermediate_size"] == layout["intermediate_size"]


# ------------------------------------------------------------------------ item 6: budget types
@pytest.fixture(scope="module")
def ranking():
    return hs.rank(CASE["vit"].build(), method="magnitude")


@pytest.mark.parametrize("name, value, shown", [
    ("sparsity", "0.3", "'0.3'"), ("sparsity", Decimal("0.3"), r"Decimal\('0.3'\)"),
    ("sparsity", torch.tensor(0.3), "tensor"), ("sparsity", True, "True"), ("sparsity", [0.3], r"\[0.3\]"),
    ("target_params", "20000", "'20000'"), ("target_gflops", Decimal("0.001"), "Decimal"),
])
def test_a_budget_of_the_wrong_type_names_the_accepted_types(ranking, name, value, shown):
    with pytest.raises(hs.BudgetError, match=rf"{name}={shown}.*must be a real number \(int, float.*got "):
        ranking.keep_counts(**{name: value})


@pytest.mark.parametrize("name", ["sparsity", "target_params", "target_gflops"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_budget_that_is_not_finite_is_refused(ranking, name, value):
    with pytest.raises(hs.BudgetError, match=rf"{name}={value}.*finite"):
        ranking.keep_counts(**{name: value})


def test_numpy_scalars_are_budgets(ranking):
    assert ranking.keep_counts(np.float32(0.25)) == ranking.keep_counts(0.25)
    assert ranking.keep_counts(target_params=np.int64(20_000)) == ranking.keep_counts(target_params=20_000)


def test_the_type_error_reaches_from_pretrained(copy_of):
    with pytest.raises(hs.BudgetError, match=r"sparsity='0.3'.*real number.*got str"):
        hs.ElasticViTModel.from_pretrained(copy_of("elastic"), sparsity="0.3")


@pytest.mark.parametrize("neuron_ratio, head_ratio, message", [
    (float("nan"), 0.1, "neuron_ratio=nan.*finite"), (0.3, float("nan"), "head_ratio=nan.*finite"),
    ("0.3", 0.1, "neuron_ratio='0.3'.*real number"), (0.3, None, "head_ratio=None.*real number"),
])
def test_keep_counts_for_ratios_checks_its_ratios(ranking, neuron_ratio, head_ratio, message):
    with pytest.raises(hs.BudgetError, match=message):
        ranking.keep_counts_for_ratios(neuron_ratio, head_ratio)


# ------------------------------------------------------------------------ item 8: damaged files
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", [
    lambda p: p.write_bytes(b""),
    lambda p: p.write_bytes(b"\x00garbage" * 100),
    _truncate,
    lambda p: p.write_bytes(p.read_bytes()[:-1]),
    lambda p: p.write_bytes(b"\xff" * 8 + p.read_bytes()[8:]),  # header length beyond the file
])
def test_a_damaged_weights_file_is_named(copy_of, damage):
    path = copy_of("elastic")
    damage(path / WEIGHTS)
    with pytest.raises(hs.CheckpointError, match=rf"{WEIGHTS}.*damaged"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ('{"metadata": {}}', "no 'weight_map'"),
    ('{"weight_map": ["model-00001-of-00002.safetensors"]}', "weight_map.*object"),
    ('{"weight_map": {"vit.embeddings.cls_token": 3}}', "weight_map.*file name"),
    ('{"weight_map": {"vit.embeddings.cls_token": "../elastic/model.safetensors"}}', "weight_map.*file name"),
    ('{"weight_map": {"vit.embeddings.cls_token": "missing.safetensors"}}', "missing.safetensors"),
])
def test_a_damaged_shard_index_is_named(copy_of, text, message):
    path = copy_of("sharded")
    (path / INDEX).write_text(text)
    with pytest.raises(hs.CheckpointError, match=message) as error:
        CheckpointReader(path)
    assert INDEX in str(error.value) and "damaged" in str(error.value)


def test_a_damaged_shard_is_named(copy_of):
    path = copy_of("sharded")
    shard = sorted(path.glob("model-*.safetensors"))[-1]
    _truncate(shard)
    with pytest.raises(hs.CheckpointError, match=rf"{shard.name}.*damaged"):
        hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)


def test_a_key_missing_from_its_shard_is_named(copy_of):
    path = copy_of("sharded")
    index = json.loads((path / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    key = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index["weight_map"][key] = shards[-1]
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(hs.CheckpointError, match="damaged") as error:
        hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)
    assert key in str(error.value) and shards[-1] in str(error.value)


def test_intact_checkpoints_still_load(copy_of):
    for name in ("elastic", "sharded"):
        model = hs.ElasticViTModel.from_pretrained(copy_of(name), sparsity=0.3)
        assert torch.isfinite(model(**CASE["vit"].inputs(1)).last_hidden_state).all()


def test_shape_round_trip_is_exact():
    shape = model_shape(CASE["vit-cls"].build())
    assert ModelShape.from_dict(copy.deepcopy(shape.to_dict())) == shape
