"""Numbers as the text renderers of the subcommands print them."""

from __future__ import annotations

from collections.abc import Sequence


def millions(n: int) -> str:
    """A parameter count for people: ``5.53 M``, ``12.3 k``, ``7``."""
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def gflops(value: float) -> str:
    """GFLOPs with enough digits for tiny models."""
    return f"{value:.3f}" if value >= 0.01 else f"{value:.3g}"


def widths(values: Sequence[int]) -> str:
    """Per-block widths, space-separated."""
    return " ".join(str(v) for v in values)
