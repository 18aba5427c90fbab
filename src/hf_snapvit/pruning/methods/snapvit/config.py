"""The settings of a SnapViT ranking run and its named presets (``"default"``, ``"fast"``, ``"paper"``), validated when
they are made. :class:`~hf_snapvit.SnapViTPruner` (:mod:`hf_snapvit.pruning.methods.snapvit.pruner`) runs them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from ....utils.precision import PRECISIONS
from ....utils.validation import is_real
from ...scoring import PRESET_SCORES, ScoreConfig
from ..config import RankingConfig
from .block_order import UNIT_ORDERS, UnitOrder
from .fitness import MEASURES
from .search_state import CHECKPOINT_SETTINGS

SOLUTIONS = ("best", "mean")
# Images per search forward when none is given: a GPU needs large batches to stay busy (a ViT-B/16 forward under bf16
# autocast on an H100: 8000 images/s at 256, 6400 at 64; benchmarks/results/bench_ranking_time/ranking_time_*); a
# CPU gains nothing.
FITNESS_BATCH_SIZE = {"cpu": 64, "accelerator": 256}


@dataclass(frozen=True)
class SnapViTConfig(RankingConfig):
    """Settings of a SnapViT ranking run; ``SnapViTConfig.preset("default" | "fast" | "paper")`` gives the named
    presets. How each default was chosen, and what each option measured on the shared ViT-Tiny, is in
    ``docs/defaults.md`` (section "What each SnapViTConfig option measured").

    Args:
        num_gradient_images: Images whose gradients give the local scores.
        num_fitness_images: Images the search scores candidates on (disjoint from the gradient images).
        scores: Gradient score settings (definition, head rows, crops).
        unit_order: Which units of a block the scores keep: ``"scores"`` (the paper: each unit by its own score),
            ``"output"`` (the default) or ``"obs"``: each block's units ordered by greedy elimination on the dense
            model's input covariance of its output projections over the fitness images, by the error of the plain
            slice or of the least-squares re-fit of the prefix correction
            (:mod:`~hf_snapvit.pruning.methods.snapvit.block_order`); the scores are handed out in that order, so
            they still set how many units each block keeps.
        fitness_sparsities: Sparsities every candidate is evaluated at; the fitness averages over them.
        split_fitness_images: Score each fitness sparsity on its own share of the fitness images rather than every
            sparsity on every image (the paper): the search's forwards fall to ``1 / len(fitness_sparsities)``.
        rotate_fitness_sparsities: Score each xNES generation's candidates at one fitness sparsity, taking them in
            turn (generation ``g`` at ``fitness_sparsities[(g - 1) % len(fitness_sparsities)]``); needs
            ``solution="mean"`` and no early stopping, since losses of different generations are then at different
            sparsities.
        fitness_image_size: Side in pixels at which the search forwards the fitness images (teacher and candidates
            alike; position embeddings interpolated); ``None``: the model's input size (the paper).
        fitness_token_fraction: Share of each fitness image's patch tokens the search forwards (a fixed random
            subset per image; the tokens before the patches are always kept); 1: every token (the paper).
        pca_components: PCA dimensions of the embedding similarity.
        fitness_measure: How a candidate's embeddings are compared with the dense model's: ``"cosine"`` (the
            paper: mean per-image cosine similarity of the PCA projections), ``"cka"`` (their linear CKA over the
            fitness images) or ``"blocks"`` (cosine similarity of every block's centred token-mean output,
            averaged over blocks).
        max_generations: Search budget in xNES generations (distribution updates); 0: no search.
        max_evaluations: Search budget in candidate evaluations (the reference's "50 iterations" are 50 evaluations).
        population_size: xNES population; default 4 + ⌊3 ln d⌋.
        solution: Which factors of the search become the ranking: ``"mean"`` (the default: the search
            distribution's mean after its last update) or ``"best"`` (the paper: the candidate with the lowest
            fitness loss). The provenance records both losses.
        early_stopping_patience: End the search once the best fitness loss has gone this many generations without
            falling by more than ``early_stopping_threshold``; ``None``: run the whole budget.
        early_stopping_threshold: The smallest fall in the fitness loss that counts as an improvement.
        init_mean: The search starts with block factors from ``init_mean[0]`` (first block) to ``init_mean[1]``
            (last), each head taking its block's value, as in the reference.
        sigma: Initial standard deviation of the search distribution (its covariance times ``sigma²``).
        covariance: Initial covariance: ``"identity"`` (the reference) or ``"cka"``, the linear-CKA similarity of the
            units' activations on the fitness images (paper appendix).
        mode, min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset: The ranking's mode and floors (also
            those of the search's candidates); see :class:`~hf_snapvit.pruning.methods.RankingConfig`.
        seed: Seeds the image draw, the crops and the search.
        fitness_batch_size: Images per forward pass in the search; ``None``: 256 on an accelerator, 64 on a CPU. It
            changes the speed only; the provenance records what ran.
        precision: Forward passes in ``"bf16"`` (autocast for the gradients, a bf16 copy of the weights for the
            search; scores, PCA and similarities stay float32/float64), ``"fp32"`` (TF32 products on CUDA) or
            ``"auto"``: accelerate's ``--mixed_precision`` when one is configured, else bf16 on CUDA and on CPUs
            with bf16 matrix units, float32 elsewhere (:func:`hf_snapvit.utils.precision.resolve_precision`).
        checkpoint_every: Save the search state every this many xNES generations (and once the gradient scores are
            computed, and at the end) to ``output_dir``; ``None``: never. A run killed part-way and started again
            with the same settings, data and model resumes and returns the ranking an uninterrupted run returns
            (:mod:`~hf_snapvit.pruning.methods.snapvit.search_state`); neither option is in the provenance.
        output_dir: Folder of the search state; a run finding a state there resumes from it (and refuses one of
            a search with other settings).
    """

    NOT_PRESET: ClassVar[tuple[str, ...]] = (*RankingConfig.NOT_PRESET, "precision", "fitness_batch_size",
                                             *CHECKPOINT_SETTINGS)

    num_gradient_images: int = 1000
    num_fitness_images: int = 1000
    scores: ScoreConfig = field(default_factory=lambda: PRESET_SCORES["default"][1])
    unit_order: UnitOrder = "output"
    fitness_sparsities: tuple[float, ...] = (0.1, 0.3, 0.5, 0.6)
    split_fitness_images: bool = False
    rotate_fitness_sparsities: bool = False
    fitness_image_size: int | None = None
    fitness_token_fraction: float = 1.0
    pca_components: int = 192
    fitness_measure: Literal["cosine", "cka", "blocks"] = "cosine"
    max_generations: int | None = 3
    max_evaluations: int | None = None
    population_size: int | None = None
    solution: Literal["best", "mean"] = "mean"
    early_stopping_patience: int | None = None
    early_stopping_threshold: float = 0.0
    init_mean: tuple[float, float] = (1.2, 0.8)
    sigma: float = 0.5
    covariance: Literal["identity", "cka"] = "identity"
    fitness_batch_size: int | None = None
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    checkpoint_every: int | None = None
    output_dir: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()  # mode, floors, seed
        if self.max_generations is None and self.max_evaluations is None:
            raise self.error_class("Give a search budget: max_generations and/or max_evaluations.")
        for name in ("num_gradient_images", "num_fitness_images", "pca_components"):
            self._check_int(name, 1)
        for name, minimum in (("fitness_batch_size", 1), ("fitness_image_size", 1), ("max_generations", 0),
                              ("max_evaluations", 0), ("population_size", 2), ("early_stopping_patience", 1)):
            self._check_int(name, minimum, optional=True)
        self._check_sparsities()
        self._check_real("fitness_token_fraction", 0, 1, low_open=True,
                         hint="the share of each fitness image's patch tokens to forward, e.g. 0.5, or 1 for all")
        self._check_bool("split_fitness_images")
        if self.split_fitness_images and self.num_fitness_images < 2 * len(self.fitness_sparsities):
            count = len(self.fitness_sparsities)
            raise self.error_class(f"{self._owner()}(num_fitness_images={self.num_fitness_images}, "
                                   f"split_fitness_images=True) deals the fitness images out among {count} "
                                   f"sparsities, two at least each; give num_fitness_images >= {2 * count} or "
                                   "split_fitness_images=False.")
        self._check_rotation()
        self._check_real("early_stopping_threshold", 0, hint="e.g. 0.003 (the smallest fall in the fitness loss "
                         "that counts as an improvement)")
        self._check_real("sigma", 0, low_open=True, hint="e.g. 0.5")
        if not (isinstance(self.init_mean, (tuple, list)) and len(self.init_mean) == 2
                and all(map(is_real, self.init_mean))):
            raise self.error_class(f"{self._owner()}(init_mean={self.init_mean!r}): give two finite factors (first "
                                   "block, last block), e.g. (1.2, 0.8).")
        for name, choices in (("covariance", ("identity", "cka")), ("solution", SOLUTIONS),
                              ("fitness_measure", MEASURES), ("unit_order", UNIT_ORDERS), ("precision", PRECISIONS)):
            self._check_choice(name, choices)
        self._check_int("checkpoint_every", 1, optional=True)
        self._check_folder("output_dir", "snapvit-search")
        if self.checkpoint_every is not None and self.output_dir is None:
            raise self.error_class(f"{self._owner()}(checkpoint_every={self.checkpoint_every!r}) needs "
                                   "output_dir=FOLDER to save the search state in, e.g. output_dir='snapvit-search'.")
        self._check_settings("scores", ScoreConfig, "ScoreConfig(definition='obd')")

    def _check_sparsities(self) -> None:
        sparsities = self.fitness_sparsities
        if not (isinstance(sparsities, (tuple, list)) and sparsities
                and all(is_real(s) and 0 <= s < 1 for s in sparsities)):
            raise self.error_class(f"{self._owner()}(fitness_sparsities={sparsities!r}): give a non-empty tuple of "
                                   "sparsities in [0, 1) to evaluate candidates at, e.g. (0.1, 0.3, 0.5, 0.6).")
        object.__setattr__(self, "fitness_sparsities", tuple(float(s) for s in sparsities))

    def _check_rotation(self) -> None:
        self._check_bool("rotate_fitness_sparsities")
        if not self.rotate_fitness_sparsities:
            return
        # One generation's losses are at another sparsity than the next one's: neither the best candidate nor a
        # stall of the loss compares like with like.
        owner = self._owner()
        if self.split_fitness_images:
            raise self.error_class(f"{owner}(rotate_fitness_sparsities=True, split_fitness_images=True): both cut "
                                   "the search to one forward per image and candidate; choose one.")
        if self.solution != "mean":
            raise self.error_class(f"{owner}(rotate_fitness_sparsities=True, solution={self.solution!r}): the best "
                                   "candidate would compare losses at different sparsities; use solution='mean'.")
        if self.early_stopping_patience is not None:
            raise self.error_class(f"{owner}(rotate_fitness_sparsities=True, early_stopping_patience="
                                   f"{self.early_stopping_patience!r}): a stall would compare losses at different "
                                   "sparsities; use early_stopping_patience=None.")

    @classmethod
    def presets(cls) -> dict[str, "SnapViTConfig"]:
        """``"default"``: the field defaults (1000 + 1000 images, 2 + 10 crops at the input size, OBD scores, each
        block's units in ``"output"`` order, 3 xNES generations at sigma 0.5, the search's mean as the result,
        global ranking). ``"fast"``: the same choices sized for a CPU (128 + 128 images, 2 global + 4 local 96-px
        crops), the fitness at 30 % sparsity only. ``"paper"``: the reference code's settings (squared accumulated
        gradients in their own order, 50 evaluations at sigma 1, the best candidate as the result, paired ranking)."""
        fast_images, fast_scores = PRESET_SCORES["fast"]
        return {
            "default": cls(),
            "paper": cls(scores=PRESET_SCORES["paper"][1], unit_order="scores", max_generations=None,
                         max_evaluations=50, sigma=1.0, mode="paired", solution="best"),
            "fast": cls(num_gradient_images=fast_images, num_fitness_images=fast_images, scores=fast_scores,
                        fitness_sparsities=(0.3,)),
        }

    @property
    def images_needed(self) -> int:
        """Calibration images a run reads: the gradient images and the fitness images."""
        return self.num_gradient_images + self.num_fitness_images
