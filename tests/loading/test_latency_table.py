"""Latency tables: the inverse of a measured latency curve, which table applies where, files, and the end-to-end
latency budget on CPU."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel, LatencyTable
from hf_snapvit.errors import BudgetError, CheckpointError
from hf_snapvit.loading.latency_table import (LATENCY_FILE, choose_table, device_name, read_latency_file,
                                      write_latency_file)


def table(**overrides) -> LatencyTable:
    fields = dict(device="cpu: test (2 threads)", dtype="float32", batch_size=8, width_multiple=1,
                  sparsities=(0.0, 0.2, 0.4, 0.6), gflops=(4.0, 3.2, 2.4, 1.6), latency_ms=(10.0, 8.0, 6.0, 4.0))
    return LatencyTable(**(fields | overrides))


def test_the_largest_size_that_fits_is_interpolated_between_measured_sizes():
    t = table()
    assert t.sparsity_for(10.0) == 0.0 and t.sparsity_for(50.0) == 0.0
    assert t.sparsity_for(7.0) == pytest.approx(0.3)
    assert t.sparsity_for(4.0) == pytest.approx(0.6)
    assert t.latency_at(0.3) == pytest.approx(7.0)
    with pytest.raises(BudgetError, match=r"latency_ms=3\.0 is out of range.*latency_ms >= 4\.000"):
        t.sparsity_for(3.0)


def test_noise_never_makes_a_larger_model_look_faster():
    # The 0.2 size was measured slower than the dense one: it is charged at least what every smaller size costs.
    t = table(latency_ms=(8.0, 9.0, 6.0, 4.0))
    assert list(t.envelope()) == [9.0, 9.0, 6.0, 4.0]
    assert t.sparsity_for(8.5) == pytest.approx(0.2 + 0.2 * (9.0 - 8.5) / 3.0)


@pytest.mark.parametrize("bad, message", [
    (dict(sparsities=(0.0,), gflops=(1.0,), latency_ms=(1.0,)), "at least 2 sizes"),
    (dict(latency_ms=(1.0, float("nan"), 1.0, 1.0)), "finite non-negative"),
    (dict(sparsities=(0.0, 0.4, 0.2, 0.6)), "strictly ascending"),
    (dict(batch_size=0), "positive integer"),
])
def test_bad_tables_are_refused(bad, message):
    with pytest.raises(CheckpointError, match=message):
        table(**bad)


def test_only_a_table_of_this_device_dtype_batch_and_multiple_applies():
    cpu8, cpu1 = table(), table(batch_size=1)
    bf16 = table(dtype="bfloat16")
    assert choose_table([cpu8, bf16], "cpu: test (2 threads)", "float32", 1, None) is cpu8
    assert choose_table([cpu8, cpu1], "cpu: test (2 threads)", "float32", 1, 1) is cpu1
    with pytest.raises(BudgetError, match=r"batch sizes \[1, 8\]: pass batch_size="):
        choose_table([cpu8, cpu1], "cpu: test (2 threads)", "float32", 1, None)
    with pytest.raises(BudgetError, match="No latency table for cuda: H100.*measure_latency"):
        choose_table([cpu8], "cuda: H100", "float32", 1, None)
    with pytest.raises(BudgetError, match="width multiple 64"):
        choose_table([cpu8], "cpu: test (2 threads)", "float32", 64, None)


def test_files_round_trip_merge_by_key_and_refuse_corruption(tmp_path):
    write_latency_file([table(), table(batch_size=1)], tmp_path)
    written = write_latency_file([table(latency_ms=(5.0, 4.0, 3.0, 2.0))], tmp_path)  # replaces the batch-8 table
    tables = read_latency_file(tmp_path / LATENCY_FILE)
    assert written == tables
    assert sorted(t.batch_size for t in tables) == [1, 8]
    assert next(t for t in tables if t.batch_size == 8).latency_ms[0] == 5.0
    (tmp_path / LATENCY_FILE).write_text(json.dumps({"tables": [{"device": "x"}]}))
    with pytest.raises(CheckpointError, match="lacks"):
        read_latency_file(tmp_path / LATENCY_FILE)
    (tmp_path / LATENCY_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="not a readable latency file"):
        read_latency_file(tmp_path / LATENCY_FILE)
    (tmp_path / LATENCY_FILE).write_text(json.dumps({"format": 99, "tables": []}))
    with pytest.raises(CheckpointError, match="upgrade"):
        read_latency_file(tmp_path / LATENCY_FILE)


def test_device_names_say_what_a_latency_is_specific_to():
    assert device_name("cpu").startswith("cpu: ") and f"({torch.get_num_threads()} threads)" in device_name("cpu")


@pytest.fixture(scope="module")
def switchable_folder(tmp_path_factory):
    """An elastic ViT large enough that its sizes differ in latency on a CPU (a few ms per pass)."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                    intermediate_size=1024, image_size=64, patch_size=8)
    model = transformers.ViTModel(config).eval()
    folder = tmp_path_factory.mktemp("elastic")
    hs.save_elastic(model, hs.rank(model, method="magnitude"), folder)
    return folder


def test_measuring_keeps_the_model_as_it_was_and_refuses_another_device_or_dtype(switchable_folder):
    model = ElasticViTModel.from_pretrained(switchable_folder, switchable=True, sparsity=0.2)
    before = model.elastic_budget
    seen = []
    hook = model.register_forward_hook(lambda module, args, output: seen.append(module.elastic_budget.sparsity))
    measured = hs.measure_latency(model, batch_size=2, sparsities=[0.0, 0.3, 0.5], repeats=2, warmup=0,
                                  show_progress=False)
    hook.remove()
    # One pass at each size per round, the order rotated by one size per round: 0 1 2, then 1 2 0.
    assert [sorted(set(seen)).index(s) for s in seen] == [0, 1, 2, 1, 2, 0]
    assert model.elastic_budget == before
    assert model.elastic_latency_tables == [measured]
    assert measured.batch_size == 2 and measured.dtype == "float32" and measured.device == device_name("cpu")
    assert len(measured.sparsities) == 3 and measured.gflops[0] > measured.gflops[-1]
    with pytest.raises(BudgetError, match="differs from the model's dtype"):
        hs.measure_latency(model, dtype=torch.bfloat16, show_progress=False)
    with pytest.raises(BudgetError, match="batch_size=0"):
        hs.measure_latency(model, batch_size=0, show_progress=False)
    # In another dtype no table applies: the budget asks for a measurement instead of guessing.
    half = ElasticViTModel.from_pretrained(switchable_folder, switchable=True, dtype=torch.bfloat16)
    half.add_latency_table(measured)
    with pytest.raises(BudgetError, match="No latency table for .* bfloat16"):
        half.set_budget(latency_ms=1e3)


@pytest.mark.slow
def test_a_latency_budget_picks_a_size_whose_measured_latency_fits(switchable_folder):
    model = ElasticViTModel.from_pretrained(switchable_folder, switchable=True)
    measured = hs.measure_latency(model, batch_size=4, repeats=9, show_progress=False)
    curve = measured.envelope()
    target = float(curve[0] + curve[-1]) / 2  # between the dense and the smallest model
    budget = model.set_budget(latency_ms=target)
    assert 0.0 < budget.sparsity <= model.max_sparsity()
    assert budget.requested == {"latency_ms": target, "batch_size": 4}
    assert budget.predicted_latency_ms <= target * 1.02  # within one width group of the interpolated size
    # The chosen size is one the measured table puts within the target (how fast it then runs is a benchmark's
    # measurement, benchmarks/bench_switching.py, not a unit test's).
    assert measured.latency_at(budget.sparsity) <= target * 1.02
    assert model.elastic_budget == budget
    with pytest.raises(BudgetError, match="out of range"):
        model.set_budget(latency_ms=float(curve[-1]) / 10)


def test_a_latency_budget_never_resolves_to_a_size_predicted_over_it(switchable_folder):
    model = ElasticViTModel.from_pretrained(switchable_folder, switchable=True)
    # A synthetic table, linear in sparsity, for this device: budgets land between any two resolvable sizes.
    top = model.max_sparsity()
    model.add_latency_table(LatencyTable(device=device_name("cpu"), dtype="float32", batch_size=1,
                                         width_multiple=model.set_budget(sparsity=0.0).width_multiple,
                                         sparsities=(0.0, top), gflops=(2.0, 1.0), latency_ms=(10.0, 5.0)))
    for target in torch.linspace(5.0, 10.0, 101).tolist():
        budget = model.set_budget(latency_ms=target)
        assert budget.predicted_latency_ms <= target + 1e-9, (target, budget)
    assert model.set_budget(latency_ms=10.0).sparsity == 0.0
    for bad in (0, -2, True, 1.5):
        with pytest.raises(BudgetError, match=f"batch_size={bad!r} must be a positive integer"):
            model.set_budget(latency_ms=8.0, batch_size=bad)
    with pytest.raises(BudgetError, match="must be a real number"):
        model.set_budget(sparsity=[0.3])


def test_a_custom_grid_always_includes_the_dense_size(switchable_folder):
    model = ElasticViTModel.from_pretrained(switchable_folder, switchable=True)
    measured = hs.measure_latency(model, batch_size=1, sparsities=[0.3, 0.5], repeats=1, warmup=0,
                                  show_progress=False)
    assert measured.sparsities[0] == 0.0 and len(measured.sparsities) == 3
