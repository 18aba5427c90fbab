"""Ranking methods behind a registry, and :func:`rank`, the one entry point for all of them.

A method is a config class and a ranker class registered under a name (:mod:`.registry`); it turns a model (and,
for data-driven methods, calibration data) into an :class:`~hf_snapvit.elastic.ranking.ElasticRanking`, which
:func:`rank` completes with the provenance (the method's name, the wall time of the run and of its phases).
Built in: ``"snapvit"`` (:mod:`.snapvit`), the gradient baselines ``"snip"`` and ``"taylor-ce"`` and the data-free
``"magnitude"``, ``"lamp"`` and ``"random"`` (:mod:`.baselines`); any other with :func:`register_method`.
"""

from __future__ import annotations

from .baselines import GradientBaselineConfig
from .config import DataFreeConfig, RankingConfig
from .dispatch import rank
from .ranker import Scorer, ScoreRanker, data_free_ranker
from .registry import RankingMethod, available_methods, ranking_method, register_method
from .snapvit import SnapViTConfig, SnapViTPruner

__all__ = ["DataFreeConfig", "GradientBaselineConfig", "RankingConfig", "RankingMethod", "ScoreRanker", "Scorer",
           "SnapViTConfig", "SnapViTPruner", "available_methods", "data_free_ranker", "rank", "ranking_method",
           "register_method"]
