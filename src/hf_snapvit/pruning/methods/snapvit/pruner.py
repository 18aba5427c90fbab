"""SnapViT: self-supervised gradient scores refined by an xNES search over per-block and per-head factors.

``SnapViTPruner(SnapViTConfig(...)).fit(model, data)`` returns an :class:`~hf_snapvit.ElasticRanking`:

1. draw a seeded gradient set and a disjoint fitness set from ``data`` (:mod:`hf_snapvit.data.calibration`);
2. local scores from DINO-loss gradients (:mod:`hf_snapvit.pruning.scoring`), handed out in each block's second-order order
   when ``unit_order`` asks for one (:mod:`hf_snapvit.pruning.methods.snapvit.block_order`);
3. an xNES search (:mod:`hf_snapvit.pruning.xnes`) over ``c`` = one factor per FFN block and one per head, where a candidate
   ranks unit ``u`` by ``score(u) · |c(u)|`` and is scored by :class:`~.fitness.EmbeddingFitness` (ended
   early, when asked, once the best loss stops falling);
4. the search distribution's final mean's scaled scores become the ranking (``solution="mean"``, the default: not
   picked for its noise on the fitness images), or the best candidate's (``"best"``, the paper's).

Under ``accelerate launch`` the gradient steps and each generation's candidates are split across processes
(:mod:`hf_snapvit.utils.distributed`); every process returns the same ranking, equal to the one-process ranking.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from huggingface_hub.utils import tqdm
from transformers import PreTrainedModel

from ....architectures.budget import ModelShape, layer_widths
from ....architectures.flops import measured_shape
from ....architectures.given import check_given
from ....data.calibration import draw_calibration
from ....correction.config import CorrectionConfig
from ....utils.distributed import process_state
from ....utils.precision import resolve_precision, tf32_matmuls
from ....errors import ConfigError
from ....utils.files import public_name
from ....architectures.placement import on_device
from ....surgery.proof import ensure_proven
from .fitness import EmbeddingFitness
from ...memory_plan import MemoryPlan, plan_memory
from ....elastic.ranking import ElasticRanking, RankingMode
from ...scoring import gradient_scores
from ....data.views import embedder, load_processor, processor_inputs
from ...xnes import XNES, XNESResult
from .block_order import block_orders, reorder_scores
from .search_state import CHECKPOINT_SETTINGS, TRAILS, SearchCheckpoint, search_key
from .config import FITNESS_BATCH_SIZE, SnapViTConfig

__all__ = ["SnapViTPruner"]


class SnapViTPruner:
    """Ranks every head and FFN neuron of a model with SnapViT. After :meth:`fit`:

    * ``history_``: one record per search generation, with the best factors found so far (``best_factors``) and the
      search distribution's mean after the generation's update (``mean_factors``);
    * ``timings_``: the wall time of each phase;
    * ``initial_factors_``: the factors the search starts from;
    * ``resumed_from_``: the generation a saved search state was resumed at (``None``: not resumed);
    * ``memory_plan_``: the micro-batches every phase ran in (:mod:`hf_snapvit.pruning.memory_plan`);
    * :meth:`ranking_from_factors` re-ranks with any factors, e.g. those of an earlier generation, without
      recomputing the scores.
    """

    def __init__(self, config: SnapViTConfig | None = None) -> None:
        self.config = config or SnapViTConfig()
        self.history_: list[dict[str, Any]] = []
        self.timings_: dict[str, float] = {}
        self.initial_factors_: np.ndarray | None = None
        self.resumed_from_: int | None = None
        self.memory_plan_: MemoryPlan | None = None
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
        max_memory: int | str | None = None,
    ) -> ElasticRanking:
        """Rank ``model`` using calibration ``data`` (PIL images, a datasets (Iterable)Dataset or a pixel tensor).

        ``processor`` defaults to ``AutoImageProcessor.from_pretrained(model.name_or_path)``; it is not needed when
        ``data`` is a tensor of pixel values. Under ``accelerate launch`` every process calls ``fit`` with the same
        arguments; the work is split across them and each returns the same ranking (the model runs on the process's
        device meanwhile). Progress bars show on the main process only.

        Args:
            model: A dense model of a supported architecture; its weights, gradients and ``requires_grad`` flags
                are as they were when this returns.
            data: Calibration images (see :mod:`hf_snapvit.data.calibration`).
            processor: The model's image processor.
            image_column: The image column of a dataset (detected if not given).
            show_progress: Show progress bars.
            max_memory: The memory budget of every phase (bytes, or ``"40GiB"``, ``"512MB"``): the gradient steps,
                the search, the unit order and the correction run in micro-batches planned from the model's shapes
                to fit it, with the same ranking up to float addition order (:func:`~hf_snapvit.pruning.memory_plan.
                plan_memory`); ``None``: what the device has (on a CPU, half the host's available memory).

        Returns:
            The ranking, with the run's settings and search summary in its provenance.

        Raises:
            UnsupportedArchitectureError: a model no registry knows whose discovered structure fails the proof
                (:func:`~hf_snapvit.surgery.proof.ensure_proven`), or whose prunable weights are tied or shared.
        """
        check_given(model)
        heads_now, neurons_now = layer_widths(model)
        if len(set(heads_now)) != 1 or len(set(neurons_now)) != 1:
            raise ConfigError("SnapViT ranks a dense model; this one is already sliced.")
        spec = ensure_proven(model)  # a model no registry knows: its discovered structure is checked first
        if not spec.prune_heads and self.config.min_head_keep_ratio < 1.0:
            # The model's forward cannot run with fewer heads (or the proof kept them all): every block keeps them.
            self.config = replace(self.config, min_head_keep_ratio=1.0)
        state = process_state()
        show_progress = show_progress and state.is_main_process
        with on_device(model, state) as device:  # a model accelerate placed stays where it is
            precision = resolve_precision(self.config.precision, device)
            with tf32_matmuls(device, enabled=precision == "no"):
                self.memory_plan_ = plan_memory(model, self.config, max_memory=max_memory, device=device,
                                                precision=precision, search_batch=self.fitness_batch_size(device))
                ranking = self._fit(model, data, processor, image_column, show_progress, precision)
        recorded = "fp32" if precision == "no" else precision
        if precision == "no" and device.type == "cuda":
            recorded = "tf32"
        return replace(ranking, provenance={**ranking.provenance, "precision": recorded,
                                            "memory_plan": self.memory_plan_.to_dict()})

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
            data, config.num_gradient_images, config.num_fitness_images,
            seed=config.seed, image_column=image_column, model=model,
            embed=embedder(model, processor, batch_size=self.memory_plan_.evaluation.batch))
        if processor is None and not hasattr(fitness_images, "shape"):
            processor = load_processor(model, purpose="preprocess the calibration images")
        fitness_pixels = processor_inputs(fitness_images, processor)
        fitness_batch_size = self.memory_plan_.search.batch
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
            head_scores, neuron_scores = self._local_scores(model, gradient_images, processor, fitness_pixels,
                                                            show_progress, precision, timings)
        else:  # the scores of the killed run: the gradient phase is the same computation
            head_scores, neuron_scores = saved["head_scores"], saved["neuron_scores"]
        timings["gradients"] = time.perf_counter() - start - timings.get("unit_order", 0.0)

        shape = measured_shape(model)
        # Scores are means over a unit's weights; times the unit's cost they become totals, so the global mode's
        # per-parameter normalisation compares heads and neurons on the mean saliency of their weights.
        self._unit_scores = (head_scores * shape.params_per_head, neuron_scores * shape.params_per_neuron, shape)
        start = time.perf_counter()
        fitness = EmbeddingFitness(model, fitness_pixels, sparsities=config.fitness_sparsities,
                                   pca_components=config.pca_components, batch_size=fitness_batch_size,
                                   precision=precision, measure=config.fitness_measure,
                                   split_images=config.split_fitness_images, image_size=config.fitness_image_size,
                                   token_fraction=config.fitness_token_fraction, seed=config.seed)
        result = self._search(model, fitness, checkpoint, saved, (head_scores, neuron_scores), show_progress)
        chosen, loss = self._solution(result, fitness)
        timings["search"] = time.perf_counter() - start
        timings["search_forward"] = fitness.forward_seconds
        self.timings_ = timings
        ranking = self.ranking_from_factors(chosen)
        provenance = {
            "method": "snapvit",
            "preset": config.preset_name(),
            # Where and how often the state was saved does not change the ranking, and a local path must not be
            # published in config.json: the checkpointing options stay out.
            "settings": {k: v for k, v in settings.items() if k not in CHECKPOINT_SETTINGS},
            "seed": config.seed,
            "calibration_data": calibration,
            "base_model": public_name(getattr(model.config, "_name_or_path", None) or None),
            # best_loss: the best candidate's; loss: the returned ranking's (the same for solution="best").
            "search": {"best_loss": result.best_fitness, "loss": loss, "evaluations": result.evaluations,
                       "generations": result.generations, "stopped_early": result.stopped_early},
        }
        return replace(ranking, provenance=provenance)

    def _solution(self, result: XNESResult, fitness: EmbeddingFitness) -> tuple[np.ndarray, float | None]:
        """The factors ``config.solution`` takes from the search, and their fitness loss (``None``: no search ran,
        the starting factors)."""
        if result.best_x is None:
            return self.initial_factors_, None
        if self.config.solution == "best":
            return result.best_x, result.best_fitness
        # The mean is never a candidate: one more evaluation gives the result's own loss (on every process alike).
        return result.mean, float(fitness.batch_loss(self.ranking_from_factors, result.mean[None])[0])

    def _local_scores(self, model: PreTrainedModel, gradient_images: Any, processor: Any, fitness_pixels: Any,
                      show_progress: bool, precision: str, timings: dict[str, float]
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The gradient scores, handed out in each block's second-order order when ``unit_order`` asks for one."""
        config = self.config
        scores = gradient_scores(model, gradient_images, processor, config.scores, seed=config.seed,
                                 show_progress=show_progress, precision=precision,
                                 micro_batch=self.memory_plan_.gradient.batch,
                                 checkpoint=self.memory_plan_.gradient.checkpoint)
        if config.unit_order == "scores":
            return scores
        start = time.perf_counter()
        # On the fitness images: every process holds all of them (of the gradient images, maybe only its share), so
        # every process computes the same orders.
        orders = block_orders(model, fitness_pixels, order=config.unit_order,
                              config=CorrectionConfig(num_samples=None, batch_size=self.memory_plan_.correction.batch,
                                                      guard=False), show_progress=show_progress)
        timings["unit_order"] = time.perf_counter() - start
        return tuple(reorder_scores(s, [o[kind] for o in orders]) for kind, s in enumerate(scores))

    def _search(self, model: PreTrainedModel, fitness: EmbeddingFitness, checkpoint: SearchCheckpoint,
                saved: dict[str, Any] | None, scores: tuple[np.ndarray, np.ndarray],
                show_progress: bool) -> XNESResult:
        """The xNES search from the starting factors, or from the saved state of a killed run; sets ``history_``."""
        config = self.config
        shape = self._unit_scores[2]
        block = np.linspace(config.init_mean[0], config.init_mean[1], shape.num_layers)
        self.initial_factors_ = np.concatenate([block, np.repeat(block, shape.num_heads)])
        if saved is not None:
            search, trail = saved["search"], {name: saved[name] for name in TRAILS}
        else:
            covariance = None
            if config.covariance == "cka":
                from .cka import cka_covariance

                covariance = cka_covariance(model, fitness.pixel_values)
            search = XNES(self.initial_factors_, covariance=covariance, sigma=config.sigma,
                          population_size=config.population_size, seed=config.seed)
            trail = {name: [] for name in TRAILS}
            checkpoint.save(*scores, search, trail)  # the gradient phase is never redone
        total = config.max_generations
        if config.max_evaluations is not None:
            by_evaluations = -(-config.max_evaluations // search.population_size)
            total = by_evaluations if total is None else min(total, by_evaluations)
        # Counted in candidates, so the bar says how long is left during the first generation already (a fast
        # search has 3 generations of 10 candidates).
        per_generation, done = search.population_size, search.generations
        with tqdm(total=None if total is None else total * per_generation, initial=done * per_generation,
                  desc="xNES search", unit="candidate", disable=not show_progress) as bar:
            def progress(record: dict[str, Any]) -> None:
                nonlocal done
                trail["best_factors"].append(search.result.best_x.tolist())
                trail["mean_factors"].append(search.mean.tolist())
                if checkpoint.due(search):
                    checkpoint.save(*scores, search, trail)
                done += 1  # the end of a generation: this process built only its share of the candidates
                bar.update(max(0, done * per_generation - bar.n))
                bar.set_postfix(generation=done, best_loss=f"{record['best_fitness']:.4f}")

            def ranking_of(candidate: np.ndarray) -> ElasticRanking:
                bar.update(1)
                return self.ranking_from_factors(candidate)

            def losses(candidates: np.ndarray) -> np.ndarray:
                # Read off the search's own count, so that a resumed search goes on at the sparsity it was due.
                turn = search.generations % len(config.fitness_sparsities) if config.rotate_fitness_sparsities else None
                return fitness.batch_loss(ranking_of, candidates, sparsity_index=turn)

            result = search.optimize(losses,
                                     max_generations=config.max_generations,
                                     max_evaluations=config.max_evaluations, callback=progress,
                                     patience=config.early_stopping_patience,
                                     threshold=config.early_stopping_threshold)
        if checkpoint.is_new(search):
            checkpoint.save(*scores, search, trail)  # the end: a finished search is not run again
        self.history_ = [dict(record, best_factors=best, mean_factors=mean)
                         for record, best, mean in zip(result.history, trail["best_factors"], trail["mean_factors"])]
        return result
