"""load_image_dataset: Hub-style sources (parquet file, parquet folder, image folder) read with datasets streaming."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

from hf_snapvit.data.sampling import key_order
from hf_snapvit.data.calibration import sample_images, split_calibration
from hf_snapvit.data.images import load_image_dataset
from hf_snapvit.errors import SnapViTError
from hf_snapvit.evaluation import load_split


def _image(i: int, size: int = 12) -> Image.Image:
    """Image ``i``: its top-left pixel encodes ``i``, so a decoded image says which one it is."""
    rng = np.random.default_rng(i)
    array = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
    array[0, 0] = (i, 255 - i, 7)
    return Image.fromarray(array)


def _png(i: int) -> bytes:
    buffer = io.BytesIO()
    _image(i).save(buffer, format="PNG")
    return buffer.getvalue()


def _write_parquet(path: Path, ids: list[int], corrupt: tuple[int, ...] = ()) -> Path:
    rows = [{"image": {"bytes": b"not an image" if i in corrupt else _png(i), "path": None}, "id": i} for i in ids]
    features = datasets.Features({"image": datasets.Image(), "id": datasets.Value("int64")})
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


def _ids(data) -> list[int]:
    return [int(example["id"]) for example in data]


def _pixel_id(value) -> int:
    """Which image a decoded value is (see :func:`_image`)."""
    image = value if isinstance(value, Image.Image) else datasets.Image().decode_example(value)
    return int(np.asarray(image.convert("RGB"))[0, 0, 0])


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory) -> Path:
    return _write_parquet(tmp_path_factory.mktemp("pq") / "data.parquet", list(range(30)))


def test_parquet_file_gives_exactly_n_images_that_decode_to_their_originals(parquet_file):
    data = load_image_dataset(parquet_file, label_column="id", num_samples=10, show_progress=False)
    assert isinstance(data, datasets.Dataset) and len(data) == 10
    ids = _ids(data)
    assert len(set(ids)) == 10 and set(ids) <= set(range(30))
    for example in data:
        decoded = datasets.Image().decode_example(example["image"])
        assert np.array_equal(np.asarray(decoded), np.asarray(_image(example["id"])))
    assert data.info.dataset_name == "data.parquet"  # the file name, not the user's directory layout


def test_seeded_draw_is_deterministic_and_the_stream_draws_what_the_prepared_split_draws(parquet_file):
    first = _ids(load_image_dataset(parquet_file, label_column="id", num_samples=12, seed=3, show_progress=False))
    again = _ids(load_image_dataset(parquet_file, label_column="id", num_samples=12, seed=3, show_progress=False))
    other = _ids(load_image_dataset(parquet_file, label_column="id", num_samples=12, seed=4, show_progress=False))
    prepared = _ids(load_image_dataset(parquet_file, label_column="id", num_samples=12, seed=3, streaming=False,
                                       show_progress=False))
    assert first == again and first != other
    assert first == prepared == [int(i) for i in key_order(30, 3)[:12]]  # the same rows, in the same order
    stream = load_image_dataset(parquet_file, label_column="id", seed=3)
    assert isinstance(stream, datasets.IterableDataset)
    assert sorted(_ids(stream)) == list(range(30))  # the lazy stream: a shuffle, every image once


def test_non_streaming_is_an_exact_seeded_permutation(parquet_file):
    ids = _ids(load_image_dataset(parquet_file, label_column="id", streaming=False, seed=1))
    assert sorted(ids) == list(range(30)) and ids != list(range(30))
    assert ids == _ids(load_image_dataset(parquet_file, label_column="id", streaming=False, seed=1))


def test_folder_of_parquet_files_reads_every_file(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    _write_parquet(folder / "part-a.parquet", list(range(0, 8)))
    _write_parquet(folder / "part-b.parquet", list(range(8, 14)))
    data = load_image_dataset(folder, label_column="id", num_samples=14, show_progress=False)
    assert sorted(_ids(data)) == list(range(14))


def test_split_files_in_a_folder_are_selected_by_split(tmp_path):
    _write_parquet(tmp_path / "train.parquet", list(range(0, 6)))
    _write_parquet(tmp_path / "validation.parquet", list(range(100, 104)))
    assert sorted(_ids(load_image_dataset(tmp_path, split="validation", label_column="id"))) == [100, 101, 102, 103]
    with pytest.raises(SnapViTError, match="test"):
        load_image_dataset(tmp_path, split="test")
    # Evaluation splits open the same way (data.splits.open_split): the same rows, every column, images decoded.
    evaluated = load_split(tmp_path, "validation")
    assert sorted(evaluated["id"]) == [100, 101, 102, 103] and isinstance(evaluated[0]["image"], Image.Image)
    with pytest.raises(SnapViTError, match="test"):
        load_split(tmp_path, "test")
    # A split file is found by its name even where datasets would not infer a split from it.
    _write_parquet(tmp_path / "holdout.parquet", [7, 8])
    assert sorted(_ids(load_image_dataset(tmp_path, split="holdout", label_column="id"))) == [7, 8]
    assert sorted(load_split(tmp_path, "holdout")["id"]) == [7, 8]


def test_imagefolder_with_class_folders_gives_labels_and_the_right_pixels(tmp_path):
    for label, ids in (("cat", [1, 2, 3]), ("dog", [4, 5])):
        (tmp_path / label).mkdir()
        for i in ids:
            _image(i).save(tmp_path / label / f"{i}.png")
    data = load_image_dataset(tmp_path, label_column="label", num_samples=5, show_progress=False)
    names = data.features["label"].names
    by_pixel = {_pixel_id(example["image"]): names[example["label"]] for example in data}
    assert by_pixel == {1: "cat", 2: "cat", 3: "cat", 4: "dog", 5: "dog"}


def test_corrupt_images_are_skipped_and_counted_in_the_log(tmp_path, caplog):
    source = _write_parquet(tmp_path / "broken.parquet", list(range(10)), corrupt=(2, 7))
    with caplog.at_level(logging.INFO, logger="hf_snapvit"):
        data = load_image_dataset(source, label_column="id", num_samples=8, show_progress=False)
    assert sorted(_ids(data)) == [0, 1, 3, 4, 5, 6, 8, 9]
    # Only the draw's candidates are decoded (8 + 1 spare of the 10 rows): one corrupt row is among them and is
    # replaced by the spare; the other is never decoded.
    skips = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skipping corrupt image")]
    assert len(skips) == 1 and "(1 skipped so far)" in skips[-1]
    assert any("skipped 1 corrupt images" in r.getMessage() for r in caplog.records)
    # The lazy stream skips them too, where datasets' own decoding would raise on the first one.
    assert sorted(_ids(load_image_dataset(source, label_column="id"))) == [0, 1, 3, 4, 5, 6, 8, 9]


def test_truncated_file_in_an_image_folder_is_skipped(tmp_path):
    for i in range(4):
        _image(i, size=64).save(tmp_path / f"{i}.png")
    whole = (tmp_path / "3.png").read_bytes()
    (tmp_path / "3.png").write_bytes(whole[: len(whole) // 2])
    data = load_image_dataset(tmp_path, num_samples=3, show_progress=False)
    assert sorted(_pixel_id(example["image"]) for example in data) == [0, 1, 2]


def test_too_few_valid_images_fails_naming_the_counts(tmp_path):
    source = _write_parquet(tmp_path / "small.parquet", list(range(5)), corrupt=(1,))
    with pytest.raises(SnapViTError) as error:
        load_image_dataset(source, num_samples=5, show_progress=False)
    message = str(error.value)
    assert "only 4 valid images" in message and "num_samples=5" in message and "1 corrupt" in message


def test_a_dataset_without_an_image_column_fails_listing_the_columns(tmp_path):
    datasets.Dataset.from_dict({"caption": ["a", "b"], "score": [1, 2]}).to_parquet(str(tmp_path / "text.parquet"))
    with pytest.raises(SnapViTError, match=r"\['caption', 'score'\]"):
        load_image_dataset(tmp_path / "text.parquet")
    with pytest.raises(SnapViTError, match=r"holds .*not images.*\['caption', 'score'\]"):
        load_image_dataset(tmp_path / "text.parquet", image_column="score")


def test_unknown_columns_fail_listing_the_columns(parquet_file):
    with pytest.raises(SnapViTError, match=r"image_column='photo'.*\['image', 'id'\]"):
        load_image_dataset(parquet_file, image_column="photo")
    with pytest.raises(SnapViTError, match=r"label_column='label'.*\['image', 'id'\]"):
        load_image_dataset(parquet_file, label_column="label")


def test_bad_sources_fail_clearly(tmp_path, monkeypatch):
    from huggingface_hub import constants

    # Offline, so the unknown Hub id fails at once instead of after network retries (conftest's HF_HUB_OFFLINE
    # comes after huggingface_hub has read its environment).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(SnapViTError, match="No such file or folder"):
        load_image_dataset(tmp_path / "missing.parquet")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(SnapViTError, match=r"\.parquet or \.arrow"):
        load_image_dataset(tmp_path / "notes.txt")
    with pytest.raises(SnapViTError, match="Hub"):
        load_image_dataset("someone/no-such-dataset")
    with pytest.raises(SnapViTError, match="num_samples=0"):
        load_image_dataset(tmp_path / "missing.parquet", num_samples=0)


def test_samplers_accept_both_results(parquet_file):
    stream = load_image_dataset(parquet_file, seed=2)
    sample = load_image_dataset(parquet_file, num_samples=9, seed=2, show_progress=False)
    for images in (sample_images(stream, 6, seed=0)[0], sample_images(sample, 6, seed=0)[0]):
        assert len(images) == 6 and all(isinstance(im, Image.Image) and im.mode == "RGB" for im in images)
        assert len({_pixel_id(im) for im in images}) == 6
    split = split_calibration(sample, 4, 5, seed=0)
    gradient_ids = {_pixel_id(im) for im in split.gradient}
    fitness_ids = {_pixel_id(im) for im in split.fitness}
    assert len(gradient_ids) == 4 and len(fitness_ids) == 5 and not gradient_ids & fitness_ids
    assert gradient_ids | fitness_ids == {_pixel_id(example["image"]) for example in sample}
    assert split.description["name"] == "data.parquet"
