"""Argument checks shared by the settings dataclasses: each raises a ConfigError naming the setting, its value and
the valid range."""

from __future__ import annotations

import math
import numbers
from typing import Any

from .errors import ConfigError


def require_int(owner: str, name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    """Raise a ConfigError unless ``value`` is an integer >= ``minimum`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"{owner}({name}={value!r}): {name} must be an integer >= {minimum}"
                          + (" or None" if optional else "") + ".")


def require_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise a ConfigError unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{owner}({name}={value!r}): {name} must be one of {', '.join(map(repr, choices))}.")


def is_real(value: Any) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
