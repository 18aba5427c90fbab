"""What recovery distils: a model's block outputs, image embedding and logits, and prefix views of a dense model.

Slicing keeps the hidden width, so a sliced student's block outputs align token for token with its dense
teacher's. Elastic recovery runs the dense model as if it were sliced: zeroing the inputs of the attention output
projection that belong to removed heads, and of the FFN output projection that belong to removed neurons, computes
exactly what the sliced model computes (each head's softmax is its own), and gradients then reach only the kept
prefix of every projection.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.nn as nn

from ..architectures import (ArchitectureSpec, get_attention, get_layers, get_mlp, get_projection,
                             head_dim)
from ..architectures.capture import capture_block_outputs
from ..architectures.parts import feature_module
from ..architectures.embedding import forward_inputs, inference_settings, output_embedding


@dataclass
class Outputs:
    """One forward pass as recovery sees it: each block's output, the image embedding, the logits (or ``None``)."""

    hidden: list[torch.Tensor]
    embedding: torch.Tensor
    logits: torch.Tensor | None

    def to(self, device: torch.device) -> "Outputs":
        """The same outputs on ``device``."""
        return Outputs([h.to(device) for h in self.hidden], self.embedding.to(device),
                       None if self.logits is None else self.logits.to(device))


def forward_outputs(model: nn.Module, spec: ArchitectureSpec, pixels: torch.Tensor) -> Outputs:
    """Run ``model`` (task head included) on ``[B, C, H, W]`` pixels and collect what recovery distils."""
    inputs = forward_inputs(model, {"pixel_values": pixels}, spec)
    # A task model's encoder runs alone: its neck, head or language model reads only the features distilled here.
    runner = model if spec.task is None else feature_module(model, spec)
    # The block outputs are kept as computed (not detached): the student's loss backpropagates through them.
    with capture_block_outputs(model, spec, backbone=True) as captured, inference_settings(model, spec):
        out = runner(**inputs)
    hidden, backbone_out = captured.calls, captured.backbone
    grid = inputs.get("grid_thw")
    if grid is not None:  # a grid tower's blocks see every image's tokens (equal grids here) in one sequence
        hidden = [h.reshape(len(grid), -1, h.shape[-1]) for h in hidden]
    embedding = output_embedding(backbone_out[-1], hidden[-1], spec, model.config, grid)
    return Outputs(hidden, embedding, getattr(out, "logits", None))


def per_image_loss(student: Outputs, teacher: Outputs, config: Any) -> torch.Tensor:
    """``[B]`` losses, one per image, so that any split of a batch across processes sums to the same total.

    Hidden states and embeddings use the squared error relative to the teacher's mean square of the same image
    (scale-free across blocks and models); logits use ``KL(teacher ‖ student)`` at ``config.temperature``, times
    ``temperature²`` as in Hinton et al.
    """
    def relative_mse(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        s, t = s.float().flatten(1), t.float().flatten(1)
        return (s - t).pow(2).mean(1) / t.pow(2).mean(1).clamp_min(1e-12)

    batch = student.embedding.shape[0]
    loss = torch.zeros(batch, device=student.embedding.device)
    if config.hidden_weight:
        blocks = [relative_mse(s, t) for s, t in zip(student.hidden, teacher.hidden)]
        loss = loss + config.hidden_weight * torch.stack(blocks).mean(0)
    if config.embedding_weight:
        loss = loss + config.embedding_weight * relative_mse(student.embedding, teacher.embedding)
    if config.logits_weight and student.logits is not None and teacher.logits is not None:
        T = config.temperature
        log_s = torch.log_softmax(student.logits.float() / T, -1)
        log_t = torch.log_softmax(teacher.logits.float() / T, -1)
        kl = (log_t.exp() * (log_t - log_s)).sum(-1)
        loss = loss + config.logits_weight * kl * T * T
    return loss


@contextlib.contextmanager
def prefix_view(model: nn.Module, spec: ArchitectureSpec, heads: Sequence[int],
                neurons: Sequence[int]) -> Iterator[None]:
    """Within the block, ``model`` (dense, in rank order) computes what its slice to the first ``heads[l]`` heads
    and ``neurons[l]`` FFN neurons of each block computes."""
    handles = []
    for layer, h, f in zip(get_layers(model, spec), heads, neurons):
        attention = get_attention(layer, spec)
        o_proj = get_projection(attention, spec.o_proj)
        mlp, variant = get_mlp(layer, spec)
        out_proj = get_projection(mlp, variant.out_proj)
        for linear, kept in ((o_proj, h * head_dim(attention, spec)), (out_proj, f)):
            if kept < linear.in_features:
                mask = torch.zeros(linear.in_features, device=linear.weight.device)
                mask[:kept] = 1
                handles.append(linear.register_forward_pre_hook(
                    lambda module, args, mask=mask: (args[0] * mask.to(args[0].dtype), *args[1:])))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
