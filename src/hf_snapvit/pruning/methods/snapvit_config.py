"""The settings of a SnapViT ranking run and its named presets (``"default"``, ``"fast"``, ``"paper"``), validated when
they are made. :class:`~hf_snapvit.SnapViTPruner` (:mod:`hf_snapvit.pruning.methods.snapvit`) runs them."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ...distributed import PRECISIONS
from ...errors import ConfigError
from ..fitness import MEASURES
from ...elastic.ranking import Floors, RankingMode
from ..scoring import ScoreConfig
from ...validation import is_real, require_choice, require_int
from ...data.views import MultiCropConfig
from .block_order import UNIT_ORDERS, UnitOrder
from .search_state import CHECKPOINT_SETTINGS

PRESETS = ("default", "fast", "paper")
SOLUTIONS = ("best", "mean")
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
        unit_order: Which units of a block the scores keep: ``"scores"`` (the paper: each unit by its own score),
            ``"output"`` (the default) or ``"obs"``: each block's units ordered by greedy elimination on the dense
            model's input covariance of its output projections over the fitness images, by the error of the plain
            slice or of the least-squares re-fit that the prefix correction makes
            (:mod:`hf_snapvit.pruning.methods.block_order`); the scores are then handed out in that order, so they still set
            how many units each block keeps. On the shared ViT-Tiny, three seeds of the ``fast`` preset, ``"output"``
            lifted top-1 at 30 % from 36.1 to 40.1 without correction and from 41.7 to 49.1 with the prefix
            correction (``docs/defaults.md``).
        fitness_sparsities: Sparsities every candidate is evaluated at; the fitness averages over them.
        split_fitness_images: Score each fitness sparsity on its own share of the fitness images (1000 images and
            four sparsities: 250 each) rather than every sparsity on every image (the paper): the search's forwards
            fall to a quarter while it still sees every image (:class:`~hf_snapvit.pruning.fitness.EmbeddingFitness`).
        rotate_fitness_sparsities: Score each xNES generation's candidates at one fitness sparsity, on every fitness
            image, taking the sparsities in the order given (generation ``g`` at ``fitness_sparsities[(g - 1) %
            len(fitness_sparsities)]``): one forward per image and candidate, as with one sparsity, while a longer
            search still answers for every size. Losses of different generations are then at different sparsities,
            so it needs ``solution="mean"`` and no early stopping. Measured against the ``fast`` preset's fitness at
            30 % only, at 3 and 20 generations, in ``docs/defaults.md``.
        fitness_image_size: Side in pixels at which the search forwards the fitness images (the dense teacher and
            every candidate alike; position embeddings interpolated, as for the gradients' small crops); ``None``:
            the model's input size (the paper). A ViT forward's cost grows faster than its token count, so a smaller
            side makes the search's forwards several times cheaper; the gradient scores and unit order still see
            the images at the input size. On the shared ViT-Tiny (``fast`` preset, three seeds) 128 px cut the
            search to 28-31 % of its time and lost 3.1 points of top-1 at 30 %, no better than no search
            (``docs/defaults.md``).
        fitness_token_fraction: Share of each fitness image's patch tokens the search forwards (a fixed random
            subset per image, the same for the teacher and every candidate; the tokens before the patches are always
            kept); 1: every token (the paper). A block's cost follows its tokens, so 0.5 about halves the search's
            forwards; unlike a smaller side, every kept patch is as the model was trained to see it. On the shared
            ViT-Tiny (the ``fast`` preset then scoring at 10 / 30 / 50 %, three seeds) 0.5 lost 2.2 points of top-1
            at 30 %, within a point of no search.
        pca_components: PCA dimensions of the embedding similarity.
        fitness_measure: How a candidate's embeddings are compared with the dense model's: ``"cosine"`` (the
            paper: the mean per-image cosine similarity of the PCA projections) or ``"cka"`` (their linear CKA over
            the fitness images: only the images' geometry counts, not the embeddings' rotation or scale) or
            ``"blocks"`` (the cosine similarity of every block's token-mean output, centred on the dense model's
            mean, averaged over blocks: per-block feature matching). For long searches prefer ``"cka"``: on the shared
            ViT-Tiny, 20 generations with the cosine measure lost k-NN accuracy at 10-30 % against 3 generations,
            with CKA they did not (three seeds, ``docs/defaults.md``).
        max_generations: Search budget in xNES generations (distribution updates).
        max_evaluations: Search budget in candidate evaluations (the reference's "50 iterations" are 50 evaluations).
        population_size: xNES population; default 4 + ⌊3 ln d⌋.
        solution: Which factors of the search become the ranking: ``"mean"`` (the default: the search
            distribution's mean after its last update) or ``"best"`` (the paper: the single candidate with the lowest
            fitness loss of all evaluated). The best of many noisy comparisons is partly chosen for its noise on the
            fitness images; the mean averages every generation's candidates, weighted by their ranks, so it is not
            chosen for that noise. On the shared ViT-Tiny, three seeds, the ``default`` preset's mean kept top-1 at
            30 % at 43.5 where its best sample fell to 39.7, and the ``fast`` preset's mean matched or beat its best
            sample (``docs/defaults.md``). The provenance records both losses.
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
            returns (:mod:`hf_snapvit.pruning.methods.search_state`). Neither option changes the ranking, so neither is
            recorded in its provenance.
        output_dir: Folder of the search state; a run finding a state there resumes from it (and refuses one of
            a search with other settings).
    """

    num_gradient_images: int = 1000
    num_fitness_images: int = 1000
    scores: ScoreConfig = field(default_factory=lambda: ScoreConfig(definition="obd"))
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
        require_int(owner, "fitness_image_size", self.fitness_image_size, 1, optional=True)
        for name, minimum in (("max_generations", 0), ("max_evaluations", 0), ("population_size", 2),
                              ("early_stopping_patience", 1)):
            require_int(owner, name, getattr(self, name), minimum, optional=True)
        sparsities = self.fitness_sparsities
        if not (isinstance(sparsities, (tuple, list)) and sparsities
                and all(is_real(s) and 0 <= s < 1 for s in sparsities)):
            raise ConfigError(f"{owner}(fitness_sparsities={sparsities!r}): give a non-empty tuple of sparsities in "
                              "[0, 1) to evaluate candidates at, e.g. (0.1, 0.3, 0.5, 0.6).")
        object.__setattr__(self, "fitness_sparsities", tuple(float(s) for s in sparsities))
        if not is_real(self.fitness_token_fraction) or not 0 < self.fitness_token_fraction <= 1:
            raise ConfigError(f"{owner}(fitness_token_fraction={self.fitness_token_fraction!r}): give the share of "
                              "each fitness image's patch tokens to forward, in (0, 1], e.g. 0.5, or 1 for all.")
        if not isinstance(self.split_fitness_images, bool):
            raise ConfigError(f"{owner}(split_fitness_images={self.split_fitness_images!r}): give True or False.")
        if self.split_fitness_images and self.num_fitness_images < 2 * len(sparsities):
            raise ConfigError(f"{owner}(num_fitness_images={self.num_fitness_images}, split_fitness_images=True) deals "
                              f"the fitness images out among {len(sparsities)} sparsities, two at least each; give "
                              f"num_fitness_images >= {2 * len(sparsities)} or split_fitness_images=False.")
        self._check_rotation(owner)
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
        require_choice(owner, "solution", self.solution, SOLUTIONS)
        require_choice(owner, "fitness_measure", self.fitness_measure, MEASURES)
        require_choice(owner, "unit_order", self.unit_order, UNIT_ORDERS)
        require_choice(owner, "precision", self.precision, PRECISIONS)
        require_choice(owner, "mode", self.mode, ("global", "paired"))
        for name in ("min_head_keep_ratio", "min_neuron_keep_ratio", "paired_head_offset"):
            value = getattr(self, name)
            closed = name != "paired_head_offset"  # a keep ratio of 1 keeps every unit (BLIP-2's heads)
            if not is_real(value) or not (0 <= value <= 1 if closed else 0 <= value < 1):
                raise ConfigError(f"{owner}({name}={value!r}): {name} must be a fraction in "
                                  f"[0, {'1]' if closed else '1)'}.")
        self._check_checkpointing(owner)
        if not isinstance(self.scores, ScoreConfig):
            raise ConfigError(f"{owner}(scores={self.scores!r}): scores must be a ScoreConfig, e.g. "
                              "ScoreConfig(definition='obd').")

    def _check_rotation(self, owner: str) -> None:
        rotate = self.rotate_fitness_sparsities
        if not isinstance(rotate, bool):
            raise ConfigError(f"{owner}(rotate_fitness_sparsities={rotate!r}): give True or False.")
        if not rotate:
            return
        # One generation's losses are at another sparsity than the next one's: neither the best candidate nor a
        # stall of the loss compares like with like.
        if self.split_fitness_images:
            raise ConfigError(f"{owner}(rotate_fitness_sparsities=True, split_fitness_images=True): both cut the "
                              "search to one forward per image and candidate; choose one.")
        if self.solution != "mean":
            raise ConfigError(f"{owner}(rotate_fitness_sparsities=True, solution={self.solution!r}): the best "
                              "candidate would compare losses at different sparsities; use solution='mean'.")
        if self.early_stopping_patience is not None:
            raise ConfigError(f"{owner}(rotate_fitness_sparsities=True, early_stopping_patience="
                              f"{self.early_stopping_patience!r}): a stall would compare losses at different "
                              "sparsities; use early_stopping_patience=None.")

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
        """``"default"``: the field defaults (1000 + 1000 images, 2 + 10 crops at the input size, OBD scores = per-image
        squared gradients times w², each block's units in ``"output"`` order, 3 xNES generations at sigma 0.5, the
        search's mean as the result, global ranking). ``"fast"``: the same choices sized for a CPU (128 + 128 images, 2
        global + 4 local 96-px crops), with the fitness at 30 % sparsity only. ``"paper"``: the reference code's
        settings (squared accumulated gradients in their own order, 50 evaluations at sigma 1, the best candidate as
        the result, paired ranking). On the shared ViT-Tiny the OBD scores beat the reference's squared gradients by
        3-4 points of mean top-1 at 10-50 % sparsity, sigma 0.5 beat sigma 1 at the same 3-generation budget, the
        ``"output"`` order lifted top-1 at 30 % by 4 points, and the search's mean kept 3.8 points at 30 % that the
        ``default`` preset's best candidate lost; leaving 60 % out of the fitness lifted the ``fast`` preset's top-1 at
        30 % by 2.6 points but cost the ``default`` preset's 1.0, and scoring the ``fast`` preset at 30 % only, a third
        of the search's forwards, cost it 0.5 points at 30 % on the mean (three seeds each; ``docs/defaults.md``).
        Run 20 generations instead of 3, that fitness held k-NN at 10 and 30 % and lost about a point at 50 % (nine
        seeds); for a longer ``fast`` search, ``fitness_sparsities=(0.1, 0.3, 0.5)`` stayed within a
        point of k-NN at every size (three seeds)."""
        presets = {
            "default": cls(),
            "paper": cls(
                scores=ScoreConfig(definition="accumulated", batch_size=16),
                unit_order="scores",
                max_generations=None,
                max_evaluations=50,
                sigma=1.0,
                mode="paired",
                solution="best",
            ),
            "fast": cls(
                num_gradient_images=128,
                num_fitness_images=128,
                scores=ScoreConfig(definition="obd", crops=MultiCropConfig(num_local=4, local_size=96)),
                fitness_sparsities=(0.3,),
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
        """Every setting by name (the score settings nested), as a ranking's record stores it."""
        return asdict(self)
