"""Every exception hf_snapvit raises, in one place.

Each error inherits from :class:`SnapViTError` (catch everything from this package) and from the matching builtin:
``ValueError`` for bad input of any kind (settings, data, files, budgets), so callers that already catch
``ValueError`` keep working (:class:`CheckpointNotFoundError`, a checkpoint that is not there, is an ``OSError``
too, as transformers' own error for it, and so is :class:`DiskFullError`, a save that ran out of space, with the
OS's ``errno``); ``RuntimeError`` only for :class:`ProcessFailedError`, a failure reported
by another process of a multi-process run, and :class:`MissingExtraError` (also an ``ImportError``), an optional
dependency that is not installed. Nothing raises the bare base class.
"""

from __future__ import annotations

import os


class SnapViTError(Exception):
    """Base class of every error raised by hf_snapvit."""


class ConfigError(SnapViTError, ValueError):
    """A setting or argument is out of range: an unknown method or preset, an impossible search budget, ..."""


class DataError(SnapViTError, ValueError):
    """Calibration or evaluation images are unusable: empty, undecodable, of the wrong type or shape, no labels."""


class CheckpointError(SnapViTError, ValueError):
    """A checkpoint or output folder cannot be read or written as asked."""


class CheckpointNotFoundError(CheckpointError, OSError):
    """A local checkpoint folder does not exist or holds no ``config.json``. An ``OSError`` too, as transformers
    raises for a checkpoint it cannot find, so ``except OSError`` keeps working."""


class DiskFullError(CheckpointError, OSError):
    """A save ran out of disk space (or quota). The message says which folder, that what was there is untouched, and
    how much space is free; ``errno`` is the OS's (``errno.ENOSPC``), ``filename`` the folder, and ``__cause__`` the
    original error. An ``OSError`` too, so ``except OSError`` and checks of ``errno`` keep working."""

    def __init__(self, message: str, code: int, filename: str | None = None) -> None:
        super().__init__(message)
        self.errno, self.strerror, self.filename = code, os.strerror(code), filename

    def __str__(self) -> str:
        return str(self.args[0])  # OSError's own form would be "[Errno 28] No space left on device: 'folder'"

    def __reduce__(self) -> tuple:
        return (type(self), (self.args[0], self.errno, self.filename))  # OSError's would pass the wrong arguments


class UnsupportedArchitectureError(SnapViTError, ValueError):
    """The model's ``model_type`` has no entry in the architecture registry."""


class RankingFormatError(SnapViTError, ValueError):
    """An ``elastic_ranking`` is missing, corrupt, too new, or does not match the model."""


class BudgetError(SnapViTError, ValueError):
    """A sparsity, parameter or GFLOP budget is out of range."""


class XNESError(SnapViTError, ValueError):
    """Invalid argument, fitness or state given to :class:`~hf_snapvit.pruning.xnes.XNES`."""


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
    "CheckpointNotFoundError",
    "ConfigError",
    "CorrectionError",
    "DataError",
    "DiskFullError",
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
