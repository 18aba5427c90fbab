"""Fitting an elastic checkpoint's weights to one size: :func:`correct` (load dense, correct, slice), beside
:func:`hf_snapvit.recover` (distil a loaded size from its dense model).

The loader only loads: it runs the :class:`~hf_snapvit.loading.fit_step.FitStep` this wing hands it
(:mod:`.steps`), so ``loading/`` imports neither correction nor recovery. Importing this package registers the builder
that keeps ``from_pretrained(correction_data=..., recovery_data=...)`` working, with a ``FutureWarning``, for one
release (``hf_snapvit`` imports it, so every load sees it).

May import: loading, correction, recovery and everything they may import. Never imports the pruner, evaluation,
benchmarks, publishing or the CLI.
"""

from __future__ import annotations

from ..loading.fit_step import register_load_fitting
from .steps import correct, fit_step

register_load_fitting(fit_step)

__all__ = ["correct", "fit_step"]
