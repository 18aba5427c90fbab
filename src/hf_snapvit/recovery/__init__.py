"""Label-free recovery: distil a sliced model from its dense teacher on unlabelled images.

Slicing removes heads and neurons but keeps the hidden width, so the student's block outputs, its image embedding
and (for classifiers) its logits can be matched to the teacher's on any images, without labels. Two modes:

* per size (:func:`recover` with a sliced student): the sliced model is trained; its checkpoint reloads at its saved
  size only, like a weight-corrected one;
* elastic (``RecoveryConfig(elastic=True)`` with the dense elastic model): the dense weights, in rank order, are
  trained so that every prefix improves. Each step distils a frozen copy of the original weights into prefix views
  at the two ends of ``elastic_range`` and ``elastic_samples`` sparsities drawn in between (the sandwich rule); the
  result is still an elastic checkpoint (save it with :func:`hf_snapvit.save_elastic`) that loads at any sparsity.

The verbs and their loop are :mod:`hf_snapvit.recovery.distillation`; the loop's parts are
:mod:`hf_snapvit.recovery.train` (batches, optimizer, resuming) and :mod:`hf_snapvit.recovery.parallel` (N processes
through ``Accelerator.prepare``).

May import: architectures, surgery, data, the elastic format and the shared modules. Never imports loading, the
pruner, evaluation or publishing (``hf_snapvit.fitting`` runs it on a load; loading only warns through
:mod:`hf_snapvit.elastic.records`).
"""

from __future__ import annotations

from ..elastic.records import warn_if_untrained
from ..errors import RecoveryError as RecoveryError  # importable here, as before the move
from .config import RecoveryConfig, RecoverySummary
from .distillation import LOSS_READ_EVERY as LOSS_READ_EVERY, recover, recover_

__all__ = ["RecoveryConfig", "RecoverySummary", "recover", "recover_", "warn_if_untrained"]
