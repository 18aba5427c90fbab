"""Switchable models: one resident model switched in place equals the separately sliced model at every budget, in any
order of switches, without touching the weights' storage."""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.errors import BudgetError, ConfigError
from hf_snapvit.surgery.switching import PrefixLinear
from helpers import CASES, masked_copy, output_of

SEQUENCE = (0.3, 0.0, 0.5, 0.1, 0.5, 0.3)
NAMED = {c.name: c for c in CASES}
FAMILIES = list(CASES)  # the families the issue names (ViT, DINOv2, SigLIP vision, ViT classifier) and every other


def storage(model: torch.nn.Module) -> list[tuple[str, int, int]]:
    return [(n, p.data_ptr(), p.nbytes) for n, p in model.named_parameters()]


@pytest.mark.parametrize("case", FAMILIES, ids=repr)
def test_switching_through_a_sequence_equals_the_separately_sliced_model(case, elastic):
    model = ElasticViTModel.from_pretrained(elastic[case.name], switchable=True)
    before = storage(model)
    inputs = case.inputs(2)
    top = model.max_sparsity()
    assert model.elastic_budget.sparsity == 0.0
    references = {}  # the sequence comes back to sizes it had: each separately sliced model is loaded once
    for sparsity in SEQUENCE:
        sparsity = min(sparsity, top)
        budget = model.set_budget(sparsity=sparsity)
        if sparsity not in references:
            references[sparsity] = ElasticViTModel.from_pretrained(elastic[case.name], sparsity=sparsity)
        reference = references[sparsity]
        assert (list(budget.heads), list(budget.neurons)) == layer_widths(reference)
        layout = getattr(reference.config, "elastic_layout", None) or {"sparsity": 0.0}
        assert budget.sparsity == pytest.approx(layout["sparsity"], abs=1e-6)
        torch.testing.assert_close(output_of(model, inputs), output_of(reference, inputs), rtol=1e-5, atol=1e-4)
    assert storage(model) == before


@pytest.mark.parametrize("case", [NAMED[n] for n in ("vit", "dinov2-swiglu", "siglip-vision", "vit-cls")], ids=repr)
def test_switched_model_equals_the_masked_dense_model(case, elastic):
    dense = transformers.AutoModel.from_pretrained(elastic[case.name]) if case.name != "vit-cls" else \
        transformers.ViTForImageClassification.from_pretrained(elastic[case.name])
    model = ElasticViTModel.from_pretrained(elastic[case.name], switchable=True)
    for sparsity in (0.4, 0.2):
        budget = model.set_budget(sparsity=min(sparsity, model.max_sparsity()))
        keep = [(np.arange(h), np.arange(f)) for h, f in zip(budget.heads, budget.neurons)]
        torch.testing.assert_close(output_of(model, case.inputs(2)), output_of(masked_copy(dense, keep),
                                                                               case.inputs(2)), rtol=1e-5, atol=1e-4)


def _random_vit(rng: np.random.Generator) -> transformers.PreTrainedModel:
    heads = int(rng.integers(2, 6))
    config = transformers.ViTConfig(hidden_size=8 * heads, num_attention_heads=heads,
                                    num_hidden_layers=int(rng.integers(1, 4)),
                                    intermediate_size=int(rng.integers(8, 80)), image_size=16, patch_size=8,
                                    qkv_bias=bool(rng.integers(0, 2)))
    torch.manual_seed(int(rng.integers(0, 1000)))
    model = transformers.ViTModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize("seed", range(6))
def test_random_architectures_and_budget_sequences(seed, tmp_path):
    rng = np.random.default_rng(seed)
    base = _random_vit(rng)
    hs.save_elastic(base, hs.rank(base, method="random", seed=seed), tmp_path, model_card=False)
    model = ElasticViTModel.from_pretrained(tmp_path, switchable=True)
    before = storage(model)
    pixels = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))}
    dense = model.set_budget(sparsity=0.0)
    for _ in range(5):
        multiple = [None, 1, 4][int(rng.integers(0, 3))]
        top = model.max_sparsity(multiple)
        kind = ["sparsity", "target_gflops", "target_params"][int(rng.integers(0, 3))]
        fraction = float(rng.uniform(0, top))
        value = {"sparsity": fraction, "target_gflops": dense.gflops * (1 - fraction),
                 "target_params": int(dense.num_params * (1 - fraction))}[kind]
        try:
            budget = model.set_budget(**{kind: value}, width_multiple=multiple)
        except BudgetError:  # a GFLOP or parameter target below the floors' smallest model
            continue
        reference = ElasticViTModel.from_pretrained(tmp_path, **{kind: value}, width_multiple=multiple)
        assert (list(budget.heads), list(budget.neurons)) == layer_widths(reference)
        torch.testing.assert_close(output_of(model, pixels), output_of(reference, pixels), rtol=1e-5, atol=1e-4)
    assert storage(model) == before


@pytest.mark.parametrize("bad", [-0.1, 1.0, float("nan"), "0.3", None])
def test_bad_sparsities_are_refused_and_leave_the_model_as_it_was(bad, elastic):
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True, sparsity=0.2)
    before = model.elastic_budget
    with pytest.raises(ValueError) as raised:
        model.set_budget(sparsity=bad)
    assert isinstance(raised.value, hs.SnapViTError)
    message = str(raised.value)
    if bad is not None:
        assert repr(bad) in message or str(bad) in message
    if isinstance(bad, float) and math.isfinite(bad):
        assert "0 <= sparsity <=" in message  # the valid range
    assert model.elastic_budget == before
    assert layer_widths(model) == (list(before.heads), list(before.neurons))


def test_one_budget_at_a_time_and_batch_size_only_with_latency(elastic):
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True)
    with pytest.raises(BudgetError, match="exactly one"):
        model.set_budget(sparsity=0.1, target_gflops=0.0005)
    with pytest.raises(BudgetError, match="batch_size"):
        model.set_budget(sparsity=0.1, batch_size=4)
    with pytest.raises(BudgetError, match="latency_ms=-1.*positive"):
        model.set_budget(latency_ms=-1)


def test_the_budget_context_restores_the_previous_size_also_after_an_error(elastic):
    case = NAMED["dinov2"]
    model = ElasticViTModel.from_pretrained(elastic["dinov2"], switchable=True, sparsity=0.1)
    outer = model.elastic_budget
    expected = output_of(model, case.inputs(1))
    with model.budget(sparsity=0.5) as inner:
        assert inner.sparsity > outer.sparsity and model.elastic_budget == inner
    assert model.elastic_budget == outer
    with pytest.raises(RuntimeError, match="boom"), model.budget(sparsity=0.3):
        raise RuntimeError("boom")
    assert model.elastic_budget == outer
    torch.testing.assert_close(output_of(model, case.inputs(1)), expected)


def test_gradients_reach_exactly_the_active_prefix_and_match_the_sliced_model(elastic):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True).train()
    budget = model.set_budget(sparsity=0.4)
    reference = ElasticViTModel.from_pretrained(elastic["vit-cls"], sparsity=0.4).train()
    torch.manual_seed(0)
    model(**case.inputs(2)).logits.sum().backward()
    reference(**case.inputs(2)).logits.sum().backward()
    for name, param in model.named_parameters():
        ref = dict(reference.named_parameters())[name]
        prefix = tuple(slice(0, n) for n in ref.shape)
        torch.testing.assert_close(param.grad[prefix], ref.grad, rtol=1e-5, atol=1e-6)
        outside = param.grad.clone()
        outside[prefix] = 0
        assert not outside.any(), name
    assert sum(budget.neurons) < model.config.num_hidden_layers * model.config.intermediate_size


def test_to_sliced_is_the_separately_sliced_model_and_leaves_the_switchable_one_alone(elastic):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True, sparsity=0.3)
    before = storage(model)
    sliced = model.to_sliced()
    reference = ElasticViTModel.from_pretrained(elastic["vit-cls"], sparsity=0.3)
    assert type(sliced) is type(reference) and type(sliced).__module__ == "hf_snapvit.loading.sliced"
    assert sliced.config.elastic_layout == reference.config.elastic_layout
    assert not any(isinstance(m, PrefixLinear) for m in sliced.modules())
    torch.testing.assert_close(output_of(sliced, case.inputs(2)), output_of(reference, case.inputs(2)))
    ours = {p.data_ptr() for p in model.parameters()}
    assert not ours & {p.data_ptr() for p in sliced.parameters()}  # an independent copy
    assert storage(model) == before and model.elastic_budget.sparsity > 0
    assert getattr(model.config, "elastic_layout", None) is None


def test_save_pretrained_at_the_current_size_and_whole(elastic, tmp_path):
    case = NAMED["vit-cls"]
    model = ElasticViTModel.from_pretrained(elastic["vit-cls"], switchable=True, sparsity=0.3)
    expected = output_of(model, case.inputs(2))
    model.save_pretrained(tmp_path / "current")
    small = ElasticViTModel.from_pretrained(tmp_path / "current")
    assert small.config.elastic_layout["num_heads"] == list(model.elastic_budget.heads)
    torch.testing.assert_close(output_of(small, case.inputs(2)), expected)
    assert (tmp_path / "current" / "README.md").is_file()

    table = hs.LatencyTable(device="cpu: test (1 threads)", dtype="float32", batch_size=2, width_multiple=1,
                            sparsities=(0.0, 0.4), gflops=(1.0, 0.6), latency_ms=(2.0, 1.0))
    model.add_latency_table(table)
    model.save_pretrained(tmp_path / "whole", whole=True)
    again = ElasticViTModel.from_pretrained(tmp_path / "whole", switchable=True)
    assert again.elastic_latency_tables == [table]
    stock = transformers.ViTForImageClassification.from_pretrained(tmp_path / "whole")  # dense, stock-loadable
    assert layer_widths(stock) == layer_widths(case.build())
    for sparsity in (0.3, 0.0):
        again.set_budget(sparsity=sparsity)
        model.set_budget(sparsity=sparsity)
        torch.testing.assert_close(output_of(again, case.inputs(2)), output_of(model, case.inputs(2)))


def test_a_copy_switches_on_its_own_and_pickles(elastic):
    case = NAMED["vit"]
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True, sparsity=0.2)
    twin = copy.deepcopy(model)
    twin.set_budget(sparsity=0.5)
    assert model.elastic_budget.sparsity < twin.elastic_budget.sparsity
    # Each switches its own modules: the original still computes at its own size, the copy at the copy's.
    assert layer_widths(model) == (list(model.elastic_budget.heads), list(model.elastic_budget.neurons))
    assert layer_widths(twin) == (list(twin.elastic_budget.heads), list(twin.elastic_budget.neurons))
    restored = pickle.loads(pickle.dumps(twin))
    assert type(restored) is type(model) and restored.elastic_budget == twin.elastic_budget
    restored.set_budget(sparsity=0.0)
    assert layer_widths(twin) == (list(twin.elastic_budget.heads), list(twin.elastic_budget.neurons))
    restored.set_budget(sparsity=0.5)
    torch.testing.assert_close(output_of(restored, case.inputs(1)), output_of(twin, case.inputs(1)))


def test_a_budget_given_to_from_pretrained_is_the_starting_size(elastic):
    model = ElasticViTModel.from_pretrained(elastic["clip-vision"], switchable=True, target_gflops=0.0005)
    reference = ElasticViTModel.from_pretrained(elastic["clip-vision"], target_gflops=0.0005)
    assert (list(model.elastic_budget.heads), list(model.elastic_budget.neurons)) == layer_widths(reference)
    assert model.elastic_budget.requested == {"target_gflops": 0.0005}


def test_switchable_loads_refuse_what_they_cannot_serve(elastic, tmp_path):
    ElasticViTModel.from_pretrained(elastic["vit"], sparsity=0.3).save_pretrained(tmp_path / "sliced")
    with pytest.raises(ConfigError, match="dense elastic checkpoint"):
        ElasticViTModel.from_pretrained(tmp_path / "sliced", switchable=True)
    with pytest.raises(ConfigError, match="switchable='yes' must be True or False"):
        ElasticViTModel.from_pretrained(elastic["vit"], switchable="yes")
    with pytest.raises(ConfigError, match="one size"):
        hs.correct(elastic["vit"], sparsity=0.3, data=torch.zeros(2, 3, 32, 32), switchable=True)


def test_a_stock_model_of_the_switchable_class_says_how_to_load_one():
    from hf_snapvit.loading.switchable import switchable_class

    model = switchable_class(transformers.ViTModel)(transformers.ViTConfig(**NAMED_CONFIG))
    with pytest.raises(ConfigError, match="switchable=True"):
        model.set_budget(sparsity=0.1)


NAMED_CONFIG = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37, image_size=32,
                    patch_size=8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_switching_equals_the_sliced_model_in_that_dtype(dtype, elastic):
    case = NAMED["dinov2"]
    model = ElasticViTModel.from_pretrained(elastic["dinov2"], switchable=True, dtype=dtype)
    reference = ElasticViTModel.from_pretrained(elastic["dinov2"], sparsity=0.4, dtype=dtype)
    model.set_budget(sparsity=0.4)
    inputs = {k: v.to(dtype) for k, v in case.inputs(2).items()}
    torch.testing.assert_close(output_of(model, inputs).float(), output_of(reference, inputs).float(),
                               rtol=2e-2, atol=2e-2)


@pytest.fixture
def fresh_dynamo():
    """Each switch recompiles the stock modules' forward code, which every model of that class shares: clear
    dynamo's caches before and after, so these recompilations do not use up the recompile limit of later tests."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_after_switches(backend, elastic, fresh_dynamo):
    case = NAMED["vit"]
    model = ElasticViTModel.from_pretrained(elastic["vit"], switchable=True)
    compiled = torch.compile(model, backend=backend)
    for sparsity in (0.3, 0.0, 0.5, 0.3):
        model.set_budget(sparsity=sparsity)
        reference = ElasticViTModel.from_pretrained(elastic["vit"], sparsity=sparsity)
        torch.testing.assert_close(output_of(compiled, case.inputs(2)), output_of(reference, case.inputs(2)),
                                   rtol=1e-5, atol=1e-4)
