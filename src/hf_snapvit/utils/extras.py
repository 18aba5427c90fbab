"""Optional dependencies: which extra of ``hf-snapvit`` installs each, and the error that names it.

The core install is what loading, slicing and ranking need. Plots need ``matplotlib`` (``hf-snapvit[plots]``),
the ``evaluate`` metrics need ``evaluate`` (``hf-snapvit[eval]``); ``hf-snapvit[all]`` installs both. A feature that
needs one imports it through :func:`require_extra`, so a missing package fails with the ``pip install`` line that
fixes it instead of a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtraError

# Importable module -> the extra of hf-snapvit that installs it.
EXTRAS: dict[str, str] = {"matplotlib": "plots", "evaluate": "eval"}


def install_hint(module: str) -> str:
    """The command that installs ``module`` (a key of :data:`EXTRAS`), e.g. ``pip install "hf-snapvit[plots]"``."""
    return f'pip install "hf-snapvit[{EXTRAS[module]}]"'


def require_extra(module: str, feature: str) -> ModuleType:
    """Import the optional dependency ``module`` (a key of :data:`EXTRAS`) that ``feature`` needs.

    Args:
        module: Top-level module name, e.g. ``"matplotlib"``.
        feature: What needs it, for the message (e.g. ``"the allocation heatmap"``).

    Returns:
        The imported module.

    Raises:
        MissingExtraError: ``module`` is not installed (or is blocked); the message names the extra to install.
    """
    if module not in EXTRAS:
        raise KeyError(f"{module!r} is not an optional dependency of hf-snapvit; known: {sorted(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f"{feature} needs {module}, which is not installed ({error}). Install it with: {install_hint(module)} "
            '(or pip install "hf-snapvit[all]" for every optional feature).',
            name=module,
        ) from None


def has_extra(module: str) -> bool:
    """Whether the optional dependency ``module`` can be imported."""
    try:
        require_extra(module, "this check")
    except MissingExtraError:
        return False
    return True
