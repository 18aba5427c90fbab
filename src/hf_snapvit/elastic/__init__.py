"""The elastic format: the ranking stored in ``config.json`` and the checkpoints that carry it on disk.

* :mod:`.ranking`: :class:`~hf_snapvit.elastic.ranking.ElasticRanking`, its keep counts at any budget and its JSON;
* :mod:`.budget_path`: the order in which units leave as the budget shrinks; :mod:`.score_curves`: the compact score
  encoding; :mod:`.size_grid`: the sparsities a check measures across a range;
* :mod:`.fingerprint`: the weight-order fingerprint that ties a ranking to its weights;
* :mod:`.file_names`: every file of a checkpoint folder by name (and who writes it);
* :mod:`.checkpoint`: reading only the slices a model keeps from safetensors; :mod:`.writing`: writing the elastic
  format beside it (the weights in rank order, the ranking, the fingerprint, a discovered model's spec);
* :mod:`.prefix_file`: the stored prefix correction, written, read and applied at load; :mod:`.latency_file`: the
  stored latency tables;
* :mod:`.records`: the fitting records a checkpoint's config carries, as loading reads them;
* :mod:`.remote_code`: the self-contained module a sliced checkpoint carries for ``trust_remote_code``.

May import: architectures, surgery and the shared modules. Publishing an elastic checkpoint (the atomic folder
write, the card, the Hub) is :mod:`hf_snapvit.publishing`; loading one is :mod:`hf_snapvit.loading`.
"""
