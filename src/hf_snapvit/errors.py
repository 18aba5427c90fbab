"""Every exception hf_snapvit raises, in one place.

Each error inherits from :class:`SnapViTError` (catch everything from this package) and from the matching builtin:
``ValueError`` for bad input of any kind (settings, data, files, budgets), so callers that already catch
``ValueError`` keep working; ``RuntimeError`` only for :class:`ProcessFailedError`, a failure reported by another
process of a multi-process run, and :class:`MissingExtraError` (also an ``ImportError``), an optional dependency that
is not installed. Nothing raises the bare base class.
"""

from __future__ import annotations


class SnapViTError(Exception):
    """Base class of every error raised by hf_snapvit."""


class ConfigError(SnapViTError, ValueError):
    """A setting or argument is out of range: an unknown method or preset, an impossible search budget, ..."""


class DataError(SnapViTError, ValueError):
    """Calibration or evaluation images are unusable: empty, undecodable, of the wrong type or shape, no labels."""


class CheckpointError(SnapViTError, ValueError):
    """A checkpoint or output folder cannot be read or written as asked."""


class UnsupportedArchitectureError(SnapViTError, ValueError):
    """The model's ``model_type`` has no entry in the architecture registry."""


class RankingFormatError(SnapViTError, ValueError):
    """An ``elastic_ranking`` is missing, corrupt, too new, or does not match the model."""


class BudgetError(SnapViTError, ValueError):
    """A sparsity, parameter or GFLOP budget is out of range."""


class XNESError(SnapViTError, ValueError):
    """Invalid argument, fitness or state given to :class:`~hf_snapvit.xnes.XNES`."""


class CorrectionError(SnapViTError, ValueError):
    """Bad correction settings or calibration data, or a Hessian that cannot be factorised."""


class RecoveryError(SnapViTError, ValueError):
    """Bad recovery settings, data, or a student that is not a slice of its teacher."""


class EvaluationError(SnapViTError, ValueError):
    """Evaluation data or settings are unusable (wrong shapes, missing labels, impossible metric)."""


class SweepError(SnapViTError, ValueError):
    """A sweep's rankings, sparsities or output folder are unusable."""


class BenchmarkError(SnapViTError, ValueError):
    """Benchmark settings are out of range."""


class ModelCardError(SnapViTError, ValueError):
    """A model card cannot be written from the given checkpoint, results or metadata."""


class HubUploadError(SnapViTError, ValueError):
    """An upload to the Hugging Face Hub cannot start: no token, a bad repo id, or an incomplete checkpoint."""


class MissingExtraError(SnapViTError, ImportError, RuntimeError):
    """A feature needs an optional dependency that is not installed; the message names the extra to install
    (``pip install "hf-snapvit[plots]"``). An ``ImportError`` too, so ``except ImportError`` keeps working."""


class ProcessFailedError(SnapViTError, RuntimeError):
    """Another process of a multi-process (``accelerate launch``) run failed; the message is that process's error."""


__all__ = [
    "BenchmarkError",
    "BudgetError",
    "CheckpointError",
    "ConfigError",
    "CorrectionError",
    "DataError",
    "EvaluationError",
    "HubUploadError",
    "MissingExtraError",
    "ModelCardError",
    "ProcessFailedError",
    "RankingFormatError",
    "RecoveryError",
    "SnapViTError",
    "SweepError",
    "UnsupportedArchitectureError",
    "XNESError",
]
