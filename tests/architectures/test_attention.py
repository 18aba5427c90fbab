"""hf_snapvit.UNPADDED_SDPA: transformers' SDPA attention without the all-true mask that torch 2.11's compile makes
transformers build (docs/deployment.md). Outputs equal the stock "sdpa" implementation's; with a padding mask the
stock mask is built."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import masking_utils

import hf_snapvit
from hf_snapvit.architectures.attention import unpadded_sdpa_mask
from helpers import CASES, output_of

BY_NAME = {case.name: case for case in CASES}


@pytest.fixture
def exporting(monkeypatch):
    """What transformers sees inside torch.compile on torch 2.11: is_exporting() answers True."""
    monkeypatch.setattr(masking_utils, "is_torchdynamo_exporting", lambda: True)


def _mask(config, embeds, attention_mask=None):
    return masking_utils.create_bidirectional_mask(config=config, inputs_embeds=embeds, attention_mask=attention_mask)


def test_no_mask_is_built_where_nothing_is_masked_even_when_transformers_thinks_it_is_exporting(exporting):
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    embeds = torch.randn(2, 5, 32)
    config._attn_implementation = "sdpa"
    stock = _mask(config, embeds)
    assert stock is not None and stock.dtype == torch.bool and bool(stock.all())  # the defect: a mask of all True
    config._attn_implementation = hf_snapvit.UNPADDED_SDPA
    assert _mask(config, embeds) is None


def test_a_padding_mask_is_still_built_as_transformers_builds_it(exporting):
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37)
    embeds, padding = torch.randn(2, 5, 32), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    config._attn_implementation = "sdpa"
    stock = _mask(config, embeds, padding)
    config._attn_implementation = hf_snapvit.UNPADDED_SDPA
    ours = _mask(config, embeds, padding)
    assert ours is not None and torch.equal(ours, stock) and not bool(ours.all())
    # A causal mask (what a text model asks for) goes to transformers' builder unchanged.
    causal = unpadded_sdpa_mask(batch_size=1, q_length=4, kv_length=4, allow_is_causal_skip=False)
    assert causal is not None and not bool(causal.all())


@pytest.mark.parametrize("name", ["dinov2", "siglip-vision"])  # a class token and registers; pooled patches
def test_models_with_unpadded_sdpa_compute_what_sdpa_computes_eager_and_compiled(name):
    case = BY_NAME[name]
    model, inputs = case.build(), case.inputs(2)
    reference = output_of(model, inputs)
    model.set_attn_implementation(hf_snapvit.UNPADDED_SDPA)
    assert model.config._attn_implementation == hf_snapvit.UNPADDED_SDPA
    torch.testing.assert_close(output_of(model, inputs), reference, rtol=0, atol=0)
    compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)
    torch.testing.assert_close(output_of(compiled, inputs), reference, rtol=1e-5, atol=1e-5)


def test_a_sliced_model_loads_with_unpadded_sdpa(tmp_path):
    case = BY_NAME["vit"]
    model = case.build()
    ranking = hf_snapvit.rank(model, method="magnitude", show_progress=False)
    hf_snapvit.save_elastic(model, ranking, tmp_path, model_card=False)
    stock = hf_snapvit.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    ours = hf_snapvit.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3,
                                                      attn_implementation=hf_snapvit.UNPADDED_SDPA)
    assert ours.config._attn_implementation == hf_snapvit.UNPADDED_SDPA
    inputs = case.inputs(2)
    torch.testing.assert_close(output_of(ours, inputs), output_of(stock, inputs), rtol=0, atol=0)
