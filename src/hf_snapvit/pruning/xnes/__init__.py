"""Exponential natural evolution strategy (xNES) as a small ask/tell optimiser.

Reference: T. Glasmachers, T. Schaul, Y. Sun, D. Wierstra and J. Schmidhuber, "Exponential Natural Evolution
Strategies", GECCO 2010. The update follows the one used by the SnapViT reference search (pypop7's ``XNES``):

* search distribution N(μ, A·Aᵀ), sampled as x_k = μ + A·z_k with z_k ~ N(0, I);
* rank-based utilities w_i = max(0, ln(λ/2 + 1) − ln i) for rank i = 1 (best) … λ, normalised to sum 1, minus 1/λ;
* natural gradients d_μ = Σ u_k z_k, G_M = Σ u_k (z_k z_kᵀ − I), G_σ = tr(G_M)/d, G_B = G_M − G_σ·I;
* μ ← μ + η_μ·A·d_μ and A ← A·expm(½(η_σ·G_σ·I + η_B·G_B)).

Defaults (d = dimension): population λ = 4 + ⌊3 ln d⌋ (19 for d = 156, 17 for d = 84), η_μ = 1 and
η_σ = η_B = 0.6·(3 + ln d)/(d·√d) (0.00248 for d = 156).

The optimiser knows nothing about models: it proposes vectors (:meth:`XNES.ask`), is told their fitness
(:meth:`XNES.tell`), and can drive a whole search with a budget (:meth:`XNES.optimize`). Its complete state, random
generator included, round-trips through JSON (:meth:`XNES.state_dict`), so a long search can be resumed and continues
bit-identically.
"""

from __future__ import annotations

from ...errors import XNESError
from .optimizer import XNES
from .rules import XNESResult, default_learning_rate_cov, default_population_size
from .state import STATE_VERSION as STATE_VERSION

__all__ = ["XNES", "XNESError", "XNESResult", "default_learning_rate_cov", "default_population_size"]
