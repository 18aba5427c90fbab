"""Image sources: from whatever the user has to ``datasets`` images. :func:`load_image_dataset` opens a Hub dataset
id, a parquet file or folder, or an image folder, and draws from it, skipping corrupt images; besides such datasets,
hf_snapvit takes PIL images and pixel tensors wherever it takes images (:mod:`hf_snapvit.data.calibration` draws them).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import numpy as np
from PIL import Image

from ..errors import DataError
from ..utils.files import public_name
from .splits import open_split
from .sampling import DEFAULT_STREAM_PREFIX
from .streams import MAX_CORRUPT_FRACTION
from ..utils.logs import get_logger

logger = get_logger(__name__)

ImageSource = Any  # Iterable[PIL.Image] | datasets.Dataset | datasets.IterableDataset | torch.Tensor


def find_image_column(column_names: Sequence[str], features: Any = None) -> str:
    """The column holding images: the first ``datasets.Image`` feature, else one named like an image column."""
    if features is not None:
        import datasets

        for name, feature in features.items():
            if isinstance(feature, datasets.Image):
                return name
    for name in ("image", "img", "images", "pixel_values"):
        if name in column_names:
            return name
    raise DataError(
        f"Cannot find an image column among the dataset's columns {list(column_names)}. "
        "Pass image_column='<name>' (--image-column) to choose one."
    )


def to_rgb(image: Any) -> Image.Image:
    """An RGB PIL image from a PIL image, an undecoded ``datasets.Image`` value or an array (see
    :func:`array_to_image`)."""
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict):  # an undecoded datasets.Image value {"bytes", "path"} (see load_image_dataset)
        import datasets

        return datasets.Image().decode_example(image).convert("RGB")
    if isinstance(image, np.ndarray):
        return array_to_image(image).convert("RGB")
    raise DataError(f"Expected a PIL image, an undecoded datasets.Image value or a numpy array, got "
                    f"{type(image).__name__}.")


_HINT = ("pass the raw images (PIL images or uint8 arrays) and let the model's processor normalise them, or pass "
         "the processor's output, a [N, C, H, W] pixel_values tensor, as the data")


def array_to_image(array: np.ndarray) -> Image.Image:
    """A PIL image from an ``[H, W]``, ``[H, W, C]`` or ``[C, H, W]`` array (``C`` = 1, 3 or 4; channels last
    when both read).

    Integers in [0, 255] are taken as they are. Floats are scaled from whichever range they are clearly in: [0, 1]
    (times 255) or [0, 255]. Anything else, e.g. negative values of pixels a processor already normalised, is
    refused: what the values mean cannot be told.
    """
    where = f"an image array of shape {tuple(array.shape)} and dtype {array.dtype}"
    if array.ndim == 3 and array.shape[-1] not in (1, 3, 4) and array.shape[0] in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # channels first, as torchvision and processors lay pixels out
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[-1] not in (3, 4)) or 0 in array.shape:
        raise DataError(f"Cannot read {where} as an image: give [H, W], [H, W, C] or [C, H, W] with 1, 3 or 4 "
                        "channels.")
    if array.dtype == np.uint8:
        return Image.fromarray(array)
    if array.dtype.kind not in "uif":
        raise DataError(f"Cannot read {where} as an image: give uint8 values in [0, 255] or floats in [0, 1].")
    low, high = float(np.min(array)), float(np.max(array))
    if not (np.isfinite(low) and np.isfinite(high)) or low < 0 or high > 255:
        raise DataError(f"Cannot read {where} as an image: its values run from {low:.4g} to {high:.4g}, outside "
                        f"[0, 1] and [0, 255], so they look normalised already; {_HINT}.")
    scale = 255.0 if array.dtype.kind == "f" and high <= 1.0 else 1.0
    return Image.fromarray(np.rint(array.astype(np.float64) * scale).astype(np.uint8))


#: Default shuffle buffer of :func:`load_image_dataset`'s lazy stream, in examples of encoded image bytes (about 20 MB
#: for 64-px JPEGs, about 1 GB for ImageNet-size ones). Draws never use it (see :mod:`hf_snapvit.data.sampling`).
DEFAULT_SHUFFLE_BUFFER = 10_000


class _ValidImages:
    """A ``filter`` function: decodes each image once and drops, logs and counts the ones that cannot be decoded."""

    def __init__(self, column: str, source: str) -> None:
        import datasets

        self.column = column
        self.source = source
        self.checked = 0
        self.skipped = 0
        self._counted = 0  # images looked at before the stream was last reopened: counted already
        self._decoder = datasets.Image()

    def rewind(self) -> None:
        """The stream is read again from its start (after a network error): count each image once."""
        self._counted, self.checked = max(self._counted, self.checked), 0

    def __call__(self, example: dict[str, Any]) -> bool:
        value = example[self.column]
        self.checked += 1
        try:
            if value is None:
                raise ValueError("the image is missing")
            if not isinstance(self._decoder.decode_example(value), Image.Image):
                raise ValueError(f"expected an image, got {type(value).__name__}")
            return True
        # PIL raises many types for bad files (UnidentifiedImageError, OSError for truncated data, SyntaxError,
        # DecompressionBombError, ...); any failure to decode means the image is unusable.
        except Exception as error:
            if self.checked <= self._counted:
                return False
            self.skipped += 1
            where = value.get("path") if isinstance(value, dict) else None
            logger.warning("Skipping corrupt image %s of %s (%d skipped so far): %s",
                           where or f"#{self.checked}", self.source, self.skipped, error)
            return False


# MAX_CORRUPT_FRACTION (from hf_snapvit.data.streams): the largest share of the images looked at that may be corrupt (one
# is always allowed); beyond it a draw fails, since the file is more likely damaged than holding a few bad images.


def read_valid_rows(dataset: Any, order: Sequence[int], column: str, count: int) -> tuple[list[Image.Image],
                                                                                           list[int]]:
    """The first ``count`` decodable images of rows ``order`` of a ``datasets.Dataset``, and their row indices.

    A row whose image cannot be decoded is skipped, logged with its index and replaced by the next row of ``order``.

    Raises:
        DataError: More than :data:`MAX_CORRUPT_FRACTION` of the rows looked at (and more than one) are corrupt.
    """
    import datasets

    feature = dataset.features.get(column)
    if isinstance(feature, datasets.Image) and feature.decode:  # decode row by row, to catch each failure
        dataset = dataset.cast_column(column, datasets.Image(mode=feature.mode, decode=False))
    images: list[Image.Image] = []
    rows: list[int] = []
    corrupt: list[int] = []
    position = 0
    while len(images) < count and position < len(order):
        chunk = [int(i) for i in order[position:position + count - len(images)]]
        position += len(chunk)
        for row, value in zip(chunk, dataset.select(chunk)[column]):
            try:
                if value is None:
                    raise ValueError("the image is missing")
                images.append(to_rgb(value))
                rows.append(row)
            except DataError:
                raise
            except Exception as error:  # PIL raises many types for bad files (see _ValidImages)
                corrupt.append(row)
                logger.warning("Skipping corrupt image at row %d of the dataset (%d skipped so far): %s", row,
                               len(corrupt), error)
    if len(corrupt) > max(1, MAX_CORRUPT_FRACTION * position):
        raise DataError(
            f"{len(corrupt)} of the {position} images read from the dataset cannot be decoded (rows "
            f"{sorted(corrupt)[:20]}{' ...' if len(corrupt) > 20 else ''}), more than the {MAX_CORRUPT_FRACTION:.0%} "
            "that are skipped: the data is likely damaged. Drop those rows (dataset.select) or re-encode the images."
        )
    return images, rows


def _check_image_feature(column: str, feature: Any, columns: list[str]) -> None:
    import datasets

    is_image = isinstance(feature, datasets.Image)
    is_path = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    is_struct = isinstance(feature, dict) and set(feature) == {"bytes", "path"}
    if not (is_image or is_path or is_struct):
        raise DataError(
            f"Column {column!r} holds {feature}, not images. Choose the image column among {columns} with "
            "image_column=... (--image-column)."
        )


def load_image_dataset(
    source: str | os.PathLike,
    *,
    split: str = "train",
    image_column: str | None = None,
    label_column: str | None = None,
    num_samples: int | None = None,
    streaming: bool = True,
    seed: int = 0,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    stream_prefix: int | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    show_progress: bool = True,
) -> Any:
    """Open calibration images from a Hub dataset, a parquet file or folder, or an image folder, drawn with a seed.

    The source is opened as evaluation splits are (:func:`~hf_snapvit.data.splits.open_split`): a
    ``.parquet`` (``.arrow``) file, a folder's ``{split}.parquet``, a folder datasets infers a builder for
    (``parquet``, or ``imagefolder`` with sub-folder names as labels), else a Hub dataset id.
    Only the image column, ``label_column`` and a ``ClassLabel`` column (to measure coverage) are kept.

    ``num_samples`` images are drawn as every hf_snapvit draw is (:mod:`hf_snapvit.data.sampling`; exact from a prepared
    split, spread over a stream's first ``stream_prefix`` rows and all its shards), warning when the draw may not
    represent the data (:mod:`hf_snapvit.data.coverage`); without it, the lazy stream, shuffled with a seeded buffer.

    Images that cannot be decoded are skipped, each logged with a running count: the image column stays undecoded
    (``{"bytes", "path"}`` values; ``dataset.cast_column(column, datasets.Image())`` gives PIL images).

    Args:
        source: A Hub dataset id (``"user/name"``), a ``.parquet``/``.arrow`` file, or a folder of parquet files or
            of images.
        split: The split to read; a single file is read as this split.
        image_column: The image column; default: the first ``datasets.Image`` column, else one named ``image``,
            ``img``, ``images`` or ``pixel_values``.
        label_column: A label column to keep (for label-based methods such as ``taylor-ce``).
        num_samples: Draw exactly this many valid images into memory (a ``datasets.Dataset``), failing if the
            source has fewer; default: return the lazy stream.
        streaming: ``False`` prepares the whole split first (datasets' cache) and draws from all of it exactly.
        seed: Seed of the draw (and of the lazy stream's shuffle).
        shuffle_buffer: Examples held by the lazy stream's shuffle buffer (encoded bytes, not decoded images).
        stream_prefix: Rows of a stream a draw reads at most (default
            :data:`~hf_snapvit.data.sampling.DEFAULT_STREAM_PREFIX`); the sample is spread over them.
        revision, token: For Hub datasets (a branch, tag or commit; a token for gated or private ones).
        show_progress: Show a progress bar while reading rows.

    Returns:
        A ``datasets.IterableDataset`` over the valid images in seeded order, or, with ``num_samples``, an in-memory
        ``datasets.Dataset`` of the images drawn (its ``info.description``, JSON, records the draw under
        :data:`~hf_snapvit.data.coverage.DRAW_KEY`). Both can be passed as ``data`` to :func:`hf_snapvit.rank` and
        :class:`~hf_snapvit.SnapViTPruner`.

    Raises:
        DataError: The source cannot be read, the split does not exist, no image column is found (the message
            lists the columns), or fewer than ``num_samples`` valid images remain.

    Example:
        >>> data = load_image_dataset("train.parquet", num_samples=256)  # doctest: +SKIP
        >>> ranking = hf_snapvit.rank(model, method="snapvit", data=data, preset="fast")  # doctest: +SKIP
    """
    import datasets

    if num_samples is not None and (type(num_samples) is not int or num_samples < 1):  # bool is no count either
        raise DataError(f"num_samples={num_samples!r} must be a positive integer (or None for the whole stream).")
    if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
        raise DataError(f"shuffle_buffer={shuffle_buffer!r} must be a positive integer.")
    name = public_name(source)  # a published config.json must not carry the user's directory layout
    raw = open_split(source, split, streaming=streaming, revision=revision, token=token)
    if raw.features is None:
        raise DataError(
            f"datasets cannot tell the columns of {str(source)!r} without reading it (not parquet, arrow or images); "
            "store the images as parquet (datasets.Dataset.to_parquet) or as image files in a folder."
        )
    image_column, keep = _columns(raw.features, image_column, label_column)
    raw = raw.select_columns(keep).cast_column(image_column, datasets.Image(decode=False))
    if num_samples is None:
        return _shuffled(raw, streaming=streaming, seed=seed, shuffle_buffer=shuffle_buffer).filter(
            _ValidImages(image_column, name))
    return _draw_samples(raw, num_samples, name=name, split=split, seed=seed, prefix=stream_prefix,
                         image_column=image_column, label_column=label_column, show_progress=show_progress)


def _columns(features: Any, image_column: str | None, label_column: str | None) -> tuple[str, list[str]]:
    """The image column (checked to hold images) and the columns to keep."""
    columns = list(features)
    if image_column is None:
        image_column = find_image_column(columns, features)
    elif image_column not in columns:
        raise DataError(f"image_column={image_column!r} (--image-column) is not among the dataset's columns "
                        f"{columns}.")
    _check_image_feature(image_column, features[image_column], columns)
    if label_column is not None and label_column not in columns:
        raise DataError(f"label_column={label_column!r} (--label-column) is not among the dataset's columns "
                        f"{columns}.")
    import datasets

    if label_column is None:  # a class column is kept to measure what a draw covers (hf_snapvit.data.coverage)
        label_column = next((n for n, f in features.items() if isinstance(f, datasets.ClassLabel)), None)
    keep = [image_column] + ([label_column] if label_column not in (None, image_column) else [])
    return image_column, keep


def _draw_samples(raw: Any, num_samples: int, *, name: str, split: str, seed: int, prefix: int | None,
                  image_column: str, label_column: str | None, show_progress: bool) -> Any:
    """``num_samples`` valid images drawn as :mod:`hf_snapvit.data.sampling` draws (exactly from a prepared split, from
    at most ``prefix`` rows over all shards of a stream), in memory as a ``datasets.Dataset`` whose
    ``info.description`` records the draw's coverage (checked, see :mod:`hf_snapvit.data.coverage`)."""
    import datasets

    from .coverage import DRAW_KEY, Coverage, check_coverage, class_names, coverage_column, label_coverage
    from .sampling import check_prefix, draw_valid, key_order

    prefix = DEFAULT_STREAM_PREFIX if prefix is None else check_prefix(prefix)
    labels = coverage_column(raw.features, label_column, list(raw.features))
    names = class_names(raw.features, labels)
    check = _ValidImages(image_column, name)
    if isinstance(raw, datasets.Dataset):  # a prepared split: every row can be drawn
        order, rows, source = key_order(len(raw), seed), [], None
        for start in range(0, len(order), num_samples):
            rows += [row for row in raw.select(order[start:start + num_samples]) if check(row)]
            if len(rows) >= num_samples:
                break
        if labels:
            source = raw.select_columns([labels]).with_format("numpy")[labels]
        found = None
    else:
        found, chosen = draw_valid(raw, num_samples, seed, prefix, lambda row, _: row if check(row) else None,
                                   what=f"stream of {name!r}", show_progress=show_progress,
                                   label_of=(lambda row: row[labels]) if labels else None)
        if found.failures:
            raise DataError(f"Read only {found.read} rows of {name!r}: {found.failures[0].failure_text()}. Check the "
                            "network and retry.") from found.failures[0].failure
        rows, source = [row for row, _, _ in chosen], found.labels_read
    rows = rows[:num_samples]
    if len(rows) < num_samples:
        raise DataError(
            f"{name!r} (split {split!r}) has only {len(rows)} valid images, but num_samples={num_samples} were asked "
            f"for ({check.skipped} corrupt images skipped). Ask for at most {len(rows)} (--num-samples) or add images."
        )
    fields = label_coverage([row[labels] for row in rows], source, names, found is not None) if labels else {}
    coverage = (Coverage("random access", len(raw), True, **fields) if found is None else
                Coverage("stream prefix", found.read, found.complete, found.groups, prefix, **fields))
    check_coverage(coverage, num_samples, f"sample of {name!r}")
    logger.info("Drew %d images from %s (split %r, seed %d; %s); skipped %d corrupt images.", num_samples, name, split,
                seed, coverage.to_dict(), check.skipped)
    record = {"images": num_samples, "split": split, "seed": seed, DRAW_KEY: coverage.to_dict()}
    info = datasets.DatasetInfo(dataset_name=name, description=json.dumps(record), features=raw.features)
    return datasets.Dataset.from_list(rows, info=info, split=datasets.NamedSplit(split))


def _shuffled(data: Any, *, streaming: bool, seed: int, shuffle_buffer: int) -> Any:
    """The seeded shuffle of a stream (a buffer) or of a prepared split (an exact permutation), as a stream."""
    if streaming:
        # Interleaving shards into the buffer only helps with several; with parquet it also costs a fixed 5 s sleep
        # when the stream closes (datasets' workaround for apache/arrow#45214), so a single file does without it.
        return data.shuffle(seed=seed, buffer_size=shuffle_buffer, max_buffer_input_shards=min(10, data.num_shards))
    # the whole split is on disk: an exact permutation, then the same lazy path as a stream
    return data.shuffle(seed=seed).to_iterable_dataset()
