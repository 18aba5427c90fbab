"""What a model's blocks and its backbone return during a forward pass, kept by forward hooks.

The image embedding, SnapViT's ``"blocks"`` fitness, recovery's distillation targets, evaluation's one-pass
embedding and logits, and the correction's size check each read block outputs (or the backbone's output) of a
forward pass run for something else: :func:`capture_block_outputs` registers the hooks and removes them however its
``with`` block is left.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

import torch
import torch.nn as nn

from ..errors import ConfigError
from .parts import feature_module, get_layers
from .registry import ArchitectureSpec, get_spec

#: Which blocks :func:`capture_block_outputs` hooks: every block, the last one only, or none.
BlockChoice = Literal["all", "last"] | None
_BLOCK_CHOICES = ("all", "last", None)


@dataclass
class CapturedOutputs:
    """What the hooks of :func:`capture_block_outputs` kept, in the order of the calls.

    Args:
        blocks: One list per hooked block, in depth order: what was kept of each of its calls.
        calls: What was kept of every hooked block's calls, in the order they ran (depth order, unless a model runs
            a block more than once).
        backbone: What was kept of each of the backbone's calls.
    """

    blocks: list[list[Any]]
    calls: list[Any] = field(default_factory=list)
    backbone: list[Any] = field(default_factory=list)

    def clear(self) -> None:
        """Forget everything kept so far (the hooks stay)."""
        for kept in self.blocks:
            kept.clear()
        self.calls.clear()
        self.backbone.clear()


def block_hidden_states(output: Any) -> torch.Tensor:
    """A block's hidden states in what its forward returned: the tensor itself, or the first entry of a tuple (the
    families whose blocks also return attention weights)."""
    return output[0] if isinstance(output, (tuple, list)) else output


@contextmanager
def capture_block_outputs(
    model: nn.Module,
    spec: ArchitectureSpec | None = None,
    *,
    blocks: BlockChoice = "all",
    backbone: bool = False,
    on_block: Callable[[torch.Tensor], Any] | None = None,
    on_backbone: Callable[[Any, dict[str, Any]], Any] | None = None,
) -> Iterator[CapturedOutputs]:
    """Inside ``with``: keep what ``model``'s blocks (and its backbone) return on every forward pass.

    Nothing is copied, detached or cast: a block's hidden states are kept as its forward returned them (same dtype
    and device, and gradients flow through them when the forward builds a graph). The hooks are removed when the
    ``with`` block is left, also by an exception; what was kept stays readable afterwards.

    Args:
        model: The model whose forward passes run inside ``with`` (a whole task model, a classifier or a backbone).
        spec: Its architecture spec (default: ``get_spec(model)``).
        blocks: ``"all"``: every block of ``get_layers(model, spec)``; ``"last"``: the last block only; ``None``: no
            block.
        backbone: Also keep what the backbone returns (:func:`~.parts.feature_module`: the module whose output
            holds the features read; implied by ``on_backbone``).
        on_block: What to keep of a block's hidden states (:func:`block_hidden_states`), e.g. their token mean, so
            that the full tensors need not be held; default: the hidden states themselves. A ``None`` from it keeps
            nothing.
        on_backbone: What to keep of a backbone call, given its output and its keyword arguments (a grid tower's
            ``grid_thw``); default: the output itself. A ``None`` from it keeps nothing.

    Yields:
        The :class:`CapturedOutputs`, filled as the forwards run.
    """
    if blocks not in _BLOCK_CHOICES:
        raise ConfigError(f"capture_block_outputs(blocks={blocks!r}): choose 'all' (every block), 'last' (the last "
                          "block) or None (no block).")
    spec = spec or get_spec(model)
    layers = list(get_layers(model, spec)) if blocks is not None else []
    layers = layers[-1:] if blocks == "last" else layers
    captured = CapturedOutputs(blocks=[[] for _ in layers])
    handles = []
    try:
        for kept, layer in zip(captured.blocks, layers):
            handles.append(layer.register_forward_hook(_block_hook(kept, captured.calls, on_block)))
        if backbone or on_backbone is not None:
            handles.append(feature_module(model, spec).register_forward_hook(
                _backbone_hook(captured.backbone, on_backbone), with_kwargs=True))
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _block_hook(kept: list, calls: list, on_block: Callable[[torch.Tensor], Any] | None) -> Callable:
    def hook(module: nn.Module, args: tuple, output: Any) -> None:
        hidden = block_hidden_states(output)
        value = hidden if on_block is None else on_block(hidden)
        if value is not None:
            kept.append(value)
            calls.append(value)

    return hook


def _backbone_hook(kept: list, on_backbone: Callable[[Any, dict[str, Any]], Any] | None) -> Callable:
    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        value = output if on_backbone is None else on_backbone(output, kwargs)
        if value is not None:
            kept.append(value)

    return hook
