"""The settings every ranking method has, and the data-free methods' settings.

:class:`RankingConfig` is the base of every method's config class (:func:`~hf_snapvit.pruning.methods.registry.
register_method` refuses any other): the ranking's mode, its floors and the seed, named presets, and the number of
calibration images a run reads. :class:`DataFreeConfig` is the config of the methods that read no images.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from ...elastic.ranking import Floors, RankingMode
from ...utils.validation import Settings

C = TypeVar("C", bound="RankingConfig")

PRESETS = ("default", "fast", "paper")
MODES = ("global", "paired")


@dataclass(frozen=True)
class RankingConfig(Settings):
    """Settings of every ranking method.

    Args:
        mode: ``"global"`` (heads and neurons compete by score per parameter) or ``"paired"`` (the reference code's
            per-block rule); see :class:`~hf_snapvit.ElasticRanking`.
        min_head_keep_ratio, min_neuron_keep_ratio, paired_head_offset: The floors (see
            :class:`~hf_snapvit.Floors`).
        seed: Seed of every random choice of the method, recorded in the provenance.
    """

    mode: RankingMode = "global"
    min_head_keep_ratio: float = Floors.min_head_keep_ratio
    min_neuron_keep_ratio: float = Floors.min_neuron_keep_ratio
    paired_head_offset: float = Floors.paired_head_offset
    seed: int = 0

    # Settings that do not define a preset: a run keeps its preset's name whatever its seed, floors or mode.
    NOT_PRESET: ClassVar[tuple[str, ...]] = ("seed", "mode", "min_head_keep_ratio", "min_neuron_keep_ratio",
                                             "paired_head_offset")

    def __post_init__(self) -> None:
        self._check_choice("mode", MODES)
        # A head keep ratio of 1 keeps every head (BLIP-2's); the paired offset must leave some ratio.
        self._check_real("min_head_keep_ratio", 0, 1, hint="a fraction")
        self._check_real("min_neuron_keep_ratio", 0, 1, hint="a fraction")
        self._check_real("paired_head_offset", 0, 1, high_open=True, hint="a fraction")
        self._check_int("seed", 0)

    @classmethod
    def presets(cls: type[C]) -> dict[str, C]:
        """The named settings of this method (``"default"``: the field defaults)."""
        return {"default": cls()}

    @classmethod
    def preset(cls: type[C], name: str, **overrides: Any) -> C:
        """The preset ``name`` with ``overrides`` replacing its fields (unknown ones are refused by name)."""
        presets = cls.presets()
        if name not in presets:
            raise cls.error_class(f"Unknown preset {name!r} of {cls.__name__}; choose one of {sorted(presets)}.")
        cls.refuse_unknown(overrides)
        return replace(presets[name], **overrides)

    @classmethod
    def refuse_unknown(cls, settings: Any) -> None:
        """Raise the class's error naming every key of ``settings`` that is not one of its fields."""
        known = cls.setting_names()
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise cls.error_class(f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}; its settings: "
                                  f"{', '.join(known)}.")

    def preset_name(self) -> str | None:
        """The preset these settings are (:attr:`NOT_PRESET` settings aside), or ``None`` for custom settings."""
        def defining(config: RankingConfig) -> dict[str, Any]:
            return {k: v for k, v in config.to_dict().items() if k not in self.NOT_PRESET}

        mine = defining(self)
        return next((name for name, preset in self.presets().items() if defining(preset) == mine), None)

    @property
    def floors(self) -> Floors:
        return Floors(self.min_head_keep_ratio, self.min_neuron_keep_ratio, self.paired_head_offset)

    @property
    def images_needed(self) -> int:
        """Calibration images a run reads (0: the method reads none)."""
        return 0


@dataclass(frozen=True)
class DataFreeConfig(RankingConfig):
    """Settings of a data-free method (``magnitude``, ``lamp``, ``random`` and scorers registered by function):
    the mode, the floors and the seed. It reads no images, so every named preset is its defaults."""

    @classmethod
    def presets(cls) -> dict[str, "DataFreeConfig"]:
        return {name: cls() for name in PRESETS}
