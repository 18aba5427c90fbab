"""The stock transformers model a config describes, on the meta device: what loading fills and budgets measure; and
the meta-device twin of a model, whose forward FLOPs are counted at no memory cost."""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from typing import Callable, ContextManager

import torch
import torch.nn as nn
from transformers import PretrainedConfig, PreTrainedModel

from ..errors import CheckpointError
from .limits import CONFIG_ERRORS, check_config_sizes
from .registry import model_class


def no_init_weights() -> ContextManager:
    """transformers' context that skips weight initialisation (``transformers.initialization``, a module outside its
    public API), or, for a transformers without it, one that changes nothing: the weights are then initialised, which
    costs time, not correctness (every weight is overwritten or discarded)."""
    try:
        from transformers.initialization import no_init_weights as skip
    except ImportError:
        return contextlib.nullcontext()
    return skip()


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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Meta tensors hold no data, so initialising them is wasted time.
        try:
            try:
                with init_empty_weights(), no_init_weights():
                    model = build()
            except RuntimeError as error:
                if "meta" not in str(error):
                    raise
                # A model that runs part of itself while it is built (timm's hybrid ViTs run their convolutional
                # stem on a blank image to size the patch embedding) cannot be built on the meta device: build it in
                # memory, still without initialising its weights.
                with no_init_weights():
                    model = build()
        except (*CONFIG_ERRORS, TypeError, KeyError, AttributeError, RuntimeError) as error:
            if kwargs and isinstance(error, TypeError):  # the caller's __init__ arguments: fail as transformers does
                raise
            # transformers' own refusal of the config (a width no head count divides, no class for it)
            cause = " ".join(str(error).split())
            raise CheckpointError(
                f"transformers cannot build {cls.__name__} from this config ({type(error).__name__}: "
                f"{cause[:160]}{'...' if len(cause) > 160 else ''}): config.json is corrupt or names another "
                "model. Fix the entry named, or re-save the model with save_pretrained.") from error
        # Built without weights, the model has not tied what its class shares (SAM's positional embedding, tied
        # word embeddings): tie now, or the skeleton counts the shared parameters twice.
        model.tie_weights()
        return model


def meta_twin(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree whose parameters and buffers are meta tensors of the same shapes and dtypes
    (one shared tensor stays one): it runs a forward shapes-only, without memory for weights, and nothing that
    forward caches reaches ``model`` (see :func:`twin`)."""
    return twin(model, lambda tensor: torch.empty_like(tensor, device="meta"))


def twin(model: nn.Module, make: Callable[[torch.Tensor], torch.Tensor] | None = None) -> nn.Module:
    """A copy of ``model``'s module tree, without gradients and without the hooks registered on its modules (a
    caller's hook would see the twin's forward; transformers installs its output-recording ones again), whose every
    parameter and buffer is ``make(tensor)`` (once per tensor): by default a parameter shares its tensor's memory and
    a buffer is copied, so the twin costs no memory for weights and a forward that writes a buffer does not write
    ``model``'s. Tensors a module keeps as plain attributes are copied as they are."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        new = make(tensor) if make is not None else (
            tensor.detach() if isinstance(tensor, nn.Parameter) else tensor.detach().clone())
        memo[id(tensor)] = nn.Parameter(new, requires_grad=False) if isinstance(tensor, nn.Parameter) else new
    copied = copy.deepcopy(model, memo)
    for module in copied.modules():
        for hooks in _HOOKS:
            getattr(module, hooks, {}).clear()
        # transformers' own output-recording hooks went with the others: let its next forward install them again
        # (else a model that ran once before gives the twin no hidden states: BEiT's segmentation head reads them).
        vars(module).pop(_RECORDING, None)
    return copied


_RECORDING = "_output_capturing_hooks_installed"  # transformers 5's mark of a model whose recording hooks are set


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")
