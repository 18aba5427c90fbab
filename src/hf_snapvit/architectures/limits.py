"""The sizes no real model has: a config or a stored ranking beyond them is corrupt (or hostile) and is refused,
naming the field, before anything of that size is built."""

from __future__ import annotations

import numbers
from typing import Any

from transformers import PretrainedConfig

from . import vision_config
from ..errors import CheckpointError

try:  # what transformers' strict config classes raise for a value they refuse (huggingface_hub >= 1.0)
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # pragma: no cover - an older huggingface_hub: configs raise ValueError
    StrictDataclassError = ValueError
#: What reading a config, or building a model from one, raises where the config is at fault.
CONFIG_ERRORS = (ValueError, StrictDataclassError)

#: The largest model a config or a stored ranking may describe; beyond these it is corrupt (or hostile) and is refused
#: before anything of that size is built. ViT-22B has 48 blocks of 48 heads and 24,576 neurons, width 6,144.
MAX_LAYERS = 1024
MAX_WIDTH = 2**20  # heads, head width, hidden and FFN widths, tokens, image and patch sides, channels
MAX_UNITS, MAX_MATRIX = 2**24, 2**32  # heads and neurons of all blocks (what a ranking decodes); one weight matrix


# (least, largest) value of the integer fields of a stored ModelShape and of a config; others: 1 to MAX_WIDTH.
_RANGES = {"num_layers": (1, MAX_LAYERS), "num_hidden_layers": (1, MAX_LAYERS), "ffn_matrices": (2, 3),
           "params_per_head": (1, None), "params_per_neuron": (1, None), "fixed_params": (0, None),
           "head_flops": (0, None), "num_register_tokens": (0, MAX_WIDTH), "attention_keys": (0, MAX_WIDTH)}


def out_of_range(name: str, value: Any) -> str:
    """Why ``value`` is no valid ``name`` (not an integer, too small, too large), or ``""``."""
    low, high = _RANGES.get(name, (1, MAX_WIDTH))
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return f"must be an integer, got {type(value).__name__}"
    if value < low:
        return f"must be >= {low}"
    return f"is too large: no supported model has more than {high}" if high is not None and value > high else ""


_CONFIG_SIZES = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "image_size",
                 "patch_size", "num_channels", "num_patches", "num_register_tokens")


def check_config_sizes(config: PretrainedConfig) -> None:
    """Raise :class:`CheckpointError` naming the field if the config has sizes no model has (``intermediate_size =
    1e12``, a million blocks), before anything is built from it: building would exhaust memory or time."""
    vision = vision_config(config)

    def refuse(name: str, value: Any, why: str) -> CheckpointError:
        return CheckpointError(f"The config (config.json) has {name}={value!r}, which {why}: the config is corrupt. "
                               "Fix the value or re-save the checkpoint with save_pretrained.")

    for name in _CONFIG_SIZES:
        value = getattr(vision, name, None)
        for item in value if isinstance(value, (list, tuple)) else [] if value is None else [value]:
            if why := out_of_range(name, item):
                raise refuse(name, value, why)
    hidden = getattr(vision, "hidden_size", None) or 1
    ratio = getattr(vision, "mlp_ratio", None)
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, numbers.Real)
                              or not 0 < ratio * hidden <= MAX_WIDTH):
        raise refuse("mlp_ratio", ratio, f"does not give an FFN width between 1 and {MAX_WIDTH}")
    width = max(getattr(vision, "intermediate_size", None) or 1, int((ratio or 0) * hidden))
    layers = getattr(vision, "num_hidden_layers", None) or 1
    if hidden * width > MAX_MATRIX or layers * width > MAX_UNITS:
        raise refuse("intermediate_size", width, f"is too large with hidden_size={hidden} and "
                     f"num_hidden_layers={layers}")
