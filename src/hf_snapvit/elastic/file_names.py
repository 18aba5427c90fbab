"""Every file of an elastic or sliced checkpoint folder by name, with the module that writes and reads it.

One place for the names, as peft keeps its in ``utils/constants.py``: a new file of the folder is declared here, its
format written and read beside :mod:`hf_snapvit.elastic.checkpoint`, and listed in :data:`FOLDER_FILES`.

This module imports nothing of hf_snapvit: the atomic folder write (:mod:`hf_snapvit.utils.files`, shared by every stage)
reads :data:`WEIGHT_BOUND_FILES` from it (``tests/package/test_layout.py`` gives it stage 0).
"""

from __future__ import annotations

from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME

#: The transformers config, with the ranking (``elastic_ranking``), a discovered model's spec (``elastic_spec``), a
#: sliced model's widths (``elastic_layout``) and ``auto_map``: written by ``save_pretrained`` from
#: :mod:`hf_snapvit.elastic.writing` (elastic) or :mod:`hf_snapvit.elastic.remote_code` (sliced).
CONFIG_FILE = CONFIG_NAME
#: The prefix correction of every size (:mod:`hf_snapvit.elastic.prefix_file`).
PREFIX_FILE = "prefix_correction.safetensors"
#: Measured latencies per size for latency budgets (:mod:`hf_snapvit.elastic.latency_file`).
LATENCY_FILE = "elastic_latency.json"
#: The module a sliced checkpoint carries for ``trust_remote_code`` (:mod:`hf_snapvit.elastic.remote_code`), and the
#: module name its ``auto_map`` entries start with.
REMOTE_MODULE = "modeling_hf_snapvit_sliced"
REMOTE_FILE = f"{REMOTE_MODULE}.py"
#: The model card (:mod:`hf_snapvit.cards.elastic` for an elastic checkpoint, :mod:`hf_snapvit.cards.sliced` for a
#: sliced one).
CARD_FILE = "README.md"
#: The card's allocation heatmap (:mod:`hf_snapvit.cards.render`, with matplotlib).
HEATMAP_FILE = "allocation_heatmap.png"

#: Files that belong to the weights they are saved with: a save of the weights replaces all of them together (the
#: weight files themselves are matched by their transformers names).
WEIGHT_BOUND_FILES = (CONFIG_FILE, SAFE_WEIGHTS_INDEX_NAME, "pytorch_model.bin.index.json", PREFIX_FILE)
#: hf_snapvit's own files of a checkpoint folder, beside the weights, ``config.json`` and the image processor's files.
FOLDER_FILES = (PREFIX_FILE, LATENCY_FILE, REMOTE_FILE, CARD_FILE, HEATMAP_FILE)

__all__ = ["CARD_FILE", "CONFIG_FILE", "FOLDER_FILES", "HEATMAP_FILE", "LATENCY_FILE", "PREFIX_FILE", "REMOTE_FILE",
           "REMOTE_MODULE", "WEIGHT_BOUND_FILES"]
