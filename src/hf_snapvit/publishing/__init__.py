"""Writing and sharing: the elastic checkpoint on disk with its model card, and its upload to the Hub.

* :mod:`.saving`: :func:`~hf_snapvit.publishing.saving.save_elastic` (the atomic folder write of the format
  :mod:`hf_snapvit.elastic.writing` makes, and the card) and :func:`~hf_snapvit.publishing.saving.add_prefix_correction`;
* :mod:`.hub`: :func:`~hf_snapvit.publishing.hub.push_to_hub`, one commit with a generated card.

The last stage before the CLI: may import everything but the CLI.
"""
