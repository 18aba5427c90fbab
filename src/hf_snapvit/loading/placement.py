"""Placing a loaded model over several devices with accelerate's big-model engine (``device_map`` as a dict).

The loader reads only the kept slices onto the CPU, then :func:`accelerate.dispatch_model` places every module where
the map says: an accelerator, ``"cpu"`` (offloaded to the CPU when the map also names an accelerator, as in
transformers) or ``"disk"`` (offloaded to ``offload_folder``). Peak host memory is therefore about the sliced model's
size, never the dense checkpoint's.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel

from ..errors import ConfigError

def device_name(device: Any) -> str:
    """``device`` as torch names it (``0`` -> ``"cuda:0"``), or as given for accelerate's ``"disk"``."""
    if isinstance(device, int) and not isinstance(device, bool) and torch.accelerator.is_available():
        return f"{torch.accelerator.current_accelerator().type}:{device}"
    try:
        return str(torch.device(device))
    except (RuntimeError, TypeError):
        return str(device)


def check_spread(device_map: dict[str, Any] | str | None, *, switchable: bool, fitting: bool) -> None:
    """Refuse a ``device_map`` that spreads the model for what needs the whole model on one device: switching sizes
    in place (every switch re-slices the weights) and correction or recovery (they fit the weights)."""
    if device_map is None or not (switchable or fitting):
        return
    what = ("switchable=True re-slices the weights in place" if switchable
            else "correction and recovery fit the weights")
    devices = (sorted({device_name(d) for d in device_map.values()}) if isinstance(device_map, dict)
               else f"devices by {device_map!r}")
    raise ConfigError(f"A device_map that spreads the model over {devices} cannot serve this load: {what} on one "
                      "device. Load onto one device (device_map='auto' without max_memory, or 'cpu'), or load the "
                      "size, save it, and load that folder with the device_map.")


def computed_map(model: PreTrainedModel, strategy: str, max_memory: dict[Any, Any] | None) -> dict[str, Any]:
    """The device map accelerate computes for the sliced ``model`` by ``strategy`` (``"auto"`` and ``"balanced"``
    spread it evenly over the accelerators, ``"balanced_low_0"`` leaves the first one room, ``"sequential"`` fills
    them in order; then the CPU, then ``"disk"``), within ``max_memory``, never splitting the modules the model
    names unsplittable (its blocks), as transformers computes it for a dense model."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = list(getattr(model, "_no_split_modules", None) or [])
    if strategy != "sequential":
        max_memory = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split,
                                         low_zero=strategy == "balanced_low_0")
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)


def dispatch_sliced(model: PreTrainedModel, options: Any) -> PreTrainedModel:
    """Place ``model`` (loaded on the CPU) as ``options.device_map`` says (``options``: the loader's
    :class:`~hf_snapvit.loading.arguments.LoadOptions`), through :func:`accelerate.dispatch_model`, with its
    ``offload_folder`` and ``offload_buffers``; ``model`` as it is without a map.

    Raises:
        ConfigError: The map leaves a weight unplaced or names a module the model does not have, or sends modules
            to ``"disk"`` without ``offload_folder``; each message names the map and the fix.
    """
    from accelerate import dispatch_model
    from accelerate.utils import check_device_map

    device_map, offload_folder = options.device_map, options.offload_folder
    if device_map is None:
        return model
    if isinstance(device_map, str):
        device_map = computed_map(model, device_map, options.max_memory)
    if {device_name(d) for d in device_map.values()} == {"disk"}:
        raise ConfigError(f"device_map={dict(device_map)} sends every module to disk, so nothing runs anywhere: give "
                          "the first modules a device (e.g. {'vit.embeddings': 'cpu', ...}) or raise max_memory.")
    names = {name for name, _ in model.named_modules()}
    unknown = sorted(str(k) for k in device_map if k not in names)
    if unknown:
        raise ConfigError(f"device_map names {unknown}, which are not modules of this {type(model).__name__}; its "
                          f"top-level modules are {sorted(n for n in names if n and '.' not in n)}. Give a map of "
                          "its module names (as model.named_modules() lists them) to devices.")
    try:
        check_device_map(model, device_map)
    except ValueError as error:
        raise ConfigError(f"device_map does not place every weight of this {type(model).__name__} ({error}). Add "
                          "the modules it leaves out, or use {'': 'cpu'} for one device.") from None
    if offload_folder is None and any(device_name(d) == "disk" for d in device_map.values()):
        raise ConfigError("device_map sends modules to 'disk', which needs offload_folder=... (a folder for "
                          "accelerate's offloaded weights), as in transformers.")
    placed = {name: device_name(device) for name, device in device_map.items()}
    return dispatch_model(model, device_map=placed, offload_dir=offload_folder,
                          offload_buffers=options.offload_buffers)


__all__ = ["check_spread", "computed_map", "device_name", "dispatch_sliced"]
