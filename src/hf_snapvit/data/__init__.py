"""Images in: where calibration and evaluation images come from, how they are drawn, and how a model sees them.

* :mod:`.images`: from whatever the user has (folders, lists, tensors, Hub datasets) to ``datasets`` images
  (:func:`~hf_snapvit.data.images.load_image_dataset`);
* :mod:`.splits`: the one way a split of a file, folder or Hub dataset is opened, for calibration and evaluation
  alike (:func:`~hf_snapvit.data.splits.open_split`);
* :mod:`.streams`: reading sources that can fail part-way, never shortening a draw silently;
* :mod:`.sampling`: seeded draws that cover their source (shuffled streams, stratified map-style draws);
* :mod:`.coverage`: whether a draw represents its source, recorded and warned about;
* :mod:`.calibration`: the gradient, fitness and correction draws of a ranking run;
* :mod:`.held_out`: the one held-out split (the end of a seeded draw, never fitted on);
* :mod:`.views`: the processor's preprocessing, its normalisation and the DINO multi-crops.

May import: :mod:`hf_snapvit.architectures` and the shared modules. Never imports the elastic format, loading or
the pruner.
"""
