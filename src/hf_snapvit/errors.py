"""Exceptions raised by hf_snapvit.

Every error inherits from both :class:`SnapViTError` (catch everything from this package) and the matching builtin
(``ValueError``), so callers that already catch ``ValueError`` keep working.
"""

from __future__ import annotations


class SnapViTError(Exception):
    """Base class of every error raised by hf_snapvit."""


class UnsupportedArchitectureError(SnapViTError, ValueError):
    """The model's ``model_type`` has no entry in the architecture registry."""


class RankingFormatError(SnapViTError, ValueError):
    """An ``elastic_ranking`` is missing, corrupt, too new, or does not match the model."""


class BudgetError(SnapViTError, ValueError):
    """A sparsity, parameter or GFLOP budget is out of range."""
