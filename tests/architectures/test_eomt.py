"""EoMT (``EomtForUniversalSegmentation``), a registered spec (data) that keeps every head: its forward expands the
segmentation queries' attention mask to ``config.num_attention_heads`` in every block, so only FFN neurons are pruned.
transformers builds EoMT's loss with scipy (in ``[test]``)."""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.architectures.embedding import dummy_inputs
from hf_snapvit.surgery.proof import _output
from helpers import masked_copy


@pytest.fixture(scope="module")
def eomt(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.EomtForUniversalSegmentation(transformers.EomtConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32,
        patch_size=8, num_queries=4, num_blocks=1, num_register_tokens=2)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    ranking = hs.rank(model, method="magnitude", show_progress=False)
    folder = tmp_path_factory.mktemp("eomt")
    stored = hs.save_elastic(model, ranking, folder)
    return model, ranking, stored, folder


def test_eomt_loads_dense_stock_and_at_sparsity_0(eomt):
    model, _, _, folder = eomt
    inputs = dummy_inputs(model, 2, seed=3)
    reference = _output(model, inputs)
    torch.testing.assert_close(_output(type(model).from_pretrained(folder).eval(), inputs), reference)
    torch.testing.assert_close(_output(hs.ElasticViTModel.from_pretrained(folder, sparsity=0.0), inputs), reference)
    assert "`eomt`" in (folder / "README.md").read_text()  # the card names what was pruned


def test_eomt_sliced_keeps_every_head_equals_masking_switchable_and_remote_code(eomt, tmp_path):
    model, ranking, stored, folder = eomt
    inputs = dummy_inputs(model, 2, seed=3)
    counts = stored.keep_counts(0.2)
    assert counts.heads == [4, 4] and sum(counts.neurons) < 2 * ranking.shape.intermediate_size
    sliced = hs.ElasticViTModel.from_pretrained(folder, sparsity=0.2)
    assert isinstance(sliced, type(model)) and sum(p.numel() for p in sliced.parameters()) < sum(
        p.numel() for p in model.parameters())
    expected = _output(sliced, inputs)
    torch.testing.assert_close(expected, _output(masked_copy(model, ranking.keep_indices(counts)), inputs),
                               rtol=1e-4, atol=1e-5)
    switchable = hs.ElasticViTModel.from_pretrained(folder, switchable=True)
    switchable.set_budget(sparsity=0.2)
    torch.testing.assert_close(_output(switchable, inputs), expected, rtol=1e-4, atol=1e-5)
    sliced.save_pretrained(tmp_path / "sliced")
    # The auto class the sliced config's auto_map names (EoMT is in transformers' AutoModel mapping).
    remote = transformers.AutoModel.from_pretrained(tmp_path / "sliced", trust_remote_code=True).eval()
    assert type(remote).__name__ == "EomtForUniversalSegmentation"
    torch.testing.assert_close(_output(remote, inputs), expected, rtol=0, atol=0)


def test_snapvit_ranks_eomt_from_images_with_every_head_kept(eomt):
    from hf_snapvit.data.views import MultiCropConfig
    from hf_snapvit.pruning.scoring import ScoreConfig

    model = eomt[0]
    config = hs.SnapViTConfig.preset("fast", num_gradient_images=2, num_fitness_images=4, max_generations=1,
                                     population_size=4, scores=ScoreConfig(crops=MultiCropConfig(num_local=1)))
    ranking = hs.rank(model, method="snapvit", data=torch.randn(8, 3, 32, 32), config=config, show_progress=False)
    counts = ranking.keep_counts(0.2)
    assert counts.heads == [4, 4] and sum(counts.neurons) < 2 * ranking.shape.intermediate_size
