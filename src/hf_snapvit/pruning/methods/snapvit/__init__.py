"""SnapViT as a ranking method: self-supervised gradient scores refined by an xNES search.

* :mod:`.config`: :class:`SnapViTConfig` and its presets;
* :mod:`.pruner`: :class:`SnapViTPruner`, the run (data draw, scores, unit order, search);
* :mod:`.block_order`: each block's second-order unit order; :mod:`.fitness`, :mod:`.token_subset`, :mod:`.cka`:
  the search objective and what makes it cheaper; :mod:`.search_state`: the resumable search state.

Registered here as ``"snapvit"`` (:func:`~hf_snapvit.pruning.methods.registry.register_method`).
"""

from ..registry import register_method
from ..config import PRESETS
from .config import FITNESS_BATCH_SIZE, SnapViTConfig
from .pruner import SnapViTPruner

register_method("snapvit", SnapViTConfig, SnapViTPruner, needs_data=True)

__all__ = ["FITNESS_BATCH_SIZE", "PRESETS", "SnapViTConfig", "SnapViTPruner"]
