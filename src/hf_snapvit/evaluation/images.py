"""Images to evaluate on: :class:`ImageSet` (PIL images, a ``datasets`` split, pixel tensors or model inputs, with
optional labels) and :func:`load_split` (a split from parquet files or a dataset name, opened as calibration images
are)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.images import find_image_column, to_rgb
from ..data.splits import open_split
from ..errors import EvaluationError
from ..data.sampling import key_order


@dataclass
class ImageSet:
    """Images to evaluate on, with optional integer labels, read batch by batch on every pass.

    Build one with :meth:`from_data`. The source is kept as given (a ``datasets.Dataset`` decodes each batch when it
    is read), so large splits need no memory beyond one batch.

    Args:
        source: A list of PIL images, a ``datasets.Dataset``, a ``[N, C, H, W]`` tensor of preprocessed pixel
            values, or a mapping of model-input tensors with a shared first dimension.
        labels: ``[N]`` integer labels, or ``None``.
        image_column: The image column of a ``datasets.Dataset`` source.
        description: Provenance recorded in results (source type, dataset name, size).
    """

    source: Any
    labels: torch.Tensor | None = None
    image_column: str | None = None
    description: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_data(
        cls,
        data: Any,
        labels: Sequence[int] | torch.Tensor | np.ndarray | None = None,
        *,
        image_column: str | None = None,
        label_column: str | None = "label",
    ) -> "ImageSet":
        """Wrap ``data`` (PIL images, a ``datasets`` (Iterable)Dataset, a pixel tensor or an ``ImageSet``).

        Args:
            data: The images. A streaming ``IterableDataset`` is read into memory once (use ``.take(n)`` first).
            labels: Labels for list or tensor sources (a dataset's come from ``label_column``); they override the
                dataset's when given.
            image_column: The image column of a dataset (default: the first ``datasets.Image`` feature).
            label_column: The label column of a dataset; a dataset without it gives an unlabelled set.

        Returns:
            The wrapped images and labels.
        """
        if isinstance(data, ImageSet):
            if labels is None:
                return data
            return dataclasses.replace(data, labels=as_labels(labels, len(data), "labels"))
        import datasets

        column = None
        found: Any = None
        if isinstance(data, datasets.IterableDataset):
            column = image_column or find_image_column(list(data.features or {}) or data.column_names or [],
                                                       data.features)
            examples = list(data)
            if label_column is not None and examples and label_column in examples[0] and labels is None:
                found = [example[label_column] for example in examples]
            data = [to_rgb(example[column]) for example in examples]
            column = None
        if isinstance(data, datasets.Dataset):
            column = image_column or find_image_column(data.column_names, data.features)
            if labels is None and label_column is not None and label_column in data.column_names:
                found = data[label_column]
            source: Any = data
            kind = "datasets.Dataset"
        elif isinstance(data, torch.Tensor):
            if data.ndim != 4:
                raise EvaluationError(
                    "A tensor of images must be preprocessed pixel values [N, C, H, W]; got shape "
                    f"{tuple(data.shape)}. "
                    "Pass PIL images or a datasets.Dataset to have the model's processor prepare them."
                )
            source, kind = data, "tensor"
        elif isinstance(data, Mapping):
            lengths = {k: v.shape[0] for k, v in data.items() if isinstance(v, torch.Tensor)}
            if not lengths or len(set(lengths.values())) != 1:
                raise EvaluationError(
                    f"A mapping of model inputs needs tensors with one shared batch size; got {lengths or 'none'}."
                )
            source, kind = dict(data), "inputs"
        elif isinstance(data, (str, bytes)) or not isinstance(data, Iterable):
            raise EvaluationError(
                f"Unsupported evaluation data of type {type(data).__name__}: give PIL images, a datasets Dataset with "
                "image and label columns, or a [N, C, H, W] tensor of pixel values (use load_split for a path)."
            )
        else:
            source, kind = [to_rgb(image) for image in data], "images"
        name = getattr(getattr(source, "info", None), "dataset_name", None)
        result = cls(source=source, image_column=column, description={"source": kind, "name": name})
        given = labels if labels is not None else found
        if given is not None:
            result.labels = as_labels(given, len(result), "labels" if labels is not None else repr(label_column))
        result.description["num_images"] = len(result)
        return result

    def __len__(self) -> int:
        if isinstance(self.source, Mapping):
            return int(next(v.shape[0] for v in self.source.values() if isinstance(v, torch.Tensor)))
        return len(self.source)

    def batches(self, batch_size: int) -> Iterator[Any]:
        """Consecutive batches: lists of PIL images, pixel tensors, or mappings of input tensors."""
        for start in range(0, len(self), batch_size):
            stop = min(start + batch_size, len(self))
            if isinstance(self.source, Mapping):
                yield {k: (v[start:stop] if isinstance(v, torch.Tensor) else v) for k, v in self.source.items()}
            elif isinstance(self.source, torch.Tensor):
                yield self.source[start:stop]
            elif self.image_column is not None:
                yield [to_rgb(image) for image in self.source[start:stop][self.image_column]]
            else:
                yield self.source[start:stop]


def as_labels(labels: Any, expected: int, name: str) -> torch.Tensor:
    """``labels`` as ``[expected]`` int64 class ids; ``name`` is how errors refer to them."""
    tensor = torch.as_tensor(np.asarray(labels))
    if tensor.ndim != 1 or tensor.shape[0] != expected:
        raise EvaluationError(f"{name} must be a 1-D sequence of {expected} labels (one per image); got shape "
                              f"{tuple(tensor.shape)}.")
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise EvaluationError(f"{name} must be integer class ids, got dtype {tensor.dtype}.")
    if expected and int(tensor.min()) < 0:
        raise EvaluationError(f"{name} must be non-negative class ids; found {int(tensor.min())}.")
    return tensor.long()


def load_split(
    path_or_name: str | os.PathLike,
    split: str,
    *,
    num_samples: int | None = None,
    seed: int = 0,
) -> Any:
    """A ``datasets.Dataset`` split: a parquet file, a folder of ``{split}.parquet`` files, or a dataset name.

    Opened as calibration images are (:func:`~hf_snapvit.data.splits.open_split`, prepared rather than streamed),
    with every column, images decoded.

    Args:
        path_or_name: ``data/validation.parquet``, a folder holding ``{split}.parquet``, or a Hub dataset id or a
            local folder ``datasets.load_dataset`` reads (parquet shards or images, splits named by the file names).
        split: The split to read (``"train"``, ``"validation"``, ...). A single file is read as this split; one
            whose name says it holds training images while a held-out split is asked for (or the reverse) fails.
        num_samples: Keep a seeded random subset of this size (default: all).
        seed: Seed of the subset's shuffle.

    Returns:
        The (sub)split, a ``datasets.Dataset``.

    Raises:
        EvaluationError: A single file named for training (``train``, ``training``) when a held-out split is asked
            for, or named for a held-out split (``validation``, ``val``, ``dev``, ``test``, ...) when ``train`` is.
        DataError: The source cannot be opened (see :func:`~hf_snapvit.data.splits.open_split`).
    """
    if num_samples is not None and num_samples < 1:
        raise EvaluationError(f"num_samples={num_samples} must be at least 1 (or None for the whole split).")
    path = Path(path_or_name).expanduser()
    if path.is_file():
        _check_file_split(path, split)
    dataset = open_split(path_or_name, split, streaming=False)
    if num_samples is not None:
        dataset = dataset.select(key_order(len(dataset), seed)[:num_samples])  # the draw every sample uses
    return dataset


#: Words in a file name that say which split it holds (those ``datasets`` infers splits from).
SPLIT_WORDS = {"train": ("train", "training"), "validation": ("validation", "valid", "val", "dev"),
               "test": ("test", "testing", "eval", "evaluation")}


def split_named_by(name: str) -> str | None:
    """The split a file name or split name says it holds (``"train-00000-of-00001"`` -> ``"train"``), or None."""
    words = set(re.split(r"[-._ 0-9\[\]:%]+", name.lower()))
    return next((split for split, keywords in SPLIT_WORDS.items() if words & set(keywords)), None)


def _check_file_split(path: Path, split: str) -> None:
    """A single file is read as ``split``: refuse one whose name says it holds the other side of train/held-out."""
    named = split_named_by(path.stem)
    asked = split_named_by(split) or split
    if named is not None and (named == "train") != (asked == "train"):
        raise EvaluationError(
            f"{path.name!r} looks like the {named!r} split (by its file name), but split {split!r} was asked for: "
            "evaluating on training images, or building the bank from held-out ones, gives meaningless results. "
            f"Give the {split!r} file (or the folder holding the split files), or ask for split {named!r} (--split / "
            "--bank-split) to use this file deliberately."
        )
