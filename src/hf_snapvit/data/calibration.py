"""Calibration draws: seeded, deterministic samples of images for scoring, search and correction.

Every draw is :mod:`hf_snapvit.data.sampling`'s: it depends only on the source and the seed, never on the process or the
batch, so one process and N processes (``accelerate launch``) see the same images, and it spreads over the whole
source (or a stream's prefix, over all its shards) rather than its first rows. What a draw covered is recorded in
the ranking's provenance and warned about when it falls short (:mod:`hf_snapvit.data.coverage`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import torch
from PIL import Image

from .coverage import (Coverage, check_coverage, class_names, coverage_column, label_coverage, neighbour_gap,
                       recorded_draw)
from .images import ImageSource, find_image_column, read_valid_rows, to_rgb
from ..architectures.inputs import pixel_shape
from ..errors import DataError
from .sampling import draw_valid, key_order, unwrap
from .streams import Decoder, from_sequence
from .views import check_pixel_values, embedder


@dataclass
class Sample:
    """A draw of images: the RGB images (or a pixel tensor), their labels, and what the draw covered."""

    images: list[Image.Image] | torch.Tensor
    labels: torch.Tensor | None
    coverage: Coverage


def sample_images(data: ImageSource, num_samples: int, *, seed: int = 0, **options: Any
                  ) -> tuple[list[Image.Image] | torch.Tensor, torch.Tensor | None]:
    """Draw up to ``num_samples`` images (and their labels), uniformly and deterministically for a given ``seed``;
    ``options`` are :func:`draw_sample`'s (``image_column``, ``label_column``, ``model``, ``stream_prefix``,
    ``embed``).

    Returns RGB PIL images, or a tensor slice when ``data`` is a tensor of pixel values, and the labels of
    ``label_column`` for datasets (``None`` otherwise). The draw is :mod:`hf_snapvit.data.sampling`'s: exact for sources
    with random access, spread over at most ``stream_prefix`` rows (all shards) of a stream, and a sample that may
    not represent its source warns (:mod:`hf_snapvit.data.coverage`). Fewer images are returned when the source has
    fewer, and with a warning when an error cut the draw short; an empty source raises. A corrupt image is skipped,
    logged and replaced (see :func:`~hf_snapvit.data.images.read_valid_rows` and :mod:`hf_snapvit.data.streams`), and a stream
    that fails with a network error is reopened and read on where it failed; pixel tensors are checked with
    :func:`~hf_snapvit.data.views.check_pixel_values` (the patch size too, given ``model``).
    """
    sample = draw_sample(data, num_samples, seed=seed, **options)
    return sample.images, sample.labels


def draw_sample(
    data: ImageSource,
    num_samples: int,
    *,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    model: Any = None,
    stream_prefix: int | None = None,
    embed: Callable[[Sequence[Any]], Any] | None = None,
    what: str = "calibration sample",
) -> Sample:
    """:func:`sample_images`, with the draw's :class:`~hf_snapvit.data.coverage.Coverage` (checked, warning if it
    falls short). ``embed`` (images to ``[N, D]`` embeddings, e.g. :func:`~hf_snapvit.data.views.embedder`) lets the
    coverage check of an unlabelled stream cut at its prefix compare images as the model sees them."""
    data, prefix = unwrap(data, stream_prefix)
    _refuse_unsupported(data)
    datasets = loaded_datasets()
    if isinstance(data, torch.Tensor):
        clips = model is not None and len(pixel_shape(model.config, 1)) == 5  # a video model's [N, T, C, H, W]
        if data.ndim != (5 if clips else 4) or data.shape[0] == 0:
            raise DataError(
                f"A tensor of calibration pixel values must have shape {'[N, T, C, H, W]' if clips else '[N, C, H, W]'}"
                f" with N >= 1, got {tuple(data.shape)}."
            )
        data = check_pixel_values(data, model=model)
        chosen = data[torch.as_tensor(key_order(data.shape[0], seed)[:num_samples])]
        return Sample(chosen, None, Coverage("random access", data.shape[0], True))
    if datasets is not None and isinstance(data, datasets.Dataset):
        sample = _from_dataset(data, num_samples, seed, image_column, label_column)
    elif datasets is not None and isinstance(data, datasets.IterableDataset):
        sample = _from_stream(data, num_samples, seed, prefix, image_column, label_column, embed)
    elif isinstance(data, Sequence):
        decoder = Decoder(to_rgb, "calibration data")
        images = from_sequence(data, key_order(len(data), seed), num_samples, decoder)
        decoder.report(num_samples, len(images))
        sample = Sample(images, None, Coverage("random access", len(data), True))
    elif isinstance(data, Iterable):
        sample = _from_stream(data, num_samples, seed, prefix, None, None, embed)
    else:
        raise DataError(
            f"Unsupported calibration data of type {type(data).__name__}: give PIL images, a datasets (Iterable)Dataset "
            "with an image column, or a [N, C, H, W] tensor of pixel values."
        )
    if not len(sample.images):
        raise DataError("The calibration data is empty; give at least one image.")
    if label_column is not None and sample.labels is None:
        raise DataError(
            f"Labels were asked for (label_column={label_column!r}) but {type(data).__name__} data has none; give a "
            "datasets Dataset with a label column."
        )
    check_coverage(sample.coverage, len(sample.images), what)
    return sample


def _from_dataset(data: Any, count: int, seed: int, image_column: str | None, label_column: str | None) -> Sample:
    """The exact draw of a map-style dataset: rows in key order, a corrupt one replaced by the next."""
    if len(data) == 0:
        raise DataError("The calibration dataset is empty; give at least one image.")
    column = image_column or find_image_column(data.column_names, data.features)
    images, rows = read_valid_rows(data, key_order(len(data), seed), column, count)
    labels = _labels(data.select(rows), label_column)
    fields: dict[str, Any] = {}
    name = coverage_column(data.features, label_column, data.column_names)
    if name is not None and rows:
        every = data.select_columns([name]).with_format("numpy")[name]
        fields = label_coverage([every[row] for row in rows], every, class_names(data.features, name), False)
    return Sample(images, labels, Coverage("random access", len(data), True, **fields))


def _from_stream(data: Any, count: int, seed: int, prefix: int, image_column: str | None,
                 label_column: str | None, embed: Any = None) -> Sample:
    """The draw of a stream (a ``datasets.IterableDataset`` or any iterable): candidates of smallest key among
    its first ``prefix`` rows, decoded in key order, a corrupt one replaced by the next candidate."""
    datasets = loaded_datasets()
    is_dataset = datasets is not None and isinstance(data, datasets.IterableDataset)
    column = decode = names = None
    label_name = None
    if is_dataset:
        columns = list(data.features or {}) or data.column_names or []
        column = image_column or find_image_column(columns, data.features)
        data, decode = undecoded(data, column)
        label_name = coverage_column(data.features, label_column, columns)
        names = class_names(data.features, label_name)
    decoder = Decoder(decode or to_rgb, "calibration stream")

    def valid(row: Any, position: tuple[int, int]) -> Any:
        group, index = position
        return decoder(row[column] if is_dataset else row, f"#{index}" + (f" of shard group {group}" if group else ""))

    found, chosen = draw_valid(data, count, seed, prefix, valid,
                               label_of=None if label_name is None else (lambda row: row.get(label_name)))
    images, kept, where = ([list(part) for part in zip(*chosen)] if chosen else ([], [], []))
    decoder.report(count, len(images), found.failures[0] if found.failures else None)
    labels = None
    if label_column is not None and is_dataset:
        if kept and label_column not in kept[0]:
            raise DataError(f"label_column={label_column!r} is not among the dataset's columns {sorted(kept[0])}.")
        labels = torch.tensor([row[label_column] for row in kept])
    fields: dict[str, Any] = {}
    if label_name is not None and kept:
        fields = label_coverage([row.get(label_name) for row in kept], found.labels_read, names, True)
    elif not found.complete and embed is not None:
        fields = {"neighbour_gap": neighbour_gap(embed, images, where)}
    coverage = Coverage("stream prefix", found.read, found.complete, found.groups, prefix, **fields)
    return Sample(images, labels, coverage)


def _refuse_unsupported(data: Any) -> None:
    """A path, a dataset name or a dict as calibration data fails, saying what to pass instead."""
    if isinstance(data, (str, bytes, os.PathLike)):
        raise DataError(
            f"Calibration data of type {type(data).__name__} ({str(data)!r}) is where images are, not images: load "
            f"them first, e.g. data=hf_snapvit.load_image_dataset({str(data)!r}, num_samples=256) (a .parquet file or "
            "folder, an image folder, or a Hub dataset id)."
        )
    if isinstance(data, Mapping):
        fix = ("data['pixel_values'] (a [N, C, H, W] tensor of preprocessed pixel values)" if "pixel_values" in data
               else "datasets.Dataset.from_dict(data) (a column of PIL images)")
        raise DataError(
            f"Calibration data of type {type(data).__name__} (keys {sorted(map(str, data))}) is not supported here "
            f"(only weight correction takes a dict of model inputs): pass {fix}."
        )


def _labels(dataset: Any, label_column: str | None) -> torch.Tensor | None:
    if label_column is None:
        return None
    if label_column not in dataset.column_names:
        raise DataError(
            f"label_column={label_column!r} is not among the dataset's columns {dataset.column_names}."
        )
    return torch.tensor(dataset[label_column])


def undecoded(stream: Any, column: str) -> tuple[Any, Any]:
    """``stream`` with its image column left undecoded, and the function that decodes one value to RGB.

    Decoding is the expensive part of reading and where a corrupt image fails: done by the caller, it happens only
    for the images used, and one bad image is skipped instead of ending the stream."""
    import datasets

    feature = (stream.features or {}).get(column)
    if not (isinstance(feature, datasets.Image) and feature.decode):
        return stream, to_rgb
    raw = stream.cast_column(column, datasets.Image(mode=feature.mode, decode=False))
    return raw, lambda value: to_rgb(feature.decode_example(value))


@dataclass
class CalibrationSplit:
    """Disjoint gradient and fitness samples (overlapping only if the source is too small), with provenance."""

    gradient: list[Image.Image] | torch.Tensor
    fitness: list[Image.Image] | torch.Tensor
    description: dict[str, Any] = field(default_factory=dict)
    gradient_labels: torch.Tensor | None = None


def _description(data: Any, num_gradient: int, num_fitness: int, seed: int, image_column: str | None,
                 label_column: str | None, coverage: Coverage) -> dict[str, Any]:
    """The provenance of a calibration draw, as rankings record it: the source, the sizes, and what it covered."""
    data, _ = unwrap(data)
    info = getattr(data, "info", None)
    record = {"source": type(data).__name__, "name": getattr(info, "dataset_name", None),
              "num_gradient": num_gradient, "num_fitness": num_fitness, "seed": seed, "image_column": image_column,
              "label_column": label_column, "draw": coverage.to_dict()}
    loaded = recorded_draw(getattr(info, "description", None))
    if loaded is not None:  # images load_image_dataset drew: what that draw covered of the source
        record["source_draw"] = loaded
    return record


def loaded_datasets() -> Any:
    """The ``datasets`` module if it is already imported, else ``None``.

    A ``datasets.Dataset`` can only exist once ``datasets`` is imported, so type checks need no import of their own:
    ranking with PIL images or pixel tensors never imports ``datasets``.
    """
    return sys.modules.get("datasets")


def split_calibration(
    data: ImageSource,
    num_gradient: int,
    num_fitness: int,
    *,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    model: Any = None,
    stream_prefix: int | None = None,
    embed: Callable[[Sequence[Any]], Any] | None = None,
) -> CalibrationSplit:
    """Draw the gradient set and the fitness set in one seeded draw, so they do not share images."""
    sample = draw_sample(data, num_gradient + num_fitness, seed=seed, image_column=image_column,
                         label_column=label_column, model=model, stream_prefix=stream_prefix, embed=embed)
    images, labels = sample.images, sample.labels
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
    description = _description(data, len(gradient), len(fitness), seed, image_column, label_column,
                               sample.coverage)
    return CalibrationSplit(gradient, fitness, description,
                            gradient_labels=None if labels is None else labels[:len(gradient)])


@dataclass(frozen=True)
class GradientSteps:
    """This process's share of the gradient steps of a calibration sample.

    Args:
        steps: ``(index of the step's first image in the whole sample, its images, its labels or None)``, in order.
        num_images: Images in the whole sample, over all processes.
        step_size: Images per gradient step (the last step of the sample may hold fewer).
    """

    steps: list[tuple[int, Any, torch.Tensor | None]]
    num_images: int
    step_size: int

    def __len__(self) -> int:
        return self.num_images


def draw_calibration(
    data: Any,
    num_gradient: int,
    num_fitness: int,
    *,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    model: Any = None,
    stream_prefix: int | None = None,
    embed: Callable[[Sequence[Any]], Any] | None = None,
) -> tuple[Any, Any, dict[str, Any], torch.Tensor | None]:
    """The calibration sample: the gradient images and the fitness images, with the draw's provenance.

    Every process of a multi-process run draws the same one-process sample (the draw depends on the source and the
    seed only, see :mod:`hf_snapvit.data.sampling`), and :func:`~hf_snapvit.pruning.scoring.gradient_scores` takes each
    process's share of the gradient steps. A stream is read once per process, undecoded, and only the sample is
    decoded.

    Args:
        data: The calibration source (see :mod:`hf_snapvit.data.images`), or a :class:`~hf_snapvit.data.sampling.StreamSource`.
        num_gradient, num_fitness: Sizes of the two sets.
        seed: Seeds the draw.
        image_column, label_column: As in :func:`sample_images`.
        model: The model the images are for: pixel tensors smaller than one of its patches fail here.
        stream_prefix: Rows of a stream read at most (default: the :class:`StreamSource`'s, else
            :data:`~hf_snapvit.data.sampling.DEFAULT_STREAM_PREFIX`).
        embed: Embeds images for the coverage check of an unlabelled stream (see :func:`draw_sample`).

    Returns:
        ``(gradient images, fitness images (empty list if num_fitness is 0), description, gradient labels or
        None)``.
    """
    if num_fitness == 0:
        sample = draw_sample(data, num_gradient, seed=seed, image_column=image_column, label_column=label_column,
                             model=model, stream_prefix=stream_prefix, embed=embed)
        description = _description(data, len(sample.images), 0, seed, image_column, label_column, sample.coverage)
        return sample.images, [], description, sample.labels
    split = split_calibration(data, num_gradient, num_fitness, seed=seed, image_column=image_column,
                              label_column=label_column, model=model, stream_prefix=stream_prefix, embed=embed)
    return split.gradient, split.fitness, split.description, split.gradient_labels


def calibration_batches(
    data: Any,
    processor: Any = None,
    *,
    num_samples: int | None = 1000,
    batch_size: int = 16,
    seed: int = 0,
    model: Any = None,
) -> tuple[list[Any], int]:
    """Draw calibration images and split them into model-input batches.

    Args:
        data: PIL images, a ``datasets`` (Iterable)Dataset with an image column, a ``[N, C, H, W]`` tensor of
            preprocessed pixel values, or a dict of such tensors sharing their first dimension (e.g. a processor's
            output for SigLIP2: ``pixel_values``, ``pixel_attention_mask``, ``spatial_shapes``).
        processor: The model's image processor; needed unless ``data`` is already preprocessed.
        num_samples: Images to draw (seeded); ``None`` for all.
        batch_size: Images per batch.
        seed: Seed of the draw.
        model: The model the images are for: pixel tensors smaller than one of its patches fail here.

    Returns:
        ``(batches, num_images)``. Image batches are preprocessed lazily, so each entry is either a dict of tensors or
        a list of PIL images still to be passed through ``processor``.
    """
    if isinstance(data, Mapping):
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        sizes = {v.shape[0] for v in tensors.values()}
        if "pixel_values" not in tensors or len(sizes) != 1:
            raise DataError(
                f"A dict of calibration inputs needs a 'pixel_values' tensor and tensors of one batch size; got "
                f"keys {sorted(data)} with batch sizes {sorted(sizes)}."
            )
        tensors["pixel_values"] = check_pixel_values(tensors["pixel_values"], model=model)
        total = sizes.pop()
        count = total if num_samples is None else min(num_samples, total)
        index = torch.as_tensor(key_order(total, seed)[:count])
        chosen = {k: v[index] for k, v in tensors.items()}
        return [{k: v[i:i + batch_size] for k, v in chosen.items()} for i in range(0, count, batch_size)], count
    if num_samples is None:
        if isinstance(data, torch.Tensor):
            num_samples = data.shape[0]
        else:
            try:
                num_samples = len(data)
            except TypeError:
                raise DataError(
                    "num_samples=None (use every image) needs data with a length; give CorrectionConfig(num_samples=N) "
                    "for a stream."
                ) from None
    images, _ = sample_images(data, num_samples, seed=seed, model=model,
                              embed=None if model is None else embedder(model, processor))
    if isinstance(images, torch.Tensor):
        return [{"pixel_values": images[i:i + batch_size]} for i in range(0, len(images), batch_size)], len(images)
    if processor is None:
        raise DataError(
            "The calibration data are images, so an image processor is needed to preprocess them: pass processor="
            "AutoImageProcessor.from_pretrained(<model>), or give preprocessed pixel values as a [N, C, H, W] tensor."
        )
    return [images[i:i + batch_size] for i in range(0, len(images), batch_size)], len(images)
