"""Views of images as a model sees them: the processor's preprocessing, its normalisation, DINO multi-crops.

Preprocessing always uses the model's own image processor (its resize, rescale and normalisation), so a model
trained with mean = std = 0.5 is never fed ImageNet statistics. :func:`load_processor` is the one place that finds
a model's processor, :func:`model_inputs` the one place that turns a batch into keyword arguments of ``forward``.
"""

from __future__ import annotations

import math
import numbers
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..architectures import vision_config
from ..architectures.embedding import unpatchify
from ..architectures.inputs import DEFAULT_SIDE, ungrid
from .images import to_rgb
from ..utils.validation import Settings
from ..errors import DataError


class Normalizer:
    """The rescale and normalisation steps of a transformers image processor, applied to float tensors."""

    def __init__(self, processor: Any) -> None:
        timm = getattr(processor, "data_config", None) or {}  # a timm processor's statistics; it scales by 1/255
        factor = getattr(processor, "rescale_factor", None) or (1 / 255 if timm else None)
        self.rescale = float(factor) if getattr(processor, "do_rescale", True) and factor is not None else 1.0
        self.normalize = bool(getattr(processor, "do_normalize", True))
        mean = getattr(processor, "image_mean", None) or timm.get("mean")
        std = getattr(processor, "image_std", None) or timm.get("std")
        if self.normalize and (mean is None or std is None):
            raise DataError(f"{type(processor).__name__} has no image_mean/image_std to normalise with.")
        self.mean = torch.tensor(list(mean or [0.0, 0.0, 0.0])).view(1, -1, 1, 1)
        self.std = torch.tensor(list(std or [1.0, 1.0, 1.0])).view(1, -1, 1, 1)

    def __call__(self, uint8: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` 0-255 values (uint8, or floats of resized crops) → model-ready float32, on their device."""
        x = uint8.float() * self.rescale
        if not self.normalize:
            return x
        if self.mean.device != x.device:  # moved once: a copy per call would stall an accelerator's queue each time
            self.mean, self.std = self.mean.to(x.device), self.std.to(x.device)
        return (x - self.mean) / self.std


def processor_inputs(images: list[Image.Image] | torch.Tensor, processor: Any, batch_size: int = 64) -> torch.Tensor:
    """Eval-transform pixel values ``[N, C, H, W]`` via the processor (tensors pass through unchanged)."""
    if isinstance(images, torch.Tensor):
        return images.float()
    patch_size = getattr(processor, "patch_size", None)
    max_patches = getattr(processor, "max_num_patches", None)
    if patch_size and max_patches:
        # Patch-sequence processors (SigLIP2) keep each image's aspect ratio, so a batch mixes patch grids; square
        # images of the default grid all give the same grid, which is then stored as ordinary [C, H, W] images.
        side = math.isqrt(int(max_patches)) * int(patch_size)
        square = [to_rgb(image).resize((side, side), Image.BICUBIC) for image in images]
        chunks = []
        for i in range(0, len(square), batch_size):
            out = processor(images=square[i:i + batch_size], return_tensors="pt")
            chunks.append(unpatchify(out["pixel_values"], int(patch_size), out.get("spatial_shapes")))
        return torch.cat(chunks)
    merge, temporal = getattr(processor, "merge_size", None), getattr(processor, "temporal_patch_size", None)
    if patch_size and merge and temporal:
        return _grid_processor_inputs(images, processor, batch_size)
    chunks = [
        processor(images=images[i:i + batch_size], return_tensors="pt")["pixel_values"]
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(chunks)


def _grid_processor_inputs(images: list[Image.Image], processor: Any, batch_size: int) -> torch.Tensor:
    """Images through a processor that returns one sequence of every image's patches and their grids (Qwen2-VL's),
    as ``[N, C, H, W]``: each image is first resized to one square the processor keeps (224 px, or the nearest side
    its pixel bounds allow, in whole merge windows), so that all share one grid."""
    p, m, t = int(processor.patch_size), int(processor.merge_size), int(processor.temporal_patch_size)
    step = p * m
    size = dict(getattr(processor, "size", None) or {})  # pixel bounds: {"shortest_edge": min, "longest_edge": max}
    low = math.isqrt(int(size.get("shortest_edge") or getattr(processor, "min_pixels", None) or 0))
    high = math.isqrt(int(size.get("longest_edge") or getattr(processor, "max_pixels", None) or DEFAULT_SIDE**2))
    side = max(step, min(max(DEFAULT_SIDE, -(-low // step) * step), high // step * step))
    square = [to_rgb(image).resize((side, side), Image.BICUBIC) for image in images]
    chunks = []
    for i in range(0, len(square), batch_size):
        out = processor(images=square[i:i + batch_size], return_tensors="pt")
        chunks.append(ungrid(out["pixel_values"].float(), out["image_grid_thw"], p, t, m))
    return torch.cat(chunks)


#: Preprocessed pixel values above this, none negative, look like raw 0-255 values (a processor's rescale and
#: normalisation give about [-3, 3]).
RAW_PIXEL_THRESHOLD = 25.0


def patch_size(model: Any) -> int | None:
    """The patch size of ``model``'s vision backbone, if its config has one."""
    size = getattr(vision_config(model.config), "patch_size", None) if model is not None else None
    return int(size) if isinstance(size, numbers.Integral) else None


def check_pixel_values(pixels: torch.Tensor, *, model: Any = None, what: str = "calibration pixel values"
                       ) -> torch.Tensor:
    """Preprocessed pixel values, checked: floating, finite, not raw 0-255 values, at least one patch in size.

    Args:
        pixels: ``[N, C, H, W]`` pixel values (or a patch sequence ``[N, P, D]``, checked for values only).
        model: The model they are for; gives the patch size (default: not checked).
        what: How errors name the tensor.

    Returns:
        ``pixels``, detached (with a warning) if it required gradients.

    Raises:
        DataError: Integer pixels, NaN or infinite values (naming the first bad image), or images smaller than one
            patch. Values that look like raw 0-255 floats only warn.
    """
    fix = ("preprocess the images with the model's image processor (processor(images=..., return_tensors='pt')"
           "['pixel_values']), or pass the PIL images with processor=...")
    if not pixels.is_floating_point():
        raise DataError(f"The {what} are {pixels.dtype}, not the normalised floats a model takes: {fix}.")
    if pixels.requires_grad:
        warnings.warn(f"The {what} have requires_grad=True; they are used detached (no gradient flows back to "
                      "them).", UserWarning, stacklevel=3)
        pixels = pixels.detach()
    bad = torch.cat([(~torch.isfinite(chunk)).flatten(1).any(1) for chunk in pixels.split(256)]) \
        if pixels.numel() else torch.zeros(0, dtype=torch.bool)
    if bad.any():
        first = int(bad.nonzero()[0])
        raise DataError(f"The {what} are not finite (NaN or inf) in {int(bad.sum())} of {len(pixels)} images, the "
                        f"first being image {first}; drop or fix those images.")
    size = patch_size(model)
    if size and pixels.ndim == 4 and min(pixels.shape[-2:]) < size:
        raise DataError(f"The {what} are {pixels.shape[-2]}x{pixels.shape[-1]} px, smaller than one {size}-px patch "
                        f"of the model: {fix}.")
    low, high = (float(pixels.amin()), float(pixels.amax())) if pixels.numel() else (0.0, 0.0)
    if low >= 0 and high > RAW_PIXEL_THRESHOLD:
        warnings.warn(f"The {what} range from {low:g} to {high:g}: they look like raw 0-255 values, not normalised "
                      f"ones; {fix}.", UserWarning, stacklevel=3)
    return pixels


@dataclass(frozen=True)
class MultiCropConfig(Settings):
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

    def __post_init__(self) -> None:
        self._check_int("num_global", 1)  # the DINO teacher embeds the global crops
        self._check_int("num_local", 0)
        self._check_int("global_size", 1, optional=True)
        self._check_int("local_size", 1, optional=True)
        self._check_pair("global_scale", low_open=True, hint="(0.25, 1.0)")
        self._check_pair("local_scale", low_open=True, hint="(0.05, 0.25)")


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
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Crops of every image: ``(global [B, G, C, S, S], local [B, L, C, s, s] or None)``, model-ready; of every
    clip (``[T, C, H, W]`` tensors, a video model's), one box for all its frames: ``[B, G, T, C, S, S]``.

    With a ``device`` (callers give one for an accelerator), PIL images are sent there as uint8 and cropped, resized
    (bilinear, antialiased) and normalised there: on a GPU the crops of a gradient step cost far more CPU time than
    the step itself, and their float32 pixels are 4x the bytes of uint8 to transfer. The boxes are the same (the same
    ``rng`` draws); only the resampling differs slightly from PIL's, so results are reproducible per device.
    """
    global_size = config.global_size or input_size
    local_size = config.local_size or input_size
    groups: list[list[torch.Tensor]] = [[], []]
    raw = False  # 0-255 crops resized as floats, still to be normalised
    for image in images:
        if device is not None and not isinstance(image, torch.Tensor):
            image = image_tensor(image, device)
        raw = raw or (isinstance(image, torch.Tensor) and image.dtype == torch.uint8)
        for group, (count, scale, size) in enumerate(
            ((config.num_global, config.global_scale, global_size), (config.num_local, config.local_scale, local_size))
        ):
            crops = []
            for _ in range(count):
                if isinstance(image, torch.Tensor):  # pixels (preprocessed, or raw uint8 on a device): resize
                    # A clip's [T, C, H, W] frames share one box, as a video model's tubelets need.
                    left, top, right, bottom = _crop_box(image.shape[-1], image.shape[-2], scale, rng)
                    crop = image[..., top:bottom, left:right].float()
                    frames = crop if crop.dim() == 4 else crop[None]
                    resized = torch.nn.functional.interpolate(
                        frames, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
                    crops.append(resized if crop.dim() == 4 else resized[0])
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
        if (batch.dtype == torch.uint8 or raw) and normalizer is not None:
            b, v = batch.shape[:2]
            batch = normalizer(batch.flatten(0, 1)).view(b, v, *batch.shape[2:])
        out.append(batch)
    return out[0], out[1]


def seeded_multi_crops(images: Sequence[Any] | torch.Tensor, first_index: int, seed: int, config: MultiCropConfig,
                       normalizer: Normalizer | None, input_size: int, device: torch.device | str | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`multi_crops` of ``images`` with image ``first_index + j`` drawn from its own generator
    ``[seed, first_index + j]``: an image's crops do not depend on the batch it came in, so results do not depend on
    the batch size or on how images are shared out across processes."""
    views = [multi_crops(images[j:j + 1], config, normalizer, input_size,
                         np.random.default_rng([seed, first_index + j]), device) for j in range(len(images))]
    local = None if views[0][1] is None else torch.cat([v[1] for v in views])
    return torch.cat([v[0] for v in views]), local


def image_tensor(image: Any, device: torch.device | str) -> torch.Tensor:
    """An RGB PIL image as a uint8 ``[C, H, W]`` tensor on ``device``."""
    array = np.asarray(to_rgb(image))
    return torch.from_numpy(array.copy()).permute(2, 0, 1).to(device)


def load_processor(source: Any, *, purpose: str = "preprocess the images", **hub_kwargs: Any) -> Any:
    """The image processor saved with a checkpoint.

    Args:
        source: A checkpoint folder or Hub id, or a model (the checkpoint it was loaded from is used).
        purpose: What the processor is needed for, named in the error when there is none.
        **hub_kwargs: Passed on to ``AutoImageProcessor.from_pretrained`` (``token``, ``revision``, ...).

    Raises:
        DataError: The model does not say where it was loaded from, or the checkpoint has no processor; the
            message says what to pass instead.
    """
    from transformers import AutoImageProcessor

    fix = ("Pass processor=AutoImageProcessor.from_pretrained(<checkpoint>), save one next to the model "
           "(preprocessor_config.json), or give preprocessed pixel values as a [N, C, H, W] tensor.")
    name = source if isinstance(source, (str, os.PathLike)) else getattr(getattr(source, "config", None),
                                                                          "_name_or_path", None)
    if not name:
        raise DataError(f"An image processor is needed to {purpose}, and the model does not say which checkpoint "
                        f"it was loaded from. {fix}")
    try:
        return AutoImageProcessor.from_pretrained(name, **hub_kwargs)
    except (OSError, ValueError) as error:
        raise DataError(f"Cannot load the image processor of {str(name)!r} to {purpose} "
                        f"({' '.join(str(error).split())}). {fix}") from error


def model_inputs(batch: Any, processor: Any, device: torch.device | str, dtype: torch.dtype, *,
                 as_pixels: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``model.forward`` for one batch, on ``device``, floating tensors in ``dtype``.

    ``batch`` is a dict of tensors (e.g. a processor's output), a ``[B, C, H, W]`` tensor of pixel values, or a list
    of PIL images, which ``processor`` preprocesses (all of its outputs are passed on, e.g. SigLIP2's patch mask).
    With ``as_pixels``, images (and pixel tensors) become float ``[B, C, H, W]`` pixel values as
    :func:`processor_inputs` makes them, the view the rankers score (patch-sequence processors' images made square):
    a correction then sees what the ranking saw.
    """
    if isinstance(batch, Mapping):
        inputs = dict(batch)
    elif isinstance(batch, torch.Tensor) and not as_pixels:
        inputs = {"pixel_values": batch}
    else:
        if processor is None and not isinstance(batch, torch.Tensor):
            raise DataError("PIL images need the model's image processor: pass processor=... "
                            "(AutoImageProcessor.from_pretrained(<model>)), or give preprocessed pixel values.")
        inputs = ({"pixel_values": processor_inputs(batch, processor, batch_size=len(batch))} if as_pixels
                  else dict(processor(images=batch, return_tensors="pt")))
    return {k: (v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
                if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def embedder(model: Any, processor: Any = None, batch_size: int = 64) -> Any:
    """A function from images (PIL images or pixel tensors) to the model's ``[N, D]`` embeddings as a float numpy
    array (:func:`~hf_snapvit.architectures.embedding.image_embedding`, no gradients), for checks that compare images as the model
    sees them (:mod:`hf_snapvit.data.coverage`). Without ``processor``, PIL images are preprocessed by the model's own
    (:func:`load_processor`), loaded on the first call."""
    from ..architectures.embedding import image_embedding

    def embed(images: Sequence[Any] | torch.Tensor) -> np.ndarray:
        nonlocal processor
        if processor is None and not isinstance(images, torch.Tensor):
            processor = load_processor(model, purpose="embed calibration images for the coverage check")
        parameter = next(model.parameters())
        chunks = []
        with torch.no_grad():
            for i in range(0, len(images), batch_size):
                batch = images[i:i + batch_size]
                inputs = model_inputs(batch if isinstance(batch, torch.Tensor) else list(batch), processor,
                                      parameter.device, parameter.dtype)
                chunks.append(image_embedding(model, inputs).float().cpu().numpy())
        return np.concatenate(chunks)

    return embed
