"""Calibration images: from whatever the user has to seeded samples and model-ready tensors.

Accepted sources: an iterable of PIL images, a ``datasets.Dataset`` or streaming ``IterableDataset`` with an image
column, or a tensor of already preprocessed pixel values ``[N, C, H, W]``. Every draw is seeded and deterministic.
:func:`load_image_dataset` turns a Hub dataset id, a parquet file or folder, or an image folder into such a dataset.
Preprocessing always uses the model's own image processor (its resize, rescale and normalisation), so a model
trained with mean = std = 0.5 is never fed ImageNet statistics.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from PIL import Image

from .errors import SnapViTError

logger = logging.getLogger(__name__)

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
    raise SnapViTError(
        f"Cannot find an image column among the dataset's columns {list(column_names)}. "
        "Pass image_column='<name>' to choose one."
    )


def _to_rgb(image: Any) -> Image.Image:
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict):  # an undecoded datasets.Image value {"bytes", "path"} (see load_image_dataset)
        import datasets

        return datasets.Image().decode_example(image).convert("RGB")
    if isinstance(image, np.ndarray):
        return Image.fromarray(image).convert("RGB")
    raise SnapViTError(f"Expected a PIL image, got {type(image).__name__}.")


def sample_images(
    data: ImageSource,
    num_samples: int,
    *,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
) -> tuple[list[Image.Image] | torch.Tensor, torch.Tensor | None]:
    """Draw up to ``num_samples`` images (and their labels), uniformly and deterministically for a given ``seed``.

    Returns RGB PIL images, or a tensor slice when ``data`` is a tensor of pixel values, and the labels of
    ``label_column`` for datasets (``None`` otherwise). Fewer images are returned only when the source has fewer; an
    empty source raises.
    """
    rng = np.random.default_rng(seed)
    if isinstance(data, torch.Tensor):
        if data.ndim != 4 or data.shape[0] == 0:
            raise SnapViTError(
                f"A tensor of calibration pixel values must have shape [N, C, H, W] with N >= 1, got {tuple(data.shape)}."
            )
        return data[torch.as_tensor(rng.permutation(data.shape[0])[:num_samples])], None
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        datasets = None
    if datasets is not None and isinstance(data, datasets.Dataset):
        if len(data) == 0:
            raise SnapViTError("The calibration dataset is empty; give at least one image.")
        column = image_column or find_image_column(data.column_names, data.features)
        chosen = data.select(rng.permutation(len(data))[:num_samples])
        images = [_to_rgb(image) for image in chosen[column]]
        labels = _labels(chosen, label_column)
    elif datasets is not None and isinstance(data, datasets.IterableDataset):
        column = image_column or find_image_column(list(data.features or {}) or data.column_names or [],
                                                   data.features)
        stream = list(seeded_stream(data, num_samples, seed))
        images = [_to_rgb(example[column]) for example in stream]
        labels = None if label_column is None else torch.tensor([example[label_column] for example in stream])
    elif isinstance(data, Sequence):
        images, labels = [_to_rgb(data[i]) for i in rng.permutation(len(data))[:num_samples]], None
    elif isinstance(data, Iterable):
        images, labels = _reservoir(data, num_samples, rng), None
    else:
        raise SnapViTError(
            f"Unsupported calibration data of type {type(data).__name__}: give PIL images, a datasets (Iterable)Dataset "
            "with an image column, or a [N, C, H, W] tensor of pixel values."
        )
    if not images:
        raise SnapViTError("The calibration data is empty; give at least one image.")
    if label_column is not None and labels is None:
        raise SnapViTError(
            f"Labels were asked for (label_column={label_column!r}) but {type(data).__name__} data has none; give a "
            "datasets Dataset with a label column."
        )
    return images, labels


def seeded_stream(data: Any, num_samples: int, seed: int) -> Any:
    """The seeded sample of a streaming ``IterableDataset``: a shuffle buffer, then the first ``num_samples``.

    Every process of a multi-process run rebuilds this same stream (see :mod:`hf_snapvit.distributed`).
    """
    return data.shuffle(seed=seed, buffer_size=max(1000, num_samples)).take(num_samples)


def _labels(dataset: Any, label_column: str | None) -> torch.Tensor | None:
    if label_column is None:
        return None
    if label_column not in dataset.column_names:
        raise SnapViTError(
            f"label_column={label_column!r} is not among the dataset's columns {dataset.column_names}."
        )
    return torch.tensor(dataset[label_column])


def _reservoir(stream: Iterable[Any], k: int, rng: np.random.Generator) -> list[Image.Image]:
    """Uniform sample of ``k`` items of a stream of unknown length, holding only ``k`` in memory."""
    sample: list[Image.Image] = []
    for i, item in enumerate(stream):
        if i < k:
            sample.append(_to_rgb(item))
        else:
            j = int(rng.integers(0, i + 1))
            if j < k:
                sample[j] = _to_rgb(item)
    return sample


@dataclass
class CalibrationSplit:
    """Disjoint gradient and fitness samples (overlapping only if the source is too small), with provenance."""

    gradient: list[Image.Image] | torch.Tensor
    fitness: list[Image.Image] | torch.Tensor
    description: dict[str, Any] = field(default_factory=dict)
    gradient_labels: torch.Tensor | None = None


def split_calibration(
    data: ImageSource,
    num_gradient: int,
    num_fitness: int,
    *,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
) -> CalibrationSplit:
    """Draw the gradient set and the fitness set in one seeded draw, so they do not share images."""
    images, labels = sample_images(data, num_gradient + num_fitness, seed=seed, image_column=image_column,
                                   label_column=label_column)
    available = len(images)
    if available >= num_gradient + num_fitness:
        gradient, fitness = images[:num_gradient], images[num_gradient:]
    else:
        warnings.warn(
            f"The calibration data has {available} images, fewer than the {num_gradient} gradient + {num_fitness} "
            "fitness images asked for; both sets are drawn from all of them and overlap.",
            stacklevel=2,
        )
        gradient, fitness = images[:num_gradient], images[:num_fitness]
    description = {
        "source": type(data).__name__,
        "name": getattr(getattr(data, "info", None), "dataset_name", None),
        "num_gradient": len(gradient),
        "num_fitness": len(fitness),
        "seed": seed,
        "image_column": image_column,
        "label_column": label_column,
    }
    return CalibrationSplit(gradient, fitness, description,
                            gradient_labels=None if labels is None else labels[:len(gradient)])


class Normalizer:
    """The rescale and normalisation steps of a transformers image processor, applied to float tensors."""

    def __init__(self, processor: Any) -> None:
        self.rescale = float(processor.rescale_factor) if getattr(processor, "do_rescale", True) else 1.0
        self.normalize = bool(getattr(processor, "do_normalize", True))
        mean = getattr(processor, "image_mean", None)
        std = getattr(processor, "image_std", None)
        if self.normalize and (mean is None or std is None):
            raise SnapViTError(f"{type(processor).__name__} has no image_mean/image_std to normalise with.")
        self.mean = torch.tensor(mean or [0.0, 0.0, 0.0]).view(1, -1, 1, 1)
        self.std = torch.tensor(std or [1.0, 1.0, 1.0]).view(1, -1, 1, 1)

    def __call__(self, uint8: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` uint8 → model-ready float32."""
        x = uint8.float() * self.rescale
        return (x - self.mean) / self.std if self.normalize else x


def processor_inputs(images: list[Image.Image] | torch.Tensor, processor: Any, batch_size: int = 64) -> torch.Tensor:
    """Eval-transform pixel values ``[N, C, H, W]`` via the processor (tensors pass through unchanged)."""
    if isinstance(images, torch.Tensor):
        return images.float()
    patch_size = getattr(processor, "patch_size", None)
    max_patches = getattr(processor, "max_num_patches", None)
    if patch_size and max_patches:
        # Patch-sequence processors (SigLIP2) keep each image's aspect ratio, so a batch mixes patch grids; square
        # images of the default grid all give the same grid, which is then stored as ordinary [C, H, W] images.
        from .architectures import unpatchify

        side = math.isqrt(int(max_patches)) * int(patch_size)
        square = [_to_rgb(image).resize((side, side), Image.BICUBIC) for image in images]
        chunks = []
        for i in range(0, len(square), batch_size):
            out = processor(images=square[i:i + batch_size], return_tensors="pt")
            chunks.append(unpatchify(out["pixel_values"], int(patch_size), out.get("spatial_shapes")))
        return torch.cat(chunks)
    chunks = [
        processor(images=images[i:i + batch_size], return_tensors="pt")["pixel_values"]
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(chunks)


@dataclass(frozen=True)
class MultiCropConfig:
    """DINO-style views: ``num_global`` crops of ``global_scale`` and ``num_local`` of ``local_scale`` (area fractions).

    Every crop is drawn independently. Sizes default to the model's input size (as in the reference code); a
    smaller ``local_size`` makes local crops cheaper (position embeddings are interpolated).
    """

    num_global: int = 2
    num_local: int = 10
    global_scale: tuple[float, float] = (0.25, 1.0)
    local_scale: tuple[float, float] = (0.05, 0.25)
    global_size: int | None = None
    local_size: int | None = None


def _crop_box(width: int, height: int, scale: tuple[float, float], rng: np.random.Generator) -> tuple[int, ...]:
    """A RandomResizedCrop box: area fraction in ``scale``, aspect ratio log-uniform in [3/4, 4/3]."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    side = min(width, height)
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def multi_crops(
    images: list[Image.Image] | torch.Tensor,
    config: MultiCropConfig,
    normalizer: Normalizer | None,
    input_size: int,
    rng: np.random.Generator,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Crops of every image: ``(global [B, G, C, S, S], local [B, L, C, s, s] or None)``, model-ready."""
    global_size = config.global_size or input_size
    local_size = config.local_size or input_size
    groups: list[list[torch.Tensor]] = [[], []]
    for image in images:
        for group, (count, scale, size) in enumerate(
            ((config.num_global, config.global_scale, global_size), (config.num_local, config.local_scale, local_size))
        ):
            crops = []
            for _ in range(count):
                if isinstance(image, torch.Tensor):  # preprocessed pixels: crop and resize the tensor
                    left, top, right, bottom = _crop_box(image.shape[-1], image.shape[-2], scale, rng)
                    crop = image[None, :, top:bottom, left:right].float()
                    crops.append(torch.nn.functional.interpolate(
                        crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0])
                else:
                    box = _crop_box(image.width, image.height, scale, rng)
                    resized = image.resize((size, size), Image.BILINEAR, box=box)
                    crops.append(torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1))
            groups[group].append(torch.stack(crops) if crops else None)
    out = []
    for group in groups:
        if group[0] is None:
            out.append(None)
            continue
        batch = torch.stack(group)  # [B, V, C, S, S]
        if batch.dtype == torch.uint8:
            b, v = batch.shape[:2]
            batch = normalizer(batch.flatten(0, 1)).view(b, v, *batch.shape[2:])
        out.append(batch)
    return out[0], out[1]


# ----------------------------------------------------------------------------------------------- dataset sources

#: Default shuffle buffer of :func:`load_image_dataset`, in examples. It holds encoded image bytes (about 20 MB for
#: 64-px JPEGs, about 1 GB for ImageNet-size ones): large enough to mix a class-sorted calibration file of this size.
DEFAULT_SHUFFLE_BUFFER = 10_000

_FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}
_PATH_SUFFIXES = (".parquet", ".arrow", ".jpg", ".jpeg", ".png", ".webp", ".zip", ".tar", ".csv", ".json", ".jsonl")


class _ValidImages:
    """A ``filter`` function: decodes each image once and drops, logs and counts the ones that cannot be decoded."""

    def __init__(self, column: str, source: str) -> None:
        import datasets

        self.column = column
        self.source = source
        self.checked = 0
        self.skipped = 0
        self._decoder = datasets.Image()

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
            self.skipped += 1
            where = value.get("path") if isinstance(value, dict) else None
            logger.warning("Skipping corrupt image %s of %s (%d skipped so far): %s",
                           where or f"#{self.checked}", self.source, self.skipped, error)
            return False


def _looks_like_path(source: str) -> bool:
    """A string meant as a local path rather than a Hub id (``name`` or ``org/name``)."""
    return (source.startswith((".", "/", "~", "\\")) or source.count("/") > 1 or "\\" in source
            or (len(source) > 1 and source[1] == ":") or source.lower().endswith(_PATH_SUFFIXES))


def _display_name(source: str | os.PathLike) -> str:
    """The dataset's name for provenance: a Hub id as is, a local path by its last component only (a published
    ``config.json`` should not carry the user's directory layout)."""
    path = Path(source).expanduser()
    return path.name if path.exists() else str(source)


def _load_raw(source: str | os.PathLike, split: str, streaming: bool, revision: str | None,
              token: str | bool | None) -> Any:
    import datasets

    path = Path(source).expanduser()
    kwargs: dict[str, Any] = {"split": split, "streaming": streaming}
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise SnapViTError(
                f"Cannot read {str(source)!r} as a dataset: a single file must be .parquet or .arrow. For images, "
                "give the folder that holds them (one sub-folder per class is read as labels), or a Hub dataset id."
            )
        args: tuple[str, ...] = (builder,)
        kwargs["data_files"] = {split: str(path)}
    elif path.is_dir():
        args = (str(path),)  # datasets infers parquet / arrow / imagefolder and the splits from the file names
    elif _looks_like_path(str(source)):
        raise SnapViTError(
            f"No such file or folder: {str(source)!r}. Give a .parquet file, a folder of parquet files or images, "
            "or a Hub dataset id such as 'user/name'."
        )
    else:
        args = (str(source),)
        kwargs.update(revision=revision, token=token)
    try:
        return datasets.load_dataset(*args, **kwargs)
    except (ConnectionError, FileNotFoundError) as error:  # also datasets' DatasetNotFoundError
        raise SnapViTError(
            f"Cannot load the dataset {str(source)!r}: {error}. It is not a local file or folder, so it was looked up "
            "on the Hub; check the id, the network, the token for gated datasets, and that HF_HUB_OFFLINE is unset."
        ) from error
    except ValueError as error:  # e.g. 'Unknown split "test". Should be one of [...]', or no data files
        raise SnapViTError(f"Cannot load split {split!r} of {str(source)!r}: {error}") from error


def _check_image_feature(column: str, feature: Any, columns: list[str]) -> None:
    import datasets

    is_image = isinstance(feature, datasets.Image)
    is_path = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    is_struct = isinstance(feature, dict) and set(feature) == {"bytes", "path"}
    if not (is_image or is_path or is_struct):
        raise SnapViTError(
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
    revision: str | None = None,
    token: str | bool | None = None,
    show_progress: bool = True,
) -> Any:
    """Open calibration images from a Hub dataset, a parquet file or folder, or an image folder, shuffled with a seed.

    The source is read with ``datasets.load_dataset(..., streaming=True)``: a ``.parquet`` (or ``.arrow``) file
    through the ``parquet`` (``arrow``) builder, a folder through the builder datasets infers from its files
    (``parquet``, or ``imagefolder`` for images, with sub-folder names as labels), anything else as a Hub dataset id.
    Only the image column (and ``label_column``) is kept. The stream is shuffled with a seeded buffer
    (``IterableDataset.shuffle(seed, buffer_size)``), so the same arguments give the same images in the same order,
    in every process of a multi-process run.

    Images that cannot be decoded are skipped, each logged with a running count. To make that possible the image
    column stays undecoded (``datasets.Image(decode=False)``: each value is ``{"bytes", "path"}``); hf_snapvit's
    samplers decode it, and ``dataset.cast_column(column, datasets.Image())`` gives PIL images on a ``Dataset``.

    Args:
        source: A Hub dataset id (``"user/name"``), a ``.parquet``/``.arrow`` file, or a folder of parquet files or
            of images.
        split: The split to read; a single file is read as this split.
        image_column: The image column; default: the first ``datasets.Image`` column, else one named ``image``,
            ``img``, ``images`` or ``pixel_values``.
        label_column: A label column to keep (for label-based methods such as ``taylor-ce``).
        num_samples: Read exactly this many valid images into memory (a ``datasets.Dataset``), failing if the
            source has fewer; default: return the lazy stream.
        streaming: ``False`` downloads and prepares the whole split first (datasets' cache), then shuffles it
            exactly instead of through a buffer.
        seed: Seed of the shuffle.
        shuffle_buffer: Examples held by the shuffle buffer (encoded bytes, not decoded images).
        revision, token: For Hub datasets (a branch, tag or commit; a token for gated or private ones).
        show_progress: Show a progress bar while reading ``num_samples`` images.

    Returns:
        A ``datasets.IterableDataset`` over the valid images in seeded order, or, with ``num_samples``, an in-memory
        ``datasets.Dataset`` of the first ``num_samples`` of them. Both can be passed as ``data`` to
        :func:`hf_snapvit.rank` and :class:`~hf_snapvit.SnapViTPruner`.

    Raises:
        SnapViTError: The source cannot be read, the split does not exist, no image column is found (the message
            lists the columns), or fewer than ``num_samples`` valid images remain.

    Example:
        >>> data = load_image_dataset("train.parquet", num_samples=256)  # doctest: +SKIP
        >>> ranking = hf_snapvit.rank(model, method="snapvit", data=data, preset="fast")  # doctest: +SKIP
    """
    import datasets
    from huggingface_hub.utils import tqdm

    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise SnapViTError(f"num_samples={num_samples!r} must be a positive integer (or None for the whole stream).")
    if isinstance(shuffle_buffer, bool) or not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
        raise SnapViTError(f"shuffle_buffer={shuffle_buffer!r} must be a positive integer.")
    name = _display_name(source)
    raw = _load_raw(source, split, streaming, revision, token)
    if raw.features is None:
        raise SnapViTError(
            f"datasets cannot tell the columns of {str(source)!r} without reading it; store the images as parquet "
            "(datasets.Dataset.to_parquet) or as an image folder."
        )
    features = raw.features
    columns = list(features)
    if image_column is None:
        image_column = find_image_column(columns, features)
    elif image_column not in columns:
        raise SnapViTError(f"image_column={image_column!r} is not among the dataset's columns {columns}.")
    _check_image_feature(image_column, features[image_column], columns)
    if label_column is not None and label_column not in columns:
        raise SnapViTError(f"label_column={label_column!r} is not among the dataset's columns {columns}.")
    keep = [image_column] + ([label_column] if label_column not in (None, image_column) else [])

    data = raw.select_columns(keep).cast_column(image_column, datasets.Image(decode=False))
    if streaming:
        # Interleaving shards into the buffer only helps with several; with parquet it also costs a fixed 5 s sleep
        # when the stream closes (datasets' workaround for apache/arrow#45214), so a single file does without it.
        data = data.shuffle(seed=seed, buffer_size=shuffle_buffer, max_buffer_input_shards=min(10, data.num_shards))
    else:  # the whole split is on disk: an exact permutation, then the same lazy path as a stream
        data = data.shuffle(seed=seed).to_iterable_dataset()
    check = _ValidImages(image_column, name)
    valid = data.filter(check)
    if num_samples is None:
        return valid

    rows: list[dict[str, Any]] = []
    with tqdm(total=num_samples, desc="Reading calibration images", unit="img", disable=not show_progress) as bar:
        for example in valid.take(num_samples):
            rows.append(example)
            bar.update(1)
    if len(rows) < num_samples:
        raise SnapViTError(
            f"{name!r} (split {split!r}) has only {len(rows)} valid images, but num_samples={num_samples} were asked "
            f"for ({check.skipped} corrupt images skipped). Ask for at most {len(rows)} (--num-samples) or add images."
        )
    logger.info("Read %d images from %s (split %r, seed %d); skipped %d corrupt images.",
                len(rows), name, split, seed, check.skipped)
    info = datasets.DatasetInfo(
        dataset_name=name,
        description=f"{num_samples} images of split {split!r}, shuffled with seed {seed}",
        features=valid.features,
    )
    return datasets.Dataset.from_list(rows, info=info, split=datasets.NamedSplit(split))
