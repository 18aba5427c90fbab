"""Models placed by accelerate's big-model engine: ``dispatch_model`` with a ``device_map``, ``cpu_offload`` or
``disk_offload`` (issue 65).

Such a model is run through the hooks accelerate attached (``AlignDevicesHook``): a module's weights come to its
execution device for its forward and, when offloaded, go back to the meta device afterwards, with their values in the
hook's weights map (host memory or an offload folder). hf_snapvit never moves such a model or copies it whole; what
reads weights outside a forward pass (a score's ``w²``, a block's output projection) reads one module at a time
inside :func:`onloaded`, which asks the module's hook to load it, as its forward would.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from ..utils.distributed import on_process_device
from ..errors import ConfigError


def is_dispatched(model: nn.Module) -> bool:
    """Whether accelerate's hooks place ``model``'s modules (``dispatch_model``, ``cpu_offload``, a ``device_map`` at
    load time)."""
    return getattr(model, "hf_device_map", None) is not None or any(hasattr(m, "_hf_hook") for m in model.modules())


def _holders(model: nn.Module) -> dict[str, nn.Module]:
    """The modules whose hook holds offloaded weights, by name."""
    from accelerate.utils import has_offloaded_params

    return {name: module for name, module in model.named_modules() if has_offloaded_params(module)}


def offloaded_by_hooks(model: nn.Module) -> bool:
    """Whether every meta-device parameter of ``model`` is held by an accelerate hook (so it has values), and some
    are: an offloaded model rather than a skeleton without weights."""
    holders = _holders(model)
    meta = [name for name, p in model.named_parameters() if p.is_meta]
    return bool(meta) and all(any(n == h or n.startswith(h + ".") or not h for h in holders) for n in meta)


def _hook_device(module: nn.Module) -> torch.device | None:
    hook = getattr(module, "_hf_hook", None)
    for each in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):  # a SequentialHook's hooks
        device = getattr(each, "execution_device", None)
        if device is not None:
            return torch.device(device if not isinstance(device, int) else f"cuda:{device}")
    return None


def execution_device(model: nn.Module, module: nn.Module | None = None) -> torch.device:
    """Where ``module`` of ``model`` (default: the model's first module with weights) computes: the execution device
    of the accelerate hook that places it, else the device of its first weight that is not on the meta device, else
    the CPU. Inputs for a dispatched model go there; its hooks move them on from block to block."""
    target = model if module is None else module
    for owner in [*target.modules(), *(model.modules() if module is not None else [])]:
        device = _hook_device(owner)
        if device is not None:
            return device
        real = next((p.device for p in owner.parameters(recurse=False) if not p.is_meta), None)
        if real is not None:
            return real
    return torch.device("cpu")


@contextlib.contextmanager
def onloaded(model: nn.Module, module: nn.Module) -> Iterator[nn.Module]:
    """Inside the block, ``module``'s weights are real tensors on its execution device, loaded by the accelerate
    hooks that hold them (on ``module``, its ancestors or its descendants), as its forward would load them; outside,
    they are offloaded again. A module that is not offloaded is left as it is."""
    holders = _holders(model)
    if not holders:
        yield module
        return
    from accelerate.utils import align_module_device

    name = next(n for n, m in model.named_modules() if m is module)
    related = [m for n, m in holders.items()
               if n == name or not n or name.startswith(n + ".") or (not name or n.startswith(name + "."))]
    with contextlib.ExitStack() as stack:
        for holder in related:
            stack.enter_context(align_module_device(holder))
        yield module


@contextlib.contextmanager
def on_device(model: nn.Module, state: Any = None) -> Iterator[torch.device]:
    """:func:`hf_snapvit.utils.distributed.on_process_device` (the model on this process's device for the block), for a
    model accelerate placed too: that one stays as its hooks place it, and the device its inputs go to is yielded.

    Raises:
        ConfigError: a placed model under ``accelerate launch`` on several processes.
    """
    if not is_dispatched(model):
        with on_process_device(model, state) as device:
            yield device
        return
    if state is not None and state.num_processes > 1:
        raise ConfigError(f"This model is placed by accelerate (device_map, cpu_offload), which spreads it over the "
                          f"devices of one process; it cannot also run on {state.num_processes} processes. Rank it "
                          "without accelerate launch, or load the whole model on every process.")
    yield execution_device(model)


@contextlib.contextmanager
def weights_reloaded_for_backward(model: nn.Module) -> Iterator[None]:
    """Inside the block, autograd keeps no offloaded linear weight that a forward loaded: each one it saves for the
    backward pass (to take the gradient of the layer's input) is saved as where to load it from, and loaded again
    by its hook when the backward pass needs it. Without this, a forward with gradients would hold every block's
    loaded weights on the execution device until the backward pass, the whole model at once."""
    holders = _holders(model)
    if not holders:
        yield
        return
    current: list[nn.Module] = []

    def enter(module: nn.Module, args: tuple) -> None:  # the linear about to run: loaded when its forward saves it
        current[:] = [module]

    def pack(tensor: torch.Tensor) -> Any:
        weight = current[0]._parameters.get("weight") if current else None
        base = tensor._base if tensor._base is not None else tensor  # a linear saves its weight transposed
        if weight is None or weight.device != tensor.device or base is not weight:
            return tensor
        return current[0], tensor.size(), tensor.stride(), tensor.storage_offset()

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        module, size, stride, offset = packed
        with onloaded(model, module):
            return module.weight.detach().as_strided(size, stride, offset)

    linears = {id(m): m for holder in holders.values() for m in holder.modules() if isinstance(m, nn.Linear)}
    handles = [m.register_forward_pre_hook(enter) for m in linears.values()]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        for handle in handles:
            handle.remove()


#: What accelerate's ``add_hook_to_module`` sets on a module instance (and ``dispatch_model`` on the model).
HOOK_ATTRIBUTES = ("_hf_hook", "_old_forward", "forward", "hf_device_map")


def strip_hooks_(module: nn.Module) -> nn.Module:
    """Remove accelerate's hook from a module instance (a copy of a dispatched module), so that it runs its class's
    own forward on the tensors it holds; a module without one is left as it is. Returns ``module``."""
    if "_hf_hook" in module.__dict__ or "hf_device_map" in module.__dict__:
        for name in HOOK_ATTRIBUTES:
            module.__dict__.pop(name, None)
    return module


def offloaded_values(model: nn.Module) -> Iterator[tuple[nn.Module, dict[str, torch.Tensor]]]:
    """``(module, {name: tensor})``: the weights and buffers of ``model`` that accelerate offloaded (on the meta
    device between forwards), each module's own, copied to the CPU one hook's module at a time, so that host memory
    holds them only as long as the caller keeps them."""
    for holder in _holders(model).values():
        with onloaded(model, holder):
            for module in holder.modules():
                values = {name: tensor.detach().to("cpu", copy=True)
                          for name, tensor in [*module.named_parameters(recurse=False),
                                               *module.named_buffers(recurse=False)] if not tensor.is_meta}
                if values:
                    yield module, values


__all__ = ["HOOK_ATTRIBUTES", "execution_device", "is_dispatched", "offloaded_by_hooks", "offloaded_values",
           "on_device", "onloaded", "strip_hooks_", "weights_reloaded_for_backward"]
