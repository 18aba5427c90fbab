"""The keyword arguments of ``ElasticViTModel.from_pretrained``, routed as ``PreTrainedModel.from_pretrained`` routes
them: Hub arguments to the downloads, the model-shaping ones to the build, transformers' loading options to what this
loader does with each, and everything else first to the config (``num_labels=10``) and then to the model class's
``__init__`` (``add_pooling_layer=False``), where an argument neither takes fails as it fails in transformers.

A transformers option this loader cannot honour (it reads only the slices a size keeps, from safetensors) is refused
naming it and the way to get it: save the size and load that folder with transformers. A ``device_map`` dict that
spreads the model is placed by accelerate's ``dispatch_model`` (:mod:`hf_snapvit.loading.placement`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..elastic.checkpoint import HUB_KWARGS
from ..errors import ConfigError
from .placement import device_name

#: Arguments transformers' ``from_pretrained`` itself drops (transformers 5), accepted and ignored the same way.
IGNORED_BY_TRANSFORMERS = ("low_cpu_mem_usage", "mirror", "_fast_init", "from_tf", "from_flax", "offload_state_dict")
#: Arguments with nothing to do here: usage telemetry, the class of a weight-loading bar this loader does not draw,
#: and ``weights_only`` (safetensors are never unpickled, so both values load the same).
NO_EFFECT = ("_from_auto", "_from_pipeline", "tqdm_class", "weights_only")
#: Arguments AutoConfig reads (for a checkpoint with its own code), which change no config attribute.
READ_BY_CONFIG = ("trust_remote_code", "code_revision")
#: Arguments that shape the model without changing its structure.
SHAPING = ("dtype", "attn_implementation", "experts_implementation")
#: transformers' options this loader cannot honour: name -> (values that mean "off", why).
UNSUPPORTED: dict[str, tuple[tuple[Any, ...], str]] = {
    "config": ((None,), "the checkpoint's own config.json holds the ranking; pass config attributes as keyword "
                        "arguments instead (e.g. num_labels=10)"),
    "state_dict": ((None,), "the weights are read from the checkpoint, slice by slice"),
    "use_safetensors": ((None, True), "elastic checkpoints are safetensors"),
    "disable_mmap": ((None, False), "only the kept slices are read, through memory maps"),
    "variant": ((None,), "the weights are read from model.safetensors (or its shards)"),
    "key_mapping": ((None,), "weight names are mapped with transformers' own conversions"),
    "quantization_config": ((None,), "the slices are read in floating point"),
    "gguf_file": ((None,), "elastic checkpoints are safetensors"),
    "distributed_config": ((None,), "the model goes to one device"),
    "device_mesh": ((None,), "the model goes to one device"),
    "tp_plan": ((None,), "the model goes to one device"),
    "tp_size": ((None,), "the model goes to one device"),
    "adapter_name": ((None, "default"), "adapters are loaded onto the model afterwards (PEFT)"),
    "adapter_kwargs": ((None, {}), "adapters are loaded onto the model afterwards (PEFT)"),
    "use_kernels": ((None, False), "kernels replace the modules that slicing changes"),
    "kernel_config": ((None,), "kernels replace the modules that slicing changes"),
    "allow_all_kernels": ((None, False), "kernels replace the modules that slicing changes"),
    "fusion_config": ((None,), "fused modules are not the ones slicing changes"),
    "generation_config": ((None,), "vision encoders do not generate"),
}


@dataclass
class LoadOptions:
    """``from_pretrained``'s keyword arguments, sorted: ``hub`` for the downloads, ``build`` for the model class
    (dtype, attention implementation, ``__init__`` arguments), ``device`` (one device) or ``device_map`` (a dict
    spreading the model, or a strategy accelerate computes one by, with ``max_memory``; ``offload_folder`` and
    ``offload_buffers``), transformers' loading switches, and the
    candidate config overrides (``config_kwargs``, with ``trust_remote_code`` and ``code_revision``, which
    ``AutoConfig`` reads; those that are no config attribute go to ``__init__``)."""

    hub: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    device: Any = None
    device_map: dict[str, Any] | str | None = None
    max_memory: dict[Any, Any] | None = None
    offload_folder: Any = None
    offload_buffers: bool = False
    ignore_mismatched_sizes: bool = False
    output_loading_info: bool = False
    config_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def overrides(self) -> list[str]:
        """The arguments that can make the model built differ from the checkpoint's own: config overrides and
        ``__init__`` arguments (its task head may then differ, which ``ignore_mismatched_sizes`` governs)."""
        return sorted((set(self.config_kwargs) - set(READ_BY_CONFIG)) | (set(self.build) - set(SHAPING)))

    @property
    def changes_the_model(self) -> bool:
        return bool(self.overrides)


def sort_arguments(kwargs: dict[str, Any]) -> LoadOptions:
    """Sort ``from_pretrained``'s ``**kwargs`` (not changed) into :class:`LoadOptions`.

    Raises:
        ConfigError: An option of transformers' ``from_pretrained`` that this loader cannot honour, naming it, why,
            and how to load with it.
    """
    kwargs = dict(kwargs)
    for name, (off, why) in UNSUPPORTED.items():
        if name in kwargs and not any(kwargs[name] is v or kwargs[name] == v for v in off):
            shown = repr(kwargs[name]) if len(repr(kwargs[name])) <= 60 else f"<{type(kwargs[name]).__name__}>"
            raise ConfigError(
                f"{name}={shown} is not supported by ElasticViTModel.from_pretrained ({why}). Load the size "
                "you want, save it (model.save_pretrained(folder)) and load that folder with transformers: "
                f"AutoModel...from_pretrained(folder, trust_remote_code=True, {name}=...).")
        kwargs.pop(name, None)
    for name in IGNORED_BY_TRANSFORMERS + NO_EFFECT:
        kwargs.pop(name, None)
    options = LoadOptions(hub={k: kwargs.pop(k) for k in HUB_KWARGS if k in kwargs},
                          ignore_mismatched_sizes=bool(kwargs.pop("ignore_mismatched_sizes", False)),
                          output_loading_info=bool(kwargs.pop("output_loading_info", False)))
    dtype, torch_dtype = kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None)
    dtype = dtype if dtype is not None else torch_dtype
    options.build["dtype"] = None if dtype == "auto" else dtype
    for name in ("attn_implementation", "experts_implementation"):
        if kwargs.get(name) is not None:
            options.build[name] = kwargs.pop(name)
        kwargs.pop(name, None)
    options.max_memory = kwargs.pop("max_memory", None)
    options.device, options.device_map = placement(kwargs.pop("device_map", None), options.max_memory)
    options.offload_folder = kwargs.pop("offload_folder", None)
    options.offload_buffers = bool(kwargs.pop("offload_buffers", False))
    if options.device_map is None and options.offload_folder is not None:
        raise ConfigError(f"offload_folder={options.offload_folder!r} holds the weights a device_map sends to "
                          "'disk'; pass a device_map dict that does (e.g. {'vit.encoder.layer.11': 'disk', ...}) "
                          "or leave offload_folder out.")
    options.config_kwargs = kwargs
    return options


#: The strategies accelerate's ``infer_auto_device_map`` computes a device map by, as transformers names them.
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def placement(device_map: Any, max_memory: Any = None) -> tuple[Any, dict[str, Any] | str | None]:
    """``(device, None)`` for a ``device_map`` that names one device (``"auto"`` without ``max_memory``: the
    accelerator torch sees, its current device, else the CPU; a dict sending every module to one device), or
    ``(None, map)`` for accelerate to place the sliced model by: a dict that spreads it over several devices or
    offloads part of it, or a strategy (:data:`STRATEGIES`; ``"auto"`` with ``max_memory``) to compute one by.

    Raises:
        ConfigError: ``max_memory`` without a strategy to use it, or an empty dict.
    """
    if max_memory is not None and device_map not in STRATEGIES:
        raise ConfigError(f"max_memory={max_memory!r} caps what accelerate places on each device, which needs "
                          f"device_map='auto', 'balanced' or 'sequential' (got device_map={device_map!r}).")
    if isinstance(device_map, str) and device_map in STRATEGIES and (device_map != "auto" or max_memory is not None):
        return None, device_map
    if isinstance(device_map, dict):
        devices = {device_name(d) for d in device_map.values()}
        if not devices:
            raise ConfigError("device_map={} places nothing: give {'': 'cpu'} (one device) or a dict of module "
                              "names to devices.")
        if len(devices) > 1 or devices == {"disk"}:
            return None, dict(device_map)
        device_map = devices.pop()
    if device_map == "auto":
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return (torch.device(accelerator.type, torch.accelerator.current_device_index()) if accelerator
                else "cpu"), None
    return device_map, None


def model_dtype(dtype: Any, config: Any) -> torch.dtype:
    """The dtype asked for, else the checkpoint's own (``"auto"`` included), else float32."""
    dtype = dtype if dtype is not None else getattr(config, "dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


__all__ = ["IGNORED_BY_TRANSFORMERS", "LoadOptions", "NO_EFFECT", "READ_BY_CONFIG", "SHAPING", "UNSUPPORTED",
           "STRATEGIES", "model_dtype", "placement", "sort_arguments"]
