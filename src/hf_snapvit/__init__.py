"""hf_snapvit: elastic vision transformers for Hugging Face transformers.

Rank every attention head and FFN neuron once (:func:`rank`), store the ranking in a normal checkpoint
(:func:`save_elastic`), and load any smaller model from it in one call (:meth:`ElasticViTModel.from_pretrained`).

The names here are the public API. The research harness (sweeps, benchmarks, the xNES optimiser, scores) and the
in-place surgery (``slicing.slice_model_``, ``correction.correct_model_``) stay importable from their submodules.
"""

from ._version import __version__
from .architectures import supported_model_types
from .budget import backbone_parameters, estimate_gflops
from .checkpoint import save_elastic
from .correction import CorrectionConfig
from .data import load_image_dataset
from .errors import (BudgetError, CheckpointError, ConfigError, DataError, RankingFormatError, SnapViTError,
                     UnsupportedArchitectureError)
from .evaluation import evaluate
from .hub import push_to_hub
from .methods import available_methods, rank, register_method
from .methods.snapvit import SnapViTConfig, SnapViTPruner
from .modeling import ElasticViTModel
from .plotting import plot_allocation
from .budget import KeepCounts
from .ranking import ElasticRanking, Floors
from .recovery import RecoveryConfig, recover
from .scoring import ScoreConfig
from .views import MultiCropConfig

__all__ = [
    "__version__",
    "BudgetError",
    "CheckpointError",
    "ConfigError",
    "CorrectionConfig",
    "DataError",
    "ElasticRanking",
    "ElasticViTModel",
    "Floors",
    "KeepCounts",
    "MultiCropConfig",
    "RankingFormatError",
    "RecoveryConfig",
    "ScoreConfig",
    "SnapViTConfig",
    "SnapViTError",
    "SnapViTPruner",
    "UnsupportedArchitectureError",
    "available_methods",
    "backbone_parameters",
    "estimate_gflops",
    "evaluate",
    "load_image_dataset",
    "plot_allocation",
    "push_to_hub",
    "rank",
    "recover",
    "register_method",
    "save_elastic",
    "supported_model_types",
]
