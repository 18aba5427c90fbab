"""A load that fits its weights to its size: what loading knows of correction and recovery, and nothing more.

Fitting is its own verb (:func:`hf_snapvit.correct`, :func:`hf_snapvit.recover`), above loading in the data flow:
:mod:`hf_snapvit.fitting` hands the loader a :class:`FitStep`, which the loader runs on the dense weights it read, so
``loading/`` imports neither :mod:`hf_snapvit.correction` nor :mod:`hf_snapvit.recovery`.

``from_pretrained``'s ``correction_data=`` / ``correction=`` / ``recovery_data=`` / ``recovery=`` keep working for one
release with a :class:`FutureWarning`: :func:`deprecated_fit_step` turns them into a :class:`FitStep` through the
builder that :mod:`hf_snapvit.fitting` registers when ``hf_snapvit`` is imported (:func:`register_load_fitting`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from transformers import PreTrainedModel

from ..errors import ConfigError

__all__ = ["FitStep", "deprecated_fit_step", "register_load_fitting"]

#: ``keep`` as :func:`hf_snapvit.surgery.slicing.slice_model_` takes it: per block, the kept heads and neurons.
Keep = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class FitStep:
    """How a load fits its weights to the size it loads.

    Attributes:
        fit: ``fit(model, keep, processor)`` gets the dense model holding every stored unit (on its device) and
            leaves it fitted and sliced to ``keep``.
        data: The images it fits on: the loader finds the checkpoint's image processor for them when the caller gave
            none (pixel tensors need none).
        check: ``check(layout, resized)`` refuses, before any weight is read, a checkpoint (``layout``: its
            ``elastic_layout``, set when it is sliced) or a budget (``resized``: one was asked for) it cannot fit.
    """

    fit: Callable[[PreTrainedModel, Keep, Any], None]
    data: Any
    check: Callable[[dict | None, bool], None]


_BUILDERS: list[Callable[..., FitStep]] = []


def register_load_fitting(build: Callable[..., FitStep]) -> None:
    """Set how ``from_pretrained``'s deprecated fitting arguments become a :class:`FitStep`:
    ``build(correction_data, correction, recovery_data, recovery)`` (:mod:`hf_snapvit.fitting` calls this at
    import; a later registration replaces an earlier one)."""
    _BUILDERS[:] = [build]


def deprecated_fit_step(correction_data: Any, correction: Any, recovery_data: Any, recovery: Any) -> FitStep | None:
    """The :class:`FitStep` of ``from_pretrained(correction_data=..., correction=..., recovery_data=...,
    recovery=...)``, with a :class:`FutureWarning` that names the verb to use instead; ``None`` when none is given."""
    given = {name: value for name, value in (("correction_data", correction_data), ("correction", correction),
                                             ("recovery_data", recovery_data), ("recovery", recovery))
             if value is not None}
    if not given:
        return None
    advice = []
    if "correction_data" in given or "correction" in given:
        advice.append("hf_snapvit.correct(path, sparsity=..., data=images, config=correction), which loads, corrects "
                      "and slices")
    if "recovery_data" in given or "recovery" in given:
        advice.append("hf_snapvit.recover(student, teacher, images, config) on the student "
                      "from_pretrained(path, sparsity=...) and its dense teacher from_pretrained(path)")
    warnings.warn(f"ElasticViTModel.from_pretrained({', '.join(f'{name}=' for name in given)}) is deprecated and will "
                  f"be removed in the next release: the loader only loads. Use {'; '.join(advice)}.",
                  FutureWarning, stacklevel=3)
    if not _BUILDERS:
        raise ConfigError(f"from_pretrained({', '.join(given)}=...) needs hf_snapvit.fitting, which registers itself "
                          "when hf_snapvit is imported: import hf_snapvit first (or use hf_snapvit.correct / "
                          "hf_snapvit.recover).")
    return _BUILDERS[0](correction_data, correction, recovery_data, recovery)
