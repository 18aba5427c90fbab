"""Model cards (README.md) for the checkpoints hf_snapvit writes.

:mod:`.elastic` writes the card of an elastic checkpoint (sizes table, evaluations, allocation heatmap);
:mod:`.sliced` the card a sliced model's ``save_pretrained`` writes. Both are built from :mod:`.source` (what a
checkpoint is), :mod:`.results` (evaluation rows) and :mod:`.sections` (text blocks). Nothing is imported here, so
saving a sliced model (text only) never loads the elastic card's plotting and evaluation.

May import: architectures, the elastic format and the shared modules; :mod:`.elastic` alone (the elastic card) may
also import correction, plots and evaluation results, and is never reached by loading.
"""
