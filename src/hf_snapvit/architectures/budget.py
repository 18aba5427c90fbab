"""Parameter and FLOP accounting for full and sliced vision transformers.

:class:`ModelShape` is everything a budget needs to know about an architecture: how many parameters one head and one
FFN neuron cost, what the rest of the backbone costs, and the token counts of the paper's GFLOP formulas (appendix,
"GFLOP definition"), plus what one forward computes beyond them (``other_flops``: a stem, a neck, a second block
stack, measured by :mod:`.flops` when a ranking is made). It is computed once from a (possibly meta-device) model and
stored in every ranking, so a ranking alone can turn a sparsity, parameter or GFLOP budget into per-layer keep counts.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

import torch.nn as nn
from transformers import PreTrainedModel

from . import (ffn_inputs, get_attention, get_backbone, get_layers, get_mlp, get_projection, get_spec, head_dim,
               head_rows, head_tables, num_heads, used_layers, vision_config)
from ..errors import BudgetError, ConfigError, RankingFormatError, SnapViTError, UnsupportedArchitectureError
from .inputs import input_channels, patch_side
from .limits import MAX_UNITS, out_of_range
from .skeleton import skeleton


#: FFN widths are rounded to this multiple by default. GPU GEMM kernels (bf16/fp16 tensor cores, int8, TensorRT) want
#: leading dimensions that are multiples of 8 to 64; at unaligned widths cuBLAS falls back to kernels several times
#: slower, so a model sliced to arbitrary widths can be slower than the dense one.
DEFAULT_WIDTH_MULTIPLE = 64
# FFNs narrower than this many groups of the default multiple (toy models) keep exact widths by default.
_MIN_GROUPS = 4


def budget_number(name: str, value: Any) -> Any:
    """``value`` if it is a finite real number (``int``, ``float``, a NumPy scalar), else a :class:`BudgetError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ("; for a tensor or array, pass float(value)" if hasattr(value, "item")
                else "; pass the number itself, not its text" if isinstance(value, str) else "")
        raise BudgetError(f"{name}={value!r} must be a real number (int, float or a NumPy scalar), got "
                          f"{type(value).__name__}{hint}.")
    if math.isfinite(value):
        return value
    raise BudgetError(f"{name}={value!r} must be a finite number.")


def resolve_width_multiple(width_multiple: int | None, intermediate_size: int) -> int:
    """The multiple kept FFN widths are rounded to.

    Args:
        width_multiple: A positive integer no larger than the FFN width, or ``None`` for the default:
            :data:`DEFAULT_WIDTH_MULTIPLE` (64) for FFNs of at least 256 neurons (every ViT-Ti/S/B/L, DINOv2, SigLIP
            and CLIP tower), exact widths for narrower ones. ``1`` keeps exact widths.
        intermediate_size: The dense FFN width of one block.

    Raises:
        BudgetError: ``width_multiple`` is not an integer, or not between 1 and ``intermediate_size``.
    """
    if width_multiple is None:
        return DEFAULT_WIDTH_MULTIPLE if intermediate_size >= _MIN_GROUPS * DEFAULT_WIDTH_MULTIPLE else 1
    if isinstance(width_multiple, bool) or not isinstance(width_multiple, numbers.Integral):
        raise BudgetError(f"width_multiple={width_multiple!r} must be an integer (1 keeps exact widths; 8, 16, 32 or "
                          f"64 suit GPU kernels), got {type(width_multiple).__name__}.")
    if not 1 <= width_multiple <= intermediate_size:
        raise BudgetError(f"width_multiple={width_multiple!r} is out of range: it must be between 1 (exact widths) "
                          f"and the FFN width {intermediate_size}.")
    return int(width_multiple)


@dataclass(frozen=True)
class KeepCounts:
    """How many heads and FFN neurons each block keeps.

    Args:
        heads: Heads kept in block ``l``.
        neurons: FFN neurons kept in block ``l``.
        num_params: Backbone parameters of the resulting model.
        gflops: Theoretical GFLOPs of the resulting model (one image).
        sparsity: Fraction of the dense backbone's parameters removed.
    """

    heads: list[int]
    neurons: list[int]
    num_params: int
    gflops: float
    sparsity: float


@dataclass(frozen=True)
class ModelShape:
    """The dense architecture of a backbone, as far as pruning budgets are concerned.

    Args:
        model_type: ``config.model_type``.
        num_layers: Number of transformer blocks.
        num_heads: Attention heads per block in the dense model.
        head_dim: Width of one head.
        hidden_size: Residual (embedding) width; never pruned.
        intermediate_size: FFN neurons per block in the dense model.
        params_per_head: Parameters removed with one head (q/k/v rows and biases, o_proj columns).
        params_per_neuron: Parameters removed with one FFN neuron (rows and biases of the input projections, one
            column of the output projection).
        fixed_params: Backbone parameters that no head or neuron owns (embeddings, norms, output biases, ...).
        num_tokens: Sequence length of one image (patches plus CLS/distillation/register tokens).
        num_patches: Number of patch tokens.
        patch_size: Side of one patch in pixels.
        num_channels: Input channels.
        ffn_matrices: Weight matrices per FFN neuron (2 for fc1/fc2, 3 for gated FFNs).
        head_flops: FLOPs outside the backbone (classifier logits); 0 for a bare backbone and for task models, whose
            GFLOPs are their vision encoder's.
        used_layers: Blocks, from the first, whose output the task reads (``None``: all). The rest keep only the
            ranking's floors at any budget below dense (LLaVA reads the second-to-last block).
        frames: Images per input: the frames of one clip for a video tower that takes them in its batch (X-CLIP's
            ``[B·T, C, H, W]``: every block runs on each frame's ``num_tokens``; FLOPs are per clip), else 1.
        other_flops: What one forward computes beyond the formulas at any width (a convolutional stem, a neck,
            attention pooling, blocks outside the pruned stack, attention run twice; negative where the blocks
            compute less, e.g. keys from a small memory), counted by
            :func:`~hf_snapvit.architectures.flops.measured_shape`; 0 where it was not measured (rankings stored
            before it was). Measured, not structural: shapes that differ only here match.
        attention_keys: The keys one query attends over, on average over the blocks, where that is fewer than
            ``num_tokens`` (windowed attention: Qwen2.5-VL's, SAM's; keys from a small memory), measured with
            :attr:`other_flops`; 0: every token. A head's attention products cost ``4·n·keys·d_key``.
    """

    model_type: str
    num_layers: int
    num_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    params_per_head: int
    params_per_neuron: int
    fixed_params: int
    num_tokens: int
    num_patches: int
    patch_size: int
    num_channels: int
    ffn_matrices: int
    head_flops: int = 0
    used_layers: int | None = None
    frames: int = 1
    other_flops: int = 0
    attention_keys: int = 0

    def __post_init__(self) -> None:
        if self.used_layers is None:
            object.__setattr__(self, "used_layers", self.num_layers)

    @property
    def dense_heads(self) -> list[int]:
        return [self.num_heads] * self.num_layers

    @property
    def dense_neurons(self) -> list[int]:
        return [self.intermediate_size] * self.num_layers

    def num_params(self, heads: Sequence[int] | None = None, neurons: Sequence[int] | None = None) -> int:
        """Backbone parameters with ``heads[l]`` heads and ``neurons[l]`` FFN neurons in block ``l``."""
        heads = self.dense_heads if heads is None else heads
        neurons = self.dense_neurons if neurons is None else neurons
        return self.fixed_params + self.params_per_head * sum(heads) + self.params_per_neuron * sum(neurons)

    def flops(self, heads: Sequence[int] | None = None, neurons: Sequence[int] | None = None) -> int:
        """FLOPs of one forward pass, following the paper's appendix formulas per block.

        Embeddings ``2·n_patch·p²·c·d``; per block, with ``a = d_key·n_heads``: QKV ``2·n·3·d·a``, QK logits
        ``2·n²·a``, softmax ``3·n_heads·n²``, reduction ``2·n²·a``, projection ``2·n·a·d``, FFN
        ``2·n·d·f·m`` (``m`` weight matrices; the paper's ``16·n·d²`` is ``m = 2, f = 4d``); plus the logits and
        :attr:`other_flops`.
        """
        heads = self.dense_heads if heads is None else heads
        neurons = self.dense_neurons if neurons is None else neurons
        n, d, dk, k = self.num_tokens, self.hidden_size, self.head_dim, self.attention_keys or self.num_tokens
        total = 2 * self.num_patches * self.patch_size**2 * self.num_channels * d
        for h, f in zip(heads, neurons):
            a = dk * h
            total += 2 * n * 3 * d * a + 2 * n * k * a + 3 * h * n * k + 2 * n * k * a + 2 * n * a * d
            total += 2 * n * d * f * self.ffn_matrices
        return total * self.frames + self.head_flops + self.other_flops

    def unit_flops(self) -> tuple[int, int, int]:
        """What one unit costs in :meth:`flops`, less the softmax (no matrix product, which FLOP counters such as
        ``torch.utils.flop_counter`` do not see): one head's projections (its q/k/v rows and o_proj columns,
        ``8·n·d·d_key``), its attention products (QK logits and reduction, ``4·n²·d_key``), and one FFN neuron
        (``2·n·d·m``)."""
        n, d, dk, t = self.num_tokens, self.hidden_size, self.head_dim, self.frames
        return 8 * n * d * dk * t, 4 * n * (self.attention_keys or n) * dk * t, 2 * n * d * self.ffn_matrices * t

    def softmax_flops(self, heads: Sequence[int] | None = None) -> int:
        """The softmax terms of :meth:`flops` (``3·n²`` per head) for ``heads[l]`` heads in block ``l``."""
        keys = self.attention_keys or self.num_tokens
        return 3 * self.num_tokens * keys * sum(self.dense_heads if heads is None else heads) * self.frames

    def gflops(self, heads: Sequence[int] | None = None, neurons: Sequence[int] | None = None) -> float:
        """:meth:`flops` in units of 10⁹."""
        return self.flops(heads, neurons) / 1e9

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "ModelShape":
        """Parse a stored shape; a missing field, a wrong type, a sign or a size no model has raises
        :class:`RankingFormatError` naming the field, before anything of that size is built."""
        if not isinstance(data, dict):
            raise RankingFormatError(f"shape must be a JSON object, got {type(data).__name__}.")
        names = [f.name for f in fields(cls)]
        if missing := [name for name in names if name not in data and name not in _OPTIONAL]:
            raise RankingFormatError(f"shape has no {missing}.")
        values = {name: data[name] for name in names if name in data}
        if not isinstance(values["model_type"], str) or not values["model_type"]:
            raise RankingFormatError(f"shape.model_type={values['model_type']!r} must be a non-empty string.")
        for name, value in values.items():
            if name not in ("model_type", "other_flops") and (why := out_of_range(name, value)):
                raise RankingFormatError(f"shape.{name}={value!r} {why}.")
        other = values.get("other_flops", 0)
        if isinstance(other, bool) or not isinstance(other, numbers.Integral):
            raise RankingFormatError(f"shape.other_flops={other!r} must be an integer, got {type(other).__name__}.")
        if values.get("used_layers", values["num_layers"]) > values["num_layers"]:
            raise RankingFormatError(f"shape.used_layers={values['used_layers']!r} must be at most shape.num_layers="
                                     f"{values['num_layers']}.")
        if (units := values["num_layers"] * (values["num_heads"] + values["intermediate_size"])) > MAX_UNITS:
            raise RankingFormatError(f"shape.num_layers × (num_heads + intermediate_size) = {units} heads and neurons "
                                     f"is too large: no supported model has more than {MAX_UNITS}.")
        shape = cls(**{name: value if name == "model_type" else int(value) for name, value in values.items()})
        if shape.flops() <= 0:
            raise RankingFormatError(f"shape.other_flops={other!r} leaves the dense model {shape.flops()} FLOPs: it "
                                     "must be more than minus the formula's count.")
        return shape

    def mismatch(self, other: "ModelShape") -> str:
        """``""`` when ``other`` is this shape, else each differing field with both values and what it means."""
        found, hints = [], set()
        for f in fields(self):
            if f.name in _MEASURED:  # measured on the ranked model's forward, not a property of its structure
                continue
            mine, theirs, hint = getattr(self, f.name), getattr(other, f.name), _MISMATCH_HINTS.get(f.name, "")
            if mine != theirs:
                found.append(f"the ranking has {f.name}={mine!r}, the model has {f.name}={theirs!r}"
                             f"{'' if hint in hints else hint}")
                hints.add(hint)
        # The first differences say what differs; the rest follow from them (a wider model costs more per head).
        return "; ".join(found[:2]) + (f"; {len(found) - 2} more fields differ" if len(found) > 2 else "")


_OPTIONAL = ("head_flops", "used_layers", "frames", "other_flops", "attention_keys")  # fields older rankings lack
_MEASURED = ("other_flops", "attention_keys")
_SIZE = " (another image or patch size: its GFLOP counts would be wrong)"
_COST = " (another parameter cost: biases such as qkv_bias, a gated FFN or other layers differ)"
_MISMATCH_HINTS = {"num_tokens": _SIZE, "num_patches": _SIZE, "patch_size": _SIZE, "params_per_head": _COST,
                   "params_per_neuron": _COST, "fixed_params": _COST, "ffn_matrices": _COST,
                   "head_flops": " (another task head: ranked with or without the classifier)",
                   "used_layers": " (the task reads another block's features, e.g. another vision_feature_layer)"}


def _linear_params(linear: nn.Linear) -> int:
    return linear.weight.numel() + (linear.bias.numel() if linear.bias is not None else 0)


def _unit_costs(layer: nn.Module, spec) -> tuple[int, int, int, int, int]:
    """(params per head, params per neuron, heads, neurons, prunable params) of one block."""
    attention = get_attention(layer, spec)
    hd, h = head_dim(attention, spec), num_heads(attention, spec)
    d = get_projection(attention, spec.o_proj).out_features
    per_head = d * hd  # o_proj columns
    for name in (spec.q_proj, spec.k_proj, spec.v_proj):
        proj = get_projection(attention, name)
        per_head += hd * (proj.in_features + (1 if proj.bias is not None else 0))
    per_head += sum(getattr(owner, name).shape[:-1].numel() for owner, name in head_tables(layer, spec))
    per_head += sum(m.in_features + (1 if m.bias is not None else 0) for m in head_rows(layer, spec))  # one row each
    mlp, variant = get_mlp(layer, spec)
    out_proj = get_projection(mlp, variant.out_proj)
    per_neuron = out_proj.out_features
    for proj, blocks in ffn_inputs(mlp, variant):
        per_neuron += blocks * (proj.in_features + (1 if proj.bias is not None else 0))
    f = out_proj.in_features
    return per_head, per_neuron, h, f, per_head * h + per_neuron * f


def backbone_parameters(model: PreTrainedModel) -> int:
    """Parameters of the vision backbone, embeddings included, task heads and unused poolers excluded."""
    spec = get_spec(model)
    backbone = get_backbone(model, spec)
    excluded = {id(p) for path in spec.excluded_from_budget if _has(backbone, path)
                for p in backbone.get_submodule(path).parameters()}
    return sum(p.numel() for p in backbone.parameters() if id(p) not in excluded)


def _has(module: nn.Module, path: str) -> bool:
    try:
        return module.get_submodule(path) is not None
    except AttributeError:
        return False


def layer_widths(model: PreTrainedModel) -> tuple[list[int], list[int]]:
    """Current ``(heads per block, FFN neurons per block)`` of a model, sliced or not."""
    spec = get_spec(model)
    heads, neurons = [], []
    for layer in get_layers(model, spec):
        _, _, h, f, _ = _unit_costs(layer, spec)
        heads.append(h)
        neurons.append(f)
    return heads, neurons


def model_shape(model: PreTrainedModel, dense: tuple[Sequence[int], Sequence[int]] | None = None) -> ModelShape:
    """Measure the :class:`ModelShape` of ``model``.

    Args:
        model: A supported model, on any device (``meta`` included), dense or sliced.
        dense: ``(num_heads, intermediate_size)`` of the dense model when ``model`` is sliced; by default the
            model's own widths, which must then be uniform across blocks.
    """
    spec = get_spec(model)
    config = model.config
    vision = vision_config(config)
    layers = get_layers(model, spec)
    costs = [_unit_costs(layer, spec) for layer in layers]
    per_head, per_neuron = costs[0][0], costs[0][1]
    prunable = sum(c[4] for c in costs)
    if dense is None:
        heads, neurons = {c[2] for c in costs}, {c[3] for c in costs}
        if len(heads) != 1 or len(neurons) != 1:
            raise uneven_widths(model, "model_shape needs the dense widths (pass dense=(num_heads, "
                                "intermediate_size))")
        dense = (heads.pop(), neurons.pop())
    attention = get_attention(layers[0], spec)
    mlp, variant = get_mlp(layers[0], spec)
    backbone = get_backbone(model, spec)
    head_flops = 0
    backbone_modules = {id(m) for m in backbone.modules()}
    for module in model.modules() if spec.task is None else ():
        if isinstance(module, nn.Linear) and id(module) not in backbone_modules:
            head_flops += 2 * module.in_features * module.out_features
    num_patches = spec.num_patches(config)
    return ModelShape(
        model_type=config.model_type,
        num_layers=len(layers),
        num_heads=int(dense[0]),
        head_dim=head_dim(attention, spec),
        hidden_size=get_projection(attention, spec.o_proj).out_features,
        intermediate_size=int(dense[1]),
        params_per_head=per_head,
        params_per_neuron=per_neuron,
        fixed_params=backbone_parameters(model) - prunable,
        num_tokens=num_patches + spec.extra_tokens(config),
        num_patches=num_patches,
        patch_size=patch_side(model),
        num_channels=input_channels(vision),
        ffn_matrices=sum(blocks for _, blocks in ffn_inputs(mlp, variant)) + 1,
        head_flops=head_flops,
        used_layers=min(len(layers), used_layers(config, spec)),
        frames=max(1, spec.frames_in_batch),
    )


def uneven_widths(model: PreTrainedModel, needs: str) -> SnapViTError:
    """The error for a model whose blocks differ in width, for a caller that ``needs`` a dense one: sliced (it
    records ``config.elastic_layout``, or is narrower than its config builds), or built so (not a plain ViT)."""
    heads, neurons = layer_widths(model)
    sliced = getattr(model.config, "elastic_layout", None) is not None
    if not sliced:
        try:
            sliced = layer_widths(skeleton(copy.deepcopy(model.config))) != (heads, neurons)
        except Exception:  # noqa: BLE001 - a config that builds no model here: the blocks were cut after building
            sliced = True
    if sliced:
        return ConfigError(f"{needs}, but this one is already sliced (per-block heads {heads}, neurons {neurons}). "
                           "Use the original checkpoint instead.")
    return UnsupportedArchitectureError(
        f"This {type(model).__name__} ({model.config.model_type}) is not a plain ViT: its config builds blocks of "
        f"different widths (heads {heads}, FFN neurons {neurons}): hierarchical stages. hf_snapvit prunes vision "
        "transformers whose blocks repeat at one width; prune a plain ViT backbone instead.")
