"""The names under which ``save_pretrained`` wrote a model's tensors: what a sliced load reads from the checkpoint.

transformers renames historical tensor names at load time and back at save time with its weight-conversion mapping
(``transformers.conversion_mapping`` and ``transformers.core_model_loading``, outside its public API). Every release
this package supports has them; without them (:func:`saved_name_transforms` is ``None``) only names already in the
in-memory layout are found, and a missing tensor's error says why (:func:`unrenamed_hint`).
"""

from __future__ import annotations

from typing import Any

import transformers
from transformers import PreTrainedModel


def saved_name_transforms(model: PreTrainedModel) -> tuple[list[Any], list[Any]] | None:
    """``(converters, renamings)``: transformers' conversion mapping for ``model`` reversed, as ``save_pretrained``
    applies it, or ``None`` for a transformers without that mapping (its modules ``conversion_mapping`` and
    ``core_model_loading`` are outside transformers' public API; both exist in every release this package supports)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange, WeightConverter
    except ImportError:
        return None
    conversions = [c for c in get_model_conversion_mapping(model, add_legacy=False) if not isinstance(c, PrefixChange)]
    reverse = [c.reverse_transform() for c in conversions[::-1]]
    return ([c for c in reverse if isinstance(c, WeightConverter)],
            [c for c in reverse if not isinstance(c, WeightConverter)])


def _saved_name(name: str, converters: list[Any], renamings: list[Any]) -> tuple[str, tuple[int, int] | None]:
    """``(name as save_pretrained writes it, chunk)``: the first converter that matches ``name`` (a fused tensor is
    saved as ``chunk = (index, count)`` of its source tensors), then every renaming in turn, as transformers' own
    reverse renaming does (each transform's ``rename_source_key`` returns the pattern it matched, or ``None``)."""
    chunk = None
    for converter in converters:
        converted, pattern = converter.rename_source_key(name)
        if pattern is not None:
            name, chunk = converted, (converter.source_patterns.index(pattern), len(converter.source_patterns))
            break
    for renaming in renamings:
        name, _ = renaming.rename_source_key(name)
    return name, chunk


def disk_names(model: PreTrainedModel, keys: set[str]) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """Map each state-dict name of ``model`` to ``(name in the checkpoint, chunk)``; names not found are left out.

    Checkpoints saved by transformers keep their historical tensor names (``attention.attention.query``), which
    transformers renames at load time. The renaming is transformers' own conversion mapping, applied in reverse
    exactly as ``save_pretrained`` does; names already in the in-memory layout are used as they are (all there is
    to use with a transformers that has no conversion mapping).
    """
    transforms = saved_name_transforms(model)
    prefix = model.base_model_prefix
    mapping: dict[str, tuple[str, tuple[int, int] | None]] = {}
    for name in model.state_dict():
        candidates: list[tuple[str, tuple[int, int] | None]] = [(name, None)]
        if transforms is not None:
            candidates.append(_saved_name(name, *transforms))
        # A bare backbone checkpoint read into a task model, or the other way round.
        for key, chunk in list(candidates):
            candidates.append((f"{prefix}.{key}", chunk))
            if key.startswith(prefix + "."):
                candidates.append((key[len(prefix) + 1:], chunk))
        found = next((c for c in candidates if c[0] in keys), None)
        if found is not None:
            mapping[name] = found
    return mapping


def unrenamed_hint(model: PreTrainedModel) -> str:
    """The sentence a missing-tensor error adds where this transformers has no conversion mapping (else ``""``)."""
    if saved_name_transforms(model) is not None:
        return ""
    return (f" This transformers ({transformers.__version__}) has no weight-conversion mapping, so tensors saved "
            "under their historical names (e.g. 'attention.attention.query') cannot be found: install a transformers "
            "release within the range hf_snapvit declares (pip install hf-snapvit resolves one).")
