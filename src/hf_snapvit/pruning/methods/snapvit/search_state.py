"""The saved state of a SnapViT search, so that a ranking run killed part-way continues where it stopped.

With ``SnapViTConfig(checkpoint_every=K, output_dir=DIR)`` the main process writes ``DIR/snapvit_search_state.json``
once the gradient scores are computed and then every ``K`` xNES generations and at the end: the scores (so the
gradient phase is not redone), the optimiser's whole state (mean, covariance factor, random generator, best so far,
history; :meth:`hf_snapvit.pruning.xnes.XNES.state_dict`) and the best and mean factors of each generation. Every write is
atomic, so a kill during a write leaves the previous state. A run that finds the file continues from it and returns the
ranking an uninterrupted run returns; the file also records what determines that ranking (the settings, the precision
that runs, the calibration draw, a digest of the fitness pixels and a sample of the model's weights), and a run that
differs in any of them is refused rather than mixing two searches.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ....utils.distributed import process_state
from ....errors import ConfigError
from ....utils.files import atomic_file, remove_torn_writes
from ....architectures.placement import onloaded
from ...xnes import XNES

STATE_FILE = "snapvit_search_state.json"
# Bumped whenever the file's layout changes, so an old file is refused instead of being misread.
STATE_FORMAT = 2
# The factors recorded after each generation: the best sample so far and the distribution's mean.
TRAILS = ("best_factors", "mean_factors")
# Settings that say where and how often to save, not what the search computes: a run may change them and resume.
CHECKPOINT_SETTINGS = ("checkpoint_every", "output_dir")
# Values sampled per weight tensor for the model's digest: enough to tell two checkpoints (or a fine-tuned copy)
# apart, few enough that a multi-billion-parameter task model is digested in well under a second.
_SAMPLED_VALUES = 4096


def _plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples become lists), so a saved key compares equal to a fresh one."""
    return json.loads(json.dumps(value))


def model_digest(model: torch.nn.Module) -> str:
    """A digest of the model's parameter names, shapes, dtypes and an evenly strided sample of each one's values."""
    digest = hashlib.sha256()
    seen: set[int] = set()
    for prefix, module in model.named_modules():  # the order of named_parameters(), a module at a time
        own = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not own:
            continue
        with onloaded(model, module):  # weights accelerate offloaded, read as their forward reads them
            for name, _ in own:
                parameter = getattr(module, name)
                flat = parameter.detach().reshape(-1)
                sample = flat[::max(1, flat.numel() // _SAMPLED_VALUES)][:_SAMPLED_VALUES]
                digest.update(f"{prefix + '.' if prefix else ''}{name}{tuple(parameter.shape)}{parameter.dtype}"
                              .encode())
                digest.update(sample.to(device="cpu", dtype=torch.float64).numpy().tobytes())
        seen.update(id(p) for _, p in own)
    return digest.hexdigest()


def pixels_digest(pixels: torch.Tensor) -> str:
    """A digest of the fitness pixels: equal pixels are the same calibration images, preprocessed the same way."""
    values = pixels.detach().to(device="cpu").contiguous()
    return hashlib.sha256(f"{tuple(values.shape)}{values.dtype}".encode() + values.numpy().tobytes()).hexdigest()


def search_key(settings: dict[str, Any], calibration: dict[str, Any], model: torch.nn.Module,
               fitness_pixels: torch.Tensor) -> dict[str, Any]:
    """What determines a search's result: ``settings`` (as they ran: precision and fitness batch size resolved;
    :data:`CHECKPOINT_SETTINGS` left out), the calibration draw, and digests of the fitness pixels and the model."""
    kept = {k: v for k, v in settings.items() if k not in CHECKPOINT_SETTINGS}
    return _plain({"settings": kept, "calibration_data": calibration, "fitness_pixels": pixels_digest(fitness_pixels),
                   "model": {"class": type(model).__name__, "weights": model_digest(model)}})


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _differences(saved: Any, key: Any, prefix: str = "") -> list[str]:
    """``"name (saved X, now Y)"`` for each dotted entry where ``saved`` and ``key`` differ."""
    if not isinstance(saved, dict) or not isinstance(key, dict):
        return [] if saved == key else [f"{prefix or 'key'} (saved {_short(saved)}, now {_short(key)})"]
    return [d for n in sorted(set(saved) | set(key))
            for d in _differences(saved.get(n), key.get(n), f"{prefix}.{n}" if prefix else n)]


class SearchCheckpoint:
    """Reads and writes the state of one search in ``output_dir`` (see the module's description).

    Args:
        output_dir: The folder of the state file; ``None`` turns saving and resuming off.
        every: Save every this many generations (``None``: only read a state that is there, never write one).
        key: :func:`search_key` of this run; a saved state with another key is refused.
    """

    def __init__(self, output_dir: str | os.PathLike | None, every: int | None, key: dict[str, Any]) -> None:
        self.path = None if output_dir is None else Path(output_dir) / STATE_FILE
        self.every = every
        self.key = key
        self._saved_at: tuple[int, int] | None = None  # (generations, evaluations) of the state on disk

    def load(self) -> dict[str, Any] | None:
        """The saved state (scores as float64 arrays, the optimiser, the best and mean factors per generation), or
        ``None``.

        Raises:
            ConfigError: The file cannot be read, or it holds a search with other settings, data or model.
        """
        if self.path is None or not self.path.exists():
            return None
        try:
            with open(self.path, encoding="utf-8") as handle:
                saved = json.load(handle)
            if saved.get("format") != STATE_FORMAT:
                raise ValueError(f"format {saved.get('format')!r}, this version reads format {STATE_FORMAT}")
        except (OSError, ValueError, AttributeError) as error:
            raise ConfigError(f"The SnapViT search state {str(self.path)!r} cannot be read ({error}); delete it to "
                              "start the search over.") from error
        changed = _differences(saved.get("key"), self.key)
        if changed:
            raise ConfigError(
                f"{str(self.path)!r} holds a SnapViT search with other settings or inputs, so this run cannot "
                f"resume it; what differs: {'; '.join(changed)}. Rank with the same settings, data and model, or "
                "give another output_dir (or delete the file) to start a new search.")
        try:
            search = XNES.from_state_dict(saved["xnes"])
            state = {"head_scores": np.array(saved["head_scores"], dtype=np.float64),
                     "neuron_scores": np.array(saved["neuron_scores"], dtype=np.float64),
                     "search": search,
                     **{name: [list(map(float, x)) for x in saved[name]] for name in TRAILS}}
        except (KeyError, TypeError, ValueError) as error:  # XNESError is a ValueError
            raise ConfigError(f"The SnapViT search state {str(self.path)!r} is damaged ({error!r}); delete it to "
                              "start the search over.") from error
        self._saved_at = (search.generations, search.evaluations)
        return state

    def due(self, search: XNES) -> bool:
        """Whether the state of ``search`` is to be saved now: every ``every``-th generation, if not saved yet."""
        return (self.every is not None and search.generations % self.every == 0
                and (search.generations, search.evaluations) != self._saved_at)

    def is_new(self, search: XNES) -> bool:
        """Whether ``search`` has moved on from the state last saved or loaded."""
        return (search.generations, search.evaluations) != self._saved_at

    def save(self, head_scores: np.ndarray, neuron_scores: np.ndarray, search: XNES,
             trail: dict[str, list[list[float]]]) -> None:
        """Write the state (main process only, atomically, so a kill during the write keeps the previous one)."""
        if self.path is None or self.every is None:
            return
        state = process_state()
        if state.is_main_process:
            remove_torn_writes(self.path)  # a run killed mid-write left them
            payload = {"format": STATE_FORMAT, "generations": search.generations, "evaluations": search.evaluations,
                       "key": self.key, "head_scores": np.asarray(head_scores, dtype=np.float64).tolist(),
                       "neuron_scores": np.asarray(neuron_scores, dtype=np.float64).tolist(),
                       "xnes": search.state_dict(), **{name: trail[name] for name in TRAILS}}
            # repr-exact floats: the scores and the optimiser come back bit for bit. A fitness of ±inf is written
            # as JSON's Infinity, which Python's json reads back.
            with atomic_file(self.path, "w", encoding="utf-8") as handle:
                json.dump(payload, handle, allow_nan=True)
        self._saved_at = (search.generations, search.evaluations)
        state.wait_for_everyone()

