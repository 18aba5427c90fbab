"""Loading any size from one elastic checkpoint: sliced models, switchable models and their latency tables.

* :mod:`.modeling`: :class:`~hf_snapvit.loading.modeling.ElasticViTModel` (``from_pretrained(repo, sparsity=...)``);
* :mod:`.sliced`: stock transformers classes built at a sliced checkpoint's widths;
* :mod:`.switchable`: one resident model that changes size in place (``set_budget``);
* :mod:`.latency_table`: measured latency at a grid of sizes, and the largest size that meets a deadline;
* :mod:`.timing`: interleaved forward timing (also what :mod:`hf_snapvit.benchmark` times models with);
* :mod:`.fit_step`: what a load that fits its weights (:mod:`hf_snapvit.fitting`) hands the loader.

May import: architectures, surgery, data views, the elastic format (with a checkpoint's stored correction and the
records of a fitting), and the text-only model cards. Never imports correction, recovery or fitting (the loader
only loads), the pruner, evaluation, benchmarks, publishing or the CLI (``tests/package/test_layout.py`` checks it).
"""
