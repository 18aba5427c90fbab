"""What a vision backbone reads and what represents an image.

Inputs: the configured image size, SigLIP2's patch sequences (:func:`patchify`), seeded dummy inputs. Outputs: the
``[B, D]`` embedding that ranking, fitness, correction and evaluation compare (:func:`image_embedding`): a bare
backbone's pooled output or CLS token, or, for a task model (a depth estimator, a vision-language model), a summary
of exactly the features its head or projector reads.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.nn as nn
from transformers import PretrainedConfig, PreTrainedModel

from . import ArchitectureSpec, get_spec, vision_config
from .capture import capture_block_outputs
from .parts import feature_module
from .inputs import flatten_frames, grid_patchify, pixel_shape
from ..errors import DataError


def input_size(config: PretrainedConfig) -> int:
    """Side in pixels of the square images the model was configured for (SigLIP2: its default patch grid)."""
    return pixel_shape(config, 1)[-1]


def patchify(pixel_values: torch.Tensor, patch_size: int) -> dict[str, torch.Tensor]:
    """``[B, C, H, W]`` images as SigLIP2 inputs: patches flattened row-major, each as ``(p, p, C)`` values (the order
    of ``Siglip2ImageProcessor``), with an all-ones mask and the patch grid."""
    b, c, h, w = pixel_values.shape
    if h % patch_size or w % patch_size:
        raise DataError(
            f"Images of {h}x{w} px cannot be cut into {patch_size}-px patches; use a crop size that is a multiple of "
            f"{patch_size}."
        )
    rows, cols = h // patch_size, w // patch_size
    patches = pixel_values.reshape(b, c, rows, patch_size, cols, patch_size).permute(0, 2, 4, 3, 5, 1)
    return {
        "pixel_values": patches.reshape(b, rows * cols, patch_size * patch_size * c),
        "pixel_attention_mask": torch.ones(b, rows * cols, dtype=torch.long, device=pixel_values.device),
        "spatial_shapes": torch.tensor([[rows, cols]] * b, dtype=torch.long, device=pixel_values.device),
    }


def unpatchify(patches: torch.Tensor, patch_size: int, spatial_shapes: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of :func:`patchify`: ``[B, rows·cols, p·p·C]`` patches of one grid (square by default) as
    ``[B, C, H, W]`` images."""
    b, n, d = patches.shape
    rows, cols = (math.isqrt(n), math.isqrt(n)) if spatial_shapes is None else map(int, spatial_shapes[0])
    if rows * cols != n or (spatial_shapes is not None and bool((spatial_shapes != spatial_shapes[0]).any())):
        raise DataError(
            f"Cannot turn {n} patches into one image grid; give images of one square size (got grids "
            f"{None if spatial_shapes is None else spatial_shapes.tolist()})."
        )
    c = d // (patch_size * patch_size)
    grid = patches.reshape(b, rows, cols, patch_size, patch_size, c).permute(0, 5, 1, 3, 2, 4)
    return grid.reshape(b, c, rows * patch_size, cols * patch_size)


def forward_inputs(model: nn.Module, inputs: dict, spec: ArchitectureSpec | None = None) -> dict:
    """``inputs`` as ``model.forward`` (or its vision encoder) takes them: ``[B, C, H, W]`` pixels become patch
    sequences (with their mask and grid) for backbones that take those (SigLIP2), clips are flattened into frames
    for a tower that takes them so (``frames_in_batch``), and a task model that reads hidden states (LLaVA) asks for
    them; anything else passes through. Returns a new dict."""
    spec = spec or get_spec(model)
    kwargs = dict(inputs)
    pixels = kwargs.get("pixel_values")
    if spec.frames_in_batch and pixels is not None:  # X-CLIP's tower: [B, T, C, H, W] clips as [B·T, C, H, W]
        kwargs["pixel_values"] = pixels = flatten_frames(pixels, spec.frames_in_batch)
    if spec.patch_inputs and pixels is not None and pixels.ndim == 4:
        kwargs.update(patchify(pixels, int(vision_config(model.config).patch_size)))
    if spec.grid_inputs and pixels is not None and pixels.ndim == 4:
        del kwargs["pixel_values"]
        kwargs.update(grid_patchify(pixels, model.config))
    elif spec.grid_inputs and pixels is not None and "image_grid_thw" in kwargs:  # the tower's processor's output
        kwargs["hidden_states"], kwargs["grid_thw"] = kwargs.pop("pixel_values"), kwargs.pop("image_grid_thw")
    if spec.task is not None and spec.task.features == "hidden_states":
        kwargs["output_hidden_states"] = True
    return kwargs


def dummy_inputs(model: PreTrainedModel, batch_size: int, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random ``pixel_values`` of the model's configured input size, as its forward takes them
    (``[B, C, H, W]``; ``[B, T, C, H, W]`` for video models, ``[B·T, C, H, W]`` for a tower that takes each clip's
    frames in its batch; patch sequences for backbones that take them, e.g. SigLIP2)."""
    config = vision_config(model.config)
    generator = torch.Generator().manual_seed(seed)
    spec = get_spec(model)
    pixels = flatten_frames(torch.randn(pixel_shape(model.config, batch_size), generator=generator),
                            spec.frames_in_batch)
    if spec.patch_inputs:
        return patchify(pixels, int(config.patch_size))
    return grid_patchify(pixels, model.config) if spec.grid_inputs else {"pixel_values": pixels}


def image_embedding(model: nn.Module, inputs: dict, spec: ArchitectureSpec | None = None):
    """The ``[B, D]`` embedding that represents each image, computed by the backbone (task heads are skipped).

    For a bare backbone: its pooled output or CLS token (the spec's ``embedding``). For a task model: a summary of
    exactly the features the task reads (:func:`task_features`): the token mean of each, concatenated.

    Crops smaller or larger than the configured image size are embedded with interpolated position embeddings.
    Backbones that take patch sequences (SigLIP2) accept ``[B, C, H, W]`` images too: they are patchified here.
    """
    spec = spec or get_spec(model)
    caller = feature_module(model, spec)
    kwargs = forward_inputs(model, inputs, spec)
    pixels = inputs.get("pixel_values")
    if pixels is not None and pixels.ndim == 5 and len(pixel_shape(model.config, 1)) != 5:  # not a video model's
        raise DataError(f"pixel_values of shape {list(pixels.shape)} hold several tiles per image (an anyres "
                        "processor's [B, tiles, C, H, W]); embed one [B, C, H, W] view per image, e.g. "
                        "pixel_values[:, 0] (the resized whole image).")
    size = getattr(vision_config(model.config), "image_size", None)
    if pixels is not None and pixels.ndim == 4 and size is not None and pixels.shape[-1] != size:
        if "interpolate_pos_encoding" in inspect.signature(caller.forward).parameters:
            kwargs["interpolate_pos_encoding"] = True
    with capture_block_outputs(model, spec, blocks="last") as captured, inference_settings(model, spec):
        out = caller(**kwargs)
    return output_embedding(out, captured.calls[-1], spec, model.config, kwargs.get("grid_thw"))


def output_embedding(out: Any, last_tokens: torch.Tensor, spec: ArchitectureSpec,
                     config: PretrainedConfig | None = None, grid_thw: torch.Tensor | None = None) -> torch.Tensor:
    """The ``[B, D]`` embedding of one forward: :func:`pooled_embedding` of the backbone's output ``out``, or where
    that holds none (:func:`returns_embedding`) the token mean of ``last_tokens``, its last block's output."""
    if not returns_embedding(out, spec):
        return per_clip(last_tokens.flatten(1, -2).mean(1), spec)  # the tokens its last block hands the task's head
    return pooled_embedding(out, spec, config, grid_thw)


def per_clip(embedding: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    """Per-frame embeddings ``[B·T, D]`` of a tower that takes each clip's frames in its batch (``frames_in_batch``)
    as each clip's, the mean of its frames' ``[B, D]``; others as they are."""
    return embedding.unflatten(0, (-1, spec.frames_in_batch)).mean(1) if spec.frames_in_batch else embedding


def returns_embedding(out: Any, spec: ArchitectureSpec) -> bool:
    """Whether a backbone's output holds what :func:`pooled_embedding` reads. A whole task model found by discovery
    (SAM with its prompt encoder and mask decoder, ViTPose) or a timm classifier (the backbone is the whole model)
    returns its task's outputs instead: its embedding is the token mean of its last block's output."""
    return spec.task is not None or spec.grid_inputs or any(
        getattr(out, name, None) is not None for name in ("pooler_output", "last_hidden_state", "feature_maps"))


@contextmanager
def inference_settings(model: nn.Module, spec: ArchitectureSpec) -> Iterator[None]:
    """Set the spec's ``inference_config`` on the model's vision config for the duration (ViTMAE's mask ratio 0:
    every patch is seen, as in inference), then put the caller's values back."""
    config = vision_config(model.config)
    saved = {name: getattr(config, name) for name, _ in spec.inference_config if hasattr(config, name)}
    try:
        for name, value in spec.inference_config:
            setattr(config, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def task_features(out: Any, spec: ArchitectureSpec, config: PretrainedConfig | None = None) -> list[torch.Tensor]:
    """The tensors of a vision model's output that its task reads: a backbone's feature maps (Depth Anything, DPT,
    or a bare ``*Backbone``), the hidden states at LLaVA's ``vision_feature_layer``, or the last hidden state."""
    kind = spec.task.features if spec.task is not None else "feature_maps"
    if kind == "feature_maps":
        return list(out.feature_maps)
    if kind == "hidden_states":
        return [out.hidden_states[index] for index in spec.task.feature_layers(config)]
    return [out.pooler_output if kind == "pooler_output" else out.last_hidden_state]


def pooled_embedding(out: Any, spec: ArchitectureSpec, config: PretrainedConfig | None = None,
                     grid_thw: torch.Tensor | None = None) -> torch.Tensor:
    """The ``[B, D]`` image embedding read from a backbone's output (what :func:`image_embedding` returns); a task
    model's needs its ``config`` (which features it reads); a tower with ``grid_inputs``, whose outputs hold every
    image's tokens in one sequence, the ``grid_thw`` it was given (the token mean of each image's part)."""
    if spec.grid_inputs:
        if grid_thw is None or len(grid_thw) == 0:
            raise DataError("This tower returns every image's tokens in one sequence; pooled_embedding needs the "
                            "grid of each image (grid_thw=..., as given to the tower).")
        if spec.task is not None:
            tokens = task_features(out, spec, config)[0]
        else:
            tokens = getattr(out, "pooler_output", None)  # the merged tokens a language model reads
            tokens = out.last_hidden_state if tokens is None else tokens
        tokens = tokens.reshape(-1, tokens.shape[-1])
        patches = grid_thw.prod(-1)  # each image's share of the sequence (merged tokens keep the proportions)
        counts = (patches * len(tokens) // int(patches.sum())).tolist()
        return torch.stack([part.mean(0) for part in tokens.split(counts)])
    if spec.task is not None or getattr(out, "feature_maps", None) is not None:
        skip = spec.task.skip_tokens(config) if spec.task is not None else 0
        # Feature maps come as [B, C, h, w] grids or [B, N, C] token sequences (reshape_hidden_states=False).
        means = [f.mean((2, 3)) if f.ndim == 4 else f[:, skip:].mean(1) for f in task_features(out, spec, config)]
        return torch.cat(means, -1)
    if spec.embedding == "pooled":
        pooled = getattr(out, "pooler_output", None)
        if pooled is not None:
            return per_clip(pooled, spec)
        last = out.last_hidden_state  # tokens [B, N, D], or a [B, C, h, w] feature map (SAM's neck)
        return per_clip(last.mean((2, 3)) if last.ndim == 4 else last.mean(1), spec)
    if spec.embedding == "cls_dist_mean":
        return out.last_hidden_state[:, :2].mean(1)
    return out.last_hidden_state[:, 0]
