"""The registry of ranking methods: a name, a config class, a ranker class and whether the method reads images.

It starts empty; each method registers itself where it is defined (:mod:`.baselines`, :mod:`.snapvit`), and a
user's method the same way::

    register_method("depth", DepthConfig, DepthRanker, needs_data=False)
    hf_snapvit.rank(model, "depth", depth_weight=2.0)

The config class subclasses :class:`~.config.RankingConfig` (mode, floors, seed, presets); the ranker class is
made with a config and ranks in ``fit(model, data, *, processor, show_progress, max_memory[, label_column])``
(:class:`~.ranker.ScoreRanker` does all but the scores). :func:`~hf_snapvit.rank`, the CLI and the sweep read
``needs_data`` and the config class from here.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, is_dataclass, replace
from typing import Any

from ...errors import ConfigError
from .config import DataFreeConfig, RankingConfig
from .ranker import data_free_ranker


@dataclass(frozen=True)
class RankingMethod:
    """A registered ranking method.

    Args:
        name: The name ``rank(model, method=name)`` takes.
        config_cls: Its settings, a :class:`~.config.RankingConfig` subclass.
        ranker_cls: Made as ``ranker_cls(config)``; its ``fit`` returns the ranking.
        needs_data: Whether it reads calibration images (``rank`` refuses a call without them).
        needs_labels: Whether it reads a label column of the data too (``rank`` passes ``label_column``).
    """

    name: str
    config_cls: type[RankingConfig]
    ranker_cls: type
    needs_data: bool
    needs_labels: bool = False

    def config(self, config: RankingConfig | None = None, **overrides: Any) -> RankingConfig:
        """The run's settings: ``config`` (default: the preset ``overrides.pop("preset")``, else ``"default"``)
        with ``overrides`` replacing its fields; a key the config class lacks is refused with the list it has."""
        preset = overrides.pop("preset", None)
        overrides = _without_legacy_defaults(self, overrides)
        known = self.config_cls.setting_names()
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(f"method={self.name!r} has no setting {', '.join(map(repr, unknown))}; its settings "
                              f"({self.config_cls.__name__}): {', '.join(known)}.")
        if config is None:
            return self.config_cls.preset(preset or "default", **overrides)
        if preset is not None:
            raise ConfigError(f"Give either config={type(config).__name__}(...) or preset={preset!r} for "
                              f"method={self.name!r}, not both: start from {self.config_cls.__name__}.preset("
                              f"{preset!r}, ...) and pass that as config.")
        if not isinstance(config, self.config_cls):
            config = _legacy_config(self, config)
        return replace(config, **overrides)


_METHODS: dict[str, RankingMethod] = {}

def _without_legacy_defaults(method: RankingMethod, overrides: dict[str, Any]) -> dict[str, Any]:
    """rank()'s keywords before the registry, at the values that meant "not given": ``mode=None`` and
    ``max_generations=None`` (the preset's), and ``precision`` for a method without it (it was ignored; the CLI
    passes ``"auto"`` for every method)."""
    kept = {}
    for key, value in overrides.items():
        if key in ("mode", "max_generations") and value is None:
            continue
        if key == "precision" and key not in method.config_cls.setting_names():
            if value != "auto":
                warnings.warn(f"precision={value!r} has no effect on method={method.name!r} (its forwards follow "
                              "accelerate's --mixed_precision) and will be refused in a later release; leave it "
                              "out.", FutureWarning, stacklevel=4)
            continue
        kept[key] = value
    return kept


def _legacy_config(method: RankingMethod, config: Any) -> RankingConfig:
    """Before the registry a gradient baseline took its images and crops from a SnapViTConfig, and a data-free
    method ignored any config: both still work, with a warning."""
    target = method.config_cls
    taken = {k: getattr(config, k) for k in ("num_gradient_images", "scores")
             if k in target.setting_names() and hasattr(config, k)}
    if not isinstance(config, RankingConfig) or (target is not DataFreeConfig and not taken):
        raise ConfigError(f"config must be a {target.__name__} for method={method.name!r}, got "
                          f"{type(config).__name__}; e.g. config={target.__name__}.preset('fast').")
    warnings.warn(f"config={type(config).__name__}(...) for method={method.name!r} is deprecated: give "
                  f"config={target.__name__}(...)" + (f" ({', '.join(taken)} taken from it)" if taken else
                                                      " (it is ignored)") + ".", FutureWarning, stacklevel=4)
    return target(**taken)


def register_method(name: str, config_cls: Any = None, ranker_cls: type | None = None, *,
                    needs_data: bool | None = None, needs_labels: bool = False, exist_ok: bool = False) -> None:
    """Make a method available as ``rank(model, method=name)``, the CLI's ``--method name`` and the sweep's.

    Args:
        name: The method's name.
        config_cls: Its settings: a frozen dataclass subclassing :class:`~.config.RankingConfig`.
        ranker_cls: Made as ``ranker_cls(config)``; ``fit(model, data, *, processor, show_progress, max_memory)``
            (and ``label_column`` with ``needs_labels``) returns an :class:`~hf_snapvit.ElasticRanking`.
            :class:`~.ranker.ScoreRanker` gives ``fit`` to a class that defines ``scores``.
        needs_data: Whether it reads calibration images.
        needs_labels: Whether it reads labels too.
        exist_ok: Replace a method of that name instead of refusing.

    ``register_method(name, scorer)`` with a data-free ``scorer(model, shape, seed) -> (head_scores [L, H],
    neuron_scores [L, F])`` still works (deprecated): it registers ``data_free_ranker(scorer)`` with
    :class:`~.config.DataFreeConfig`.
    """
    if callable(config_cls) and not isinstance(config_cls, type) and ranker_cls is None:
        warnings.warn(f"register_method({name!r}, scorer) is deprecated: register_method({name!r}, DataFreeConfig, "
                      "data_free_ranker(scorer), needs_data=False) (both from hf_snapvit.pruning.methods).",
                      FutureWarning, stacklevel=2)
        config_cls, ranker_cls, needs_data = DataFreeConfig, data_free_ranker(config_cls, name), False
    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_method(name={name!r}): give the method's name, a non-empty string.")
    if name in _METHODS and not exist_ok:
        raise ConfigError(f"method {name!r} is already registered; pass exist_ok=True to replace it.")
    if not (isinstance(config_cls, type) and issubclass(config_cls, RankingConfig) and is_dataclass(config_cls)):
        raise ConfigError(f"register_method({name!r}, config_cls={config_cls!r}): give a dataclass subclassing "
                          "hf_snapvit.pruning.methods.RankingConfig (DataFreeConfig for a method without settings).")
    if not (isinstance(ranker_cls, type) and callable(getattr(ranker_cls, "fit", None))):
        raise ConfigError(f"register_method({name!r}, ranker_cls={ranker_cls!r}): give a class made with the config "
                          "whose fit(model, data, ...) returns the ranking, e.g. a ScoreRanker subclass.")
    if not isinstance(needs_data, bool) or not isinstance(needs_labels, bool):
        raise ConfigError(f"register_method({name!r}, needs_data={needs_data!r}, needs_labels={needs_labels!r}): "
                          "say whether the method reads calibration images (and labels): True or False.")
    _METHODS[name] = RankingMethod(name, config_cls, ranker_cls, needs_data, needs_labels and needs_data)


def ranking_method(name: str) -> RankingMethod:
    """The registered method ``name``; an unknown name is refused with the list of known ones."""
    if name not in _METHODS:
        raise ConfigError(f"Unknown ranking method {name!r}. Available: {', '.join(available_methods())}.")
    return _METHODS[name]


def available_methods() -> list[str]:
    """Names accepted by ``rank(method=...)``."""
    return sorted(_METHODS)
