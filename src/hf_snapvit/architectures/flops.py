"""What one forward of a model computes, counted by ``torch.utils.flop_counter`` (matrix products and convolutions).

Budgets count heads and FFN neurons with the paper's formulas (:class:`~hf_snapvit.architectures.budget.ModelShape`);
what a forward computes beyond them (a convolutional stem, a neck, attention pooling, a second block stack, attention
run twice) is measured here, once, and stored with the ranking (``ModelShape.other_flops``); :func:`estimate_gflops`
adds it to the formulas. The count runs at batch 1 on a twin of the model without its hooks
(:mod:`~hf_snapvit.architectures.skeleton`): shapes-only on the meta device, so a 7 B model costs nothing to count;
with the weights it shares with the model where that is cheaper (a small forward) or needed (``.item()``,
data-dependent shapes).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, replace
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode, flop_registry
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from . import get_attention, get_layers, get_spec, num_heads
from .budget import ModelShape, layer_widths, model_shape
from .embedding import dummy_inputs, inference_settings
from .skeleton import meta_twin, skeleton, twin

#: Parameters beyond which a meta-device model whose forward cannot run shapes-only is not given weights to count it.
MAX_MATERIALISED = 10**9
#: Forwards of at most this many FLOPs (by the formulas) are counted with the model's weights: shapes-only dispatch
#: costs about as much as 2-5 GFLOPs of a CPU's matrix products (ViT-Tiny at 224 px: 0.05 s run, 0.1 s shapes-only).
SMALL_FORWARD = 4 * 10**9
#: Attention over fewer keys than tokens by more than this share counts them (less: the formula's every token).
_TOLERANCE = 0.15


def _sdpa_flops(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """The two matrix products of one scaled-dot-product attention (``torch.utils.flop_counter`` counts the GPU
    kernels, not the one CPUs run)."""
    *batch, length, width = query
    return 2 * int(np.prod(batch)) * length * key[-2] * (width + value[-1])


_CPU_SDPA = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
COUNTED = {} if _CPU_SDPA is None or _CPU_SDPA in flop_registry else {_CPU_SDPA: _sdpa_flops}


@contextlib.contextmanager
def counting() -> Iterator[FlopCounterMode]:
    """A FLOP counter that sees every matrix product of a forward, the CPU's scaled-dot-product attention included
    (a softmax, norm or activation is no matrix product: it is not counted)."""
    with FlopCounterMode(display=False, custom_mapping=COUNTED) as counter:
        yield counter


@dataclass(frozen=True)
class ForwardFlops:
    """The FLOPs of one forward of one input: ``total``, and per module (by dotted path from the counted model, a
    module's own count including its children's; modules that did not run are absent)."""

    total: int
    modules: dict[str, int]

    def under(self, paths: list[str]) -> int:
        """The FLOPs of the modules at ``paths`` together."""
        return sum(self.modules.get(path, 0) for path in paths)


def _result(counter: FlopCounterMode) -> ForwardFlops:
    modules = {}
    for name, ops in counter.get_flop_counts().items():
        if name != "Global":  # "Root" is the model, "Root.a.b" its module a.b
            modules[name.partition(".")[2]] = int(sum(ops.values()))
    return ForwardFlops(int(counter.get_total_flops()), modules)


def _count(model: nn.Module, inputs: dict[str, torch.Tensor]) -> ForwardFlops:
    with torch.no_grad(), torch.random.fork_rng(devices=[]), counting() as counter:
        torch.manual_seed(0)  # the same draws as the proof's forwards (ViTMAE shuffles its patches by noise)
        model(**inputs)
    return _result(counter)


def _on(model: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``inputs`` on ``model``'s device, floating ones in its floating dtype."""
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    if parameter is None:
        return inputs
    return {name: value.to(parameter.device, parameter.dtype if value.is_floating_point() else value.dtype)
            for name, value in inputs.items()}


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode (dropout off, norms' running statistics untouched), each module's mode restored."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def forward_flops(model: nn.Module, inputs: dict[str, torch.Tensor] | None = None, *,
                  expected: float | None = None) -> ForwardFlops:
    """The FLOPs one forward of ``model`` computes on ``inputs`` (default: seeded dummy inputs of its configured
    size, one image), in eval mode and without gradients, on a twin of ``model``
    (:func:`~hf_snapvit.architectures.skeleton.twin`, without its hooks): shapes-only on the meta device, or, for a
    forward the formulas put at no more than :data:`SMALL_FORWARD` FLOPs (``expected``; it runs in less time than
    dispatching shapes-only takes) and for one that needs values (``.item()``), with the weights it shares with
    ``model``. A model on the meta device (a budget's skeleton) runs that forward with zero weights, unless it has
    more than :data:`MAX_MATERIALISED` parameters. ``model`` (its weights, modes, caches) and the random state are
    left as they were.

    Raises:
        RuntimeError: the forward fails both ways (or a meta-device model is too large to run).
    """
    inputs = dummy_inputs(model, 1) if inputs is None else inputs
    spec = get_spec(model)
    if getattr(model, "hf_device_map", None) is not None:  # accelerate's offloading hooks hold its weights
        with _evaluating(model), inference_settings(model, spec):
            return _count(model, _on(model, inputs))

    def run(copied: nn.Module) -> ForwardFlops:
        copied.eval()
        with inference_settings(copied, spec):  # ViTMAE: every patch, as it serves images
            return _count(copied, _on(copied, inputs))  # on its device (meta: shapes only), in its dtype

    small = expected is not None and expected <= SMALL_FORWARD
    first, second = (_with_weights, meta_twin) if small else (meta_twin, _with_weights)
    try:
        return run(first(model))
    except Exception:  # noqa: BLE001 - the other way may run it (shapes-only cannot run .item())
        pass
    return run(second(model))


def _with_weights(model: nn.Module) -> nn.Module:
    """A twin of ``model`` that holds its weights (zeros in place of meta-device ones)."""
    if not any(p.device.type == "meta" for p in model.parameters()):
        return twin(model)
    if sum(p.numel() for p in model.parameters()) > MAX_MATERIALISED:
        raise RuntimeError(f"the forward of this {type(model).__name__} cannot run shapes-only, and it is too large "
                           "to run without its weights")
    return twin(model, lambda t: torch.zeros(t.shape, dtype=t.dtype) if t.device.type == "meta" else t.detach())


def measured_shape(model: PreTrainedModel, dense: tuple[Sequence[int], Sequence[int]] | None = None,
                   flops: ForwardFlops | None = None) -> ModelShape:
    """:func:`model_shape` with :attr:`ModelShape.other_flops` measured: what one forward of ``model`` (a task
    model's vision encoder) computes beyond the formulas at its current widths, so that ``shape.flops()`` is what
    the dense model runs (plus the softmax, which no FLOP counter sees). ``flops``: the forward's count, if already
    made. A forward that cannot be counted leaves ``other_flops`` at 0, with a warning."""
    shape = model_shape(model, dense)
    spec = get_spec(model)
    if flops is None:
        counted = model.get_submodule(spec.encoder) if spec.task is not None else model
        try:
            flops = forward_flops(counted, expected=shape.flops())
        except Exception as error:  # noqa: BLE001 - budgets still work, with the formula's GFLOPs
            warnings.warn(f"{type(model).__name__}: hf_snapvit's GFLOPs count its blocks, embedding and head only: "
                          f"its forward could not be counted ({type(error).__name__}: {str(error)[:200]}).",
                          UserWarning, stacklevel=2)
            return shape
    heads, neurons = layer_widths(model)
    shape = replace(shape, attention_keys=_attention_keys(model, shape, flops))
    return replace(shape, other_flops=flops.total - (shape.flops(heads, neurons) - shape.softmax_flops(heads)))


def _attention_keys(model: PreTrainedModel, shape: ModelShape, flops: ForwardFlops) -> int:
    """The keys a query of the pruned blocks attends over, on average over the blocks, from what each block's
    attention module computed beyond its q/k/v/o projections (``4·n·keys·width``), where that is fewer than its
    tokens (windowed attention in some or all blocks, keys from a memory); else 0 (every token, as the formula
    counts)."""
    spec = get_spec(model)
    root = model.get_submodule(spec.encoder) if spec.task is not None else model
    if not spec.attention:  # the block is its attention: its count holds the FFN's too
        return 0
    names = {id(m): name for name, m in root.named_modules()}
    n, d, t = shape.num_tokens, shape.hidden_size, shape.frames
    keys = []
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        width = num_heads(attention, spec) * shape.head_dim
        counted = flops.modules.get(names.get(id(attention), ""), 0) / t
        keys.append((counted - 8 * n * d * width) / (4 * n * width))
    mean = sum(keys) / len(keys) if keys else 0
    return max(1, round(mean)) if keys and min(keys) > 0 and mean <= (1 - _TOLERANCE) * n else 0


def estimate_gflops(
    config_or_model: PretrainedConfig | PreTrainedModel | str,
    heads: Sequence[int] | None = None,
    neurons: Sequence[int] | None = None,
) -> float:
    """GFLOPs of one forward pass (one image): the paper's formulas for the blocks, plus what the forward computes
    beyond them (:attr:`ModelShape.other_flops`, counted on the model's meta-device twin).

    Args:
        config_or_model: A model (its current, possibly sliced, widths are used), a config, or a path/repo id whose
            ``config.json`` is read. A config of a ``*ForImageClassification`` includes the classifier's logits.
        heads: Optional per-block head counts (defaults to the model's current ones).
        neurons: Optional per-block FFN widths (defaults to the model's current ones).

    Example:
        >>> from transformers import ViTConfig
        >>> cfg = ViTConfig(num_labels=1000, architectures=["ViTForImageClassification"])  # ViT-B/16
        >>> round(estimate_gflops(cfg), 1)
        35.1
    """
    if isinstance(config_or_model, str):
        config_or_model = AutoConfig.from_pretrained(config_or_model)
    model = config_or_model if isinstance(config_or_model, nn.Module) else skeleton(config_or_model)
    current_heads, current_neurons = layer_widths(model)
    shape = measured_shape(model, dense=(max(current_heads), max(current_neurons)))
    return shape.gflops(current_heads if heads is None else heads, current_neurons if neurons is None else neurons)
