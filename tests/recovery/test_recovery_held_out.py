"""Recovery never hides a size it made worse: each checked size's loss on images it never trained on, before and
after, in ``config.elastic_recovery["held_out"]``, with a warning naming every size that got worse."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import hf_snapvit
from hf_snapvit.errors import RecoveryError
from hf_snapvit.recovery import RecoveryConfig, recover
from hf_snapvit.recovery.held_out import held_out_sizes, split_held_out
from hf_snapvit.surgery.slicing import slice_model_

from helpers import CASES, PROCESSOR, images

CASE = {c.name: c for c in CASES}
FAST = dict(steps=4, batch_size=4, warmup_steps=1)


def pixels(n, seed=0):
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def sliced(model):
    return slice_model_(copy.deepcopy(model), [(np.arange(2), np.arange(10))] * 2)


def test_the_held_out_images_are_never_trained_on_and_training_sees_the_images_it_saw_without_them():
    config = RecoveryConfig(held_out_images=4)
    drawn = list(range(20))
    train, held, why = split_held_out(drawn, 10, config)
    assert train == list(range(10)) and held == [10, 11, 12, 13] and why is None
    train, held, why = split_held_out(drawn[:12], 10, config)  # short data: the check comes off the end
    assert train == list(range(8)) and held == [8, 9, 10, 11] and not set(train) & set(held)
    train, held, why = split_held_out(drawn[:7], 10, config)  # too short for both: no check, and it says why
    assert train == drawn[:7] and held is None and "only 7 images" in why
    train, held, why = split_held_out(drawn, 10, RecoveryConfig(held_out_images=0))
    assert train == list(range(10)) and held is None and why == "held_out_images=0"


def test_a_per_size_recovery_reports_its_size_before_and_after():
    teacher = CASE["vit"].build()
    config = RecoveryConfig(**FAST, lr=1e-3, num_images=16, held_out_images=8)
    trained, summary = recover(sliced(teacher), teacher, pixels(24), config, show_progress=False)
    record = trained.config.elastic_recovery["held_out"]
    assert record["num_images"] == 8 and len(record["sizes"]) == 1 and record["sizes"][0]["sparsity"] is None
    row = record["sizes"][0]
    assert row["loss_before"] > 0 and row["loss_after"] < row["loss_before"] and record["worse"] == []
    assert summary.num_images == 16  # the 8 held-out images were not trained on


def test_an_elastic_recovery_checks_both_ends_and_every_tenth_between():
    model = CASE["vit-cls"].build()
    ranking = hf_snapvit.rank(model, method="magnitude")
    sizes = held_out_sizes([(0.05, ranking.sorted()), (0.4, ranking.sorted())])
    assert [s for s, _ in sizes] == [0.05, 0.1, 0.2, 0.3, 0.4]
    assert [c.sparsity for _, c in sizes] == sorted(c.sparsity for _, c in sizes)


def test_a_size_made_worse_is_reported_and_warned_about(tmp_path):
    model = CASE["vit-cls"].build()
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), tmp_path, image_processor=PROCESSOR)
    dense = hf_snapvit.ElasticViTModel.from_pretrained(tmp_path)
    # The unsliced view starts equal to its teacher (loss 0): any training of the shared weights makes it worse.
    config = RecoveryConfig(**FAST, lr=1e-2, num_images=16, held_out_images=8, elastic=True, elastic_range=(0.0, 0.3))
    with pytest.warns(UserWarning, match=r"worse than before on 8 held-out images: sparsity 0 \(0 -> "):
        trained, _ = recover(dense, None, pixels(24), config, show_progress=False)
    record = trained.config.elastic_recovery["held_out"]
    assert [row["sparsity"] for row in record["sizes"]] == [0.0, 0.1, 0.2, 0.3]
    assert record["sizes"][0]["loss_before"] == 0 and 0.0 in record["worse"]
    assert all(row["loss_before"] > 0 for row in record["sizes"][1:])
    assert set(record["worse"]) == {row["sparsity"] for row in record["sizes"]
                                    if row["loss_after"] > row["loss_before"]}


def test_too_few_images_for_a_check_say_so_in_a_warning_and_the_record():
    teacher = CASE["vit"].build()
    with pytest.warns(UserWarning, match="could not check .* only 12 images"):
        trained, _ = recover(sliced(teacher), teacher, images(12), RecoveryConfig(**FAST, num_images=None),
                             processor=PROCESSOR, show_progress=False)
    assert "only 12 images" in trained.config.elastic_recovery["held_out"]["skipped"]


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_a_bad_held_out_count_is_refused(bad):
    with pytest.raises(RecoveryError, match="held_out_images"):
        RecoveryConfig(held_out_images=bad)


def test_a_size_outside_the_recovered_range_warns_once_and_its_card_tells_the_recovery(tmp_path):
    import warnings

    model = CASE["vit-cls"].build()
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), tmp_path / "e", image_processor=PROCESSOR)
    dense = hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "e")
    config = RecoveryConfig(**FAST, num_images=16, held_out_images=8, elastic=True, elastic_range=(0.1, 0.3))
    trained, _ = recover(dense, None, pixels(24), config, show_progress=False)
    ranking = hf_snapvit.ElasticRanking.from_dict(trained.config.elastic_ranking)
    hf_snapvit.save_elastic(trained, ranking, tmp_path / "r")
    card = (tmp_path / "r" / "README.md").read_text()
    assert "## Recovery" in card and "between sparsity 0.1 and 0.3" in card and "4 steps of 4 images" in card
    rows = [line for line in card.split("## Recovery")[1].splitlines() if line.startswith(("| 10 %", "| 20 %", "| 30 %"))]
    assert len(rows) == 3  # the held-out loss of each checked size, before and after
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "r", sparsity=0.2)  # inside: silent
        hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "r", sparsity=0.5)  # outside: warns
        hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "r", sparsity=0.45)  # the same checkpoint: once
        switchable = hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "r", switchable=True)
        switchable.set_budget(0.2)
    untrained = [w for w in caught if "was not trained" in str(w.message)]
    assert len(untrained) == 1 and "sparsities 0.1 to 0.3" in str(untrained[0].message)
