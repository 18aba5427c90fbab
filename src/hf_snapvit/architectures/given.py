"""What ``rank``, ``save_elastic`` and ``SnapViTPruner.fit`` take as a model: a transformers ``PreTrainedModel`` with
its weights. Anything else is refused in one line naming what to pass instead, before any part of it is read: a
``torch.compile`` wrapper or a PEFT model (their module trees are not the model's own, and a PEFT model's adapters
are no part of the weights a checkpoint would hold), a model whose weights are on the meta device (nothing to rank or
save; weights accelerate offloaded, which its hooks hold, are values and pass), a module that is no
``PreTrainedModel`` (no config to store), and a model without blocks."""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from transformers import PreTrainedModel

from ..errors import UnsupportedArchitectureError
from .placement import offloaded_by_hooks


def check_given(model: Any) -> None:
    """Refuse, with an :class:`~hf_snapvit.errors.UnsupportedArchitectureError` of one line, a ``model`` that is no
    transformers model with its weights (see the module docstring)."""
    name = type(model).__name__
    if isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
        raise UnsupportedArchitectureError(
            f"This is a torch.compile'd model ({name} of {type(model._orig_mod).__name__}): pass the model it "
            "compiles (model._orig_mod), and compile the model ElasticViTModel.from_pretrained returns.")
    if hasattr(model, "peft_config") and hasattr(model, "base_model") and not isinstance(model, PreTrainedModel):
        raise UnsupportedArchitectureError(
            f"This is a PEFT model ({name}): its adapters are not part of the weights hf_snapvit ranks and saves. "
            "Merge them first (model = model.merge_and_unload()) and pass that model.")
    if not isinstance(model, PreTrainedModel):
        inner = next((type(m).__name__ for m in model.modules() if isinstance(m, PreTrainedModel)), None) \
            if isinstance(model, nn.Module) else None
        raise UnsupportedArchitectureError(
            f"hf_snapvit ranks and saves a transformers PreTrainedModel (ViTModel, AutoModel.from_pretrained(...)), "
            f"got {name}" + (f"; pass the {inner} it holds." if inner else "."))
    if any(p.is_meta for p in model.parameters()) and not offloaded_by_hooks(model):
        raise UnsupportedArchitectureError(
            f"This {name} has weights on the meta device (no values to rank or save): load its weights first, e.g. "
            "with from_pretrained, or call model.to_empty(device=...) and load a state dict.")


def check_blocks(model: PreTrainedModel, layers: nn.Module, path: str) -> None:
    """Refuse a model whose block stack is empty (``num_hidden_layers=0``): it has no heads or neurons to prune."""
    if len(layers) == 0:
        raise UnsupportedArchitectureError(
            f"This {type(model).__name__} ({model.config.model_type}) has no blocks ({path or 'its block stack'} is "
            "empty): there are no heads or neurons to prune.")
