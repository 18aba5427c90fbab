"""hf_snapvit: elastic vision transformers for Hugging Face transformers.

Rank every attention head and FFN neuron once (:func:`rank`), store the ranking in a normal checkpoint
(:func:`save_elastic`), and load any smaller model from it in one call (:meth:`ElasticViTModel.from_pretrained`).
"""

from ._version import __version__
from .architectures import ArchitectureSpec, MlpSpec, get_spec, register_architecture, supported_model_types
from .budget import ModelShape, backbone_parameters, estimate_gflops, layer_widths, model_shape
from .checkpoint import save_elastic
from .correction import CorrectionConfig, CorrectionError, CorrectionSummary, correct_model_
from .data import load_image_dataset
from .errors import BudgetError, RankingFormatError, SnapViTError, UnsupportedArchitectureError
from .evaluation import EvaluationResult, Evaluator, LinearProbeConfig
from .hub import HubUploadError, push_to_hub
from .model_card import make_model_card, write_model_card
from .modeling import ElasticViTModel
from .plotting import plot_allocation
from .rank import available_methods, rank, register_method
from .ranking import FORMAT_VERSION, ElasticRanking, KeepCounts
from .slicing import slice_model_
from .snapvit import SnapViTConfig, SnapViTPruner
from .sweep import SweepResult, run_sweep
from .xnes import XNES, XNESResult

__all__ = [
    "__version__",
    "ArchitectureSpec",
    "BudgetError",
    "CorrectionConfig",
    "CorrectionError",
    "CorrectionSummary",
    "ElasticRanking",
    "ElasticViTModel",
    "EvaluationResult",
    "Evaluator",
    "FORMAT_VERSION",
    "HubUploadError",
    "KeepCounts",
    "LinearProbeConfig",
    "MlpSpec",
    "ModelShape",
    "RankingFormatError",
    "SnapViTConfig",
    "SnapViTError",
    "SnapViTPruner",
    "SweepResult",
    "UnsupportedArchitectureError",
    "XNES",
    "XNESResult",
    "available_methods",
    "backbone_parameters",
    "correct_model_",
    "estimate_gflops",
    "get_spec",
    "layer_widths",
    "load_image_dataset",
    "make_model_card",
    "model_shape",
    "plot_allocation",
    "push_to_hub",
    "rank",
    "register_architecture",
    "register_method",
    "run_sweep",
    "save_elastic",
    "slice_model_",
    "supported_model_types",
    "write_model_card",
]
