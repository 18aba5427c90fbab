"""Linear CKA: between pruning units, the optional initial covariance of the xNES search (paper appendix); and
between a pruned model's embeddings and the dense model's, the ``"cka"`` fitness measure.

Each search coordinate is a unit group: one FFN block (its neurons' activations, the fc1 output of the CLS token) or
one head (its context vector of the CLS token, where it enters o_proj). Linear CKA between two groups' activations
over the fitness images says how redundant they are; the resulting matrix, in the layout of the search vector
(FFN blocks first, then heads block-major), has a unit diagonal and is positive semi-definite.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from ....architectures import get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim
from ....architectures.embedding import image_embedding


@torch.no_grad()
def unit_activations(model: PreTrainedModel, pixel_values: torch.Tensor, batch_size: int = 64) -> list[torch.Tensor]:
    """CLS-token activations ``[N, width]`` of every FFN block, then of every head (block-major)."""
    spec = get_spec(model)
    layers = get_layers(model, spec)
    ffn: list[list[torch.Tensor]] = [[] for _ in layers]
    heads: list[list[torch.Tensor]] = [[] for _ in layers]
    handles = []
    for l, layer in enumerate(layers):
        mlp, variant = get_mlp(layer, spec)
        attention = get_attention(layer, spec)
        handles.append(get_projection(mlp, variant.out_proj).register_forward_pre_hook(
            lambda module, args, l=l: ffn[l].append(args[0][:, 0].float().cpu())))
        handles.append(get_projection(attention, spec.o_proj).register_forward_pre_hook(
            lambda module, args, l=l: heads[l].append(args[0][:, 0].float().cpu())))
    try:
        for i in range(0, len(pixel_values), batch_size):
            image_embedding(model, {"pixel_values": pixel_values[i:i + batch_size]}, spec)
    finally:
        for handle in handles:
            handle.remove()
    hd = head_dim(get_attention(layers[0], spec), spec)
    groups = [torch.cat(chunks) for chunks in ffn]
    for chunks in heads:
        context = torch.cat(chunks)
        groups.extend(context.split(hd, dim=1))
    return groups


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Linear CKA of two activation matrices ``[N, a]`` and ``[N, b]`` of the same N inputs: 1 when one is a
    rotation and scaling of the other, whatever its scale. A 0-d tensor on their device (nothing waits for it); 0
    when either is constant."""
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    scale = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    cross = torch.linalg.matrix_norm(y.T @ x) ** 2
    return torch.where(scale > 0, cross / scale.clamp_min(torch.finfo(scale.dtype).tiny), torch.zeros_like(scale))


def linear_cka_matrix(groups: list[torch.Tensor]) -> np.ndarray:
    """Pairwise linear CKA, ``‖YᵀX‖²_F / (‖XᵀX‖_F ‖YᵀY‖_F)`` on centred activations."""
    centred = [(g - g.mean(0, keepdim=True)).double() for g in groups]
    norms = [torch.linalg.matrix_norm(x.T @ x).item() for x in centred]
    d = len(groups)
    matrix = np.eye(d)
    for i in range(d):
        for j in range(i + 1, d):
            denominator = norms[i] * norms[j]
            value = (torch.linalg.matrix_norm(centred[j].T @ centred[i]).item() ** 2 / denominator
                     if denominator > 0 else 0.0)
            matrix[i, j] = matrix[j, i] = value
    return matrix


def cka_covariance(model: PreTrainedModel, pixel_values: torch.Tensor, *, ridge: float = 1e-3) -> np.ndarray:
    """The CKA matrix of the model's units, made strictly positive definite with a small ridge for Cholesky."""
    matrix = linear_cka_matrix(unit_activations(model, pixel_values))
    return (matrix + ridge * np.eye(len(matrix))) / (1.0 + ridge)
