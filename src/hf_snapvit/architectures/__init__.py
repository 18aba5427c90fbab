"""Where each supported transformers architecture keeps its attention heads and FFN neurons.

Architecture knowledge is data: one :class:`ArchitectureSpec` per vision transformer ``model_type``
(:mod:`.families`) and one :class:`TaskModelSpec` per task model built on one (:mod:`.task_models`), looked up in
the registry (:mod:`.registry`) and reached in a model through :mod:`.parts`. Supporting a new vision transformer means registering one spec with
:func:`register_architecture`; a new task model, one with :func:`register_task_model`.

The first stage: may import only the shared modules (errors, validation). Discovery (:mod:`.discovery`) builds on
the registry and installs itself there, so the registry never imports it.
"""

from .parts import (ffn_inputs, ffn_rows, find_attribute, get_attention, get_backbone, get_layers, get_mlp,
                    get_projection, head_dim, head_rows, head_tables, num_heads, qkv_projections, qkv_rows, row_blocks,
                    set_attribute)
from .registry import (ArchitectureSpec, EmbeddingKind, FeatureKind, MlpSpec, TaskModelSpec, get_spec, model_class,
                       register_architecture, register_task_model, supported_model_types, task_model_spec,
                       used_layers, vision_config)
from . import discovery, families, task_models  # noqa: E402,F401  (registers the specs, installs discovery)

__all__ = ["ArchitectureSpec", "EmbeddingKind", "FeatureKind", "MlpSpec", "TaskModelSpec", "ffn_inputs", "ffn_rows",
           "find_attribute", "get_attention", "get_backbone", "get_layers", "get_mlp", "get_projection", "get_spec",
           "head_dim", "head_rows", "head_tables", "model_class", "num_heads", "qkv_projections", "qkv_rows",
           "register_architecture", "register_task_model", "row_blocks", "set_attribute", "supported_model_types",
           "task_model_spec", "used_layers", "vision_config"]
