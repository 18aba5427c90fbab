"""The elastic format: the ranking stored in ``config.json`` and the checkpoints that carry it on disk.

* :mod:`.ranking`: :class:`~hf_snapvit.elastic.ranking.ElasticRanking`, its keep counts at any budget and its JSON;
* :mod:`.budget_path`: the order in which units leave as the budget shrinks; :mod:`.score_curves`: the compact score
  encoding;
* :mod:`.fingerprint`: the weight-order fingerprint that ties a ranking to its weights;
* :mod:`.checkpoint`: reading only the slices a model keeps from safetensors;
* :mod:`.remote_code`: the self-contained module a sliced checkpoint carries for ``trust_remote_code``.

May import: architectures, surgery and the shared modules. Writing an elastic checkpoint is
:mod:`hf_snapvit.publishing.saving`; loading one is :mod:`hf_snapvit.loading`.
"""
