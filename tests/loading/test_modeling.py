"""``ElasticViTModel.from_pretrained(**kwargs)`` takes transformers' own keyword arguments as
``PreTrainedModel.from_pretrained`` does (issue 64): config overrides, then the model class's ``__init__``,
``ignore_mismatched_sizes``, ``output_loading_info``, the arguments transformers ignores; options it cannot honour are
refused naming them and how to load with them."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.errors import CheckpointError, ConfigError

from helpers import CASES, output_of

CASE = {c.name: c for c in CASES}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Elastic checkpoints of a tiny classifier (5 labels) and of a bare ViT (with its pooler)."""
    root = tmp_path_factory.mktemp("kwargs")
    out = {}
    for name in ("vit-cls", "vit"):
        model = CASE[name].build().eval()
        hs.save_elastic(model, hs.rank(model, method="magnitude"), root / name, model_card=False)
        out[name] = root / name
    return out


def test_a_new_task_head_needs_ignore_mismatched_sizes_as_in_transformers(folders):
    folder = folders["vit-cls"]
    with pytest.raises(ConfigError, match=r"\['num_labels'\] change tensors.*classifier.weight: the checkpoint holds "
                                          r"\(5, 32\), the model \(10, 32\).*ignore_mismatched_sizes=True"):
        hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3, num_labels=10)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # what transformers says for the same call
        transformers.AutoModelForImageClassification.from_pretrained(folder, num_labels=10)
    with pytest.warns(UserWarning, match="newly initialized.*classifier"):
        model, info = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3, num_labels=10,
                                                         ignore_mismatched_sizes=True, output_loading_info=True)
    assert model.config.num_labels == 10 and model.classifier.out_features == 10
    assert info["mismatched_keys"] == {"classifier.weight", "classifier.bias"} and info["missing_keys"] == set()
    # The backbone is the 5-label checkpoint's, sliced as without the override.
    plain = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    assert layer_widths(model) == layer_widths(plain)
    inputs = CASE["vit-cls"].inputs(2, 3)
    with torch.no_grad():
        hidden = model.vit(**inputs).last_hidden_state
        torch.testing.assert_close(hidden, plain.vit(**inputs).last_hidden_state)
    # ... and a switchable model takes the same arguments.
    switchable = hs.ElasticViTModel.from_pretrained(folder, switchable=True, num_labels=10,
                                                    ignore_mismatched_sizes=True)
    switchable.set_budget(sparsity=0.3)
    assert switchable.classifier.out_features == 10 and layer_widths(switchable) == layer_widths(plain)


def test_init_arguments_reach_the_model_class_and_unknown_ones_fail_there(folders):
    model, info = hs.ElasticViTModel.from_pretrained(folders["vit"], sparsity=0.3, add_pooling_layer=False,
                                                     output_loading_info=True)
    assert model.pooler is None
    assert {key for key in info["unexpected_keys"] if "pooler" in key}  # the checkpoint's pooler, not read
    with pytest.raises(TypeError, match="not_an_option"):
        hs.ElasticViTModel.from_pretrained(folders["vit"], not_an_option=3)


def test_arguments_transformers_ignores_or_that_change_nothing_load_the_same_model(folders):
    folder = folders["vit-cls"]
    reference = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    inputs = CASE["vit-cls"].inputs(2, 3)
    for kwargs in ({"low_cpu_mem_usage": True}, {"use_safetensors": True}, {"weights_only": False},
                   {"key_mapping": None}, {"_from_auto": True}, {"trust_remote_code": True},
                   {"output_attentions": True}):
        model = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3, **kwargs)
        torch.testing.assert_close(output_of(model, inputs), output_of(reference, inputs))
    assert model.config.output_attentions is True  # a config override, as in transformers
    model, info = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3, output_loading_info=True)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}


@pytest.mark.parametrize("kwargs", [{"quantization_config": {"load_in_8bit": True}}, {"tp_plan": "auto"},
                                    {"use_safetensors": False}, {"config": transformers.ViTConfig()},
                                    {"variant": "fp16"}])
def test_options_this_loader_cannot_honour_are_refused_naming_them_and_the_way(folders, kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=rf"{name}=.* is not supported.*save_pretrained.*transformers.*{name}="):
        hs.ElasticViTModel.from_pretrained(folders["vit-cls"], sparsity=0.3, **kwargs)


def test_overrides_that_change_the_blocks_are_refused_before_any_weight_is_read(folders):
    with pytest.raises(ConfigError, match=r"\['intermediate_size'\] change the blocks.*intermediate_size 37 -> 16"):
        hs.ElasticViTModel.from_pretrained(folders["vit"], sparsity=0.3, intermediate_size=16)


def test_without_overrides_a_damaged_head_is_still_reported_as_damage(folders, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "damaged"
    shutil.copytree(folders["vit-cls"], folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["classifier.bias"] = torch.zeros(7)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="classifier.bias.*damaged or was edited"):
        hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
