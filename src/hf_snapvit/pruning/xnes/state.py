"""The xNES optimiser's complete state as plain JSON values, and its validated decoding, so that a long search can
be saved and resumed bit-identically (random generator included)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import XNESError

# Bumped whenever the layout of ``state_dict`` changes, so an old file is rejected instead of being misread.
STATE_VERSION = 1


def decode_state(state: dict[str, Any]) -> dict[str, Any]:
    """The optimiser's fields from a stored state (numpy arrays and a restored generator), checked for consistency."""
    version = state.get("state_version")
    if version != STATE_VERSION:
        raise XNESError(f"unsupported XNES state_version {version!r} (this code reads {STATE_VERSION})")
    try:
        mu = np.array(state["mean"], dtype=np.float64)
        factor = np.array(state["factor"], dtype=np.float64)
        d = mu.size
        if mu.ndim != 1 or factor.shape != (d, d):
            raise XNESError(f"inconsistent state: mean shape {mu.shape}, factor shape {factor.shape}")
        lam = int(state["population_size"])
        pending = state["pending_z"]
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = state["rng_state"]
        best_fitness = state["best_fitness"]
        return {
            "mean": mu,
            "factor": factor,
            "population_size": lam,
            "learning_rate_mean": float(state["learning_rate_mean"]),
            "learning_rate_cov": float(state["learning_rate_cov"]),
            "seed": int(state["seed"]),
            "minimize": bool(state["minimize"]),
            "rng": rng,
            "pending_z": None if pending is None else np.array(pending, dtype=np.float64).reshape(lam, d),
            "best_x": None if state["best_x"] is None else np.array(state["best_x"], dtype=np.float64),
            "best_fitness": None if best_fitness is None else float(best_fitness),
            "evaluations": int(state["evaluations"]),
            "generations": int(state["generations"]),
            "history": [dict(r) for r in state["history"]],
        }
    except KeyError as exc:
        raise XNESError(f"XNES state is missing the key {exc.args[0]!r}") from exc


def jsonable(obj: Any) -> Any:
    """Deep-copy a bit-generator state into plain dicts/ints/strings (numpy ints become Python ints)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj
