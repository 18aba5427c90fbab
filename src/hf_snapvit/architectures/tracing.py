"""What one forward of a model shows discovery (:mod:`.discovery`) and the check of a stored spec (:mod:`.stored`):
the order in which a block uses its ``nn.Linear`` weights, the tokens it sees, how it splits a projection's output
into heads, and the classifier heads a model inside names itself. A model on the meta device (the loader's skeleton)
is traced too: tensors its ``__init__`` left on the CPU (rotary tables) are moved to meta as they are used."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from ..errors import UnsupportedArchitectureError
from .inputs import blank_inputs, pixel_shape


_RESHAPES = frozenset({torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.unflatten,
                       torch.unflatten})
#: One reshape seen inside the block's first run: ``(nn.Linear calls before it, input shape, output shape)``.
Split = tuple[int, tuple[int, ...], tuple[int, ...]]


class _LinearCalls(TorchFunctionMode):
    """Records which of a block's ``nn.Linear`` weights each ``F.linear`` call uses: through the layer's own forward,
    or applied to its weight directly (timm's EVA attention adds separate query and value biases that way); and,
    while the block's first run is ``inside``, the shapes each reshape takes and gives."""

    def __init__(self, block: nn.Module, meta: bool) -> None:
        super().__init__()
        self.owners = {id(m.weight): (n, m) for n, m in block.named_modules() if isinstance(m, nn.Linear)}
        self.calls: list[tuple[str, nn.Linear]] = []
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
        out = func(*args, **kwargs)
        if self.inside and func in _RESHAPES and args and isinstance(args[0], torch.Tensor) and isinstance(
                out, torch.Tensor):
            self.splits.append((len(self.calls), tuple(args[0].shape), tuple(out.shape)))
        return out


def _to_meta(value: object) -> object:
    return value.to("meta") if isinstance(value, torch.Tensor) and value.device.type != "meta" else value


def trace_block(model: nn.Module, block: nn.Module,
                splits: list[Split] | None = None) -> tuple[list[tuple[str, nn.Linear]], int]:
    """The block's ``nn.Linear`` layers in the order one forward uses their weights, and the number of tokens it
    sees; ``splits`` (a list, if given) gets the reshapes of its first run (:data:`Split`)."""
    shape = pixel_shape(model.config, 1)
    device = next(model.parameters()).device
    recorder = _LinearCalls(block, meta=device.type == "meta")
    tokens: list[int] = []

    def enter(module: nn.Module, args: tuple, kwargs: dict) -> None:
        tokens.append(_tokens(args, kwargs))
        recorder.inside = len(tokens) == 1

    hooks = [block.register_forward_pre_hook(enter, with_kwargs=True),
             block.register_forward_hook(lambda *_: setattr(recorder, "inside", False))]
    dtype = next(model.parameters()).dtype
    training = model.training
    model.eval()  # a training-mode forward would update running statistics of the caller's model
    try:
        with torch.no_grad(), recorder:
            model(**blank_inputs(model, torch.zeros(shape, dtype=dtype, device=device)))
    except Exception as error:  # noqa: BLE001 - any failure means the model cannot be discovered this way
        raise UnsupportedArchitectureError(
            f"hf_snapvit could not run one forward of {type(model).__name__} on blank pixel_values of shape "
            f"{list(shape)} to discover its structure ({type(error).__name__}: {error}). Describe it with "
            "hf_snapvit.ArchitectureSpec and call hf_snapvit.register_architecture(spec).") from error
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    if splits is not None:
        splits.extend(recorder.splits)
    seen, order = set(), []
    for name, module in recorder.calls:  # the first call of each layer (one block runs once per forward)
        if name not in seen:
            seen.add(name)
            order.append((name, module))
    return order, tokens[0] if tokens else 0


def _tokens(args: tuple, kwargs: dict) -> int:
    """Tokens per image a block sees: ``[B, N, D]`` hidden states, or one image's ``[N, D]`` sequence."""
    hidden = args[0] if args else next((v for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
    if not isinstance(hidden, torch.Tensor):
        return 0
    return int(hidden.shape[1]) if hidden.dim() == 3 else int(hidden.shape[0]) if hidden.dim() == 2 else 0


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
