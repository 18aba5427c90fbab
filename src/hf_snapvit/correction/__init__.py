"""Post-pruning weight correction: fold the removed heads' and neurons' contribution into the kept weights.

Removing an attention head deletes ``head_dim`` input columns of the attention output projection (``o_proj``);
removing an FFN neuron deletes one input column of the FFN output projection (``fc2`` / ``down_proj``). The rows
removed from q/k/v and ``fc1`` are simply gone, so only those two column-pruned layers can be corrected. For each of
them, with ``X`` the layer's inputs on unlabelled calibration images and ``H = XXᵀ/n + λI``, the kept columns ``K``
are re-fitted so that the layer reproduces its dense output ``WX`` from the kept inputs alone (optimal brain surgeon,
as in SparseGPT). Every removed column is processed before any kept one, so each removed column's error reaches
every kept column, and the result equals the least-squares solution ``W_K' = W H[:, K] H[K, K]⁻¹`` on the damped
Hessian. The bias is unchanged.

Two forms: per size (:func:`correct_model_`, :mod:`.per_size`: the model is corrected and sliced to one size) and
one correction for every size of an elastic checkpoint (:mod:`.prefix`, stored as
:mod:`hf_snapvit.elastic.prefix_file` describes).

May import: architectures, surgery, data and the shared modules. Never imports loading, the pruner, evaluation or
publishing (loading applies a stored correction through :mod:`hf_snapvit.elastic.prefix_file`, not through this
wing).
"""

from __future__ import annotations

from ..errors import CorrectionError as CorrectionError  # importable here, as before the move
from .config import CorrectionConfig, CorrectionSummary, LayerCorrection
from .per_size import correct_model_
from .solve import compensate_removed_columns, damping_value, reconstruction_error

__all__ = [
    "CorrectionConfig",
    "CorrectionSummary",
    "LayerCorrection",
    "compensate_removed_columns",
    "correct_model_",
    "damping_value",
    "reconstruction_error",
]
