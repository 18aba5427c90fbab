"""Task models built on a supported vision encoder: Depth Anything, DPT with a DINOv2 backbone, ZoeDepth on BEiT, LLaVA,
LLaVA-NeXT, PaliGemma and the other VLMs of TASKS. Only the encoder is pruned; the elastic checkpoint stays a normal checkpoint of the task model, and every
size is the stock task class."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers as T

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel
from hf_snapvit.architectures import get_layers, get_spec, supported_model_types, used_layers
from hf_snapvit.architectures.budget import backbone_parameters, layer_widths, model_shape
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.elastic.ranking import ElasticRanking
from hf_snapvit.surgery.slicing import slice_model_

from helpers import FEW_CROPS, PROCESSOR, images, masked_copy
from support.task_models import TASKS, next_inputs, task_output, task_pixels, vlm_inputs

@pytest.fixture(scope="module", params=TASKS, ids=repr)
def task_checkpoint(request, tmp_path_factory):
    case = request.param
    model = case.model()
    folder = tmp_path_factory.mktemp(case.name)
    hs.save_elastic(model, hs.rank(model, "magnitude"), folder, image_processor=PROCESSOR)
    return case, model, folder


def test_supported_model_types_list_the_task_models():
    assert {case.build(layers=2).config.model_type for case in TASKS} <= set(supported_model_types())
    assert {"depth_anything", "dpt", "llava", "llava_next", "paligemma"} <= set(supported_model_types())


def test_stock_from_pretrained_of_the_elastic_checkpoint_equals_dense(task_checkpoint):
    case, model, folder = task_checkpoint
    stock = type(model).from_pretrained(folder).eval()
    inputs = case.inputs(model)
    torch.testing.assert_close(task_output(stock, inputs), task_output(model, inputs), rtol=1e-4, atol=1e-5)


def test_sparsity_zero_equals_dense(task_checkpoint):
    case, model, folder = task_checkpoint
    loaded = ElasticViTModel.from_pretrained(folder, sparsity=0.0)
    inputs = case.inputs(model)
    assert layer_widths(loaded) == layer_widths(model)
    torch.testing.assert_close(task_output(loaded, inputs), task_output(model, inputs), rtol=1e-4, atol=1e-5)


def test_sparsity_030_is_the_stock_task_class_with_a_smaller_encoder(task_checkpoint):
    case, model, folder = task_checkpoint
    sliced = ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    assert isinstance(sliced, type(model)) and type(sliced).__name__ == type(model).__name__
    assert backbone_parameters(sliced) < 0.75 * backbone_parameters(model)
    # Everything outside the encoder's blocks is loaded as it is: the dense model's tensors.
    blocks = {id(p) for p in get_layers(sliced).parameters()}
    outside = {n: p for n, p in sliced.named_parameters() if id(p) not in blocks}
    dense = dict(model.named_parameters())
    assert len(outside) > 10 and all(torch.equal(p, dense[n]) for n, p in outside.items())
    output = task_output(sliced, case.inputs(model))
    assert torch.isfinite(output).all() and output.shape == task_output(model, case.inputs(model)).shape
    if case.generates:
        inputs = case.inputs(model)
        generated = sliced.generate(**inputs, max_new_tokens=3, do_sample=False)
        assert generated.shape == (2, inputs["input_ids"].shape[1] + 3)


@pytest.mark.parametrize("case", TASKS, ids=repr)
@pytest.mark.parametrize("seed", [0, 1])
def test_masked_equals_sliced_on_random_encoders(case, seed):
    rng = np.random.default_rng(seed)
    heads = int(rng.integers(2, 5))
    model = case.model(seed, layers=int(rng.integers(2, 4)), heads=heads, head_width=8,
                       ffn=int(rng.integers(20, 70)))
    shape = model_shape(model)
    ranking = ElasticRanking(rng.random((shape.num_layers, shape.num_heads)),
                             rng.random((shape.num_layers, shape.intermediate_size)), shape)
    counts = ranking.keep_counts(float(rng.uniform(0.2, 0.5)), width_multiple=1)
    keep = ranking.keep_indices(counts)
    sliced = slice_model_(copy.deepcopy(model), keep)
    assert layer_widths(sliced) == (counts.heads, counts.neurons)
    inputs = case.inputs(model)
    torch.testing.assert_close(task_output(sliced, inputs), task_output(masked_copy(model, keep), inputs),
                               rtol=1e-4, atol=1e-5)


def test_a_switchable_task_model_equals_the_sliced_one_at_each_size(task_checkpoint):
    case, model, folder = task_checkpoint
    switchable = ElasticViTModel.from_pretrained(folder, switchable=True)
    assert isinstance(switchable, type(model))
    inputs = case.inputs(model)
    for sparsity in (0.3, 0.0, 0.5, 0.1):
        switchable.set_budget(sparsity)
        sliced = ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
        torch.testing.assert_close(task_output(switchable, inputs), task_output(sliced, inputs), rtol=1e-4,
                                   atol=1e-5)


# --------------------------------------------------------------------------- LLaVA's unused last block
def test_llava_reads_the_second_to_last_block_and_the_ranking_spends_nothing_on_the_last():
    model = TASKS[2].model(layers=4)
    assert used_layers(model.config) == 3 and model_shape(model).used_layers == 3
    ranking = hs.rank(model, "magnitude")
    floors = ranking.floors(1)
    dense_heads, dense_neurons = ranking.shape.num_heads, ranking.shape.intermediate_size
    for sparsity in (0.005, 0.05, 0.2, 0.4):
        counts = ranking.keep_counts(sparsity, width_multiple=1)
        assert (counts.heads[-1], counts.neurons[-1]) == floors, sparsity
        assert counts.sparsity > 0
    # The first step of the budget path drops the unused block alone: the used blocks stay whole until it is done.
    small = ranking.keep_counts(0.005, width_multiple=1)
    assert small.heads[:-1] == [dense_heads] * 3 and small.neurons[:-1] == [dense_neurons] * 3
    assert ranking.keep_counts(0.0).heads == [dense_heads] * 4
    ratios = ranking.keep_counts_for_ratios(0.1, 0.0)
    assert (ratios.heads[-1], ratios.neurons[-1]) == floors


def test_llava_unused_block_at_its_floors_gives_the_masked_models_outputs(tmp_path):
    model = TASKS[2].model(layers=4)
    hs.save_elastic(model, hs.rank(model, "magnitude"), tmp_path, image_processor=PROCESSOR)
    sliced = ElasticViTModel.from_pretrained(tmp_path, sparsity=0.2, width_multiple=1)
    heads, neurons = layer_widths(sliced)
    assert heads[-1] < heads[0] and neurons[-1] < 64
    ranking = ElasticRanking.from_dict(sliced.config.elastic_ranking)
    permuted = type(model).from_pretrained(tmp_path).eval()  # the elastic checkpoint: units in rank order
    keep = [(np.arange(h), np.arange(f)) for h, f in zip(heads, neurons)]
    inputs = vlm_inputs(model)
    torch.testing.assert_close(task_output(sliced, inputs), task_output(masked_copy(permuted, keep), inputs),
                               rtol=1e-4, atol=1e-5)
    # The unused block's output never reaches the language model: zeroing it entirely changes nothing.
    everything = [(np.arange(4), np.arange(64))] * 3 + [(np.arange(0), np.arange(0))]
    torch.testing.assert_close(task_output(masked_copy(permuted, everything), inputs), task_output(permuted, inputs),
                               rtol=1e-4, atol=1e-5)
    assert ranking.shape.used_layers == 3


def test_snapvit_ranks_a_vlm_through_its_processor_and_the_features_it_reads():
    model = TASKS[2].model(layers=3)
    config = hs.SnapViTConfig(num_gradient_images=6, num_fitness_images=6, max_generations=1,
                              fitness_sparsities=(0.3,), pca_components=4, scores=FEW_CROPS)
    ranking = hs.rank(model, "snapvit", images(12), config=config, processor=PROCESSOR, show_progress=False)
    # The last block's units never reach the features LLaVA reads: their gradient scores are exactly zero.
    assert np.all(ranking.head_scores[-1] == 0) and np.all(ranking.neuron_scores[-1] == 0)
    assert np.any(ranking.head_scores[0] > 0) and np.any(ranking.neuron_scores[1] > 0)
    assert ranking.shape.used_layers == 2


def test_the_embedding_is_the_token_mean_of_the_features_the_task_reads():
    model = TASKS[2].model(layers=3)
    pixels = task_pixels()
    with torch.no_grad():
        hidden = model.model.vision_tower(pixel_values=pixels, output_hidden_states=True).hidden_states
        embedding = image_embedding(model, {"pixel_values": pixels})
    torch.testing.assert_close(embedding, hidden[-2][:, 1:].mean(1))  # default strategy: CLS dropped
    # Depth models read their backbone's feature maps, also where the backbone wraps a model that returns none
    # (ZoeDepth's BeitBackbone around a BeitModel).
    for depth in (TASKS[0].model(), TASKS[-1].model()):
        with torch.no_grad():
            maps = depth.backbone(pixel_values=pixels).feature_maps
            torch.testing.assert_close(image_embedding(depth, {"pixel_values": pixels}),
                                       torch.cat([m.mean(1) for m in maps], -1))


# --------------------------------------------------------------------------- what is not supported
def test_dpt_with_its_own_vit_encoder_gets_one_clear_error():
    model = T.DPTForDepthEstimation(T.DPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                intermediate_size=37, image_size=32, patch_size=8,
                                                neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16))
    with pytest.raises(hs.UnsupportedArchitectureError, match=r"dpt.*backbone_config.*dinov2"):
        hs.rank(model, "magnitude")


def test_an_unregistered_task_model_gets_the_list_of_what_is_supported():
    config = T.InstructBlipConfig()
    with pytest.raises(hs.UnsupportedArchitectureError,
                       match=r"instructblip.*Supported:.*blip-2.*depth_anything.*llava.*paligemma"):
        get_spec(config)


@pytest.mark.slow
@pytest.mark.parametrize("case", [TASKS[0], TASKS[2], TASKS[4]], ids=repr)
def test_a_sliced_task_model_saves_and_reloads_with_and_without_hf_snapvit(case, tmp_path):
    model = case.model()
    hs.save_elastic(model, hs.rank(model, "magnitude"), tmp_path / "elastic", image_processor=PROCESSOR)
    sliced = ElasticViTModel.from_pretrained(tmp_path / "elastic", sparsity=0.3)
    sliced.save_pretrained(tmp_path / "sliced")
    inputs = case.inputs(model)
    expected = task_output(sliced, inputs)
    again = ElasticViTModel.from_pretrained(tmp_path / "sliced")
    torch.testing.assert_close(task_output(again, inputs), expected)
    config = T.AutoConfig.from_pretrained(tmp_path / "sliced", trust_remote_code=True)
    auto = next(iter(config.auto_map))
    remote = getattr(T, auto).from_pretrained(tmp_path / "sliced", trust_remote_code=True).eval()
    assert type(remote).__name__ == type(model).__name__ and layer_widths(remote) == layer_widths(sliced)
    torch.testing.assert_close(task_output(remote, inputs), expected)
    tag = "depth-estimation" if "Depth" in type(model).__name__ else "image-text-to-text"
    encoder = get_spec(model).task.encoder
    for folder in ("elastic", "sliced"):  # both cards say which part was pruned, and the task's Hub pipeline
        card = (tmp_path / folder / "README.md").read_text()
        assert f"Only the vision encoder (`{encoder}`" in card and f"pipeline_tag: {tag}" in card, folder


def test_correction_and_recovery_fit_a_task_models_encoder_to_the_features_its_task_reads(tmp_path):
    from helpers import images as pil_images

    case = TASKS[0]
    model = case.model()
    hs.save_elastic(model, hs.rank(model, "magnitude"), tmp_path, image_processor=PROCESSOR)
    corrected = hs.correct(tmp_path, sparsity=0.3, data=pil_images(16), processor=PROCESSOR)
    record = corrected.config.elastic_correction
    assert record["mean_error_after"] < record["mean_error_before"]
    plain = ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    recovered, _ = hs.recover(plain, ElasticViTModel.from_pretrained(tmp_path), pil_images(8),
                              hs.RecoveryConfig(steps=2, batch_size=4), processor=PROCESSOR, show_progress=False)
    assert layer_widths(recovered) == layer_widths(plain)
    changed = [n for (n, p), q in zip(get_layers(recovered).named_parameters(), get_layers(plain).parameters())
               if not torch.equal(p, q)]
    assert changed  # recovery trained the encoder's blocks
    assert torch.isfinite(task_output(recovered, case.inputs(model))).all()


def test_anyres_tiles_get_a_clear_error_naming_the_fix():
    model = TASKS[3].model()
    tiles = next_inputs(model)["pixel_values"]
    with pytest.raises(hs.DataError, match=r"\[2, 3, 3, 32, 32\].*pixel_values\[:, 0\]"):
        image_embedding(model, {"pixel_values": tiles})
    assert image_embedding(model, {"pixel_values": tiles[:, 0]}).shape == (2, 32)


def test_evaluation_embeds_a_task_model_with_the_features_its_task_reads():
    from hf_snapvit.evaluation.features import extract_features, has_classifier

    model = TASKS[2].model()
    pixels = task_pixels(4)
    assert not has_classifier(model)
    features = extract_features(model, pixels, batch_size=2, show_progress=False)
    assert features.logits is None
    torch.testing.assert_close(features.embeddings, image_embedding(model, {"pixel_values": pixels}))


@pytest.mark.parametrize("case", TASKS, ids=repr)
def test_recovery_and_the_correction_check_read_the_embedding_the_task_reads(case):
    # Both capture the encoder's output with hooks; ZoeDepth's features come from its BeitBackbone, not the BeitModel
    # inside it (get_backbone), so a hook on the wrong module finds no feature maps.
    from hf_snapvit.correction.prefix_sizes import outputs_of
    from hf_snapvit.recovery.forward import forward_outputs

    model = case.model()
    spec = get_spec(model)
    pixels = task_pixels()
    expected = image_embedding(model, {"pixel_values": pixels})
    with torch.no_grad():
        torch.testing.assert_close(forward_outputs(model, spec, pixels).embedding, expected)
    torch.testing.assert_close(outputs_of(model, spec, [{"pixel_values": pixels}])["embedding_mse"][0], expected)
