"""Local importance scores from self-supervised (or supervised) gradients: SnapViT's diagonal term.

For every FFN neuron and attention head, a score summarises the squared gradient of a loss with respect to the
weights the unit owns (paper §3.2; the reference's choices are in ``snapvit-reference.md`` §1-2):

* loss ``"dino"``: the DINO-style multi-crop loss between a frozen copy of the model (the teacher, here the same
  weights under ``no_grad``) embedding global crops and the model embedding every crop; ``"ce"``: cross-entropy of the
  model's own classifier on labelled images;
* definition ``"fisher"`` (the paper): the mean over images of each image's squared gradient, a diagonal Fisher;
  ``"obd"``: that Fisher times the squared weight, the optimal-brain-damage saliency ``½·H_ii·w²`` of removing it;
  ``"accumulated"`` (the reference code): the square of the gradient accumulated over batches; ``"snip"``: ``|w·g|``
  with the accumulated gradient; ``"taylor"``: the first-order Taylor estimate of removing the whole unit,
  ``(Σ_unit w·g)²`` (Molchanov et al. 2019);
* a neuron is scored on its FFN input rows, a head on its value rows (``head_rows="v"``, as the reference) or on its
  q, k and v rows; each score is the mean over those weights. Scores are accumulated in float64: they reach 1e-30.
  ``fisher`` and ``obd`` sum one value per weight row every step (a unit's score is a sum over its rows), so they
  hold no float64 copy of the weights; the others need each weight's whole gradient sum and keep one per weight.

The per-image definitions take every image of a gradient step from the step's one backward pass
(:mod:`hf_snapvit.pruning.sample_gradients`), not one backward pass per image.

A step too large for memory (SigLIP-so400m, 384 px: 16 images x 12 crops of 729 tokens) runs in parts of the memory
plan's size (:mod:`hf_snapvit.pruning.memory_plan`), halved after an out-of-memory error (accelerate's
``find_executable_batch_size``); per-image sums and batch-mean gradients are linear in the images, so parts add up.

The crops of image ``i`` are drawn from ``numpy.random.default_rng([seed, i])``, so they do not depend on the batch
or the process that embeds the image; on several processes (:mod:`hf_snapvit.utils.distributed`) each takes whole gradient
steps and the float64 sums are added across processes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from accelerate.utils import find_executable_batch_size
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..architectures.embedding import input_size as architecture_input_size
from ..architectures import ffn_rows, get_attention, get_layers, get_mlp, get_spec, qkv_rows
from ..architectures.embedding import image_embedding
from ..data.views import MultiCropConfig, Normalizer, processor_inputs, seeded_multi_crops
from ..errors import ConfigError, DataError
from ..utils.validation import Settings
from ..data.calibration import GradientSteps
from ..utils.distributed import local_share, process_state, raise_if_failed_anywhere, reduce_sum
from ..utils.precision import autocast
from .checkpointing import checkpointed_blocks
from ..architectures.placement import execution_device, offloaded_by_hooks, weights_reloaded_for_backward
from .sample_gradients import SquaredSampleGradients
from .unit_scores import unit_scores, weight_statistics
from ..utils.logs import get_logger

logger = get_logger(__name__)

ScoreDefinition = Literal["fisher", "obd", "accumulated", "snip", "taylor"]


@dataclass(frozen=True)
class ScoreConfig(Settings):
    """Settings of the gradient scores.

    Args:
        loss: ``"dino"`` (self-supervised multi-crop loss, label-free) or ``"ce"`` (cross-entropy of the model's
            classifier; needs labels).
        definition: ``"fisher"`` (per-image squared gradients, the paper), ``"obd"`` (``fisher · w²``), ``"accumulated"`` (square of the summed
            batch-mean gradients, the reference code), ``"snip"`` (``|w·g|``) or ``"taylor"`` (``(Σ_unit w·g)²``).
        head_rows: ``"v"`` scores a head on its value rows (the reference), ``"qkv"`` on its q, k and v rows.
        batch_size: Images per gradient step. The per-image definitions (``"fisher"``, ``"obd"``) take every image's
            own gradient from the step's one backward pass (:mod:`hf_snapvit.pruning.sample_gradients`), so the step size
            changes their scores only by float rounding; the others average the gradient over the step. It does
            not set the memory: a step runs in parts planned to fit ``rank(..., max_memory=...)``, with the same
            scores up to float rounding (and in halves again after an out-of-memory error on a GPU).
        crops: The multi-crop views of the DINO loss.
    """

    loss: Literal["dino", "ce"] = "dino"
    definition: ScoreDefinition = "fisher"
    head_rows: Literal["v", "qkv"] = "v"
    batch_size: int = 16
    crops: MultiCropConfig = field(default_factory=MultiCropConfig)

    def __post_init__(self) -> None:
        self._check_choice("loss", ("dino", "ce"))
        self._check_choice("definition", get_args(ScoreDefinition))
        self._check_choice("head_rows", ("v", "qkv"))
        self._check_int("batch_size", 1)
        self._check_settings("crops", MultiCropConfig, "MultiCropConfig(num_local=4)")

    @property
    def step_size(self) -> int:
        """Images per gradient step (``batch_size``, for every definition)."""
        return self.batch_size


# The gradient phase of each named preset: (images, score settings). SnapViT's presets and the gradient baselines'
# share it, so that a baseline scores like for like with the SnapViT run it is compared with.
PRESET_SCORES: dict[str, tuple[int, ScoreConfig]] = {
    "default": (1000, ScoreConfig(definition="obd")),
    "fast": (128, ScoreConfig(definition="obd", crops=MultiCropConfig(num_local=4, local_size=96))),
    "paper": (1000, ScoreConfig(definition="accumulated", batch_size=16)),
}


def dino_loss(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """Multi-crop loss of the reference: ``teacher [B, G, D]`` global views, ``student [B, V, D]`` all views.

    Embeddings are L2-normalised; temperature 1, no centring. For each image the cross-entropy between the teacher
    distribution of global view ``t`` and the student distribution of every view ``s != t`` is summed; the batch is
    averaged.
    """
    p = F.softmax(F.normalize(teacher, dim=-1), dim=-1)  # [B, G, D]
    log_q = F.log_softmax(F.normalize(student, dim=-1), dim=-1)  # [B, V, D]
    cross = -torch.einsum("bgd,bvd->bgv", p, log_q)  # [B, G, V]
    views = torch.arange(student.shape[1], device=student.device)
    same = views[None, :] == torch.arange(teacher.shape[1], device=student.device)[:, None]  # global t is view t
    return cross.masked_fill(same[None], 0.0).sum((1, 2)).mean()


def _scored_layers(model: PreTrainedModel, head_rows: str) -> tuple[list[list[tuple[nn.Linear, slice]]],
                                                                     list[list[tuple[nn.Linear, slice]]]]:
    """The linear layers, with the rows of each, whose weights score each block's heads and FFN neurons (the value
    rows, or the query, key and value rows, which are row blocks of one fused ``qkv`` in some models)."""
    spec = get_spec(model)
    heads, neurons = [], []
    roles = (2,) if head_rows == "v" else (0, 1, 2)
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        heads.append([qkv_rows(attention, spec, role) for role in roles])
        mlp, variant = get_mlp(layer, spec)
        neurons.append(ffn_rows(mlp, variant))
    return heads, neurons


def _add_step(loss_of, chunk, labels, first: int, recorder: SquaredSampleGradients | None,
              weights: list[torch.Tensor], sums: list[torch.Tensor], precision_context, step_images: int,
              scales: list[torch.Tensor] | None = None) -> None:
    """Add ``chunk`` (a step's images, or a part of them) to ``sums``: every image's squared gradient (with a
    ``recorder``), else its share of the step's batch-mean gradient (the step has ``step_images`` images)."""
    if recorder is None:
        with precision_context:
            # The step's mean loss is the parts' means weighted by their sizes: their gradients add up to the step's.
            loss = loss_of(chunk, labels, first_index=first) * (len(chunk) / step_images)
        loss.backward()
        for total, w in zip(sums, weights):
            total += w.grad.double()
            w.grad = None
        return
    with recorder, precision_context:
        # The sum of the images' losses: each image's rows then receive that image's own gradient.
        loss = loss_of(chunk, labels, first_index=first) * len(chunk)
    recorder.accumulate(loss, len(chunk), sums, scales)


def _accumulate(steps: list, weights: list[torch.Tensor], devices: list[torch.device], add, show_progress: bool,
                per_row: bool, micro_batch: int | None = None) -> list[torch.Tensor]:
    """The float64 sums over ``steps`` (one per row of each weight with ``per_row``, else one per weight), each step
    run in parts of at most ``micro_batch`` images (the memory plan's), at most as many as fit in memory; each sum on
    its layer's execution device (``devices``: a weight accelerate offloaded is on the meta device between forwards).

    On an out-of-memory error the sums restart from zero with parts of half the size: every step needs about the
    same memory, so the error comes in the first step and little work is repeated.
    """
    largest = max((len(chunk) for _, chunk, _ in steps), default=1)
    start_with = min(largest, micro_batch or largest)

    def run(part: int) -> list[torch.Tensor]:
        if part < start_with:
            logger.warning("A gradient step in parts of %d images did not fit in memory; running it in parts of %d "
                           "images (the scores are the same up to float rounding).", start_with, part,
                           main_process_only=False)  # this process's memory
        sums = [torch.zeros(w.shape[:1] if per_row else w.shape, dtype=torch.float64, device=d)
                for w, d in zip(weights, devices)]
        for w in weights:
            w.grad = None
        for first, chunk, labels in tqdm(steps, desc="gradient scores", unit="step", disable=not show_progress):
            for start in range(0, len(chunk), part):
                add(chunk[start:start + part], None if labels is None else labels[start:start + part],
                    first + start, sums, len(chunk))
        return sums

    # Wrapped by a call, not as a decorator: before accelerate 1.15 the decorator form drops reduce_batch_size_fn.
    return find_executable_batch_size(run, starting_batch_size=start_with, reduce_batch_size_fn=_halve(start_with))()


def _halve(start: int):
    """The next part size after an out-of-memory error: half the last one (accelerate's default takes 90 %)."""
    size = start

    def reduce() -> int:
        nonlocal size
        if size == 1:  # raised inside accelerate's handler: the device's own message stays attached as the context
            raise torch.OutOfMemoryError(
                "The gradient scores of one image do not fit in the device's memory (every crop of an image is "
                "forwarded with gradients at once). Use fewer or smaller crops, e.g. ScoreConfig(crops="
                "MultiCropConfig(num_local=4, local_size=96)) as the 'fast' preset does, or a device with more memory.")
        size //= 2
        return size

    return reduce


def _batch_loss(model, spec, chunk, labels, *, processor, normalizer, config, input_size, first_index, seed,
                device, input_grad: bool = False) -> torch.Tensor:
    """The step's loss; with ``input_grad`` the pixels, not the weights, carry the gradient into the graph (of an
    offloaded model, whose weights must not be held by the graph's leaves)."""
    def leaf(pixels: torch.Tensor) -> torch.Tensor:
        return pixels.detach().requires_grad_(True) if input_grad else pixels

    if config.loss == "ce":
        logits = model(pixel_values=leaf(processor_inputs(chunk, processor).to(device))).logits
        return F.cross_entropy(logits.float(), labels.to(device))
    global_views, local_views = seeded_multi_crops(chunk, first_index, seed, config.crops, normalizer, input_size,
                                                   None if device.type == "cpu" else device)
    global_views = global_views.to(device)
    b, g = global_views.shape[:2]
    with torch.no_grad():
        teacher = image_embedding(model, {"pixel_values": global_views.flatten(0, 1)}, spec).view(b, g, -1)
    student = [image_embedding(model, {"pixel_values": leaf(global_views.flatten(0, 1))}, spec).view(b, g, -1)]
    if local_views is not None:
        local_views = local_views.to(device)
        student.append(image_embedding(model, {"pixel_values": leaf(local_views.flatten(0, 1))}, spec)
                       .view(b, local_views.shape[1], -1))
    return dino_loss(teacher.float(), torch.cat(student, 1).float())


def gradient_scores(
    model: PreTrainedModel,
    images: Any,
    processor: Any,
    config: ScoreConfig = ScoreConfig(),
    *,
    labels: torch.Tensor | None = None,
    seed: int = 0,
    show_progress: bool = True,
    precision: str | None = None,
    micro_batch: int | None = None,
    checkpoint: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient scores ``(heads [L, H], neurons [L, F])`` of ``model`` on calibration ``images``, float64 per unit.

    On several processes (``accelerate launch``) each process computes the gradient steps ``rank, rank + N, ...``
    of the same sample and the per-weight float64 sums are added across processes, so every process returns the
    one-process scores (up to the order of float64 additions). Forward passes autocast to ``precision``, by default
    the configured mixed precision (:func:`hf_snapvit.utils.precision.autocast`).

    Args:
        model: A dense model of a supported architecture; its weights, gradients (``.grad``), ``requires_grad``
            flags and train/eval mode are as they were when this returns.
        images: PIL images or a ``[N, C, H, W]`` tensor of pixel values (see :mod:`hf_snapvit.data.images`), the same on
            every process; or a :class:`~hf_snapvit.data.calibration.GradientSteps` holding only this process's steps
            (from :func:`~hf_snapvit.data.calibration.draw_calibration`), with their labels.
        processor: The model's image processor (its normalisation is applied to every crop).
        config: Score settings.
        labels: Class labels of ``images``, for ``loss="ce"``.
        seed: Seeds the crops: image ``i`` is cropped with ``numpy.random.default_rng([seed, i])``.
        show_progress: Show a progress bar over gradient steps (on the main process).
        precision: Autocast precision of the forward passes (``"no"``, ``"bf16"``, ...; see
            :func:`hf_snapvit.utils.precision.resolve_precision`); ``None`` follows accelerate's configuration.
        micro_batch, checkpoint: Run each gradient step in parts of at most ``micro_batch`` images, and with
            ``checkpoint`` every block's activations recomputed in the backward pass (a memory plan's choices,
            :func:`~hf_snapvit.pruning.memory_plan.plan_memory`), with the same scores up to float rounding.
    """
    spec = get_spec(model)
    state = process_state()
    num_images, steps, labelled = _this_process_steps(images, labels, config, state)
    _check_labels(model, config, labelled)
    device = execution_device(model)  # a dispatched model's hooks move the inputs on from there
    normalizer = Normalizer(processor) if processor is not None else None
    input_size = architecture_input_size(model.config)
    head_layers, neuron_layers = _scored_layers(model, config.head_rows)
    layers = list(dict.fromkeys(m for group in head_layers + neuron_layers for m, _ in group))  # a fused qkv once
    weights = [m.weight for m in layers]
    offloaded = offloaded_by_hooks(model)  # then no weight requires a gradient: the pixels do (input_grad)
    recorder = SquaredSampleGradients(layers) if config.definition in ("fisher", "obd") else None
    _check_offloaded(offloaded, config, recorder)
    saved, was_training = _only_these_require_grad(model, set() if offloaded else {id(w) for w in weights})
    # A per-image sum reduces to one value per row every step; obd's w² is applied in the step, unless the weights
    # are offloaded (not there between forwards): then per weight, and w² once at the end.
    per_row = recorder is not None and not (offloaded and config.definition == "obd")
    scales = weights if config.definition == "obd" and per_row else None
    # Per-image squared gradients, or the batch-mean gradients summed over batches (the reference), in float64.
    loss_of = functools.partial(_batch_loss, model, spec, processor=processor, normalizer=normalizer, config=config,
                                input_size=input_size, seed=seed, device=device, input_grad=offloaded)

    def add(chunk, chunk_labels, first, sums, step_images):
        with weights_reloaded_for_backward(model):  # an offloaded model: one block's weights loaded at a time
            _add_step(loss_of, chunk, chunk_labels, first, recorder, weights, sums,
                      autocast(device, gradients=True, precision=precision), step_images, scales)

    error: BaseException | None = None
    try:
        model.zero_grad(set_to_none=True)
        try:  # a failure here must reach the other processes before they wait in the reduction
            with checkpointed_blocks(model, checkpoint):
                sums = _accumulate(steps, weights, [execution_device(model, m) for m in layers], add,
                                   show_progress and state.is_main_process, per_row, micro_batch)
        except Exception as exc:
            error = exc
        raise_if_failed_anywhere(error, state)
        sums = reduce_sum(sums)
        stats = weight_statistics(config.definition, model, layers, sums, num_images)
    finally:
        _restore(model, saved, was_training)
    return unit_scores(model, spec, config.definition, stats, head_layers, neuron_layers)


def _restore(model: PreTrainedModel, saved: dict, was_training: bool) -> None:
    """Put back what :func:`_only_these_require_grad` changed."""
    for (module, name), (flag, grad) in saved.items():
        getattr(module, name).requires_grad_(flag)  # an offloaded weight is a new tensor after each forward
        getattr(module, name).grad = grad
    model.train(was_training)


def _check_offloaded(offloaded: bool, config: ScoreConfig, recorder: SquaredSampleGradients | None) -> None:
    if recorder is None and offloaded:
        raise ConfigError(f"ScoreConfig(definition={config.definition!r}) reads the weights' .grad, which "
                          "accelerate's offload hooks drop with the weights after each forward; score this "
                          "offloaded model with definition='obd' or 'fisher' (every image's gradient comes from "
                          "its layer's inputs and output gradients), or load it onto one device.")


def _check_labels(model: PreTrainedModel, config: ScoreConfig, labelled: bool) -> None:
    if config.loss == "ce":
        if not labelled:
            raise DataError("loss='ce' needs labelled images: give a dataset with a label column.")
        if not hasattr(model, "classifier") and not hasattr(model, "cls_classifier"):
            raise ConfigError(
                f"loss='ce' needs a classification head, and {type(model).__name__} has none; use loss='dino'."
            )


def _this_process_steps(images: Any, labels: torch.Tensor | None, config: ScoreConfig, state: Any
                        ) -> tuple[int, list, bool]:
    """``(images in the whole sample, this process's gradient steps, whether every step has labels)``."""
    step = config.step_size
    if isinstance(images, GradientSteps):
        if images.step_size != step:
            raise DataError(
                f"The gradient steps were drawn with {images.step_size} images per step, but this score definition "
                f"({config.definition!r}, batch_size={config.batch_size}) takes {step}; draw them with "
                f"step_size={step}."
            )
        if labels is not None:
            raise DataError("Pass labels inside GradientSteps, not as labels=..., for pre-sharded images.")
        return images.num_images, images.steps, all(step_labels is not None for _, _, step_labels in images.steps)
    num_images = len(images)
    steps = local_share([(start, images[start:start + step], None if labels is None else labels[start:start + step])
                         for start in range(0, num_images, step)], state)
    return num_images, steps, labels is not None


def _only_these_require_grad(model: PreTrainedModel, scored: set[int]) -> tuple[dict, bool]:
    """Make only the scored weights require gradients and put the model in eval mode; return what to restore:
    every parameter's ``requires_grad`` flag and gradient (the caller's ``.grad``), and the train mode."""
    saved = {(module, name): (p.requires_grad, p.grad) for module in model.modules()
             for name, p in module.named_parameters(recurse=False)}
    was_training = model.training
    for p in model.parameters():
        p.requires_grad_(id(p) in scored)
    model.eval()
    return saved, was_training
