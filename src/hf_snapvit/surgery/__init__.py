"""Surgery on a model's modules: the cuts that keep a subset of heads and FFN neurons, and the proof they are exact.

* :mod:`.slicing`: physical slicing and reordering of q/k/v/o rows and columns, FFN rows and columns, per-head tables;
* :mod:`.switching`: the same widths as prefix views of the full weights, changed in place between two forwards;
* :mod:`.proof`: what a discovered architecture spec must pass (reordered == untouched, sliced == masked).

May import: :mod:`hf_snapvit.architectures` and the shared modules (errors, validation, files). Imported by every
later stage: data views, the elastic format, correction, loading and the pruner.
"""
