"""``ElasticViTModel.from_pretrained(repo, sparsity=...)``: any model size from one elastic checkpoint."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, PreTrainedModel

from .architectures import get_spec
from .budget import model_shape, skeleton
from .checkpoint import HUB_KWARGS, CheckpointReader, load_sliced_state_dict
from .correction import CorrectionConfig, CorrectionError, correct_model_
from .errors import BudgetError, RankingFormatError, SnapViTError
from .ranking import ElasticRanking, KeepCounts
from .slicing import slice_model_


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
        correction_data: Any = None,
        correction: CorrectionConfig | None = None,
        processor: Any = None,
        **kwargs: Any,
    ) -> PreTrainedModel:
        """Load an elastic checkpoint at a budget, reading only the weights that budget keeps.

        Args:
            pretrained_model_name_or_path: A Hub repo id or a local folder holding an elastic checkpoint (from
                :func:`hf_snapvit.save_elastic`) or a sliced one (``save_pretrained`` of a model returned here).
            sparsity: Fraction of the backbone's parameters to remove (embeddings included, task heads excluded).
            target_params: Alternatively, the number of backbone parameters to keep.
            target_gflops: Alternatively, the theoretical GFLOPs of one forward pass.
            correction_data: Unlabelled calibration images (PIL list, ``datasets`` Dataset or ``[N, C, H, W]`` pixel
                tensor). When given, the dense weights are loaded, the removed heads' and neurons' contribution is
                compensated into the kept weights (SparseGPT-style, :mod:`hf_snapvit.correction`), and the model is
                then sliced. Needs the dense elastic checkpoint.
            correction: :class:`~hf_snapvit.correction.CorrectionConfig` for the correction (defaults if ``None``).
            processor: Image processor for ``correction_data`` images; by default the checkpoint's own.
            **kwargs: ``revision``, ``token``, ``cache_dir``, ``force_download``, ``local_files_only``, ``subfolder``
                and ``proxies`` go to the Hub; ``dtype`` (or ``torch_dtype``), ``attn_implementation`` and
                ``device_map`` (one device) shape the model; anything else overrides config attributes, as in
                transformers.

        Returns:
            The stock transformers model, sliced, in eval mode. Its ``config.elastic_layout`` records the per-block
            widths, so ``save_pretrained`` writes a checkpoint this method reloads without the dense weights. A
            corrected model also records ``config.elastic_correction`` (settings, number of images, mean
            reconstruction errors); its checkpoint reloads at its saved size only.

        Example:
            >>> model = ElasticViTModel.from_pretrained("my-org/vit-elastic", sparsity=0.3)  # doctest: +SKIP
        """
        hub_kwargs = {k: kwargs.pop(k) for k in HUB_KWARGS if k in kwargs}
        dtype = kwargs.pop("dtype", None)
        torch_dtype = kwargs.pop("torch_dtype", None)
        dtype = dtype if dtype is not None else torch_dtype
        attn_implementation = kwargs.pop("attn_implementation", None)
        device = kwargs.pop("device_map", None)
        if isinstance(device, dict):
            raise TypeError("device_map must be one device (e.g. 'cuda:0'); multi-device maps are not supported yet.")

        config, unused = AutoConfig.from_pretrained(
            pretrained_model_name_or_path, return_unused_kwargs=True, **hub_kwargs, **kwargs
        )
        if unused:
            raise TypeError(f"ElasticViTModel.from_pretrained got unexpected keyword arguments {sorted(unused)}.")
        get_spec(config)  # unsupported architectures fail before any weight is touched
        stored = getattr(config, "elastic_ranking", None)
        layout = getattr(config, "elastic_layout", None)
        if stored is None and layout is None:
            raise RankingFormatError(
                f"{str(pretrained_model_name_or_path)!r} is not an elastic checkpoint: its config.json has no "
                "'elastic_ranking'. Create one with ranking = hf_snapvit.rank(model) and "
                "hf_snapvit.save_elastic(model, ranking, save_directory)."
            )
        ranking = ElasticRanking.from_dict(stored) if stored is not None else None
        corrected = getattr(config, "elastic_correction", None)
        if correction is not None and correction_data is None:
            raise CorrectionError("correction= was given without correction_data=; pass the calibration images too.")
        if correction_data is not None and layout is not None:
            raise CorrectionError(
                "Correction needs the dense weights, but this checkpoint is already sliced (config.elastic_layout is "
                "set). Load the dense elastic checkpoint with correction_data= instead."
            )

        if dtype is None or dtype == "auto":
            dtype = getattr(config, "dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        build_kwargs: dict[str, Any] = {"dtype": dtype}
        if attn_implementation is not None:
            build_kwargs["attn_implementation"] = attn_implementation
        if layout is not None:
            del config.elastic_layout  # the skeleton is built dense, then sliced
        model = skeleton(config, **build_kwargs)
        dense_shape = model_shape(model)
        if ranking is not None:
            ranking.check_matches(dense_shape)

        stored_heads = layout["num_heads"] if layout else dense_shape.dense_heads
        stored_neurons = layout["intermediate_size"] if layout else dense_shape.dense_neurons
        if len(stored_heads) != dense_shape.num_layers or len(stored_neurons) != dense_shape.num_layers:
            raise RankingFormatError(
                f"config.elastic_layout lists {len(stored_heads)} head counts and {len(stored_neurons)} FFN widths for "
                f"a model with {dense_shape.num_layers} blocks; the checkpoint is corrupt, re-export it."
            )
        budget_given = any(v is not None for v in (sparsity, target_params, target_gflops))
        if budget_given:
            if ranking is None:
                raise RankingFormatError(
                    "This sliced checkpoint has no elastic_ranking, so it can only be loaded at its saved size; "
                    "call from_pretrained without sparsity/target_params/target_gflops."
                )
            counts = ranking.keep_counts(sparsity, target_params=target_params, target_gflops=target_gflops)
            if corrected is not None and (counts.heads != list(stored_heads) or counts.neurons != list(stored_neurons)):
                raise BudgetError(
                    "This checkpoint was weight-corrected for its saved size, so it cannot be sliced further (the "
                    "correction would no longer match the units kept). Load it without a budget, or correct the "
                    "dense elastic checkpoint at the new budget: from_pretrained(dense, sparsity=..., "
                    "correction_data=images)."
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
        else:
            params = dense_shape.num_params(stored_heads, stored_neurons)
            counts = KeepCounts(
                heads=list(stored_heads),
                neurons=list(stored_neurons),
                num_params=params,
                gflops=dense_shape.gflops(stored_heads, stored_neurons),
                sparsity=1.0 - params / dense_shape.num_params(),
            )

        dense_state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        keep = [(np.arange(h), np.arange(f)) for h, f in zip(counts.heads, counts.neurons)]
        # Correction works on the dense weights and slices afterwards.
        loaded = keep if correction_data is None else [(np.arange(h), np.arange(f)) for h, f in
                                                       zip(stored_heads, stored_neurons)]
        slice_model_(model, loaded)
        sliceable = {k for k, v in model.state_dict().items() if tuple(v.shape) != dense_state[k]}
        reader = CheckpointReader(pretrained_model_name_or_path, **hub_kwargs)
        state = load_sliced_state_dict(model, reader, sliceable)
        missing = [name for name in model.state_dict() if name not in state]
        if missing:
            _initialise_missing(model, missing)
        model.load_state_dict(state, strict=False, assign=True)
        left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
        if left:
            raise SnapViTError(f"These tensors were neither in the checkpoint nor initialised: {left}.")
        model.eval()
        if device is not None:
            model.to(device)
        if correction_data is not None:
            if processor is None and not isinstance(correction_data, (torch.Tensor, Mapping)):
                processor = _load_processor(pretrained_model_name_or_path, hub_kwargs)
            summary = correct_model_(model, keep, correction_data, processor, correction or CorrectionConfig())
            if summary.num_removed:
                model.config.elastic_correction = {
                    "settings": summary.config.to_dict(),
                    "num_images": summary.num_images,
                    "num_tokens": summary.num_tokens,
                    "mean_error_before": round(summary.mean_error("before"), 6),
                    "mean_error_after": round(summary.mean_error("after"), 6),
                }

        model.config._name_or_path = str(pretrained_model_name_or_path)
        if counts.heads != dense_shape.dense_heads or counts.neurons != dense_shape.dense_neurons:
            model.config.elastic_layout = {
                "num_heads": counts.heads,
                "intermediate_size": counts.neurons,
                "sparsity": round(counts.sparsity, 6),
                "num_params": counts.num_params,
                "gflops": round(counts.gflops, 6),
            }
        return model

    @staticmethod
    def push_to_hub(folder_or_model: Any, repo_id: str, **kwargs: Any) -> Any:
        """Upload an elastic or sliced checkpoint (a folder or a model) with a generated model card, in one commit.

        Same as :func:`hf_snapvit.push_to_hub` (see there for ``private``, ``token``, ``revision``, ``create_pr``,
        ``commit_message`` and the card's arguments); returns the ``huggingface_hub.CommitInfo``.
        """
        from .hub import push_to_hub

        return push_to_hub(folder_or_model, repo_id, **kwargs)


def _load_processor(path: str | os.PathLike, hub_kwargs: dict[str, Any]) -> Any:
    """The checkpoint's own image processor, for correction images given as PIL images or a dataset."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(path, **hub_kwargs)
    except (OSError, ValueError) as error:
        raise CorrectionError(
            f"{str(path)!r} has no image processor to preprocess the correction images ({error}). Pass processor="
            "AutoImageProcessor.from_pretrained(<base model>), or give correction_data as a [N, C, H, W] tensor of "
            "preprocessed pixel values."
        ) from error



def _initialise_missing(model: PreTrainedModel, names: list[str]) -> None:
    """Give tensors absent from the checkpoint fresh values, as transformers does, and say so."""
    warnings.warn(
        f"Some weights were not in the checkpoint and are newly initialized: {names}. You should probably train "
        "them before use (as transformers would tell you for the same checkpoint).",
        stacklevel=3,
    )
    owners = {name.rsplit(".", 1)[0] if "." in name else "" for name in names}
    for owner in owners:
        module = model.get_submodule(owner)
        module.to_empty(device="cpu", recurse=False)
        model._init_weights(module)
