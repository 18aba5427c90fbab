"""The weight-order fingerprint of an elastic checkpoint.

A ranking describes one order of the units. ``save_elastic`` records, per block, the first weight (column 0) of each
head's first value row and of the first :data:`FINGERPRINT_NEURONS` FFN input rows, in stored order; the loader reads
the same few values (one small slice per head, one per FFN) and refuses a ranking whose weights are in another order.
Input rows are what a weight correction leaves alone; a prefix is what a sliced checkpoint keeps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from ..architectures import get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim, row_blocks
from ..errors import RankingFormatError
from .ranking import ElasticRanking

FINGERPRINT_NEURONS = 32
# Relative L2 distance per block. Other units in those places differ by about 140 % (independent values), while a
# bf16 re-save or ordinary fine-tuning of a sliced model (Trainer, recovery) moves the values by a few percent.
FINGERPRINT_TOLERANCE = 0.25
RESAVE = "re-save it with hf_snapvit.save_elastic(model, ranking, folder)"


def unit_rows(model: PreTrainedModel) -> list[tuple[torch.Tensor, tuple[int, int], int, torch.Tensor]]:
    """Per block: the value projection's weight, which ``(i, n)`` of its row blocks the value rows are (the ``i``-th of
    ``n``: ``(2, 3)`` in a fused ``qkv``, ``(0, 1)`` alone), the head width and the first FFN input projection's
    weight."""
    spec = get_spec(model)
    rows = []
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        mlp, variant = get_mlp(layer, spec)
        rows.append((get_projection(attention, spec.v_proj).weight,
                     (spec.qkv_blocks[2], row_blocks(spec, spec.v_proj)), head_dim(attention, spec),
                     get_projection(mlp, variant.in_proj[0]).weight))
    return rows


def block_of(found: tuple[str, tuple[int, int] | None] | None,
             block: tuple[int, int]) -> tuple[str, tuple[int, int] | None] | None:
    """``found`` (a checkpoint tensor and the ``(part, parts)`` of it one in-memory tensor is) narrowed to row block
    ``block = (i, n)`` of that tensor."""
    if found is None or block[1] == 1:
        return found
    part, parts = found[1] or (0, 1)
    return found[0], (part * block[1] + block[0], parts * block[1])


def rounded(values: torch.Tensor) -> list[float]:
    values = torch.nan_to_num(values.detach().double().reshape(-1), nan=0.0, posinf=0.0, neginf=0.0)
    return [float(f"{v:.6g}") for v in values.cpu().tolist()]


def fingerprint_of(model: PreTrainedModel) -> dict[str, Any]:
    """The weight-order fingerprint of an in-memory (permuted) model."""
    heads, neurons = [], []
    for v_weight, (block, blocks), hd, in_weight in unit_rows(model):
        heads.append(rounded(v_weight.unflatten(0, (blocks, -1))[block, ::hd, 0]))
        neurons.append(rounded(in_weight[:FINGERPRINT_NEURONS, 0]))
    return {"version": 1, "heads": heads, "neurons": neurons}


def expected_values(fingerprint: Any, ranking: ElasticRanking) -> list[tuple[list[float], list[float]]]:
    """The fingerprint's per-block ``(heads, neurons)`` values, checked against the ranking's shape."""
    shape = ranking.shape
    try:
        blocks = list(zip(fingerprint["heads"], fingerprint["neurons"], strict=True))
        values = [([float(v) for v in h], [float(v) for v in f]) for h, f in blocks]
        ok = len(values) == shape.num_layers and all(
            len(h) == shape.num_heads and len(f) == min(shape.intermediate_size, FINGERPRINT_NEURONS)
            for h, f in values)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise RankingFormatError(
            "elastic_ranking.provenance.weights_fingerprint is corrupt: expected {'heads': [L][H] numbers, "
            f"'neurons': [L][min(F, {FINGERPRINT_NEURONS})] numbers}} for L={shape.num_layers} blocks of "
            f"H={shape.num_heads} heads and F={shape.intermediate_size} neurons; {RESAVE}."
        )
    return values


def read_units(reader: Any, found: tuple[str, tuple[int, int] | None] | None, head_width: int | None,
                count: int) -> list[float] | None:
    """Column 0 of the first row of each stored head (``head_width`` rows each), or of the first ``count`` rows."""
    if found is None:
        return None  # the loader reports a missing tensor
    key, (part, parts) = found[0], found[1] or (0, 1)
    rows = reader.shape(key)[0] // parts
    if head_width is None:
        return rounded(reader.read(key, (min(rows, count), 1), found[1]))
    stored = min(rows // head_width, count)
    # The i-th of parts·stored equal parts starts at head i's first row within projection ``part``.
    return [rounded(reader.read(key, (1, 1), (part * (rows // head_width) + h, parts * (rows // head_width))))[0]
            for h in range(stored)]


def close(expected: list[float], found: list[float]) -> bool:
    a, b = np.asarray(expected, dtype=np.float64), np.asarray(found, dtype=np.float64)
    return float(np.linalg.norm(a - b)) <= FINGERPRINT_TOLERANCE * float(np.linalg.norm(a)) + 1e-12 * len(a)
