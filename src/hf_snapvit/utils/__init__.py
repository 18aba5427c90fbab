"""Helpers every wing shares: atomic files (:mod:`.files`), checkpoint sources (:mod:`.sources`), the
configs' base and argument checks (:mod:`.validation`), optional extras (:mod:`.extras`), accelerate's processes
(:mod:`.distributed`), precision (:mod:`.precision`) and the loggers (:mod:`.logs`).

May import only :mod:`hf_snapvit.errors` and :mod:`hf_snapvit.elastic.file_names`.
"""
