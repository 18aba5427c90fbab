"""hf_snapvit: elastic vision transformers for Hugging Face transformers.

Rank every attention head and FFN neuron once (:func:`rank`), store the ranking in a normal checkpoint
(:func:`save_elastic`), and load any smaller model from it in one call (:meth:`ElasticViTModel.from_pretrained`).
"""

from ._version import __version__
from .architectures import ArchitectureSpec, MlpSpec, get_spec, register_architecture, supported_model_types
from .budget import ModelShape, backbone_parameters, estimate_gflops, layer_widths, model_shape
from .checkpoint import save_elastic
from .errors import BudgetError, RankingFormatError, SnapViTError, UnsupportedArchitectureError
from .modeling import ElasticViTModel
from .rank import available_methods, rank, register_method
from .ranking import FORMAT_VERSION, ElasticRanking, KeepCounts
from .slicing import slice_model_
from .snapvit import SnapViTConfig, SnapViTPruner
from .xnes import XNES, XNESResult

__all__ = [
    "__version__",
    "ArchitectureSpec",
    "BudgetError",
    "ElasticRanking",
    "ElasticViTModel",
    "FORMAT_VERSION",
    "KeepCounts",
    "MlpSpec",
    "ModelShape",
    "RankingFormatError",
    "SnapViTConfig",
    "SnapViTError",
    "SnapViTPruner",
    "UnsupportedArchitectureError",
    "XNES",
    "XNESResult",
    "available_methods",
    "backbone_parameters",
    "estimate_gflops",
    "get_spec",
    "layer_widths",
    "model_shape",
    "rank",
    "register_architecture",
    "register_method",
    "save_elastic",
    "slice_model_",
    "supported_model_types",
]
