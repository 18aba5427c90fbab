"""SnapViT: self-supervised gradient scores refined by an xNES search over per-block and per-head factors.

``SnapViTPruner(SnapViTConfig(...)).fit(model, data)`` returns an :class:`~hf_snapvit.ElasticRanking`:

1. draw a seeded gradient set and a disjoint fitness set from ``data`` (:mod:`hf_snapvit.calibration`);
2. local scores from DINO-loss gradients (:mod:`hf_snapvit.scoring`);
3. an xNES search (:mod:`hf_snapvit.xnes`) over ``c`` = one factor per FFN block and one per head, where a candidate
   ranks unit ``u`` by ``score(u) · |c(u)|`` and is scored by :class:`~hf_snapvit.fitness.EmbeddingFitness`;
4. the best candidate's scaled scores become the ranking.

Under ``accelerate launch`` the gradient steps and each generation's candidates are split across processes
(:mod:`hf_snapvit.distributed`); every process returns the same ranking, equal to the one-process ranking.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ..budget import ModelShape, layer_widths, model_shape
from ..calibration import draw_calibration
from ..distributed import PRECISIONS, on_process_device, process_state, resolve_precision, tf32_matmuls
from ..errors import ConfigError
from ..files import public_name
from ..fitness import EmbeddingFitness
from ..ranking import ElasticRanking, Floors, RankingMode
from ..scoring import ScoreConfig, gradient_scores
from ..validation import is_real, require_choice, require_int
from ..views import MultiCropConfig, load_processor, processor_inputs
from ..xnes import XNES, XNESResult
from .search_state import CHECKPOINT_SETTINGS, SearchCheckpoint, search_key

PRESETS = ("default", "fast", "paper")
# Settings that do not define a preset: a run keeps its preset's name whatever its seed, floors or mode.
_NOT_PRESET_SETTINGS = ("seed", "min_head_keep_ratio", "min_neuron_keep_ratio", "paired_head_offset", "mode",
                        "precision", "fitness_batch_size", *CHECKPOINT_SETTINGS)
# Images per search forward when none is given: a GPU needs large batches to stay busy (a ViT-B/16 forward under bf16
# autocast on an H100: 8000 images/s at 256, 6400 at 64; benchmarks/results/ranking_time_*); a CPU gains nothing.
FITNESS_BATCH_SIZE = {"cpu": 64, "accelerator": 256}


@dataclass(frozen=True)
class SnapViTConfig:
    """Settings of a SnapViT ranking run. ``SnapViTConfig.preset("default" | "fast" | "paper")`` gives the named
    presets. The defaults (OBD scores, global mode, 3 xNES generations at sigma 0.5) were chosen by a sweep of score
    definition x mode x search budget on the shared ViT-Tiny (``benchmarks/defaults_vit_tiny.py``, see
    ``docs/defaults.md``); ``"paper"`` keeps the reference code's settings.

    Args:
        num_gradient_images: Images whose gradients give the local scores.
        num_fitness_images: Images the search scores candidates on (disjoint from the gradient images).
        scores: Gradient score settings (definition, head rows, crops).
        fitness_sparsities: Sparsities every candidate is evaluated at; the fitness averages over them.
        pca_components: PCA dimensions of the embedding similarity.
        max_generations: Search budget in xNES generations (distribution updates).
        max_evaluations: Search budget in candidate evaluations (the reference's "50 iterations" are 50 evaluations).
        population_size: xNES population; default 4 + ⌊3 ln d⌋.
        early_stopping_patience: End the search before its budget once the best fitness loss has gone this many
            generations without falling by more than ``early_stopping_threshold``; ``None``: run the whole budget.
            The generations run are the first generations of the full search, so stopping changes nothing else.
        early_stopping_threshold: The smallest fall in the fitness loss that counts as an improvement. The loss's
            noise between candidates is about 0.003 at 256 fitness images on the shared ViT-Tiny
            (``docs/defaults.md``).
        init_mean: The search starts with block factors from ``init_mean[0]`` (first block) to ``init_mean[1]``
            (last), each head taking its block's value, as in the reference.
        sigma: Initial standard deviation of the search distribution (its covariance times ``sigma²``).
        covariance: Initial covariance: ``"identity"`` (the reference) or ``"cka"``, the linear-CKA similarity of the
            units' activations on the fitness images (paper appendix).
        mode: Ranking mode of the result (and of the search's candidates).
        min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset: See :class:`~hf_snapvit.ElasticRanking`.
        fitness_batch_size: Images per forward pass in the search; ``None``: 256 on an accelerator, 64 on a CPU. It
            changes the speed only (the results up to float rounding); the provenance records what ran.
        seed: Seeds the image draw, the crops and the search.
        precision: Forward passes in ``"bf16"`` (autocast for the gradients, a bf16 copy of the weights for the
            search; scores, PCA and similarities stay float32/float64),
            ``"fp32"`` (TF32 products on CUDA) or ``"auto"``: accelerate's ``--mixed_precision`` when one is
            configured, else bf16 on CUDA and on CPUs with bf16 matrix units (AMX, AVX512-BF16), float32 elsewhere
            (:func:`hf_snapvit.distributed.resolve_precision`). The provenance records what ran.
        checkpoint_every: Save the search state every this many xNES generations (and once the gradient scores are
            computed, and at the end) to ``output_dir``; ``None``: never. A run killed part-way and started again
            with the same settings, data and model resumes from it and returns the ranking an uninterrupted run
            returns (:mod:`hf_snapvit.methods.search_state`). Neither option changes the ranking, so neither is
            recorded in its provenance.
        output_dir: Folder of the search state; a run finding a state there resumes from it (and refuses one of
            a search with other settings).
    """

    num_gradient_images: int = 1000
    num_fitness_images: int = 1000
    scores: ScoreConfig = field(default_factory=lambda: ScoreConfig(definition="obd"))
    fitness_sparsities: tuple[float, ...] = (0.1, 0.3, 0.5, 0.6)
    pca_components: int = 192
    max_generations: int | None = 3
    max_evaluations: int | None = None
    population_size: int | None = None
    early_stopping_patience: int | None = None
    early_stopping_threshold: float = 0.0
    init_mean: tuple[float, float] = (1.2, 0.8)
    sigma: float = 0.5
    covariance: Literal["identity", "cka"] = "identity"
    mode: RankingMode = "global"
    min_head_keep_ratio: float = Floors.min_head_keep_ratio
    min_neuron_keep_ratio: float = Floors.min_neuron_keep_ratio
    paired_head_offset: float = Floors.paired_head_offset
    fitness_batch_size: int | None = None
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    checkpoint_every: int | None = None
    output_dir: str | None = None

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.max_generations is None and self.max_evaluations is None:
            raise ConfigError("Give a search budget: max_generations and/or max_evaluations.")
        for name, minimum in (("num_gradient_images", 1), ("num_fitness_images", 1), ("pca_components", 1),
                              ("seed", 0)):
            require_int(owner, name, getattr(self, name), minimum)
        require_int(owner, "fitness_batch_size", self.fitness_batch_size, 1, optional=True)
        for name, minimum in (("max_generations", 0), ("max_evaluations", 0), ("population_size", 2),
                              ("early_stopping_patience", 1)):
            require_int(owner, name, getattr(self, name), minimum, optional=True)
        sparsities = self.fitness_sparsities
        if not (isinstance(sparsities, (tuple, list)) and sparsities
                and all(is_real(s) and 0 <= s < 1 for s in sparsities)):
            raise ConfigError(f"{owner}(fitness_sparsities={sparsities!r}): give a non-empty tuple of sparsities in "
                              "[0, 1) to evaluate candidates at, e.g. (0.1, 0.3, 0.5, 0.6).")
        object.__setattr__(self, "fitness_sparsities", tuple(float(s) for s in sparsities))
        if not is_real(self.early_stopping_threshold) or self.early_stopping_threshold < 0:
            raise ConfigError(f"{owner}(early_stopping_threshold={self.early_stopping_threshold!r}): give the smallest "
                              "fall in the fitness loss that counts as an improvement, a finite number >= 0, e.g. "
                              "0.003.")
        if not is_real(self.sigma) or self.sigma <= 0:
            raise ConfigError(f"{owner}(sigma={self.sigma!r}): sigma must be a positive finite number, e.g. 0.5.")
        if not (isinstance(self.init_mean, (tuple, list)) and len(self.init_mean) == 2
                and all(map(is_real, self.init_mean))):
            raise ConfigError(f"{owner}(init_mean={self.init_mean!r}): give two finite factors (first block, last "
                              "block), e.g. (1.2, 0.8).")
        require_choice(owner, "covariance", self.covariance, ("identity", "cka"))
        require_choice(owner, "precision", self.precision, PRECISIONS)
        require_choice(owner, "mode", self.mode, ("global", "paired"))
        for name in ("min_head_keep_ratio", "min_neuron_keep_ratio", "paired_head_offset"):
            value = getattr(self, name)
            if not is_real(value) or not 0 <= value < 1:
                raise ConfigError(f"{owner}({name}={value!r}): {name} must be a fraction in [0, 1).")
        self._check_checkpointing(owner)
        if not isinstance(self.scores, ScoreConfig):
            raise ConfigError(f"{owner}(scores={self.scores!r}): scores must be a ScoreConfig, e.g. "
                              "ScoreConfig(definition='obd').")

    def _check_checkpointing(self, owner: str) -> None:
        require_int(owner, "checkpoint_every", self.checkpoint_every, 1, optional=True)
        if self.output_dir is not None:
            if not isinstance(self.output_dir, (str, os.PathLike)) or not os.fspath(self.output_dir):
                raise ConfigError(f"{owner}(output_dir={self.output_dir!r}): give the folder to keep the search "
                                  "state in, as a str or path, e.g. output_dir='snapvit-search'.")
            object.__setattr__(self, "output_dir", os.fspath(self.output_dir))
        elif self.checkpoint_every is not None:
            raise ConfigError(f"{owner}(checkpoint_every={self.checkpoint_every!r}) needs output_dir=FOLDER to save "
                              "the search state in, e.g. output_dir='snapvit-search'.")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "SnapViTConfig":
        """``"default"``: the field defaults (1000 + 1000 images, 2 + 10 crops at the input size, OBD scores =
        per-image squared gradients times w², 3 xNES generations at sigma 0.5, global ranking). ``"fast"``: the same
        choices sized for a CPU (128 + 128 images, 2 global + 4 local 96-px crops). ``"paper"``: the reference code's
        settings (squared accumulated gradients, 50 evaluations at sigma 1, paired ranking). On the shared ViT-Tiny
        the OBD scores beat the reference's squared gradients by 3-4 points of mean top-1 at 10-50 % sparsity, and
        sigma 0.5 beat sigma 1 at the same 3-generation budget (``benchmarks/defaults_vit_tiny.py``)."""
        presets = {
            "default": cls(),
            "paper": cls(
                scores=ScoreConfig(definition="accumulated", batch_size=16),
                max_generations=None,
                max_evaluations=50,
                sigma=1.0,
                mode="paired",
            ),
            "fast": cls(
                num_gradient_images=128,
                num_fitness_images=128,
                scores=ScoreConfig(definition="obd", crops=MultiCropConfig(num_local=4, local_size=96)),
            ),
        }
        if name not in presets:
            raise ConfigError(f"Unknown preset {name!r}; choose one of {sorted(presets)}.")
        return replace(presets[name], **overrides)

    def preset_name(self) -> str | None:
        """The preset these settings are (seed, floors and mode aside), or ``None`` for custom settings."""
        mine = {k: v for k, v in asdict(self).items() if k not in _NOT_PRESET_SETTINGS}
        for name in PRESETS:
            if mine == {k: v for k, v in asdict(self.preset(name)).items() if k not in _NOT_PRESET_SETTINGS}:
                return name
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SnapViTPruner:
    """Ranks every head and FFN neuron of a model with SnapViT. After :meth:`fit`:

    * ``history_``: one record per search generation, with the best factors found so far (``best_factors``);
    * ``timings_``: the wall time of each phase;
    * ``initial_factors_``: the factors the search starts from;
    * ``resumed_from_``: the generation a saved search state was resumed at (``None``: not resumed);
    * :meth:`ranking_from_factors` re-ranks with any factors, e.g. those of an earlier generation, without
      recomputing the scores.
    """

    def __init__(self, config: SnapViTConfig | None = None) -> None:
        self.config = config or SnapViTConfig()
        self.history_: list[dict[str, Any]] = []
        self.timings_: dict[str, float] = {}
        self.initial_factors_: np.ndarray | None = None
        self.resumed_from_: int | None = None
        self._unit_scores: tuple[np.ndarray, np.ndarray, ModelShape] | None = None

    def ranking_from_factors(self, factors: Any, *, mode: RankingMode | None = None) -> ElasticRanking:
        """The ranking that search factors ``factors`` give (layout: one factor per block's FFN, then one per head,
        as in ``history_``), in the config's mode unless ``mode`` is given. Needs a finished :meth:`fit`."""
        if self._unit_scores is None:
            raise ConfigError("ranking_from_factors needs the scores of a finished fit(); call fit() first.")
        head_scores, neuron_scores, shape = self._unit_scores
        L, H = shape.num_layers, shape.num_heads
        c = np.abs(np.asarray(factors, dtype=np.float64))
        if c.shape != (L + L * H,):
            raise ConfigError(f"factors have shape {c.shape}; this model needs ({L + L * H},): {L} FFN factors, "
                               f"then {L}x{H} head factors.")
        config = self.config
        return ElasticRanking(
            head_scores=head_scores * c[L:].reshape(L, H),
            neuron_scores=neuron_scores * c[:L, None],
            shape=shape,
            mode=mode or config.mode,
            min_head_keep_ratio=config.min_head_keep_ratio,
            min_neuron_keep_ratio=config.min_neuron_keep_ratio,
            paired_head_offset=config.paired_head_offset,
        )

    def fit(
        self,
        model: PreTrainedModel,
        data: Any,
        *,
        processor: Any = None,
        image_column: str | None = None,
        show_progress: bool = True,
    ) -> ElasticRanking:
        """Rank ``model`` using calibration ``data`` (PIL images, a datasets (Iterable)Dataset or a pixel tensor).

        ``processor`` defaults to ``AutoImageProcessor.from_pretrained(model.name_or_path)``; it is not needed when
        ``data`` is a tensor of pixel values. Under ``accelerate launch`` every process calls ``fit`` with the same
        arguments; the work is split across them and each returns the same ranking (the model runs on the process's
        device meanwhile). Progress bars show on the main process only.

        Args:
            model: A dense model of a supported architecture; its weights, gradients and ``requires_grad`` flags
                are as they were when this returns.
            data: Calibration images (see :mod:`hf_snapvit.calibration`).
            processor: The model's image processor.
            image_column: The image column of a dataset (detected if not given).
            show_progress: Show progress bars.

        Returns:
            The ranking, with the run's settings and search summary in its provenance.
        """
        heads_now, neurons_now = layer_widths(model)
        if len(set(heads_now)) != 1 or len(set(neurons_now)) != 1:
            raise ConfigError("SnapViT ranks a dense model; this one is already sliced.")
        state = process_state()
        show_progress = show_progress and state.is_main_process
        with on_process_device(model, state) as device:
            precision = resolve_precision(self.config.precision, device)
            with tf32_matmuls(device, precision):
                ranking = self._fit(model, data, processor, image_column, show_progress, precision)
        recorded = "fp32" if precision == "no" else precision
        if precision == "no" and device.type == "cuda":
            recorded = "tf32"
        return replace(ranking, provenance={**ranking.provenance, "precision": recorded})

    def fitness_batch_size(self, device: torch.device) -> int:
        """Images per search forward on ``device``: the configured number, else the device's default."""
        default = FITNESS_BATCH_SIZE["cpu" if device.type == "cpu" else "accelerator"]
        return self.config.fitness_batch_size or default

    def _fit(self, model: PreTrainedModel, data: Any, processor: Any, image_column: str | None,
             show_progress: bool, precision: str) -> ElasticRanking:
        config = self.config
        timings: dict[str, float] = {}
        start = time.perf_counter()
        gradient_images, fitness_images, calibration, _ = draw_calibration(
            data, config.num_gradient_images, config.num_fitness_images, step_size=config.scores.step_size,
            seed=config.seed, image_column=image_column, model=model)
        if processor is None and not hasattr(fitness_images, "shape"):
            processor = load_processor(model, purpose="preprocess the calibration images")
        fitness_pixels = processor_inputs(fitness_images, processor)
        fitness_batch_size = self.fitness_batch_size(next(model.parameters()).device)
        settings = {**config.to_dict(), "fitness_batch_size": fitness_batch_size}  # what runs
        # The key digests the pixels and weights: computed only for a run that saves or resumes.
        key = {} if config.output_dir is None else search_key({**settings, "precision": precision}, calibration,
                                                               model, fitness_pixels)
        checkpoint = SearchCheckpoint(config.output_dir, config.checkpoint_every, key)
        saved = checkpoint.load()
        self.resumed_from_ = None if saved is None else saved["search"].generations
        timings["data"] = time.perf_counter() - start

        start = time.perf_counter()
        if saved is None:
            head_scores, neuron_scores = gradient_scores(model, gradient_images, processor, config.scores,
                                                         seed=config.seed, show_progress=show_progress,
                                                         precision=precision)
        else:  # the scores of the killed run: the gradient phase is the same computation
            head_scores, neuron_scores = saved["head_scores"], saved["neuron_scores"]
        timings["gradients"] = time.perf_counter() - start

        shape = model_shape(model)
        # Scores are means over a unit's weights; times the unit's cost they become totals, so the global mode's
        # per-parameter normalisation compares heads and neurons on the mean saliency of their weights.
        self._unit_scores = (head_scores * shape.params_per_head, neuron_scores * shape.params_per_neuron, shape)
        start = time.perf_counter()
        fitness = EmbeddingFitness(model, fitness_pixels, sparsities=config.fitness_sparsities,
                                   pca_components=config.pca_components, batch_size=fitness_batch_size,
                                   precision=precision)
        result = self._search(model, fitness, checkpoint, saved, (head_scores, neuron_scores), show_progress)
        timings["search"] = time.perf_counter() - start
        timings["search_forward"] = fitness.forward_seconds
        self.timings_ = timings
        # A zero-generation budget means no search: the starting factors.
        best = self.ranking_from_factors(self.initial_factors_ if result.best_x is None else result.best_x)
        provenance = {
            "method": "snapvit",
            "preset": config.preset_name(),
            # Where and how often the state was saved does not change the ranking, and a local path must not be
            # published in config.json: the checkpointing options stay out.
            "settings": {k: v for k, v in settings.items() if k not in CHECKPOINT_SETTINGS},
            "seed": config.seed,
            "calibration_data": calibration,
            "base_model": public_name(getattr(model.config, "_name_or_path", None) or None),
            "search": {"best_loss": result.best_fitness, "evaluations": result.evaluations,
                       "generations": result.generations, "stopped_early": result.stopped_early},
        }
        return replace(best, provenance=provenance)

    def _search(self, model: PreTrainedModel, fitness: EmbeddingFitness, checkpoint: SearchCheckpoint,
                saved: dict[str, Any] | None, scores: tuple[np.ndarray, np.ndarray],
                show_progress: bool) -> XNESResult:
        """The xNES search from the starting factors, or from the saved state of a killed run; sets ``history_``."""
        config = self.config
        shape = self._unit_scores[2]
        block = np.linspace(config.init_mean[0], config.init_mean[1], shape.num_layers)
        self.initial_factors_ = np.concatenate([block, np.repeat(block, shape.num_heads)])
        if saved is not None:
            search, best_factors = saved["search"], saved["best_factors"]
        else:
            covariance = None
            if config.covariance == "cka":
                from ..cka import cka_covariance

                covariance = cka_covariance(model, fitness.pixel_values)
            search = XNES(self.initial_factors_, covariance=covariance, sigma=config.sigma,
                          population_size=config.population_size, seed=config.seed)
            best_factors = []
            checkpoint.save(*scores, search, best_factors)  # the gradient phase is never redone
        total = config.max_generations
        if config.max_evaluations is not None:
            by_evaluations = -(-config.max_evaluations // search.population_size)
            total = by_evaluations if total is None else min(total, by_evaluations)
        with tqdm(total=total, initial=search.generations, desc="xNES search", unit="gen",
                  disable=not show_progress) as bar:
            def progress(record: dict[str, Any]) -> None:
                best_factors.append(search.result.best_x.tolist())
                if checkpoint.due(search):
                    checkpoint.save(*scores, search, best_factors)
                bar.update(1)
                bar.set_postfix(best_loss=f"{record['best_fitness']:.4f}")

            result = search.optimize(lambda X: fitness.batch_loss(self.ranking_from_factors, X),
                                     max_generations=config.max_generations,
                                     max_evaluations=config.max_evaluations, callback=progress,
                                     patience=config.early_stopping_patience,
                                     threshold=config.early_stopping_threshold)
        if checkpoint.is_new(search):
            checkpoint.save(*scores, search, best_factors)  # the end: a finished search is not run again
        self.history_ = [dict(record, best_factors=x) for record, x in zip(result.history, best_factors)]
        return result
