"""Issue 53: draws that cover their source. Every kind of ``data=`` draws the same way (the rows of smallest seeded
key): a stream draws what the same rows opened map-style draw, spread over its shards and a bounded prefix, holding
only the sample; a draw that cannot represent its data warns with the numbers and records what it covered."""

from __future__ import annotations

import json
import os
import sys
import warnings

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

import hf_snapvit as hs
from hf_snapvit.data import coverage, sampling
from hf_snapvit.data.calibration import draw_sample, sample_images
from hf_snapvit.evaluation import load_split
from hf_snapvit.data.sampling import StreamSource, key_order, row_keys, stream_candidates

from helpers import CASES, FEW_CROPS, PROCESSOR, images, run_at_once

CASE = {c.name: c for c in CASES}
NAMES = [f"class {c}" for c in range(40)]


def pixels(drawn) -> list[bytes]:
    return [image.tobytes() for image in drawn]


def coloured(label: int, i: int) -> Image.Image:
    """A 16x16 image whose colour says its class (and a little noise, its index)."""
    rng = np.random.default_rng(i)
    base = np.array([(37 * label) % 256, (91 * label) % 256, (53 * label) % 256], dtype=np.int16)
    return Image.fromarray(np.clip(base + rng.integers(-6, 7, (16, 16, 3)), 0, 255).astype(np.uint8))


def sorted_table(classes: int, per_class: int, *, class_label: bool = True) -> datasets.Dataset:
    """Rows sorted by class, as image folders and the shared train parquet store them."""
    labels = [c for c in range(classes) for _ in range(per_class)]
    feature = datasets.ClassLabel(names=NAMES[:classes]) if class_label else datasets.Value("int64")
    rows = {"image": [coloured(c, i) for i, c in enumerate(labels)], "label": labels}
    return datasets.Dataset.from_dict(rows, features=datasets.Features({"image": datasets.Image(), "label": feature}))


# ------------------------------------------------------------------------------------------------------- the keys
def test_keys_depend_on_seed_shard_and_row_only():
    keys = row_keys(3, np.arange(1000))
    assert np.array_equal(np.concatenate([row_keys(3, np.arange(0, 400)), row_keys(3, np.arange(400, 1000))]), keys)
    assert len(set(keys.tolist())) == 1000
    assert not np.array_equal(row_keys(4, np.arange(1000)), keys)
    assert not np.array_equal(row_keys(3, np.arange(1000), shard=1), keys)
    # the first k of the key order is a uniform draw: over many seeds every row is drawn about equally often
    counts = np.bincount(np.concatenate([key_order(20, seed)[:5] for seed in range(2000)]), minlength=20)
    assert counts.min() > 0.8 * 500 and counts.max() < 1.2 * 500


# ------------------------------------------------------------------------------------- every kind of data, one draw
def test_a_stream_draws_what_the_same_rows_opened_map_style_draw():
    table = sorted_table(10, 6)
    mapped, mapped_labels = sample_images(table, 12, seed=5, label_column="label")
    streamed, streamed_labels = sample_images(table.to_iterable_dataset(), 12, seed=5, label_column="label")
    assert pixels(streamed) == pixels(mapped) and streamed_labels.tolist() == mapped_labels.tolist()
    assert mapped_labels.tolist() == [table[int(i)]["label"] for i in key_order(60, 5)[:12]]
    # a list and a generator of the same images draw them too, in the same order
    pictures = [coloured(c, i) for i, c in enumerate(table["label"])]
    listed, _ = sample_images(pictures, 12, seed=5)
    generated, _ = sample_images(iter(pictures), 12, seed=5)
    assert pixels(listed) == pixels(generated) == pixels(mapped)
    tensor = torch.randn(60, 3, 8, 8)
    drawn, _ = sample_images(tensor, 12, seed=5)
    assert torch.equal(drawn, tensor[torch.as_tensor(key_order(60, 5)[:12])])


def test_the_same_seed_draws_the_same_images_and_another_seed_others():
    stream = sorted_table(10, 6).to_iterable_dataset(num_shards=3)
    first, again = sample_images(stream, 10, seed=1)[0], sample_images(stream, 10, seed=1)[0]
    other = sample_images(stream, 10, seed=2)[0]
    assert pixels(first) == pixels(again) and pixels(first) != pixels(other)


def test_the_draw_is_the_same_in_every_process():
    """Processes share no state: each computes the draw from the source and the seed (different hash seeds here)."""
    script = ("import sys; sys.path.insert(0, 'tests/data'); import hashlib, numpy as np; from test_sampling import "
              "sorted_table; from hf_snapvit.data.calibration import sample_images; images, labels = sample_images("
              "sorted_table(10, 6).to_iterable_dataset(num_shards=4), 9, seed=7, label_column='label'); "
              "print(hashlib.sha256(b''.join(i.tobytes() for i in images)).hexdigest(), labels.tolist())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # Both processes run at once, as a launcher starts them.
    done = run_at_once([[sys.executable, "-c", script]] * 2, cwd=root,
                       envs=[{**os.environ, "PYTHONHASHSEED": str(h), "RANK": str(h), "WORLD_SIZE": "2"} for h in (0, 1)])
    outputs = {result.stdout for result in done}
    assert len(outputs) == 1
    images_here, labels_here = sample_images(sorted_table(10, 6).to_iterable_dataset(num_shards=4), 9, seed=7,
                                             label_column="label")
    assert str(labels_here.tolist()) in outputs.pop()


def test_a_stream_of_several_shards_is_drawn_from_every_shard():
    # 8 shards, each one class in class order; a prefix of 16 rows reads 2 rows of each shard
    stream = sorted_table(8, 10).to_iterable_dataset(num_shards=8)
    sample = draw_sample(stream, 8, seed=0, stream_prefix=16, label_column="label")
    assert sample.coverage.shard_groups == 8 and sample.coverage.rows_read == 16
    assert sample.coverage.classes_read == 8 and not sample.coverage.complete
    # one shard and the same prefix sees two classes only, and says so
    with pytest.warns(hs.CoverageWarning, match=r"first 16 rows.*hold 2 of the 8 classes"):
        one = draw_sample(sorted_table(8, 10).to_iterable_dataset(), 8, seed=0, stream_prefix=16)
    assert one.coverage.classes_read == 2


def test_shards_are_read_in_at_most_max_groups(monkeypatch):
    monkeypatch.setattr(sampling, "MAX_SHARD_GROUPS", 3)
    stream = sorted_table(6, 4).to_iterable_dataset(num_shards=6)
    found = stream_candidates(stream, 5, seed=0, prefix=1000)
    assert found.groups == 3 and found.read == 24 and found.complete


def test_a_stream_is_read_up_to_its_prefix_holding_only_the_candidates():
    read = {"n": 0}

    def rows():
        for i in range(100_000):
            read["n"] += 1
            yield i

    found = stream_candidates(rows(), 50, seed=0, prefix=30_000)
    assert read["n"] == 30_001 and found.read == 30_000 and not found.complete  # one more row tells it goes on
    assert len(found.items) == 50 and max(found.items) < 30_000
    keys = row_keys(0, np.arange(30_000))
    assert found.items == np.argsort(keys)[:50].tolist()  # the rows of smallest key, smallest first
    # spread over the prefix, not its first rows
    assert np.mean(found.items) == pytest.approx(15_000, rel=0.25)


def test_a_stream_draws_peak_memory_is_its_candidates_whatever_the_rows_read():
    """Issue 53: a draw keeps only its candidates, so a long stream of large images costs no more memory than a short
    one (benchmarks/draw_memory.py measured it at scale; it left the tree, its JSON and docs/calibration.md stay)."""
    import tracemalloc

    def peak(rows: int, size: int = 4000) -> tuple[int, list[bytes]]:
        # A new object per row, as a stream decodes none of them.
        payloads = (i.to_bytes(8, "little") * (size // 8) for i in range(rows))
        tracemalloc.start()
        found = stream_candidates(payloads, 16 + sampling.spare(16), seed=0, prefix=rows, show_progress=False)
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return used, found.items

    used, items = peak(20_000)
    assert len(items) == 18 and sum(map(len, items)) == 18 * 4000
    assert used < 0.02 * 20_000 * 4000  # not proportional to what was read


def test_a_class_sorted_stream_of_100000_rows_is_drawn_as_evenly_as_a_shuffled_one():
    labels = np.repeat(np.arange(200), 500)  # 200 classes in order, as an image folder of 100,000 images
    found = stream_candidates(iter(labels.tolist()), 256, seed=0, prefix=sampling.DEFAULT_STREAM_PREFIX)
    assert found.complete and found.read == 100_000
    shuffled = np.random.default_rng(0).permutation(labels)[:256]
    assert len(set(found.items)) >= len(set(shuffled.tolist())) - 10  # about 145 of 200 classes, as shuffled


def test_the_prefix_is_a_checked_setting():
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(hs.DataError, match=r"stream_prefix=.*positive number of rows"):
            StreamSource(iter([]), prefix=bad)
    drawn, _ = sample_images(StreamSource(iter(images(30)), prefix=10), 4, seed=0)
    assert set(pixels(drawn)) <= set(pixels(images(30)[:10]))


# ------------------------------------------------------------------------------------------------------ coverage
def test_a_stream_of_three_classes_warns_naming_them():
    table = sorted_table(3, 30)
    with pytest.warns(hs.CoverageWarning, match=r"cover only 3 classes \(class 0, class 1, class 2\).*StreamSource"):
        sample = draw_sample(table.to_iterable_dataset(), 40, seed=0)
    assert sample.coverage.few_classes == ("class 0", "class 1", "class 2")


def test_a_draw_that_covers_its_data_does_not_warn():
    table = sorted_table(40, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hs.CoverageWarning)
        for data in (table, table.to_iterable_dataset(), table.to_iterable_dataset(num_shards=4)):
            sample = draw_sample(data, 60, seed=0)
            assert sample.coverage.complete and sample.coverage.sample_classes > 30


def test_a_sorted_stream_read_in_part_without_a_class_feature_warns_that_it_is_in_label_order():
    table = sorted_table(20, 10, class_label=False)
    with pytest.warns(hs.CoverageWarning, match=r"come in label order \(\d+% of neighbouring rows share a label"):
        sample = draw_sample(table.to_iterable_dataset(), 40, seed=0, label_column="label", stream_prefix=100)
    assert sample.coverage.label_order[0] > 0.8 and sample.coverage.label_classes is None


def colour_of(pictures) -> np.ndarray:
    return np.stack([np.asarray(p, dtype=np.float64).mean((0, 1)) for p in pictures])


def test_an_unlabelled_stream_read_in_part_is_checked_with_the_models_embedding():
    sorted_rows = [coloured(c, i) for i, c in enumerate(np.repeat(np.arange(20), 10))]
    with pytest.warns(hs.CoverageWarning, match=r"nearest neighbours.*were read \d+% of the sample away"):
        sample = draw_sample(iter(sorted_rows), 60, seed=0, stream_prefix=150, embed=colour_of)
    assert sample.coverage.neighbour_gap < coverage.ORDERED_NEIGHBOUR_GAP
    shuffled = [sorted_rows[i] for i in np.random.default_rng(0).permutation(200)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", hs.CoverageWarning)
        sample = draw_sample(iter(shuffled), 60, seed=0, stream_prefix=150, embed=colour_of)
    assert sample.coverage.neighbour_gap > 0.2
    # a stream read to its end needs no such check
    assert draw_sample(iter(sorted_rows), 60, seed=0, embed=colour_of).coverage.neighbour_gap is None


def test_the_ranking_records_the_draw_and_the_card_says_it(tmp_path):
    config = hs.SnapViTConfig(num_gradient_images=4, num_fitness_images=4, scores=FEW_CROPS, max_generations=1,
                              fitness_sparsities=(0.3,), pca_components=4)
    model = CASE["vit"].build()
    stream = sorted_table(12, 3).to_iterable_dataset(num_shards=2)
    ranking = hs.rank(model, method="snapvit", data=StreamSource(stream, prefix=20), config=config,
                      processor=PROCESSOR, show_progress=False)
    draw = ranking.provenance["calibration_data"]["draw"]
    assert draw["method"] == "stream prefix" and draw["prefix"] == 20 and draw["shard_groups"] == 2
    assert draw["rows_read"] == 20 and draw["complete"] is False and draw["label_classes"] == 12
    assert ranking.provenance["calibration_data"]["source"] == "IterableDataset"
    hs.save_elastic(model, ranking, tmp_path / "elastic", image_processor=PROCESSOR)
    card = (tmp_path / "elastic" / "README.md").read_text()
    assert "drawn uniformly from the first 20 rows of a stream cut there (prefix), over 2 shard groups" in card
    stored = json.loads((tmp_path / "elastic" / "config.json").read_text())["elastic_ranking"]
    assert stored["provenance"]["calibration_data"]["draw"] == json.loads(json.dumps(draw))


def test_load_image_dataset_draws_from_every_shard_and_records_the_draw(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    table = sorted_table(4, 10)
    for shard in range(4):
        table.select(range(10 * shard, 10 * shard + 10)).to_parquet(str(folder / f"train-{shard:05d}.parquet"))
    data = hs.load_image_dataset(folder, num_samples=8, stream_prefix=8, show_progress=False)
    assert sorted(set(data["label"])) == [0, 1, 2, 3]  # two rows read from each shard, not eight from the first
    record = json.loads(data.info.description)[coverage.DRAW_KEY]
    assert record["shard_groups"] == 4 and record["rows_read"] == 8 and record["classes_read"] == 4
    prepared = hs.load_image_dataset(folder, num_samples=8, streaming=False, show_progress=False)
    assert json.loads(prepared.info.description)[coverage.DRAW_KEY]["method"] == "random access"


def test_evaluation_subsets_are_the_same_draw(tmp_path):
    table = sorted_table(5, 8)
    table.to_parquet(str(tmp_path / "validation.parquet"))
    subset = load_split(tmp_path / "validation.parquet", "validation", num_samples=7, seed=3)
    assert subset["label"] == [table[int(i)]["label"] for i in key_order(40, 3)[:7]]
    rows = [np.asarray(image).tobytes() for image in subset["image"]]
    assert rows == [np.asarray(table[int(i)]["image"]).tobytes() for i in key_order(40, 3)[:7]]
