"""The inputs a vision backbone takes: the pixel shape its config asks for, and the patch-sequence layout of towers
that take every image's patches in one sequence with their grid (Qwen2-VL). Discovery runs its blank forward with
these, and the embedding and the data views turn images into them and back."""

from __future__ import annotations

import inspect
import math
from typing import Callable

import torch
import torch.nn as nn
from transformers import PretrainedConfig

from ..errors import DataError
from .registry import square_side, vision_config

DEFAULT_SIDE = 224  # pixels, for a tower whose config names no image size
# How discovery tells the input side it inferred for a model whose config names none (installed by .discovery).
_INFERRED: dict[str, Callable[[PretrainedConfig], int | None]] = {}


def on_inferred_side(lookup: Callable[[PretrainedConfig], int | None]) -> None:
    """Install how :func:`pixel_shape` finds the side discovery inferred for a config that names none."""
    _INFERRED["side"] = lookup


def pixel_shape(config: PretrainedConfig, batch_size: int) -> tuple[int, ...]:
    """The shape of ``pixel_values`` the model was configured for: ``[B, C, H, W]``, or ``[B, T, C, H, W]`` for a
    video model (its config has ``num_frames``: VideoMAE's tubelet input; a tower that takes the frames flattened
    into the batch gets them so at its call, :func:`flatten_frames`). The side is the config's ``image_size`` (or
    its patch grid), else a timm model's input size (:func:`_timm_side`), else the side discovery inferred from the
    model's position embedding (:func:`position_side`, stored as ``elastic_spec["image_size"]``), else
    :data:`DEFAULT_SIDE` px in whole patches (and merge windows) where the config names a patch size."""
    vision = vision_config(config)
    size, patch = _named_side(vision), _integer(getattr(vision, "patch_size", None))
    if size is None:
        size = _inferred_side(config)
    if size is None:  # a tower of any resolution (Qwen2-VL): 224 px, in whole merge windows of patches
        step = (patch or 1) * int(getattr(vision, "spatial_merge_size", 1) or 1)
        size = max(step, DEFAULT_SIDE // step * step)
    side = int(square_side(size, "image_size"))
    channels = input_channels(vision)
    frames = getattr(vision, "num_frames", None)
    if isinstance(frames, int) and not isinstance(frames, bool) and frames > 0:
        return (batch_size, frames, channels, side, side)
    return (batch_size, channels, side, side)


def _named_side(vision: PretrainedConfig) -> int | tuple | list | None:
    """The side a vision config names: its ``image_size`` (or patch grid), else a timm model's input size."""
    size, patch = getattr(vision, "image_size", None), _integer(getattr(vision, "patch_size", None))
    if size is None and getattr(vision, "num_patches", None) is not None and patch:
        size = math.isqrt(int(vision.num_patches)) * patch
    return size if size is not None else _timm_side(vision)


def input_channels(vision: PretrainedConfig) -> int:
    """The channels of the images the model takes: ``num_channels``, else a timm model's (its ``pretrained_cfg``'s
    ``(C, H, W)``, else the ``in_chans`` it was built with), else 3."""
    channels = _integer(getattr(vision, "num_channels", None))
    pretrained, arguments = getattr(vision, "pretrained_cfg", None), getattr(vision, "model_args", None)
    if channels is None and isinstance(pretrained, dict) and isinstance(pretrained.get("input_size"), (list, tuple)):
        channels = _integer(pretrained["input_size"][0]) if len(pretrained["input_size"]) == 3 else None
    if channels is None and isinstance(arguments, dict):
        channels = _integer(arguments.get("in_chans"))
    return channels or 3


def names_size(vision: PretrainedConfig) -> bool:
    """Whether a vision config names the input size (:func:`pixel_shape` does not fall back to a guess)."""
    return _named_side(vision) is not None


def _inferred_side(config: PretrainedConfig) -> int | None:
    """The side a checkpoint's stored spec records, or that discovery inferred for this config, else ``None``."""
    stored = getattr(config, "elastic_spec", None)
    if isinstance(stored, dict) and _integer(stored.get("image_size")):
        return _integer(stored["image_size"])
    return _INFERRED["side"](config) if "side" in _INFERRED else None


def position_side(model: nn.Module, patch: int) -> int:
    """The input side a model's position embedding fixes, where its config names none: the first parameter named
    for positions (not relative ones) with a row per token, ``[..., N, D]``, whose ``N`` is a square grid of patches
    after the fewest leading tokens (class, registers), times the patch side ``patch``; 0 if there is none."""
    for name, parameter in model.named_parameters():
        lower = name.lower()
        if "pos" not in lower or "rel" in lower or parameter.ndim < 2:
            continue
        rows = int(parameter.shape[-2])
        for extra in range(min(rows, 9)):
            if (side := math.isqrt(rows - extra)) and side * side == rows - extra:
                return side * patch
        return 0
    return 0


def flatten_frames(pixels: torch.Tensor, frames_in_batch: int) -> torch.Tensor:
    """``[B, T, C, H, W]`` clips as a tower that takes every clip's frames in the batch wants them
    (``frames_in_batch`` = T: X-CLIP's ``[B·T, C, H, W]``); other pixels as they are."""
    return pixels.flatten(0, 1) if frames_in_batch and pixels.ndim == 5 else pixels


def _integer(value: object) -> int | None:
    """A size given as an integer or a square pair (``patch_size=[16, 16]``), else ``None``."""
    value = value[0] if isinstance(value, (tuple, list)) and value else value
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _timm_side(config: PretrainedConfig) -> int | None:
    """A timm model's input side: its ``pretrained_cfg``'s ``(C, H, W)``, else the ``img_size`` it was built with
    (``model_args``), else its architecture's default input size."""
    pretrained = getattr(config, "pretrained_cfg", None)
    if isinstance(pretrained, dict) and isinstance(pretrained.get("input_size"), (list, tuple)):
        return _integer(square_side(list(pretrained["input_size"][-2:]), "pretrained_cfg.input_size[-2:]"))
    arguments = getattr(config, "model_args", None)
    if isinstance(arguments, dict) and _integer(square_side(arguments.get("img_size"), "model_args.img_size")):
        return _integer(arguments["img_size"])
    architecture = getattr(config, "architecture", None)
    if not isinstance(architecture, str):
        return None
    try:
        from timm.models import get_pretrained_cfg
        default = get_pretrained_cfg(architecture)
    except Exception:  # noqa: BLE001 - no timm, or a name timm does not know: no size from it
        return None
    return _integer(default.input_size[-1]) if default is not None and default.input_size else None


def patch_conv(model: nn.Module) -> nn.Module | None:
    """The model's patch embedding: its first convolution whose stride equals its kernel, else ``None``."""
    return next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d))
                 and tuple(m.stride) == tuple(m.kernel_size)), None)


def patch_side(model: nn.Module) -> int:
    """One patch's side in pixels: the config's ``patch_size``, else the kernel of the model's first convolution
    whose stride equals its kernel (the patch embedding of a model whose config names no patch size: timm's)."""
    vision = vision_config(model.config)
    size = getattr(vision, "patch_size", None)
    arguments = getattr(vision, "model_args", None)
    if size is None and isinstance(arguments, dict):  # a timm model's: the patch size it was built with
        built = arguments.get("patch_size")
        # Sizes per branch (CrossViT's [12, 16]) name no one patch: the patch embedding's kernel tells.
        size = built if not isinstance(built, (list, tuple)) or len(set(built)) == 1 else None
    if size is None:
        conv = patch_conv(model)
        size = conv.kernel_size[-1] if conv is not None else None
    if size is None:
        raise DataError(f"{type(model).__name__} names no patch_size in its config and has no patch-embedding "
                        "convolution (stride equal to its kernel); set config.patch_size.")
    return int(square_side(size, "patch_size"))


def takes_grid(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes one sequence of every image's patches and their ``grid_thw`` (Qwen2-VL's
    vision tower) rather than ``pixel_values``."""
    parameters = inspect.signature(model.forward).parameters
    return "grid_thw" in parameters and "pixel_values" not in parameters


def blank_inputs(model: nn.Module, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """``pixels`` as the keyword arguments of ``model``'s forward (patch sequences and grids where it takes those)."""
    if takes_grid(model):
        return grid_patchify(pixels, model.config)
    return {"pixel_values": pixels}


def grid_patchify(pixels: torch.Tensor, config: PretrainedConfig) -> dict[str, torch.Tensor]:
    """``[B, C, H, W]`` images as the inputs of a tower that takes every image's patches in one sequence
    (:attr:`~hf_snapvit.ArchitectureSpec.grid_inputs`, Qwen2-VL): each image repeated over the
    ``temporal_patch_size`` frames of one time step, cut into ``patch_size`` patches, ordered window by window of
    ``spatial_merge_size``² patches and flattened as ``(C, t, p, p)`` (the layout of ``Qwen2VLImageProcessor``), with
    ``grid_thw = [1, H/p, W/p]`` per image."""
    vision = vision_config(config)
    p, t, m = int(vision.patch_size), int(vision.temporal_patch_size), int(vision.spatial_merge_size)
    b, c, h, w = pixels.shape
    if h % (p * m) or w % (p * m):
        raise DataError(f"Images of {h}x{w} px cannot be cut into windows of {m}x{m} patches of {p} px; use a crop "
                        f"size that is a multiple of {p * m}.")
    rows, cols = h // p, w // p
    frames = pixels[:, None].expand(b, t, c, h, w)
    windows = frames.reshape(b, t, c, rows // m, m, p, cols // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return {"hidden_states": windows.reshape(b * rows * cols, c * t * p * p),
            "grid_thw": torch.tensor([[1, rows, cols]] * b, dtype=torch.long, device=pixels.device)}


def ungrid(patches: torch.Tensor, grid_thw: torch.Tensor, patch_size: int, temporal_patch_size: int,
           merge_size: int) -> torch.Tensor:
    """The inverse of :func:`grid_patchify` for images of one grid (a Qwen2-VL processor's ``pixel_values`` and
    ``image_grid_thw``): ``[B, C, H, W]`` images, the first of each image's repeated frames."""
    if len(grid_thw) == 0 or bool((grid_thw != grid_thw[0]).any()) or int(grid_thw[0, 0]) != 1:
        raise DataError(f"Cannot turn patches of the grids {grid_thw.tolist()} into one batch of images; give images "
                        "of one size, one frame each.")
    p, t, m = patch_size, temporal_patch_size, merge_size
    b, rows, cols = len(grid_thw), int(grid_thw[0, 1]), int(grid_thw[0, 2])
    c = patches.shape[-1] // (t * p * p)
    windows = patches.reshape(b, rows // m, cols // m, m, m, c, t, p, p)[:, :, :, :, :, :, 0]
    return windows.permute(0, 5, 1, 3, 6, 2, 4, 7).reshape(b, c, rows * p, cols * p)
