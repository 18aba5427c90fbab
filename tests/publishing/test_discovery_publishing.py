"""The families that work by discovery alone, through every path a user takes after ranking: the model card, the Hub
upload (checked at the HfApi boundary, as in test_hub.py), stock ``from_pretrained``, sparsity 0, the switchable
model, and the sliced model saved by path and loaded by transformers alone with ``trust_remote_code``."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.architectures import discovery
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery import proof
from hf_snapvit.surgery.proof import _output
from support.discovered import FAMILIES
from support.hub import TOKEN, materialise


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_discovered_family_publishes_loads_stock_switches_and_loads_with_remote_code(family, hub, monkeypatch,
                                                                                       tmp_path):
    monkeypatch.setattr(discovery, "_DISCOVERED", {})  # each family discovered from scratch, as in a new process
    monkeypatch.setattr(proof, "_PROVEN", set())
    torch.manual_seed(0)
    model = FAMILIES[family](transformers).eval()
    model_type = model.config.model_type
    inputs = dummy_inputs(model, 2, seed=3)
    reference = _output(model, inputs)
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    folder = tmp_path / "elastic"
    hs.save_elastic(model, ranking, folder)
    card = (folder / "README.md").read_text()
    assert f"`{model_type}`" in card and "heads and" in card and "FFN neurons per block" in card  # what was pruned

    hs.push_to_hub(f"me/{family}-elastic", folder, token=TOKEN)
    files = hub.only_commit()["files"]
    assert "elastic_spec" in json.loads(files["config.json"])  # the proven spec travels with the upload
    uploaded = materialise(files, tmp_path / "uploaded")
    discovery._DISCOVERED.clear()  # loading reads the spec from config.json
    # Stock from_pretrained reads the elastic checkpoint dense; so does sparsity 0.
    _close(_output(type(model).from_pretrained(uploaded).eval(), inputs), reference)
    _close(_output(hs.ElasticViTModel.from_pretrained(uploaded, sparsity=0.0), inputs), reference)
    sliced = hs.ElasticViTModel.from_pretrained(uploaded, sparsity=0.3)
    switchable = hs.ElasticViTModel.from_pretrained(uploaded, switchable=True)
    switchable.set_budget(sparsity=0.3)
    _close(_output(switchable, inputs), _output(sliced, inputs))

    sliced.save_pretrained(tmp_path / "sliced")
    discovery._DISCOVERED.clear()
    auto = next(iter(json.loads((tmp_path / "sliced" / "config.json").read_text())["auto_map"]))  # as load_with says
    remote = getattr(transformers, auto).from_pretrained(tmp_path / "sliced", trust_remote_code=True).eval()
    torch.testing.assert_close(_output(remote, inputs), _output(sliced, inputs), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["sam", "vitpose"])
def test_snapvit_ranks_a_whole_task_model_on_the_tokens_its_last_block_hands_the_head(family, monkeypatch):
    from hf_snapvit.architectures import get_layers
    from hf_snapvit.architectures.embedding import image_embedding
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    monkeypatch.setattr(discovery, "_DISCOVERED", {})
    monkeypatch.setattr(proof, "_PROVEN", set())
    torch.manual_seed(0)
    model = FAMILIES[family](transformers).eval()
    pixels = dummy_inputs(model, 2, seed=3)["pixel_values"]
    # Its output is the task's (masks, heatmaps), not an embedding: the embedding is the last block's token mean.
    tokens = []
    hook = get_layers(model)[-1].register_forward_hook(
        lambda module, args, output: tokens.append(output[0] if isinstance(output, tuple) else output))
    with torch.no_grad():
        embedding = image_embedding(model, {"pixel_values": pixels})
    hook.remove()
    torch.testing.assert_close(embedding, tokens[0].flatten(1, -2).mean(1))
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=3, num_fitness_images=6, max_generations=1,
                                     scores=ScoreConfig(crops=MultiCropConfig(num_local=2)))
    ranking = hs.rank(model, method="snapvit", data=torch.randn(12, *pixels.shape[1:]), config=config,
                      show_progress=False)
    assert ranking.provenance["method"] == "snapvit" and 0.2 < ranking.keep_counts(0.3).sparsity < 0.4
