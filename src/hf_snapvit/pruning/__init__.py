"""The pruner: gradient scores, the xNES search over them, and the ranking methods behind :func:`hf_snapvit.rank`.

* :mod:`.scoring` and :mod:`.sample_gradients`: SnapViT's local scores from self-supervised gradients;
* :mod:`.fitness`, :mod:`.token_subset`, :mod:`.cka`: the search objective and what makes it cheaper;
* :mod:`.xnes`: the evolution strategy; :mod:`.methods`: SnapViT, the baselines and :func:`~.methods.rank`.

May import every earlier stage (data, surgery, the elastic format, correction); loading a model never imports it.
"""
