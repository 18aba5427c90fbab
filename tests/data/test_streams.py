"""Issue 30: calibration sources that fail part-way (a network error from the iterator, a corrupt row) are retried or
skipped with a count, and a draw an error cut short says so; float numpy arrays are read when their range is clear
and refused, saying why, when the pixels look normalised already."""

from __future__ import annotations

import io
import logging
import warnings

import datasets
import numpy as np
import pytest
from PIL import Image

import hf_snapvit as hs
from hf_snapvit.data import streams
from hf_snapvit.data.calibration import sample_images
from hf_snapvit.data.sampling import key_order
from hf_snapvit.data.images import array_to_image, load_image_dataset, to_rgb
from hf_snapvit.errors import DataError

from helpers import CASES, FEW_CROPS, PROCESSOR, images

CASE = {c.name: c for c in CASES}
TINY = hs.SnapViTConfig(num_gradient_images=4, num_fitness_images=4, scores=FEW_CROPS, max_generations=1,
                        fitness_sparsities=(0.3,), pca_components=4)


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(streams, "RETRY_DELAY_SECONDS", 0.0)


def pixels_of(drawn) -> list[bytes]:
    return [image.tobytes() for image in drawn]


def failing_generator(items, fail_at: int, error: BaseException):
    yield from items[:fail_at]
    raise error


class FlakySource:
    """An iterable whose ``iter()`` starts over (as a network stream reopened does); pass ``k`` of it raises
    ``errors[k]`` at item ``fail_at[k]`` (``None``: no error)."""

    def __init__(self, items, fail_at, errors=None):
        self.items, self.fail_at, self.passes = items, list(fail_at), 0
        self.errors = errors or [ConnectionError("connection reset by peer")] * len(self.fail_at)

    def __iter__(self):
        k, self.passes = self.passes, self.passes + 1
        for i, item in enumerate(self.items):
            if k < len(self.fail_at) and self.fail_at[k] == i:
                raise self.errors[k]
            yield item


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# ----------------------------------------------------------------------------------- a stream that fails part-way
def test_a_generator_that_fails_part_way_warns_naming_the_error_and_the_counts():
    with pytest.warns(UserWarning, match=r"ConnectionError: reset.*cannot be reopened.*5 images.*5 items read.*8 "
                                         r"asked for"):
        drawn, _ = sample_images(failing_generator(images(12), 5, ConnectionError("reset")), 8, seed=0)
    assert sorted(pixels_of(drawn)) == sorted(pixels_of(images(5)))  # all 5 read, in the draw's (key) order
    with pytest.raises(DataError, match=r"No calibration images.*TimeoutError"):
        sample_images(failing_generator(images(12), 0, TimeoutError("read timed out")), 8, seed=0)
    # A reservoir that already holds all it needs still says its sample comes from the items read before the error.
    with pytest.warns(UserWarning, match=r"3 images, drawn from the 6 items read, for the 3 asked for"):
        sample_images(failing_generator(images(12), 6, OSError("disk gone")), 3, seed=0)


def test_an_error_that_is_no_network_error_is_raised_as_it_is():
    with pytest.raises(KeyError):
        sample_images(failing_generator(images(12), 3, KeyError("a bug in the caller's generator")), 8, seed=0)


def test_a_reopenable_source_is_reopened_and_gives_the_uninterrupted_draw(caplog):
    clean, _ = sample_images(images(12), 8, seed=3)  # a list: the same seeded reservoir as any iterable
    clean_stream, _ = sample_images(iter(images(12)), 8, seed=3)
    source = FlakySource(images(12), fail_at=[5, 0, 9])
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        warnings.simplefilter("error")
        drawn, _ = sample_images(source, 8, seed=3)
    assert pixels_of(drawn) == pixels_of(clean_stream) and len(clean) == 8
    assert source.passes == 4 and caplog.text.count("reopening it") == 3


def test_the_connection_errors_of_the_http_client_datasets_streams_with_are_retried():
    client = datasets.utils.file_utils.httpx  # httpx (or the fork datasets imports under that name): no OSError
    assert not issubclass(client.ReadError, OSError)
    source = FlakySource(images(12), fail_at=[4], errors=[client.ReadError("peer closed connection")])
    drawn, _ = sample_images(source, 8, seed=0)
    assert pixels_of(drawn) == pixels_of(sample_images(iter(images(12)), 8, seed=0)[0]) and source.passes == 2


def test_retries_are_bounded_and_a_source_that_keeps_failing_ends_the_draw_with_a_warning():
    source = FlakySource(images(12), fail_at=[3] * 10)
    with pytest.warns(UserWarning, match=r"still failed after 3 retries.*3 images.*for the 8 asked for"):
        drawn, _ = sample_images(source, 8, seed=0)
    assert len(drawn) == 3 and source.passes == 1 + streams.STREAM_RETRIES


def test_reopenings_are_counted_in_a_row_so_a_long_flaky_stream_still_completes():
    source = FlakySource(images(20), fail_at=[2, 4, 6, 8, 10, 12, 14])  # more failures than retries, never twice
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn, _ = sample_images(source, 20, seed=0)
    assert len(drawn) == 20


def test_a_file_that_is_not_there_is_not_retried():
    source = FlakySource(images(4), fail_at=[1], errors=[FileNotFoundError("gone.png")])
    with pytest.raises(FileNotFoundError):
        sample_images(source, 4, seed=0)
    assert source.passes == 1


def _stream(n: int, state: dict | None = None, fail_at: int | None = None, corrupt: tuple[int, ...] = ()):
    """A datasets stream of ``n`` PNG images with labels; its generator raises ConnectionError at item ``fail_at``
    the first time it runs (``state`` remembers), and rows ``corrupt`` hold bytes that are not an image."""
    pictures = images(n)

    def generate():
        for i in range(n):
            if fail_at == i and not state["failed"]:
                state["failed"] = True
                raise ConnectionError("the Hub closed the connection")
            image = b"not an image" if i in corrupt else _png(pictures[i])
            yield {"image": {"bytes": image, "path": None}, "label": i}

    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    return datasets.IterableDataset.from_generator(generate, features=features)


@pytest.mark.parametrize("fail_at", [3, 1010], ids=["in-the-first-buffer", "past-the-first-buffer"])
def test_a_datasets_stream_whose_generator_raises_once_gives_the_uninterrupted_draw(fail_at, caplog):
    # The shuffle buffer takes in 1000 examples (datasets reads ahead in batches): the failure comes while it fills,
    # or after it was filled once.
    n, count = (1030, 1020) if fail_at > 1000 else (30, 20)
    clean, clean_labels = sample_images(_stream(n), count, seed=1, label_column="label")
    flaky = _stream(n, {"failed": False}, fail_at=fail_at)
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        warnings.simplefilter("error")
        drawn, labels = sample_images(flaky, count, seed=1, label_column="label")
    assert "ConnectionError: the Hub closed the connection" in caplog.text
    assert pixels_of(drawn) == pixels_of(clean) and labels.tolist() == clean_labels.tolist()


def test_a_corrupt_row_of_a_datasets_stream_is_skipped_counted_and_replaced(caplog):
    data = _stream(30, corrupt=(4, 17))
    with caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        drawn, labels = sample_images(data, 28, seed=2, label_column="label")
    assert len(drawn) == 28 and not {4, 17} & set(labels.tolist())
    assert "2 skipped so far" in caplog.text
    # the draw is the rows in key order with the corrupt rows left out
    expected = [int(row) for row in key_order(30, 2) if row not in (4, 17)]
    assert labels.tolist() == expected
    assert pixels_of(drawn) == pixels_of([images(30)[row] for row in expected])


def test_a_stream_of_mostly_corrupt_rows_fails_as_damaged():
    with pytest.raises(DataError, match=r"cannot be decoded.*likely damaged"):
        sample_images(_stream(30, corrupt=tuple(range(0, 30, 3))), 25, seed=0)


def test_corrupt_items_of_a_list_or_a_generator_are_skipped_and_replaced(caplog):
    items = images(12)
    items[3] = {"bytes": b"not an image", "path": None}
    with caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        drawn, _ = sample_images(items, 8, seed=0)
    assert len(drawn) == 8 and "index 3" in caplog.text and "1 skipped so far" in caplog.text
    drawn, _ = sample_images(iter(items), 8, seed=0)
    assert len(drawn) == 8
    # a short source that loses an image to corruption says the draw is smaller than asked
    with pytest.warns(UserWarning, match=r"11 images, fewer than the 12 asked for.*1 corrupt"):
        drawn, _ = sample_images(items, 12, seed=0)


def test_a_ranking_from_a_stream_that_fails_part_way_completes_and_says_so():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranking = hs.rank(CASE["vit"].build(), method="snapvit", data=failing_generator(images(12), 6,
                          ConnectionError("reset")), config=TINY, processor=PROCESSOR, show_progress=False)
    said = " | ".join(str(w.message) for w in caught)
    assert "calibration draw is incomplete" in said and "6 images, fewer than the 4 gradient + 4 fitness" in said
    assert ranking.provenance["calibration_data"]["num_gradient"] == 4


def _flaky_streams(monkeypatch, fail_at: int, times: int, message: str) -> dict:
    """datasets streams raise ConnectionError(message) at item ``fail_at``, the first ``times`` times they run."""
    original, state = datasets.IterableDataset.__iter__, {"failures": 0}

    def flaky(self):
        for i, row in enumerate(original(self)):
            if i == fail_at and state["failures"] < times:
                state["failures"] += 1
                raise ConnectionError(message)
            yield row

    monkeypatch.setattr(datasets.IterableDataset, "__iter__", flaky)
    return state


def test_load_image_dataset_reopens_a_failed_stream_and_counts_each_corrupt_image_once(tmp_path, monkeypatch,
                                                                                         caplog):
    rows = [{"image": {"bytes": b"not an image" if i == 2 else _png(image), "path": None}, "id": i}
            for i, image in enumerate(images(20))]
    features = datasets.Features({"image": datasets.Image(), "id": datasets.Value("int64")})
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(tmp_path / "data.parquet"))
    clean = load_image_dataset(tmp_path / "data.parquet", num_samples=18, label_column="id", show_progress=False)
    state = _flaky_streams(monkeypatch, 12, 1, "connection reset")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hf_snapvit"):
        data = load_image_dataset(tmp_path / "data.parquet", num_samples=18, label_column="id", show_progress=False)
    assert state["failures"] == 1 and data["id"] == clean["id"] and "reopening it" in caplog.text
    assert 2 not in data["id"]
    assert caplog.text.count("Skipping corrupt image") == 1 and "skipped 1 corrupt images" in caplog.text


def test_load_image_dataset_that_keeps_failing_names_the_error(tmp_path, monkeypatch):
    datasets.Dataset.from_list([{"image": {"bytes": _png(image), "path": None}} for image in images(6)],
                               features=datasets.Features({"image": datasets.Image()})
                               ).to_parquet(str(tmp_path / "data.parquet"))
    _flaky_streams(monkeypatch, 0, 100, "network is unreachable")
    with pytest.raises(DataError, match=r"Read only 0 rows.*network is unreachable.*3 retries"):
        load_image_dataset(tmp_path / "data.parquet", num_samples=4, show_progress=False)


# ------------------------------------------------------------------------------------------- float numpy arrays
def _arrays(n: int, layout: str, scale: float):
    """The pixels of ``images(n)`` as float arrays in ``layout`` ("chw" or "hwc"), divided by ``scale``."""
    out = []
    for image in images(n):
        array = np.asarray(image, dtype=np.float32) / scale
        out.append(array.transpose(2, 0, 1) if layout == "chw" else array)
    return out


@pytest.mark.parametrize("layout", ["chw", "hwc"])
@pytest.mark.parametrize("scale", [255.0, 1.0], ids=["range-0-1", "range-0-255"])
def test_float_arrays_in_a_clear_range_are_read_as_the_images_they_are(layout, scale):
    drawn, _ = sample_images(_arrays(10, layout, scale), 6, seed=0)
    expected, _ = sample_images(images(10), 6, seed=0)
    assert pixels_of(drawn) == pixels_of(expected)


def test_other_array_layouts_and_types():
    image = images(1)[0]
    hwc = np.asarray(image)
    assert to_rgb(hwc.transpose(2, 0, 1)).tobytes() == image.tobytes()  # channels-first uint8
    assert to_rgb(hwc.astype(np.int64)).tobytes() == image.tobytes()
    gray = np.linspace(0, 1, 48 * 40, dtype=np.float64).reshape(48, 40)
    assert np.asarray(to_rgb(gray))[-1, -1].tolist() == [255, 255, 255]
    assert np.asarray(to_rgb(gray[None]))[0, 0].tolist() == [0, 0, 0]  # [1, H, W]
    assert array_to_image(np.ones((5, 5, 4), dtype=np.float32)).mode == "RGBA"


@pytest.mark.parametrize("array, words", [
    (np.linspace(-2.1, 2.6, 3 * 32 * 32, dtype=np.float32).reshape(3, 32, 32),
     r"shape \(3, 32, 32\).*from -2\.1 to 2\.6.*normalised already.*processor"),
    (np.full((32, 32, 3), 300.0), r"from 300 to 300.*\[0, 255\]"),
    (np.full((32, 32, 3), np.nan), r"from nan"),
    (np.zeros((2, 3, 32, 32), dtype=np.float32), r"shape \(2, 3, 32, 32\).*\[C, H, W\]"),
    (np.zeros((32, 32, 5), dtype=np.float32), r"shape \(32, 32, 5\).*1, 3 or 4 channels"),
    (np.zeros((8, 8, 3), dtype=bool), r"dtype bool.*uint8"),
])
def test_arrays_that_are_not_clearly_images_are_refused_saying_why(array, words):
    with pytest.raises(DataError, match=words):
        sample_images([array] * 3, 2, seed=0)


def test_a_ranking_from_float_arrays_equals_the_ranking_from_the_images():
    model = CASE["vit"].build()
    from_images = hs.rank(model, method="snapvit", data=images(12), config=TINY, processor=PROCESSOR,
                          show_progress=False)
    from_arrays = hs.rank(model, method="snapvit", data=_arrays(12, "chw", 255.0), config=TINY,
                          processor=PROCESSOR, show_progress=False)
    assert np.array_equal(from_images.head_scores, from_arrays.head_scores)
    assert np.array_equal(from_images.neuron_scores, from_arrays.neuron_scores)
    with pytest.raises(DataError, match="normalised already"):
        hs.rank(model, method="snapvit", data=[PROCESSOR(images=x, return_tensors="np")["pixel_values"][0]
                                               for x in images(12)], config=TINY, processor=PROCESSOR,
                show_progress=False)
