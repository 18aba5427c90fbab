"""``ElasticViTModel.from_pretrained(repo, sparsity=...)``: any model size from one elastic checkpoint."""

from __future__ import annotations

import os
from functools import partial
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from transformers import PreTrainedModel

from ..architectures import get_spec
from ..architectures.budget import model_shape, resolve_width_multiple
from ..architectures.skeleton import skeleton
from ..architectures.stored import require_stored_spec
from ..elastic.checkpoint import CheckpointReader, check_ranking, elastic_entries, read_config, stored_widths
from ..elastic.prefix_file import correct_widths_, prefix_file_for
from ..elastic.records import fitted_to_size, warn_if_untrained
from ..errors import BudgetError, ConfigError, RankingFormatError
from ..elastic.ranking import ElasticRanking, KeepCounts
from .arguments import READ_BY_CONFIG, LoadOptions, model_dtype, sort_arguments
from .fit_step import FitStep, deprecated_fit_step
from ..elastic.latency_file import load_latency_tables
from .placement import check_spread, dispatch_sliced
from .sliced import finish_sliced
from .stored_spec import check_stored_spec_loads
from .switchable import as_switchable
from .weights import load_weights
from ..surgery.slicing import prefixes
from ..data.views import load_processor


class ElasticViTModel:
    """Loads physically sliced models from elastic checkpoints.

    This is a factory, like ``transformers.AutoModel``: :meth:`from_pretrained` returns an instance of the stock
    transformers class named in the checkpoint's ``config.json`` (``ViTModel``, ``Dinov2Model``,
    ``ViTForImageClassification``, ...), with fewer heads and FFN neurons per block.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise EnvironmentError(
            "ElasticViTModel is a factory; use ElasticViTModel.from_pretrained(path_or_repo_id, sparsity=...)."
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        sparsity: float | None = None,
        *,
        target_params: int | None = None,
        target_gflops: float | None = None,
        width_multiple: int | None = None,
        correction_data: Any = None,
        correction: Any = None,
        recovery_data: Any = None, recovery: Any = None,
        processor: Any = None,
        switchable: bool = False,
        prefix_correction: bool | None = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """Load an elastic checkpoint at a budget, reading only the weights that budget keeps.

        Args:
            pretrained_model_name_or_path: A Hub repo id or a local folder holding an elastic checkpoint (from
                :func:`hf_snapvit.save_elastic`) or a sliced one (``save_pretrained`` of a model returned here).
            sparsity: Fraction of the backbone's parameters to remove (embeddings included, task heads excluded).
            target_params: Alternatively, the number of backbone parameters to keep.
            target_gflops: Alternatively, the theoretical GFLOPs of one forward pass.
            width_multiple: Kept FFN widths are multiples of this, so GPU kernels stay fast (bf16/fp16 GEMMs slow down
                several-fold at unaligned widths); ``None``: 64 for ViT-S/B/L (smaller for narrow FFNs, see
                :func:`hf_snapvit.architectures.budget.resolve_width_multiple`); ``1``: exact widths.
            correction_data, correction: Deprecated (a ``FutureWarning``; removed in the next release): use
                :func:`hf_snapvit.correct`, which loads, corrects and slices with the same result.
            recovery_data, recovery: Deprecated likewise: distil the loaded size from the dense model with
                :func:`hf_snapvit.recover` (after any correction).
            processor: Image processor for the images of the deprecated arguments; by default the checkpoint's own.
            switchable: Load every unit; the model then changes size in place (``model.set_budget(...)``, see
                :mod:`hf_snapvit.loading.switchable`), starting at the budget given here, else at full size.
            prefix_correction: The stored correction of every size: ``None`` applies it where it helps (unless images
                are given to fit), ``True`` requires it, ``False`` leaves it.
            **kwargs: transformers' own, routed as ``PreTrainedModel.from_pretrained`` routes them (each is listed
                in :mod:`hf_snapvit.loading.arguments`): the Hub's (``revision``, ``token``, ...), ``dtype``,
                ``device_map`` (a dict, or a strategy with ``max_memory``: placed by accelerate),
                ``attn_implementation``, ``ignore_mismatched_sizes``, ``output_loading_info``; the rest override config
                attributes, then ``__init__``. Options it cannot honour (``tp_plan``, ...) raise ``ConfigError``.

        Returns:
            The stock transformers model, sliced, in eval mode (its twin in :mod:`hf_snapvit.loading.sliced`);
            ``config.elastic_layout`` records its widths, so ``save_pretrained`` writes a checkpoint this method (or
            transformers with ``trust_remote_code=True``) reloads. A corrected (recovered) model records
            ``config.elastic_correction`` (``elastic_recovery``) and reloads at its saved size only. With
            ``output_loading_info=True``, ``(model, info)``.

        Example: ``ElasticViTModel.from_pretrained("my-org/vit-elastic", sparsity=0.3)``.
        """
        fit = deprecated_fit_step(correction_data, correction, recovery_data, recovery)
        return load_elastic(pretrained_model_name_or_path, sparsity, target_params=target_params,
                            target_gflops=target_gflops, width_multiple=width_multiple, fit=fit, processor=processor,
                            switchable=switchable, prefix_correction=prefix_correction, **kwargs)


def load_elastic(source: str | os.PathLike, sparsity: float | None = None, *, target_params: int | None = None,
                 target_gflops: float | None = None, width_multiple: int | None = None, fit: FitStep | None = None,
                 processor: Any = None, switchable: bool = False, prefix_correction: bool | None = None,
                 **kwargs: Any) -> PreTrainedModel:
    """:meth:`ElasticViTModel.from_pretrained`'s load (its arguments, less the deprecated ones); with ``fit``
    (:mod:`hf_snapvit.fitting`'s verbs), the dense weights are read and fitted to the budget instead of sliced."""
    options = sort_arguments(kwargs)
    config, unused = read_config(source, options.hub, options.config_kwargs)
    options.build.update(unused)
    require_stored_spec(config, source)  # a model no registry knows: never a guess
    get_spec(config)  # unsupported architectures fail before any weight is touched
    ranking, layout = elastic_entries(config, source)
    resized = any(v is not None for v in (sparsity, target_params, target_gflops))
    _check_switchable(switchable, layout, fit is not None)
    check_spread(options.device_map, switchable=switchable is True, fitting=fit is not None)
    if fit is not None:
        fit.check(layout, resized)
    model, dense_shape = _dense_skeleton(config, layout, ranking, options.build)
    checkpoint_shape = _checkpoint_shape(source, options, layout, ranking, dense_shape)
    reader = CheckpointReader(source, **options.hub)
    check_ranking(config, ranking, source, model, checkpoint_shape, reader, sliced=layout is not None,
                  resized=resized)
    stored = stored_widths(layout, dense_shape)
    counts, multiple = _resolve_budget(ranking, dense_shape, layout, stored, sparsity, target_params,
                                       target_gflops, width_multiple, corrected=fitted_to_size(config))
    prefix = prefix_file_for(source, prefix_correction, options.hub, fit is not None, layout)
    info: dict[str, Any] = {}
    if switchable:
        model = _load_switchable(model, source, ranking, dense_shape, reader, options,
                                 (sparsity, target_params, target_gflops, width_multiple), prefix, info)
    else:
        processor_for = partial(_processor_for, source=source, hub_kwargs=options.hub)
        _load_sized(model, counts, stored, reader, options, fit, processor, processor_for, prefix, info)
        model.config._name_or_path = str(source)
        model = dispatch_sliced(finish_sliced(model, counts, multiple, dense_shape), options)
    return (model, info) if options.output_loading_info else model


def _dense_skeleton(config: Any, layout: dict | None, ranking: ElasticRanking | None,
                    build_kwargs: dict[str, Any]) -> tuple[PreTrainedModel, Any]:
    """The dense meta-device model the checkpoint's config describes and its shape, with a spec config.json stores
    held to it field by field (and to the ranking) before anything is sliced."""
    build_kwargs["dtype"] = model_dtype(build_kwargs["dtype"], config)
    if layout is not None:
        del config.elastic_layout  # the skeleton is built dense, then sliced
    model = skeleton(config, **build_kwargs)
    get_spec(model)
    dense_shape = model_shape(model)
    if ranking is not None:  # what the forward computes beyond the formulas, measured when the ranking was made
        dense_shape = replace(dense_shape, other_flops=ranking.shape.other_flops,
                              attention_keys=ranking.shape.attention_keys)
    check_stored_spec_loads(model, ranking, dense_shape)
    return model, dense_shape


# What config overrides and __init__ arguments may change in the model's cost model: its task head and the parameters
# outside the blocks (a pooler left out). Anything else changes the blocks the ranking was made for.
_HEAD_FIELDS = ("head_flops", "fixed_params")


def _checkpoint_shape(source: Any, options: LoadOptions, layout: dict | None, ranking: ElasticRanking | None,
                      shape: Any) -> Any:
    """The shape of the model the checkpoint itself describes, which its ranking must match: ``shape`` (the model
    being built) unless config overrides or ``__init__`` arguments may have changed its task head; then the
    checkpoint's own, after checking that they changed nothing else."""
    if not options.changes_the_model or ranking is None:
        return shape
    config, _ = read_config(source, options.hub, {k: v for k, v in options.config_kwargs.items()
                                                  if k in READ_BY_CONFIG})
    _, own = _dense_skeleton(config, layout, ranking, {"dtype": options.build["dtype"]})
    changed = [f"{name} {getattr(own, name)} -> {getattr(shape, name)}" for name in own.to_dict()
               if name not in _HEAD_FIELDS and getattr(own, name) != getattr(shape, name)]
    if changed:
        raise ConfigError(f"The keyword arguments {options.overrides} change the blocks the checkpoint's ranking "
                          f"was made for ({'; '.join(changed)}); overrides may change the task head (num_labels, "
                          "id2label, ...) and what lies outside the blocks only. Load without them, or rank the model "
                          "they describe with hf_snapvit.rank and save it with save_elastic.")
    return own


def _load_sized(model: PreTrainedModel, counts: KeepCounts, stored: tuple[list[int], list[int]],
                reader: CheckpointReader, options: LoadOptions, fit: FitStep | None, processor: Any,
                processor_for: Any, prefix: Any, info: dict[str, Any]) -> None:
    """Fill the skeleton with the units ``counts`` keeps; with a ``fit`` step, load what the checkpoint holds (a fit
    starts from the dense weights) and let it fit the model down to ``counts``; else apply the checkpoint's
    ``prefix`` correction where it helps."""
    warn_if_untrained(model.config, counts.sparsity)
    keep = prefixes(counts.heads, counts.neurons)
    info.update(load_weights(model, prefixes(*stored) if fit is not None else keep, reader, stored, options))
    if options.device is not None:
        model.to(options.device)
    if fit is not None:
        fit.fit(model, keep, processor_for(fit.data, processor))
    elif prefix is not None and prefix.applies_at(counts.sparsity) and correct_widths_(model, prefix):
        model.config.elastic_correction = prefix.record


def _check_switchable(switchable: Any, layout: dict | None, fitting: bool) -> None:
    if not isinstance(switchable, bool):
        raise ConfigError(f"switchable={switchable!r} must be True or False.")
    if switchable and layout is not None:
        raise ConfigError("switchable=True needs the dense elastic checkpoint (every unit in rank order), but this "
                          "one is sliced (config.elastic_layout is set). Load the elastic checkpoint it came from.")
    if switchable and fitting:
        raise ConfigError("Correction and recovery fit the weights to one size, so they cannot serve a switchable "
                          "model. Load switchable=True without fitting (hf_snapvit.correct, recover); for a checkpoint "
                          "that is good at many sizes, recover with RecoveryConfig(elastic=True) and save_elastic.")


def _load_switchable(model: PreTrainedModel, source: str | os.PathLike, ranking: ElasticRanking, dense_shape: Any,
                     reader: CheckpointReader, options: LoadOptions, budget: tuple[Any, Any, Any, Any],
                     prefix: Any, info: dict[str, Any]) -> PreTrainedModel:
    """Fill the dense skeleton with every unit, make it switchable, and switch it to ``budget`` (sparsity,
    target_params, target_gflops, width_multiple) if one is given."""
    dense = (dense_shape.dense_heads, dense_shape.dense_neurons)
    info.update(load_weights(model, prefixes(*dense), reader, dense, options))
    if options.device is not None:
        model.to(options.device)
    model.config._name_or_path = str(source)
    as_switchable(model, ranking, dense_shape, load_latency_tables(source, **options.hub), correction=prefix)
    sparsity, target_params, target_gflops, width_multiple = budget
    if any(v is not None for v in (sparsity, target_params, target_gflops)):
        model.set_budget(sparsity, target_params=target_params, target_gflops=target_gflops,
                         width_multiple=width_multiple)
    return model


def _resolve_budget(ranking: ElasticRanking | None, dense_shape: Any, layout: dict | None,
                    stored: tuple[list[int], list[int]], sparsity: float | None, target_params: int | None,
                    target_gflops: float | None, width_multiple: int | None, *,
                    corrected: bool) -> tuple[KeepCounts, int | None]:
    """The widths to load and their width multiple: the budget's (checked against what the checkpoint holds), else
    the stored ones."""
    stored_heads, stored_neurons = stored
    multiple = resolve_width_multiple(width_multiple, dense_shape.intermediate_size)
    if all(v is None for v in (sparsity, target_params, target_gflops)):
        params = dense_shape.num_params(stored_heads, stored_neurons)
        return KeepCounts(heads=stored_heads, neurons=stored_neurons, num_params=params,
                          gflops=dense_shape.gflops(stored_heads, stored_neurons),
                          sparsity=1.0 - params / dense_shape.num_params()), (layout or {}).get("width_multiple")
    if ranking is None:
        raise RankingFormatError(
            "This sliced checkpoint has no elastic_ranking, so it can only be loaded at its saved size; "
            "call from_pretrained without sparsity/target_params/target_gflops."
        )
    counts = ranking.keep_counts(sparsity, target_params=target_params, target_gflops=target_gflops,
                                 width_multiple=width_multiple)
    if corrected and (counts.heads != stored_heads or counts.neurons != stored_neurons):
        raise BudgetError(
            "This checkpoint was weight-corrected or recovered for its saved size, so it cannot be sliced further "
            "(its weights were fitted to the units kept). Load it without a budget, or correct/recover the "
            "dense elastic checkpoint at the new budget: hf_snapvit.correct(dense, sparsity=..., data=images), or "
            "hf_snapvit.recover(from_pretrained(dense, sparsity=...), from_pretrained(dense), images)."
        )
    too_big = [l for l, (h, f, sh, sf) in enumerate(zip(counts.heads, counts.neurons, stored_heads,
                                                       stored_neurons)) if h > sh or f > sf]
    if too_big:
        saved_sparsity = 1.0 - dense_shape.num_params(stored_heads, stored_neurons) / dense_shape.num_params()
        raise BudgetError(
            f"This checkpoint was saved sliced (sparsity {saved_sparsity:.4f}) and cannot grow back: the "
            f"requested budget needs more units than it holds in blocks {too_big}. Ask for a sparsity >= "
            f"{saved_sparsity:.4f}, or load the dense elastic checkpoint."
        )
    return counts, multiple


def _processor_for(data: Any, processor: Any, source: Any, hub_kwargs: dict[str, Any]) -> Any:
    """The processor for images handed to the loader: the caller's, else the checkpoint's own (pixels need none)."""
    if processor is None and not isinstance(data, (torch.Tensor, Mapping)):
        processor = load_processor(source, purpose="preprocess the calibration images", **hub_kwargs)
    return processor
