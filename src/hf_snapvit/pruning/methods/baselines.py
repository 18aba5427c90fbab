"""Baseline importance scores: data-free (weight magnitude, LAMP, random) and gradient-based (SNIP, Taylor).

Each scorer maps a model to ``(head_scores [L, H], neuron_scores [L, F])``, non-negative, larger = more important,
in the model's current unit order. The gradient baselines' settings (:class:`GradientBaselineConfig`) have the
same presets as SnapViT's gradient phase (:data:`~hf_snapvit.pruning.scoring.PRESET_SCORES`): the same images, crops
and step size, so comparisons are like for like. Every method here registers itself (:mod:`.registry`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch
from transformers import PreTrainedModel

from ...architectures import (ffn_rows, get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim,
                              head_tables, num_heads, qkv_rows)
from ...architectures.budget import ModelShape
from ...data.calibration import draw_calibration
from ...utils.distributed import process_state
from ...utils.precision import mixed_precision
from ...errors import DataError
from ..memory_plan import parse_memory, plan_gradient_steps
from ...architectures.placement import on_device, onloaded
from ..scoring import PRESET_SCORES, ScoreConfig, gradient_scores
from ...data.views import embedder, load_processor
from .config import PRESETS, DataFreeConfig, RankingConfig
from .ranker import ScoreRanker, data_free_ranker
from .registry import register_method

# Gradient baselines: how each changes the score settings of the run it is compared with.
GRADIENT_METHODS: dict[str, dict[str, str]] = {
    "snip": {"definition": "snip"},
    "taylor-ce": {"loss": "ce", "definition": "taylor"},
}


@dataclass(frozen=True)
class GradientBaselineConfig(RankingConfig):
    """Settings of the gradient baselines (``snip``, ``taylor-ce``); the presets are SnapViT's gradient phase's.

    Args:
        num_gradient_images: Images whose gradients give the scores.
        scores: Their batch size, crops and head rows; each method sets its own loss and score definition.
    """

    num_gradient_images: int = PRESET_SCORES["default"][0]
    scores: ScoreConfig = field(default_factory=lambda: PRESET_SCORES["default"][1])

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_int("num_gradient_images", 1)
        self._check_settings("scores", ScoreConfig, "ScoreConfig(batch_size=16)")

    @classmethod
    def presets(cls) -> dict[str, "GradientBaselineConfig"]:
        return {name: cls(num_gradient_images=PRESET_SCORES[name][0], scores=PRESET_SCORES[name][1])
                for name in PRESETS}

    @property
    def images_needed(self) -> int:
        """Calibration images a run reads: the gradient images."""
        return self.num_gradient_images


class GradientBaseline(ScoreRanker):
    """A gradient baseline: :func:`gradient_baseline_scores` with the method's loss and score definition."""

    method: ClassVar[str]

    def scores(self, model: PreTrainedModel, shape: ModelShape, data: Any, **run: Any
               ) -> tuple[np.ndarray, np.ndarray]:
        config = self.config
        heads, neurons, self.settings_, self.calibration_ = gradient_baseline_scores(
            model, shape, self.method, data, scores=config.scores, num_images=config.num_gradient_images,
            processor=run["processor"], seed=config.seed, label_column=run["label_column"],
            show_progress=run["show_progress"], max_memory=run["max_memory"])
        self.settings_["preset"] = config.preset_name()
        return heads, neurons


class SnipRanker(GradientBaseline):
    """SNIP: ``|w·g|`` of the accumulated gradient of the DINO loss."""

    method = "snip"


class TaylorRanker(GradientBaseline):
    """First-order Taylor estimate ``(Σ_unit w·g)²`` of the cross-entropy of the model's classifier."""

    method = "taylor-ce"


@torch.no_grad()
def magnitude_scores(model: PreTrainedModel, shape: ModelShape, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """L1 norm of every weight and bias a unit owns (q/k/v rows, o_proj columns and per-head table entries; FFN rows
    and output column)."""
    spec = get_spec(model)
    heads, neurons = [], []
    for layer in get_layers(model, spec):
        with onloaded(model, layer):  # weights accelerate offloaded, loaded for this block only
            per_head, per_neuron = _block_magnitudes(layer, spec)
        heads.append(per_head)
        neurons.append(per_neuron)
    return np.stack(heads), np.stack(neurons)


def _block_magnitudes(layer: torch.nn.Module, spec: Any) -> tuple[np.ndarray, np.ndarray]:
    attention = get_attention(layer, spec)
    hd = head_dim(attention, spec)
    per_row = torch.zeros(num_heads(attention, spec) * hd, dtype=torch.float64)
    for role in range(3):
        proj, rows = qkv_rows(attention, spec, role)
        per_row += proj.weight.detach()[rows].abs().double().sum(1).cpu()
        if proj.bias is not None:
            per_row += proj.bias.detach()[rows].abs().double().cpu()
    per_row += get_projection(attention, spec.o_proj).weight.detach().abs().double().sum(0).cpu()
    per_head = per_row.view(-1, hd).sum(1)
    for owner, name in head_tables(layer, spec):
        per_head += getattr(owner, name).detach().abs().double().flatten(0, -2).sum(0).cpu()
    mlp, variant = get_mlp(layer, spec)
    out_proj = get_projection(mlp, variant.out_proj)
    per_neuron = out_proj.weight.detach().abs().double().sum(0).cpu()
    for proj, rows in ffn_rows(mlp, variant):
        per_neuron += proj.weight.detach()[rows].abs().double().sum(1).cpu()
        if proj.bias is not None:
            per_neuron += proj.bias.detach()[rows].abs().double().cpu()
    return per_head.numpy(), per_neuron.numpy()


def random_scores(model: PreTrainedModel, shape: ModelShape, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Uniform random importance per parameter: every removal order is equally likely in both ranking modes."""
    rng = np.random.default_rng(seed)
    heads = rng.random((shape.num_layers, shape.num_heads)) * shape.params_per_head
    neurons = rng.random((shape.num_layers, shape.intermediate_size)) * shape.params_per_neuron
    return heads, neurons


def _lamp(weight: torch.Tensor) -> torch.Tensor:
    """LAMP score of every weight of one matrix: w² / Σ of the w'² at least as large (Lee et al. 2021)."""
    squares = weight.detach().double().pow(2).flatten()
    order = torch.argsort(squares)
    sorted_squares = squares[order]
    remaining = torch.flip(torch.cumsum(torch.flip(sorted_squares, [0]), 0), [0])  # Σ over this and larger ones
    scores = torch.empty_like(squares)
    scores[order] = sorted_squares / remaining.clamp_min(torch.finfo(torch.float64).tiny)
    return scores.view_as(weight).cpu()


@torch.no_grad()
def lamp_scores(model: PreTrainedModel, shape: ModelShape, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean LAMP score of a unit's weights, normalised per matrix: the whole FFN input matrix for neurons, the value
    matrix for heads (as the reference does), times the unit's parameter count."""
    spec = get_spec(model)
    heads, neurons = [], []
    for layer in get_layers(model, spec):
        with onloaded(model, layer):  # weights accelerate offloaded, loaded for this block only
            attention = get_attention(layer, spec)
            hd = head_dim(attention, spec)
            v_proj, rows = qkv_rows(attention, spec, 2)
            heads.append(_lamp(v_proj.weight[rows]).mean(1).view(-1, hd).mean(1).numpy())
            mlp, variant = get_mlp(layer, spec)
            neurons.append(np.mean([_lamp(proj.weight).mean(1)[rows].numpy()
                                    for proj, rows in ffn_rows(mlp, variant)], 0))
    return np.stack(heads) * shape.params_per_head, np.stack(neurons) * shape.params_per_neuron


def gradient_baseline_scores(
    model: PreTrainedModel,
    shape: ModelShape,
    method: str,
    data: Any,
    *,
    scores: ScoreConfig,
    num_images: int,
    processor: Any,
    seed: int,
    label_column: str,
    show_progress: bool,
    max_memory: int | str | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any], dict[str, Any]]:
    """Scores of the gradient baseline ``method`` (a key of :data:`GRADIENT_METHODS`) on ``num_images`` images of
    ``data``, scored with ``scores`` changed as the method needs; and ``(settings, calibration)`` for the provenance.

    Under ``accelerate launch`` the gradient steps are split across processes as SnapViT's are."""
    if data is None:
        raise DataError(f"method={method!r} needs calibration images: pass data=... (a dataset or images).")
    scores = replace(scores, **GRADIENT_METHODS[method])
    labelled = scores.loss == "ce"
    state = process_state()
    images, _, _, labels = draw_calibration(data, num_images, 0, seed=seed,
                                            label_column=label_column if labelled else None, model=model,
                                            embed=embedder(model, processor))
    if processor is None and not hasattr(images, "shape"):
        processor = load_processor(model, purpose=f"preprocess the calibration images of method={method!r}")
    with on_device(model, state) as device:  # a model accelerate placed stays where it is
        # Planned for the autocast precision gradient_scores takes from accelerate's configuration.
        plan = plan_gradient_steps(model, scores, max_memory=max_memory, device=device, precision=mixed_precision())
        heads, neurons = gradient_scores(model, images, processor, scores, labels=labels, seed=seed,
                                         show_progress=show_progress and state.is_main_process,
                                         micro_batch=plan.batch, checkpoint=plan.checkpoint)
    if scores.definition != "taylor":  # means over a unit's weights -> totals, as every ranking score is
        heads, neurons = heads * shape.params_per_head, neurons * shape.params_per_neuron
    settings: dict[str, Any] = {"scores": scores.to_dict(), "num_gradient_images": len(images)}
    settings["memory_plan"] = {"budget_bytes": None if max_memory is None else parse_memory(max_memory),
                               "gradient": {**asdict(plan), "peak": plan.peak}}
    if mixed_precision() != "no":  # it changes the scores; full precision leaves the record as it always was
        settings["mixed_precision"] = mixed_precision()
    calibration = {"source": type(data).__name__, "num_gradient": len(images),
                   "label_column": label_column if labelled else None}
    return heads, neurons, settings, calibration


for _name, _scorer in (("magnitude", magnitude_scores), ("random", random_scores), ("lamp", lamp_scores)):
    register_method(_name, DataFreeConfig, data_free_ranker(_scorer, _name), needs_data=False)
register_method("snip", GradientBaselineConfig, SnipRanker, needs_data=True)
register_method("taylor-ce", GradientBaselineConfig, TaylorRanker, needs_data=True, needs_labels=True)
