"""Calibration images: from whatever the user has to seeded samples and model-ready tensors.

Accepted sources: an iterable of PIL images, a ``datasets.Dataset`` or streaming ``IterableDataset`` with an image
column, or a tensor of already preprocessed pixel values ``[N, C, H, W]``. Every draw is seeded and deterministic.
Preprocessing always uses the model's own image processor (its resize, rescale and normalisation), so a model
trained with mean = std = 0.5 is never fed ImageNet statistics.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from PIL import Image

from .errors import SnapViTError

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
        stream = list(data.shuffle(seed=seed, buffer_size=max(1000, num_samples)).take(num_samples))
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
