"""Calibration draws: seeded, deterministic samples of images for scoring, search and correction.

Every draw depends only on the source and the seed, never on the process or the batch, so one process and N
processes (``accelerate launch``) see the same images: :func:`draw_calibration` reads a streaming dataset once per
process, taking only that process's gradient steps (see :mod:`hf_snapvit.distributed` for why the split is
``strategy="examples"``).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from PIL import Image

from .data import ImageSource, find_image_column, read_valid_rows, to_rgb
from .distributed import process_state, raise_if_failed_anywhere
from .errors import DataError
from .streams import Decoder, ResilientStream, first_valid, from_sequence, reservoir
from .views import check_pixel_values


def sample_images(
    data: ImageSource,
    num_samples: int,
    *,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    model: Any = None,
) -> tuple[list[Image.Image] | torch.Tensor, torch.Tensor | None]:
    """Draw up to ``num_samples`` images (and their labels), uniformly and deterministically for a given ``seed``.

    Returns RGB PIL images, or a tensor slice when ``data`` is a tensor of pixel values, and the labels of
    ``label_column`` for datasets (``None`` otherwise). Fewer images are returned when the source has fewer, and
    with a warning when an error cut the draw short; an empty source raises. A corrupt image is skipped, logged and
    replaced (see :func:`~hf_snapvit.data.read_valid_rows` and :mod:`hf_snapvit.streams`), and a stream that fails
    with a network error is reopened and read on where it failed; pixel tensors are checked with
    :func:`~hf_snapvit.views.check_pixel_values` (the patch size too, given ``model``).
    """
    rng = np.random.default_rng(seed)
    _refuse_unsupported(data)
    if isinstance(data, torch.Tensor):
        if data.ndim != 4 or data.shape[0] == 0:
            raise DataError(
                f"A tensor of calibration pixel values must have shape [N, C, H, W] with N >= 1, got {tuple(data.shape)}."
            )
        data = check_pixel_values(data, model=model)
        return data[torch.as_tensor(rng.permutation(data.shape[0])[:num_samples])], None
    datasets = loaded_datasets()
    if datasets is not None and isinstance(data, datasets.Dataset):
        if len(data) == 0:
            raise DataError("The calibration dataset is empty; give at least one image.")
        column = image_column or find_image_column(data.column_names, data.features)
        images, rows = read_valid_rows(data, rng.permutation(len(data)), column, num_samples)
        labels = _labels(data.select(rows), label_column)
    elif datasets is not None and isinstance(data, datasets.IterableDataset):
        column = image_column or find_image_column(list(data.features or {}) or data.column_names or [],
                                                   data.features)
        raw, decode = undecoded(seeded_stream(data, num_samples, seed, take=False), column)
        decoder, stream = Decoder(decode, "calibration stream"), ResilientStream(raw, "calibration stream")
        images, examples = first_valid(stream, num_samples, decoder, lambda example: example[column])
        decoder.report(num_samples, len(images), stream)
        labels = None if label_column is None else torch.tensor([example[label_column] for example in examples])
    elif isinstance(data, Sequence):
        decoder = Decoder(to_rgb, "calibration data")
        images, labels = from_sequence(data, rng.permutation(len(data)), num_samples, decoder), None
        decoder.report(num_samples, len(images))
    elif isinstance(data, Iterable):
        decoder, stream = Decoder(to_rgb, "calibration stream"), ResilientStream(data, "calibration stream")
        images, labels = reservoir(stream, num_samples, rng, decoder), None
        decoder.report(num_samples, len(images), stream)
    else:
        raise DataError(
            f"Unsupported calibration data of type {type(data).__name__}: give PIL images, a datasets (Iterable)Dataset "
            "with an image column, or a [N, C, H, W] tensor of pixel values."
        )
    if not images:
        raise DataError("The calibration data is empty; give at least one image.")
    if label_column is not None and labels is None:
        raise DataError(
            f"Labels were asked for (label_column={label_column!r}) but {type(data).__name__} data has none; give a "
            "datasets Dataset with a label column."
        )
    return images, labels


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


def seeded_stream(data: Any, num_samples: int, seed: int, *, take: bool = True) -> Any:
    """The seeded sample of a streaming ``IterableDataset``: a shuffle buffer, then the first ``num_samples``
    (``take=False``: the whole shuffled stream, for a reader that replaces a corrupt image by the next one).

    Every process of a multi-process run rebuilds this same stream (see :mod:`hf_snapvit.distributed`).
    """
    shuffled = data.shuffle(seed=seed, buffer_size=max(1000, num_samples))
    return shuffled.take(num_samples) if take else shuffled


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
                 label_column: str | None) -> dict[str, Any]:
    """The provenance of a calibration draw, as rankings record it."""
    return {"source": type(data).__name__, "name": getattr(getattr(data, "info", None), "dataset_name", None),
            "num_gradient": num_gradient, "num_fitness": num_fitness, "seed": seed, "image_column": image_column,
            "label_column": label_column}


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
) -> CalibrationSplit:
    """Draw the gradient set and the fitness set in one seeded draw, so they do not share images."""
    images, labels = sample_images(data, num_gradient + num_fitness, seed=seed, image_column=image_column,
                                   label_column=label_column, model=model)
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
    description = _description(data, len(gradient), len(fitness), seed, image_column, label_column)
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


def stream_steps(
    stream: Any,
    column: str,
    step_size: int,
    *,
    label_column: str | None = None,
    rank: int,
    world_size: int,
) -> list[tuple[int, list, torch.Tensor | None]]:
    """The gradient steps of process ``rank`` from a stream of the whole sample, reading only that process's images.

    The stream is grouped into steps (``IterableDataset.batch``) and split with ``split_dataset_by_node(...,
    strategy="examples")``, so process ``rank`` gets steps ``rank, rank + world_size, ...`` of exactly the stream one
    process reads. Image columns are read undecoded and only this process's images are decoded.

    Args:
        stream: A ``datasets.IterableDataset`` yielding the sample in order.
        column: The image column.
        step_size: Images per gradient step.
        label_column: A label column to return with the images.
        rank, world_size: This process and the number of processes.

    Returns:
        ``(index of the step's first image, RGB images, labels or None)`` per step, in order.
    """
    from datasets.distributed import split_dataset_by_node

    stream, decode = undecoded(stream, column)  # the other processes' images are never decoded
    mine = split_dataset_by_node(stream.batch(step_size), rank=rank, world_size=world_size, strategy="examples")
    steps = []
    for j, batch in enumerate(mine):
        if label_column is not None and label_column not in batch:
            raise DataError(
                f"label_column={label_column!r} is not among the dataset's columns {sorted(batch)}."
            )
        images = [decode(x) for x in batch[column]]
        labels = None if label_column is None else torch.tensor(batch[label_column])
        steps.append(((rank + j * world_size) * step_size, images, labels))
    return steps


def draw_calibration(
    data: Any,
    num_gradient: int,
    num_fitness: int,
    *,
    step_size: int,
    seed: int = 0,
    image_column: str | None = None,
    label_column: str | None = None,
    state: PartialState | None = None,
    model: Any = None,
) -> tuple[Any, Any, dict[str, Any], torch.Tensor | None]:
    """One process's calibration sample: the gradient images (all, or this process's steps) and the fitness images.

    With one process, or any source but a streaming ``IterableDataset``, every process draws the one-process sample
    (:func:`split_calibration`, or :func:`sample_images` when ``num_fitness`` is
    0) and :func:`~hf_snapvit.scoring.gradient_scores` takes its share of the steps. A stream on several processes is
    read as :func:`stream_steps` describes; the fitness images are the same on every process. A stream too short for
    both sets falls back to the full draw, so the sets overlap exactly as with one process.

    Args:
        data: The calibration source (see :mod:`hf_snapvit.data`).
        num_gradient, num_fitness: Sizes of the two sets.
        step_size: Images per gradient step (``ScoreConfig.step_size``).
        seed: Seeds the draw.
        image_column, label_column: As in :func:`sample_images`.
        state: The process state (default: :func:`process_state`).
        model: The model the images are for: pixel tensors smaller than one of its patches fail here.

    Returns:
        ``(gradient images or GradientSteps, fitness images (empty list if num_fitness is 0), description,
        gradient labels or None)``.
    """
    datasets = loaded_datasets()
    state = state or process_state()
    streaming = datasets is not None and isinstance(data, datasets.IterableDataset) and state.num_processes > 1

    def full_draw() -> tuple[Any, Any, dict[str, Any], torch.Tensor | None]:
        if num_fitness == 0:
            images, labels = sample_images(data, num_gradient, seed=seed, image_column=image_column,
                                           label_column=label_column, model=model)
            return images, [], _description(data, len(images), 0, seed, image_column, label_column), labels
        split = split_calibration(data, num_gradient, num_fitness, seed=seed, image_column=image_column,
                                  label_column=label_column, model=model)
        return split.gradient, split.fitness, split.description, split.gradient_labels

    if not streaming:
        return full_draw()

    column = image_column or find_image_column(list(data.features or {}) or data.column_names or [], data.features)
    stream = seeded_stream(data, num_gradient + num_fitness, seed)
    fitness = [to_rgb(example[column]) for example in stream.skip(num_gradient)] if num_fitness else []
    if len(fitness) < num_fitness:  # a small source: the sets overlap, as one process draws them
        return full_draw()
    steps, error = [], None
    try:  # a bad label column or a corrupt image may show up in one process's share only
        steps = stream_steps(stream.take(num_gradient), column, step_size, label_column=label_column,
                             rank=state.process_index, world_size=state.num_processes)
    except Exception as exc:
        error = exc
    raise_if_failed_anywhere(error, state)
    total = sum(gather_object([sum(len(images) for _, images, _ in steps)]))
    if total == 0:
        raise DataError("The calibration data is empty; give at least one image.")
    gradient = GradientSteps(steps, total, step_size)
    return gradient, fitness, _description(data, total, len(fitness), seed, image_column, label_column), None


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
        index = torch.as_tensor(np.random.default_rng(seed).permutation(total)[:count])
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
    images, _ = sample_images(data, num_samples, seed=seed, model=model)
    if isinstance(images, torch.Tensor):
        return [{"pixel_values": images[i:i + batch_size]} for i in range(0, len(images), batch_size)], len(images)
    if processor is None:
        raise DataError(
            "The calibration data are images, so an image processor is needed to preprocess them: pass processor="
            "AutoImageProcessor.from_pretrained(<model>), or give preprocessed pixel values as a [N, C, H, W] tensor."
        )
    return [images[i:i + batch_size] for i in range(0, len(images), batch_size)], len(images)
