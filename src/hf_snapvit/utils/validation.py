"""The settings dialect shared by every configuration dataclass: :class:`Settings` gives ``to_dict`` and
``from_dict`` (unknown keys refused with the list of known ones) and argument checks that raise the class's own
``error_class`` (:class:`~hf_snapvit.errors.ConfigError` unless a wing names its own), each naming the setting, its
value and the valid range."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import MISSING, asdict, fields
from typing import Any, ClassVar, TypeVar

from ..errors import ConfigError, SnapViTError

S = TypeVar("S", bound="Settings")


def require_int(owner: str, name: str, value: Any, minimum: int, *, optional: bool = False,
                error: type[SnapViTError] = ConfigError) -> None:
    """Raise ``error`` unless ``value`` is an integer >= ``minimum`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise error(f"{owner}({name}={value!r}): {name} must be an integer >= {minimum}"
                    + (" or None" if optional else "") + ".")


def require_choice(owner: str, name: str, value: Any, choices: tuple[str, ...], *,
                   error: type[SnapViTError] = ConfigError) -> None:
    """Raise ``error`` unless ``value`` is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise error(f"{owner}({name}={value!r}): {name} must be one of {', '.join(map(repr, choices))}.")


def is_real(value: Any) -> bool:
    """A finite real number (not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _plain(value: Any) -> Any:
    """JSON's shapes: tuples become lists (a config read back from JSON then compares equal to the one written)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Settings:
    """Base of the settings dataclasses (frozen dataclasses that subclass it): one ``to_dict``/``from_dict`` and
    checks raising :attr:`error_class`, the wing's own error (``ConfigError``, ``CorrectionError``, ...)."""

    error_class: ClassVar[type[SnapViTError]] = ConfigError

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict: nested settings as dicts, tuples as lists."""
        return _plain(asdict(self))  # type: ignore[call-overload]

    @classmethod
    def setting_names(cls) -> list[str]:
        """The names of the settings (the dataclass fields given to the constructor), sorted."""
        return sorted(f.name for f in fields(cls) if f.init)  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[S], data: Mapping[str, Any]) -> S:
        """Inverse of :meth:`to_dict`: unknown keys are refused with the list of known ones; nested settings are
        rebuilt from their dicts and lists become tuples where the field's default is one."""
        known = {f.name: f for f in fields(cls) if f.init}  # type: ignore[arg-type]
        if not isinstance(data, Mapping):
            raise cls.error_class(f"{cls.__name__}.from_dict takes a dict of settings, got {type(data).__name__}.")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise cls.error_class(f"Unknown {cls.__name__} settings {unknown}; known: {sorted(known)}.")
        values = {}
        for name, value in data.items():
            spec = known[name]
            default = spec.default_factory() if spec.default_factory is not MISSING else spec.default
            if isinstance(default, Settings) and isinstance(value, Mapping):
                value = type(default).from_dict(value)
            elif isinstance(default, tuple) and isinstance(value, list):
                value = tuple(value)
            values[name] = value
        return cls(**values)

    # The checks: each names the class, the setting, its value and what is valid.
    def _owner(self) -> str:
        return type(self).__name__

    def _check_int(self, name: str, minimum: int, *, optional: bool = False) -> None:
        require_int(self._owner(), name, getattr(self, name), minimum, optional=optional, error=self.error_class)

    def _check_choice(self, name: str, choices: tuple[str, ...]) -> None:
        require_choice(self._owner(), name, getattr(self, name), choices, error=self.error_class)

    def _check_bool(self, name: str) -> None:
        if not isinstance(getattr(self, name), bool):
            raise self.error_class(f"{self._owner()}({name}={getattr(self, name)!r}): give True or False.")

    def _check_real(self, name: str, low: float | None = None, high: float | None = None, *,
                    low_open: bool = False, high_open: bool = False, hint: str = "") -> None:
        """A finite number in the interval from ``low`` to ``high`` (closed unless ``*_open``; ``None``: unbounded)."""
        value = getattr(self, name)
        ok = is_real(value) and (low is None or (value > low if low_open else value >= low)) and (
            high is None or (value < high if high_open else value <= high))
        if not ok:
            left = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
            right = "" if high is None else f"{high:g}" + (")" if high_open else "]")
            where = (f"in {left}, {right}" if low is not None and high is not None
                     else f"{'>' if low_open else '>='} {low:g}" if low is not None
                     else f"{'<' if high_open else '<='} {high:g}" if high is not None else "finite")
            raise self.error_class(f"{self._owner()}({name}={value!r}): {name} must be a finite number {where}"
                                   + (f", {hint}" if hint else "") + ".")

    def _check_pair(self, name: str, *, low_open: bool, hint: str = "") -> None:
        """Two fractions ``(low, high)`` with ``0 <(=) low <= high <= 1``; stored as a tuple."""
        value = getattr(self, name)
        ok = (isinstance(value, (tuple, list)) and len(value) == 2 and all(map(is_real, value))
              and (0 < value[0] if low_open else 0 <= value[0]) and value[0] <= value[1] <= 1)
        if not ok:
            lower = "0 < low" if low_open else "0 <= low"
            raise self.error_class(f"{self._owner()}({name}={value!r}): {name} must be two fractions (low, high) "
                                   f"with {lower} <= high <= 1" + (f", e.g. {hint}" if hint else "") + ".")
        object.__setattr__(self, name, tuple(value))

    def _check_folder(self, name: str, example: str) -> None:
        """A folder given as a str or path (or ``None``), stored as a str."""
        value = getattr(self, name)
        if value is None:
            return
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise self.error_class(f"{self._owner()}({name}={value!r}): give a folder as a str or path, e.g. "
                                   f"{name}={example!r}.")
        object.__setattr__(self, name, os.fspath(value))

    def _check_settings(self, name: str, kind: type, example: str) -> None:
        if not isinstance(getattr(self, name), kind):
            raise self.error_class(f"{self._owner()}({name}={getattr(self, name)!r}): {name} must be a "
                                   f"{kind.__name__}, e.g. {example}.")
