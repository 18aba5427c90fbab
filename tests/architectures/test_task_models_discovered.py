"""VLMs whose vision tower no registry knows (Idefics3, SmolVLM, InternVL, Qwen2-VL): the task model is a registered task spec
(data), its tower is discovered inside it and proven, and the proven spec travels in config.json, so a fresh process
loads any size. The language model and connector load as they are; ``generate()`` runs on the sliced model."""

from __future__ import annotations

import json

import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures import discovery, get_spec
from helpers import masked_copy
from support.vlms import VLMS

def _logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


# Each test discovers, reads and proves specs from scratch, as a new process would (conftest.fresh_process).
pytestmark = pytest.mark.usefixtures("fresh_process")


@pytest.mark.parametrize("name", list(VLMS))
def test_a_vlm_with_a_discovered_tower_is_ranked_saved_and_loaded_at_any_size(name, tmp_path):
    torch.manual_seed(0)
    model = VLMS[name][0]().eval()
    tower_type = model.config.vision_config.model_type
    assert tower_type not in hs.supported_model_types() and model.config.model_type in hs.supported_model_types()
    inputs = VLMS[name][1](model)
    reference = _logits(model, inputs)
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    stored_ranking = hs.save_elastic(model, ranking, tmp_path, model_card=False)
    assert json.loads((tmp_path / "config.json").read_text())["elastic_spec"]["layers"]  # the tower's proven spec
    discovery._DISCOVERED.clear()  # a fresh process: the spec comes from config.json
    torch.testing.assert_close(_logits(hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.0), inputs), reference,
                               rtol=1e-4, atol=1e-5)
    sliced = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.2)
    spec = get_spec(sliced)
    tower = sliced.get_submodule(spec.encoder)
    assert isinstance(sliced, type(model)) and sum(p.numel() for p in tower.parameters()) < sum(
        p.numel() for p in model.get_submodule(spec.encoder).parameters())
    masked = masked_copy(model, ranking.keep_indices(stored_ranking.keep_counts(0.2)))
    expected = _logits(sliced, inputs)
    torch.testing.assert_close(expected, _logits(masked, inputs), rtol=1e-4, atol=1e-5)
    switchable = hs.ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    switchable.set_budget(sparsity=0.2)
    torch.testing.assert_close(_logits(switchable, inputs), expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        generated = sliced.generate(**inputs, max_new_tokens=2, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 2


@pytest.mark.parametrize("name", list(VLMS))
def test_snapvit_ranks_a_vlm_with_a_discovered_tower_on_the_tokens_its_connector_reads(name):
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    torch.manual_seed(0)
    model = VLMS[name][0]().eval()
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=2, num_fitness_images=4, max_generations=1,
                                     population_size=4, scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    ranking = hs.rank(model, method="snapvit", data=torch.randn(8, 3, 32, 32), config=config, show_progress=False)
    assert ranking.provenance["method"] == "snapvit" and 0.15 < ranking.keep_counts(0.2).sparsity < 0.25
