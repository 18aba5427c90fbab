"""Sliced models: stock transformers classes that build themselves at ``config.elastic_layout``'s widths and whose
``save_pretrained`` / ``push_to_hub`` write a checkpoint the whole HF ecosystem can load and describe.

``hf_snapvit.loading.sliced.ViTForImageClassification`` (and so on for every transformers class, created on first use and
cached) subclasses the transformers class of the same name. It keeps the stock name so ``config.architectures``,
pipelines' supported-model checks and PEFT's ``auto_mapping`` see the stock class, and it lives under that name in
this module so pickle, ``torch.save``, deepcopy and ``AutoPeftModel`` find it again. Setting ``_auto_class`` or
``register_for_auto_class`` on the stock classes instead would change every stock model in the process.

Saving adds, atomically and without touching the model: the self-contained module of
:mod:`hf_snapvit.elastic.remote_code` with ``config.json["auto_map"]`` (so ``AutoModel*.from_pretrained(path,
trust_remote_code=True)`` loads it with transformers alone), ``elastic_layout["load_with"]``, and the model card of
:mod:`hf_snapvit.cards.sliced`, which also survives transformers' ``push_to_hub`` (it overwrites README.md with its
empty template after saving).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import transformers
from huggingface_hub import ModelCard
from transformers import PreTrainedModel

from ..utils.files import atomic_directory, final_path, write_text_atomic
from ..elastic.file_names import CARD_FILE, CONFIG_FILE
from ..elastic.remote_code import write_remote_code
from ..cards.sliced import base_model_id, sliced_card
from ..surgery.slicing import slice_to_layout_

_CLASSES: dict[tuple[type, type], type] = {}  # (mixin, stock class) -> twin
# The sentence of transformers' empty card template (``create_and_tag_model_card``), which ours replaces.
_STOCK_TEMPLATE = "This is the model card of a 🤗 transformers model that has been pushed on the Hub."


class SlicedModelMixin:
    """What a sliced class adds to its stock transformers class (see the module docstring)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        slice_to_layout_(self)  # from_pretrained / from_config: cut before transformers loads the weights

    @classmethod
    def is_custom_code(cls) -> bool:
        """``False``: the modules and weight names are the stock class's, so transformers applies its weight-name
        conversions when loading and saving (a sliced checkpoint keeps the names a stock one has)."""
        return False

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """transformers' ``save_pretrained``, written atomically, plus the loading module, ``auto_map``,
        ``elastic_layout["load_with"]`` and README.md (the model card). ``push_to_hub=True`` then uploads it with
        :meth:`push_to_hub` (``repo_id``, ``commit_message``, ``create_pr``, ``private`` go there)."""
        push = kwargs.pop("push_to_hub", False)
        push_kwargs = {k: kwargs.pop(k) for k in ("repo_id", "commit_message", "create_pr", "private") if k in kwargs}
        if not kwargs.get("is_main_process", True):  # only the main process writes (as transformers does)
            return super().save_pretrained(save_directory, *args, **kwargs)
        name = final_path(save_directory).name  # the folder's own name, also inside another atomic write
        with atomic_directory(save_directory) as staging:
            super().save_pretrained(staging, *args, **kwargs)
            write_sliced_extras(self, staging, name)
        if push:
            self.push_to_hub(push_kwargs.pop("repo_id", name),
                             token=kwargs.get("token"), **push_kwargs)
        return None

    def _upload_modified_files(self, working_dir: str | os.PathLike, repo_id: str, *args: Any,
                               **kwargs: Any) -> Any:
        """Put our card (naming ``repo_id``) back before transformers' ``push_to_hub`` uploads the folder."""
        readme = Path(working_dir) / CARD_FILE
        existing = ModelCard(readme.read_text(encoding="utf-8")) if readme.is_file() else None
        tags = list((existing.data.tags or []) if existing is not None else [])
        if existing is None or _STOCK_TEMPLATE in existing.text or "hf-snapvit" in tags:
            config = json.loads((Path(working_dir) / CONFIG_FILE).read_text())
            card = sliced_card(config, repo_id, base_model=base_model_id(config, self.config.name_or_path),
                               tags=tags)
            write_text_atomic(readme, str(card))
        return super()._upload_modified_files(working_dir, repo_id, *args, **kwargs)


def write_sliced_extras(model: PreTrainedModel, folder: str | os.PathLike, repo: str) -> None:
    """Add to the freshly saved checkpoint ``folder`` of the sliced ``model``: the loading module, ``auto_map`` and
    ``elastic_layout["load_with"]`` in config.json, and README.md naming the checkpoint ``repo``."""
    config = write_remote_code(model, folder)
    card = sliced_card(config, repo, base_model=base_model_id(config, model.config.name_or_path))
    write_text_atomic(Path(folder) / CARD_FILE, str(card))


def sliced_class(stock: type) -> type:
    """The sliced twin of the transformers model class ``stock`` (``stock`` itself if it already is one).

    Raises:
        TypeError: ``stock`` is not a model class that transformers exports (the loading module names it as
            ``transformers.<name>``).
    """
    return twin_class(stock, SlicedModelMixin, __name__, "built at ``config.elastic_layout``'s widths")


def twin_class(stock: type, mixin: type, module: str, what: str, *, exported_only: bool = True) -> type:
    """The class ``module.<stock name>`` that adds ``mixin`` to the transformers class ``stock`` (created once, then
    cached; ``stock`` itself if it already has ``mixin``). It keeps the stock name, so ``config.architectures``,
    pipelines and PEFT see the stock class; :func:`twin_lookup` finds it again under ``module``.

    With ``exported_only=False`` a user's own model class gets a twin too (the switchable model of a discovered
    architecture); its checkpoints then load through the user's ``AutoModel`` registration, not a loading module.

    Raises:
        TypeError: ``stock`` is not a model class that transformers exports (or, with ``exported_only=False``, not a
            ``PreTrainedModel`` subclass).
    """
    if isinstance(stock, type) and issubclass(stock, mixin):
        return stock
    exported = getattr(transformers, getattr(stock, "__name__", ""), None) is stock
    if not (isinstance(stock, type) and issubclass(stock, PreTrainedModel) and stock is not PreTrainedModel
            and (exported or not exported_only)):
        raise TypeError(f"{stock!r} is not a model class exported by transformers; hf_snapvit can only give "
                        "twins to transformers' own classes (e.g. transformers.ViTModel).")
    if (mixin, stock) not in _CLASSES:
        twin = type(stock.__name__, (mixin, stock), {
            "__module__": module, "__qualname__": stock.__name__,
            "__doc__": f"transformers.{stock.__name__}, {what} (hf_snapvit)."})
        _record_outputs_as(twin, stock)
        _CLASSES[mixin, stock] = twin
    return _CLASSES[mixin, stock]


def _record_outputs_as(twin: type, stock: type) -> None:
    """Let ``twin`` record ``hidden_states`` and ``attentions`` as ``stock`` does. transformers (5.2x) looks up what a
    model's forward records in a registry keyed by the model's class name, filled by ``PreTrainedModel.__init__``; a
    model whose class becomes the twin after it was built (:func:`as_sliced`, switchable models) would find nothing
    there, and ``output_hidden_states=True`` would return ``None``."""
    try:  # a private name: transformers has no public way to register a class
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY as registry
    except ImportError:  # a transformers that records outputs another way
        return
    # A plain dict up to 5.22, a dict whose __setitem__ takes a model from 5.23; both keyed by str(class).
    if isinstance(registry, dict):
        dict.__setitem__(registry, str(twin), getattr(stock, "_can_record_outputs", None))


def as_sliced(model: PreTrainedModel) -> PreTrainedModel:
    """Give a model that :class:`~hf_snapvit.ElasticViTModel` just built and sliced its sliced class, in place.

    A model of a class transformers does not export keeps its class (it saves as before, without the loading
    module).
    """
    try:
        model.__class__ = sliced_class(type(model))
    except TypeError:
        pass
    return model


def finish_sliced(model: PreTrainedModel, counts: Any, width_multiple: int | None, dense_shape: Any) -> PreTrainedModel:
    """Give a model just cut to ``counts`` (a :class:`~hf_snapvit.architectures.budget.KeepCounts`), when it is smaller than the
    dense model of ``dense_shape``, its ``config.elastic_layout`` and its sliced class, in place (whose
    ``save_pretrained`` / ``push_to_hub`` write what other libraries need to load and describe it)."""
    if counts.heads != dense_shape.dense_heads or counts.neurons != dense_shape.dense_neurons:
        layout = {"num_heads": list(counts.heads), "intermediate_size": list(counts.neurons),
                  "sparsity": round(counts.sparsity, 6), "num_params": counts.num_params,
                  "gflops": round(counts.gflops, 6)}
        if width_multiple is not None:
            layout["width_multiple"] = width_multiple
        model.config.elastic_layout = layout
        as_sliced(model)
    return model


def twin_lookup(module: str, twin: Callable[[type], type]) -> Callable[[str], type]:
    """A module ``__getattr__`` under which ``<module>.<transformers class name>`` is ``twin(that class)``: how
    pickle, deepcopy and ``AutoPeftModel`` find hf_snapvit's twins of the stock classes again."""
    def lookup(name: str) -> type:
        stock = getattr(transformers, name, None) if not name.startswith("_") else None
        if isinstance(stock, type) and issubclass(stock, PreTrainedModel):
            return twin(stock)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return lookup


__getattr__ = twin_lookup(__name__, sliced_class)
