"""hf_snapvit: elastic vision transformers for Hugging Face transformers.

Rank every attention head and FFN neuron once (:func:`rank`), store the ranking in a normal checkpoint
(:func:`save_elastic`), and load any smaller model from it in one call (:meth:`ElasticViTModel.from_pretrained`),
or load it once with ``switchable=True`` and change its size in place (``model.set_budget(...)``), by sparsity,
parameters, GFLOPs or measured latency (:func:`measure_latency`).

The names here are the public API. The research harness (sweeps, benchmarks, the xNES optimiser, scores) and the
in-place surgery (``surgery.slicing.slice_model_``, ``correction.correct_model_``) stay importable from their submodules.
Names whose features need an optional extra (``plot_allocation``: ``hf-snapvit[plots]``) or the evaluation harness
(``evaluate``) are imported on first use, so ``import hf_snapvit`` and loading a model import neither matplotlib,
evaluate nor datasets.
"""

from importlib import import_module
from typing import Any

from ._version import __version__
from .utils import moved as _moved
from .architectures import (ArchitectureSpec, MlpSpec, TaskModelSpec, register_architecture, register_task_model,
                            supported_model_types)
from .architectures.attention import UNPADDED_SDPA, register_unpadded_sdpa
from .architectures.budget import backbone_parameters
from .architectures.flops import estimate_gflops
from .correction import CorrectionConfig
from .data.coverage import CoverageWarning
from .data.images import load_image_dataset
from .errors import (BudgetError, CheckpointError, ConfigError, DataError, DiskFullError, RankingFormatError,
                     SnapViTError, UnsupportedArchitectureError)
from .publishing.hub import push_to_hub
from .loading.latency_table import LatencyTable, measure_latency
from .pruning.methods import available_methods, rank, register_method
from .pruning.methods.snapvit import SnapViTConfig, SnapViTPruner
from .loading.modeling import ElasticViTModel
from .architectures.budget import KeepCounts
from .elastic.ranking import ElasticRanking, Floors
from .recovery import RecoveryConfig, recover
from .fitting import correct
from .data.sampling import StreamSource
from .publishing.saving import add_prefix_correction, save_elastic
from .pruning.scoring import ScoreConfig
from .loading.switchable import ElasticBudget
from .data.views import MultiCropConfig

_moved.install()  # the old module paths (hf_snapvit.distributed, hf_snapvit.plotting, ...) keep importing

__all__ = [
    "__version__",
    "ArchitectureSpec",
    "BudgetError",
    "CheckpointError",
    "ConfigError",
    "CorrectionConfig",
    "CoverageWarning",
    "DataError",
    "DiskFullError",
    "ElasticBudget",
    "ElasticRanking",
    "ElasticViTModel",
    "Floors",
    "LatencyTable",
    "MlpSpec",
    "KeepCounts",
    "MultiCropConfig",
    "RankingFormatError",
    "RecoveryConfig",
    "ScoreConfig",
    "SnapViTConfig",
    "SnapViTError",
    "SnapViTPruner",
    "StreamSource",
    "TaskModelSpec",
    "UNPADDED_SDPA",
    "UnsupportedArchitectureError",
    "available_methods",
    "backbone_parameters",
    "correct",
    "estimate_gflops",
    "evaluate",
    "load_image_dataset",
    "measure_latency",
    "plot_allocation",
    "push_to_hub",
    "rank",
    "recover",
    "register_architecture",
    "register_method",
    "register_task_model",
    "save_elastic",
    "add_prefix_correction",
    "supported_model_types",
]

# So that attn_implementation=UNPADDED_SDPA works in any from_pretrained once hf_snapvit is imported.
register_unpadded_sdpa()

# Public name -> the submodule that defines it, imported on first access (PEP 562).
_LAZY = {"evaluate": ".evaluation", "plot_allocation": ".plots"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
