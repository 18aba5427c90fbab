"""What one forward of a model shows discovery (:mod:`.discovery`) and the check of a stored spec (:mod:`.stored`):
the order in which a block uses its ``nn.Linear`` weights and the tokens each takes, the tokens and width the block
sees, how it splits a projection's output into heads, the patch grid the patch embedding gives, which of some modules
ran at all, and the classifier heads a model inside names itself. A model on the meta device (the loader's skeleton)
is traced too: tensors its ``__init__`` left on the CPU (rotary tables) are moved to meta as they are used."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map
from transformers import PreTrainedModel

from ..errors import UnsupportedArchitectureError
from .inputs import blank_inputs, names_size, patch_conv, pixel_shape
from .registry import vision_config


_RESHAPES = frozenset({torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.unflatten,
                       torch.unflatten})
#: One reshape seen inside the block's first run: ``(nn.Linear calls before it, input shape, output shape)``.
Split = tuple[int, tuple[int, ...], tuple[int, ...]]


class _LinearCalls(TorchFunctionMode):
    """Records which of a block's ``nn.Linear`` weights each ``F.linear`` call uses: through the layer's own forward,
    or applied to its weight directly (timm's EVA attention adds separate query and value biases that way), with the
    tokens of its input; and, while the block's first run is ``inside``, the shapes each reshape takes and gives."""

    def __init__(self, block: nn.Module, meta: bool) -> None:
        super().__init__()
        self.owners = {id(m.weight): (n, m) for n, m in block.named_modules() if isinstance(m, nn.Linear)}
        self.calls: list[tuple[str, nn.Linear]] = []
        self.tokens: dict[str, int] = {}
        self.splits: list[Split] = []
        self.inside, self.meta = False, meta

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.meta:
            args, kwargs = tree_map(_to_meta, (args, kwargs))
        if func is F.linear:
            weight = kwargs.get("weight", args[1] if len(args) > 1 else None)
            if id(weight) in self.owners:
                self.calls.append(self.owners[id(weight)])
                source = args[0] if args else kwargs.get("input")
                self.tokens.setdefault(self.owners[id(weight)][0], int(source.shape[-2]) if getattr(
                    source, "ndim", 0) >= 2 else 1)
        out = func(*args, **kwargs)
        if self.inside and func in _RESHAPES and args and isinstance(args[0], torch.Tensor) and isinstance(
                out, torch.Tensor):
            self.splits.append((len(self.calls), tuple(args[0].shape), tuple(out.shape)))
        return out


def _to_meta(value: object) -> object:
    return value.to("meta") if isinstance(value, torch.Tensor) and value.device.type != "meta" else value


@dataclass
class Trace:
    """What one forward showed of a block (:func:`trace`)."""

    calls: list[tuple[str, nn.Linear]]  #: the block's ``nn.Linear`` layers, in the order their weights were first used
    tokens: int  #: tokens per image its first run saw (``[B, N, D]`` hidden states, or one image's ``[N, D]``)
    hidden: int  #: the width of its input hidden states (0: not a tensor)
    call_tokens: dict[str, int] = field(default_factory=dict)  #: the tokens each layer's first input held
    splits: list[Split] = field(default_factory=list)  #: the reshapes of its first run
    patches: int = 0  #: the patch grid the patch embedding (:func:`patch_conv`) gave the input, 0 if none ran


def trace(model: nn.Module, block: nn.Module, shape: tuple[int, ...] | None = None,
          watch: tuple[nn.Module, ...] = ()) -> tuple[Trace, set[int]]:
    """One forward of ``model`` on blank ``pixel_values`` of ``shape`` (default: :func:`pixel_shape`'s, one image)
    and what it showed of ``block``; with the ids of the modules of ``watch`` that ran.

    Raises:
        UnsupportedArchitectureError: the forward fails on that input, naming it and the cause.
    """
    shape = tuple(shape or pixel_shape(model.config, 1))
    device = next(model.parameters()).device
    recorder = _LinearCalls(block, meta=device.type == "meta")
    tokens: list[tuple[int, int]] = []
    ran: set[int] = set()
    grid: list[int] = []

    widths = {m.in_features for m in block.modules() if isinstance(m, nn.Linear)}

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
        tokens.append(_tokens(args, kwargs, widths))
        recorder.inside = len(tokens) == 1

    def patches(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if not grid and isinstance(output, torch.Tensor) and output.ndim >= 3:  # [B, C, *grid] for one input
            grid.append(output.numel() // int(output.shape[1]))

    hooks = [block.register_forward_pre_hook(enter, with_kwargs=True),
             block.register_forward_hook(lambda *_: setattr(recorder, "inside", False))]
    hooks += [m.register_forward_pre_hook(lambda module, args: ran.add(id(module))) for m in watch]
    if (conv := patch_conv(model)) is not None:
        hooks.append(conv.register_forward_hook(patches))
    dtype = next(model.parameters()).dtype
    training = model.training
    model.eval()  # a training-mode forward would update running statistics of the caller's model
    try:
        with torch.no_grad(), recorder:
            model(**blank_inputs(model, torch.zeros(shape, dtype=dtype, device=device)))
    except Exception as error:  # noqa: BLE001 - any failure means the model cannot be discovered this way
        cause = " ".join(f"{type(error).__name__}: {error}".split())
        raise UnsupportedArchitectureError(
            f"hf_snapvit could not run one forward of {type(model).__name__} on blank pixel_values of shape "
            f"{list(shape)} to discover its structure ({cause[:160]}). {_input_fix(model, cause)}") from error
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    seen, order = set(), []
    for name, module in recorder.calls:  # the first call of each layer (one block runs once per forward)
        if name not in seen:
            seen.add(name)
            order.append((name, module))
    first = tokens[0] if tokens else (0, 0)
    return Trace(order, first[0], first[1], recorder.tokens, recorder.splits, grid[0] if grid else 0), ran


def _input_fix(model: nn.Module, cause: str) -> str:
    """What makes a blank forward run: pixel_values alone, where the forward needs more (a text, prompts: its
    required inputs, or those the error names), else the input sizes the config names."""
    parameters = inspect.signature(model.forward).parameters
    words = set(re.findall(r"\w+", cause))
    needs = [n for n, p in parameters.items() if n != "pixel_values" and p.default is p.empty and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)] or [  # else those the error names, and a text's
        n for n in parameters if n != "pixel_values" and (n in words or n.endswith("input_ids") or any(
            n.endswith(f"_{w}") for w in words if "_" in w))]
    if needs:
        tower = next((name for name, m in model.named_modules() if name and isinstance(m, PreTrainedModel)
                      and "pixel_values" in inspect.signature(m.forward).parameters), None)
        return (f"Its forward needs {', '.join(needs[:3])} besides pixel_values: " + (
            f"rank its vision tower ({tower}) instead." if tower else "hf_snapvit ranks models that take images "
                                                                       "alone."))
    vision = vision_config(model.config)
    if not names_size(vision):
        return ("Its config names no image_size: set config.image_size (and patch_size) to the input size the model "
                "takes.")
    frames = " and num_frames" if getattr(vision, "num_frames", None) else ""
    return f"Check that config.image_size, num_channels{frames} are the input the model takes."


def trace_block(model: nn.Module, block: nn.Module, splits: list[Split] | None = None,
                shape: tuple[int, ...] | None = None) -> tuple[list[tuple[str, nn.Linear]], int]:
    """The block's ``nn.Linear`` layers in the order one forward uses their weights, and the number of tokens it
    sees (:func:`trace`); ``splits`` (a list, if given) gets the reshapes of its first run (:data:`Split`)."""
    found, _ = trace(model, block, shape)
    if splits is not None:
        splits.extend(found.splits)
    return found.calls, found.tokens


def _tokens(args: tuple, kwargs: dict, widths: set[int]) -> tuple[int, int]:
    """Tokens per image a block sees (``[B, N, D]`` hidden states, one image's ``[N, D]`` sequence, or a grid of them:
    ``[B, H, W, D]``, or ``[B, D, H, W]`` where only ``D`` is a width the block's ``nn.Linear`` layers take, ViTDet's)
    and their width; a grid's tokens are 0 (its tokens are the patch grid's)."""
    hidden = args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() == 0:
        return 0, 0
    if hidden.dim() == 4 and int(hidden.shape[-1]) not in widths and int(hidden.shape[1]) in widths:
        return 0, int(hidden.shape[1])  # channels first
    count = int(hidden.shape[1]) if hidden.dim() == 3 else int(hidden.shape[0]) if hidden.dim() == 2 else 0
    return count, int(hidden.shape[-1])


def classifier_paths(model: nn.Module) -> tuple[str, ...]:
    """The paths of the classifier heads a module inside ``model`` names (timm's ``get_classifier()``): task heads,
    not backbone parameters, when the whole model is the backbone."""
    paths = {id(m): n for n, m in model.named_modules()}
    found = []
    for module in model.modules():
        get = getattr(module, "get_classifier", None)
        if module is model or not callable(get):
            continue
        try:
            heads = get()
        except Exception:  # noqa: BLE001 - a module whose get_classifier needs arguments names no head
            continue
        for head in heads if isinstance(heads, tuple) else (heads,):  # DeiT distilled: class and distillation
            if isinstance(head, nn.Module) and paths.get(id(head)) and any(True for _ in head.parameters()):
                found.append(paths[id(head)])
    return tuple(dict.fromkeys(found))
