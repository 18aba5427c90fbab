"""The stock transformers model a config describes, on the meta device: what loading fills and budgets measure; and
the meta-device twin of a model, whose forward FLOPs are counted at no memory cost."""

from __future__ import annotations

import copy
import itertools
import warnings

import torch
import torch.nn as nn
from transformers import PretrainedConfig, PreTrainedModel

from .limits import check_config_sizes
from .registry import model_class


def skeleton(config: PretrainedConfig, **kwargs) -> PreTrainedModel:
    """The stock transformers model for ``config`` on the meta device: shapes only, no memory, no weights.

    The class is taken from ``config.architectures`` (falling back to ``AutoModel``), so a checkpoint of a
    ``ViTForImageClassification`` gives a ``ViTForImageClassification``.
    """
    from accelerate import init_empty_weights

    check_config_sizes(config)
    cls = model_class(config)
    if cls.__module__.startswith("transformers.models.auto"):
        build = lambda: cls.from_config(config, **kwargs)  # noqa: E731
    else:
        build = lambda: cls._from_config(config, **kwargs)  # noqa: E731
    from transformers.initialization import no_init_weights

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Meta tensors hold no data, so initialising them is wasted time.
        try:
            with init_empty_weights(), no_init_weights():
                model = build()
        except RuntimeError as error:
            if "meta" not in str(error):
                raise
            # A model that runs part of itself while it is built (timm's hybrid ViTs run their convolutional stem
            # on a blank image to size the patch embedding) cannot be built on the meta device: build it in memory,
            # still without initialising its weights.
            with no_init_weights():
                model = build()
        # Built without weights, the model has not tied what its class shares (SAM's positional embedding, tied
        # word embeddings): tie now, or the skeleton counts the shared parameters twice.
        model.tie_weights()
        return model


def meta_twin(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree whose parameters and buffers are meta tensors of the same shapes and dtypes
    (one shared tensor stays one): it runs a forward shapes-only, without memory for weights, and nothing that
    forward caches reaches ``model``. Tensors a module keeps as plain attributes are copied as they are."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = nn.Parameter(meta, requires_grad=False) if isinstance(tensor, nn.Parameter) else meta
    return copy.deepcopy(model, memo)
