"""Module paths that moved: the shared helpers (``hf_snapvit.distributed``, ``hf_snapvit.files``, ...) live in
:mod:`hf_snapvit.utils` and the plots in :mod:`hf_snapvit.plots`. Code written against an old path keeps working:
``import hf_snapvit.distributed`` gives a stand-in module, and each name read from it is the same object as in its
new home, with a ``FutureWarning`` naming that home. The old paths go in a later release.

The stand-ins come from an import finder placed last on ``sys.meta_path``, so they are made only for the listed
names, only when no real module of that name exists, and only when some code imports one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any

#: Old module path -> the modules its names moved to, searched in order.
MOVED: dict[str, tuple[str, ...]] = {
    "hf_snapvit.distributed": ("hf_snapvit.utils.distributed", "hf_snapvit.utils.precision"),
    "hf_snapvit.extras": ("hf_snapvit.utils.extras",),
    "hf_snapvit.files": ("hf_snapvit.utils.files",),
    "hf_snapvit.logs": ("hf_snapvit.utils.logs",),
    "hf_snapvit.plotting": ("hf_snapvit.plots",),
    "hf_snapvit.sources": ("hf_snapvit.utils.sources",),
    "hf_snapvit.validation": ("hf_snapvit.utils.validation",),
}


class MovedModule(types.ModuleType):
    """The stand-in for a moved module: reads each name from its new home, with a ``FutureWarning``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for target in MOVED[self.__name__]:
            module = importlib.import_module(target)
            if hasattr(module, name):
                warnings.warn(f"{self.__name__} is deprecated and will be removed in a later release; import {name} "
                              f"from {target} instead (the same object: `from {target} import {name}`).",
                              FutureWarning, stacklevel=2)
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        for target in MOVED[self.__name__]:
            module = importlib.import_module(target)
            names |= set(getattr(module, "__all__", ()))
        return sorted(names)


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return MovedModule(spec.name, f"Deprecated: moved to {', '.join(MOVED[spec.name])}.")

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())


__all__ = ["MOVED", "MovedModule", "install"]
