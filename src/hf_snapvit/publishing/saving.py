"""Publishing an elastic checkpoint: one atomic folder write of its format and its model card.

:func:`save_elastic` orchestrates: the format is :mod:`hf_snapvit.elastic.writing` (the weights permuted into rank
order, the ranking, a discovered model's spec), written beside its reader (:mod:`hf_snapvit.elastic.checkpoint`); this
module stages the folder, checks that a discovered model loads back, and adds the ``README.md`` model card
(:mod:`hf_snapvit.cards.elastic`) that the Hub and ``huggingface_hub.ModelCard.load`` read. Every file name of the
folder is in :mod:`hf_snapvit.elastic.file_names`. Writing sits after the card modules in the data flow; loading
never imports this module.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from ..architectures import get_spec
from ..architectures.discovery import adopt_discovered
from ..architectures.embedding import dummy_inputs
from ..errors import CheckpointError
from ..correction import CorrectionConfig
from ..correction.prefix import PrefixCorrection
from ..elastic.prefix_file import write_prefix_file
from ..correction.prefix_sizes import check_sizes
from ..utils.files import atomic_directory
from ..cards.elastic import GENERATED_MARKER, write_model_card
from ..elastic.file_names import CARD_FILE, CONFIG_FILE
from ..elastic.ranking import ElasticRanking
from ..elastic.writing import elastic_checkpoint
from ..surgery.proof import float_output, masked_copy

__all__ = ["add_prefix_correction", "save_elastic"]


def save_elastic(
    model: PreTrainedModel,
    ranking: ElasticRanking,
    save_directory: str | os.PathLike,
    *,
    image_processor: Any = None,
    model_card: bool = True,
    base_model: str | None = None,
    evaluations: Any = None,
    card_options: Mapping[str, Any] | None = None,
    **save_kwargs: Any,
) -> ElasticRanking:
    """Write the elastic checkpoint of ``model``: its weights permuted into rank order, the ranking, a model card.

    The write is atomic (:func:`hf_snapvit.utils.files.atomic_directory`): an interrupted save leaves ``save_directory``
    as it was. ``model`` is not touched: the permuted weights are new tensors of a shallow copy, so the model's
    parameter objects, values, gradients and config stay as they are (optimizers, hooks and EMA copies made before
    the save keep working). The stored ranking carries a fingerprint of the permuted weights
    (``provenance["weights_fingerprint"]``), which ``ElasticViTModel.from_pretrained`` checks. A local path the
    base model was loaded from is stored by its folder name only (:func:`hf_snapvit.utils.files.public_name`).

    Args:
        model: The dense model that ``ranking`` was computed on.
        ranking: From :func:`hf_snapvit.rank`.
        save_directory: Destination folder (created if needed).
        image_processor: Saved alongside when given (e.g. ``AutoImageProcessor.from_pretrained(base)``), so
            pipelines can load the checkpoint by path alone.
        model_card: Write ``README.md`` (and its allocation heatmap when matplotlib, ``hf-snapvit[plots]``, is
            installed): metadata, sizes table, usage, the ranking's provenance. A hand-written README.md already in
            ``save_directory`` is kept as it is; a generated one is rewritten. ``False`` writes no card.
        base_model: Hub id of the model that was ranked (the one a local copy came from), stored as the ranking's
            ``provenance["base_model"]`` for this and later cards; default: the recorded one (a folder: its name).
        evaluations: Measured metrics per sparsity for the card's table and ``model-index`` (the forms accepted
            are listed in :mod:`hf_snapvit.cards.results`).
        card_options: Further arguments of :func:`hf_snapvit.cards.elastic.write_model_card` (``sparsities``,
            ``repo_id``, ``model_name``, ``license``, ``datasets``, ``eval_dataset``, ...).
        **save_kwargs: Passed to ``model.save_pretrained`` (``max_shard_size``, ...). To publish the folder, call
            :func:`hf_snapvit.push_to_hub` on it (or :func:`hf_snapvit.publishing.hub.save_and_push` for both in one call).

    Returns:
        The ranking as stored (in rank order): what ``ElasticViTModel.from_pretrained`` resolves budgets with.
    """
    options = dict(card_options or {})
    if reserved := sorted({"base_model", "evaluations", "source", "save_directory"} & set(options)):
        raise CheckpointError(f"card_options must not hold {reserved}: pass them as save_elastic's own arguments.")
    checkpoint = elastic_checkpoint(model, ranking, base_model=base_model)
    with atomic_directory(save_directory) as staging:
        checkpoint.write(staging, image_processor=image_processor, **save_kwargs)
        if checkpoint.discovered is not None:  # a registered family's loading is tested; a discovered one's, here
            _check_loads(staging, model, ranking, checkpoint.ranking, save_directory)
        if model_card and not _hand_written_card(save_directory):
            # From the folder just written: the card describes exactly the config.json beside it.
            write_model_card(staging, staging, base_model=base_model, evaluations=evaluations, **options)
    return checkpoint.ranking


def _check_loads(staging: Path, model: PreTrainedModel, ranking: ElasticRanking, stored: ElasticRanking,
                 save_directory: str | os.PathLike) -> None:
    """Load the staged checkpoint as a user would, at two sparsities, and compare its vision encoder with
    ``model``'s, masked to the units that size keeps (float32 forwards on seeded inputs); anything else raises
    :class:`CheckpointError`, before the checkpoint is moved into place."""
    from ..loading.modeling import ElasticViTModel  # loading never imports this module

    spec = get_spec(model)
    encoder = model.get_submodule(spec.encoder) if spec.task is not None else model
    encoder_spec = get_spec(encoder)
    device = next(iter(model.parameters())).device
    inputs = {k: v.to(device) for k, v in dummy_inputs(encoder, 1, seed=1).items()}
    top = stored.max_sparsity
    sparsity = 0.0
    try:
        for sparsity in sorted({round(top / 3, 4), round(2 * top / 3, 4)}):
            masked = masked_copy(encoder, encoder_spec, ranking.keep_indices(stored.keep_counts(sparsity)))
            expected = float_output(masked.float().eval(), inputs)
            del masked
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # what the loader tells a user, it tells them when they load
                loaded = ElasticViTModel.from_pretrained(staging, sparsity=sparsity, dtype=torch.float32,
                                                         device_map=str(device))
            found = float_output(loaded.get_submodule(spec.encoder) if spec.task is not None else loaded, inputs)
            atol = 1e-4 * max(1.0, float(expected.nan_to_num().abs().max()) if expected.numel() else 0.0)
            if found.shape != expected.shape or not torch.allclose(found, expected, rtol=0, atol=atol, equal_nan=True):
                raise ValueError(f"its outputs differ from the masked model's by up to "
                                 f"{float((found - expected).abs().nan_to_num(nan=float('inf')).max()):.3g}")
    except Exception as error:  # noqa: BLE001 - whatever stops the load, the checkpoint is not written
        cause = (str(error).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(
            f"save_elastic wrote nothing to {str(save_directory)!r}: the checkpoint of this {type(model).__name__} "
            f"does not load back at sparsity {sparsity:.3g} ({type(error).__name__}: {cause}). A model built from "
            "its config.json differs from this one (an attribute set after it was built, or a tensor computed while "
            "it is built), or hf_snapvit cannot load it; register an ArchitectureSpec, or report it with the model's "
            "class.") from error
    finally:
        adopt_discovered(encoder_spec, encoder)  # loading read the stored spec; the model keeps its proven one


def _hand_written_card(save_directory: str | os.PathLike) -> bool:
    """Whether ``save_directory`` holds a README.md that hf_snapvit did not generate: it is the user's, and kept."""
    readme = Path(save_directory) / CARD_FILE
    return readme.is_file() and GENERATED_MARKER not in readme.read_text(encoding="utf-8", errors="replace")


def add_prefix_correction(
    folder: str | os.PathLike,
    images: Any,
    processor: Any = None,
    config: CorrectionConfig | None = None,
    *,
    refresh_card: bool = False,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Fit the correction for every size of a local elastic checkpoint and store it beside its weights
    (``prefix_correction.safetensors``, :mod:`hf_snapvit.elastic.prefix_file`).

    From then on ``ElasticViTModel.from_pretrained(folder, sparsity=s)`` (and a switchable model at every size)
    compensates the removed heads' and neurons' contribution into the kept output-projection weights: the per-size
    least-squares correction of :mod:`hf_snapvit.correction` (dense propagation), without images at load time, at the
    sizes where held-out images say it helps. At full size the model is unchanged. A later save of the checkpoint's
    weights drops the file.

    Args:
        folder: A local dense elastic checkpoint (from :func:`save_elastic`).
        images: Unlabelled calibration images (PIL list, ``datasets`` Dataset or ``[N, C, H, W]`` pixels).
        processor: Their image processor; by default the checkpoint's own.
        config: Damping, ``num_samples``, batch size and seed. With ``guard`` (the default) a quarter of the images
            is held out and decides at which sizes the correction applies
            (:mod:`hf_snapvit.correction.prefix_sizes`); ``guard=False`` applies it at every size.
        refresh_card: Rewrite the folder's ``README.md`` if hf_snapvit generated it, so that it describes the
            correction: with :func:`~hf_snapvit.cards.elastic.write_model_card`'s defaults, so a card written with
            other options (evaluations, ``card_options``) loses them; a hand-written card is always kept. By default
            the card stays as it is.
        show_progress: Show progress bars.

    Returns:
        The record stored in the file's metadata (and in ``config.elastic_correction`` of the models it corrects).
    """
    from ..loading.modeling import ElasticViTModel
    from ..data.views import load_processor

    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise CheckpointError(f"{str(folder)!r} is not a local checkpoint folder (no config.json); save the elastic "
                              "checkpoint with hf_snapvit.save_elastic first, or download it.")
    model = ElasticViTModel.from_pretrained(folder, prefix_correction=False)
    if getattr(model.config, "elastic_layout", None) or getattr(model.config, "elastic_ranking", None) is None:
        raise CheckpointError(f"{str(folder)!r} is not a dense elastic checkpoint; add the prefix correction to the "
                              "checkpoint save_elastic wrote (every unit, in rank order).")
    if processor is None and not isinstance(images, (torch.Tensor, Mapping)):
        processor = load_processor(folder, purpose="preprocess the calibration images")
    correction = PrefixCorrection.fit(model, images, processor, config, show_progress=show_progress)
    if correction.config.guard:
        check_sizes(correction, model, ElasticRanking.from_dict(model.config.elastic_ranking),
                    show_progress=show_progress)
    record = correction.record()
    write_prefix_file(folder, correction.factors, record)
    if refresh_card and (folder / CARD_FILE).is_file() and not _hand_written_card(folder):
        write_model_card(folder, folder)
    return record
