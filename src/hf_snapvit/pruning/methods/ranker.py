"""The base of a ranking method whose unit scores are its ranking, and the wrapper of a data-free scorer function.

A method is a config class and a ranker class (:mod:`.registry`): ``ranker_cls(config).fit(model, data, *,
processor, show_progress, max_memory[, label_column])`` returns an :class:`~hf_snapvit.ElasticRanking`. A subclass
of :class:`ScoreRanker` only computes the scores; :meth:`ScoreRanker.fit` adds the model's shape, the config's mode
and floors and the provenance. :class:`~hf_snapvit.SnapViTPruner` implements ``fit`` itself.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from transformers import PreTrainedModel

from ...architectures.budget import ModelShape
from ...architectures.flops import measured_shape
from ...elastic.ranking import ElasticRanking
from ...utils.files import public_name
from .config import RankingConfig

Scorer = Callable[[PreTrainedModel, ModelShape, int], "tuple[np.ndarray, np.ndarray]"]


class ScoreRanker:
    """Ranks a model by :meth:`scores`. After :meth:`fit`: ``settings_`` and ``calibration_`` (what the provenance
    records; a subclass may set them in :meth:`scores`) and ``timings_`` (its phases' wall times, seconds)."""

    def __init__(self, config: RankingConfig) -> None:
        self.config = config
        self.settings_: dict[str, Any] = {}
        self.calibration_: dict[str, Any] | None = None
        self.timings_: dict[str, float] = {}

    def scores(self, model: PreTrainedModel, shape: ModelShape, data: Any, **run: Any
               ) -> tuple[np.ndarray, np.ndarray]:
        """``(head_scores [L, H], neuron_scores [L, F])``: non-negative totals per unit (larger = more important),
        in the model's current unit order. ``run``: ``processor``, ``show_progress``, ``max_memory``,
        ``label_column``."""
        raise NotImplementedError(f"{type(self).__name__} must define scores(model, shape, data, **run)")

    def fit(self, model: PreTrainedModel, data: Any = None, *, processor: Any = None, show_progress: bool = True,
            max_memory: int | str | None = None, label_column: str = "label") -> ElasticRanking:
        """The ranking of ``model`` by :meth:`scores`, in the config's mode and with its floors."""
        shape = measured_shape(model)
        self.settings_, self.calibration_ = {}, None
        head_scores, neuron_scores = self.scores(model, shape, data, processor=processor, show_progress=show_progress,
                                                 max_memory=max_memory, label_column=label_column)
        config = self.config
        return ElasticRanking(
            head_scores=np.asarray(head_scores, dtype=np.float64),
            neuron_scores=np.asarray(neuron_scores, dtype=np.float64),
            shape=shape,
            mode=config.mode,
            **config.floors.to_dict(),
            provenance={
                "method": type(self).__name__,  # rank() records the registered name
                "settings": self.settings_,
                "seed": config.seed,
                "calibration_data": self.calibration_,
                "base_model": public_name(getattr(model.config, "_name_or_path", None) or None),
            },
        )


class DataFreeRanker(ScoreRanker):
    """Ranks by a data-free ``scorer(model, shape, seed) -> (head_scores, neuron_scores)``; see
    :func:`data_free_ranker`."""

    scorer: Scorer

    def scores(self, model: PreTrainedModel, shape: ModelShape, data: Any, **run: Any
               ) -> tuple[np.ndarray, np.ndarray]:
        return type(self).scorer(model, shape, self.config.seed)


def data_free_ranker(scorer: Scorer, name: str | None = None) -> type[DataFreeRanker]:
    """The ranker class of a data-free ``scorer(model, shape, seed) -> (head_scores [L, H], neuron_scores [L, F])``,
    to register with :class:`~.config.DataFreeConfig` and ``needs_data=False``."""
    label = name or getattr(scorer, "__name__", "scorer")
    return type(f"DataFreeRanker[{label}]", (DataFreeRanker,), {"scorer": staticmethod(scorer)})
