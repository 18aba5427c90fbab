"""The text of a model card's sections: the size table, the summary and usage snippet, and the ranking's provenance.

Each function takes the :class:`~hf_snapvit.cards.source.CheckpointDescription` of the checkpoint and returns what
``templates/model_card.md`` shows; :mod:`hf_snapvit.cards.elastic` puts them together.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from .._version import __version__
from ..architectures.budget import resolve_width_multiple
from .results import MetricColumns, percent
from .source import CheckpointDescription
from ..errors import BudgetError, ModelCardError
from ..elastic.ranking import ElasticRanking
from ..elastic.file_names import REMOTE_FILE
from ..utils.validation import is_real

# datasets' packaged loaders: their name says only the file format, not where the images came from.
_GENERIC_LOADERS = {"parquet", "imagefolder", "csv", "json", "arrow", "webdataset", "text"}
# Rankings made before rank() recorded what its method reads (provenance["needs_data"], ["needs_labels"]) were made
# by the built-in methods of that time: these read no images, and this one read labels.
_LEGACY_DATA_FREE = ("magnitude", "random", "lamp")
_LEGACY_LABELLED = ("taylor-ce",)


def hub_id(candidate: Any) -> str | None:
    """``candidate`` if it reads as a namespaced Hub repo id (``org/name``) rather than a local path."""
    if not isinstance(candidate, str) or candidate.count("/") != 1 or os.path.exists(candidate):
        return None
    try:
        validate_repo_id(candidate)
    except HFValidationError:
        return None
    return candidate


def family_name(model_type: str | None) -> str:
    """How transformers names a model family (``vit`` -> ``ViT``, ``dinov2`` -> ``Dinov2``): its config class's name;
    the ``model_type`` itself where transformers has no config of that type."""
    if not model_type:
        return "vision transformer"
    try:
        from transformers import CONFIG_MAPPING

        return CONFIG_MAPPING[model_type].__name__.removesuffix("Config") or model_type
    except (KeyError, ImportError, AttributeError):
        return model_type


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def _gflops(gflops: float) -> str:
    return f"{gflops:.3f}" if gflops >= 0.1 else f"{gflops:.3g}"


def size_table(
    described: CheckpointDescription, metrics: MetricColumns, grid: Sequence[float]
) -> tuple[list[str], list[list[str]]]:
    """The size table: parameters, GFLOPs, kept units and measured metrics of the checkpoint and of each sparsity.

    Args:
        described: The checkpoint; its first row is the dense model (elastic) or the checkpoint itself (sliced).
        metrics: The measured columns.
        grid: The sparsities of the further rows, each resolved through the ranking as ``from_pretrained`` does.

    Returns:
        ``(columns, rows)``, every row a list of cells.
    """
    ranking, layout = described.ranking, described.layout
    shape = ranking.shape if ranking is not None else None
    columns = ["sparsity", "backbone params", "GFLOPs", "heads kept", "FFN neurons kept", *metrics.headers()]
    if layout is not None:
        heads, neurons, saved = layout["num_heads"], layout["intermediate_size"], float(layout["sparsity"])
        total_heads = shape.num_layers * shape.num_heads if shape else max(heads) * len(heads)
        total_neurons = shape.num_layers * shape.intermediate_size if shape else max(neurons) * len(neurons)
        first = [f"**{percent(saved)} (this checkpoint)**", _count(int(layout["num_params"])),
                 _gflops(float(layout["gflops"])), f"{sum(heads)} / {total_heads}",
                 f"{sum(neurons)} / {total_neurons}", *metrics.cells(saved)]
    else:
        total_heads, total_neurons = shape.num_layers * shape.num_heads, shape.num_layers * shape.intermediate_size
        first = ["0 % (dense)", _count(shape.num_params()), _gflops(shape.gflops()),
                 f"{sum(shape.dense_heads)} / {total_heads}", f"{sum(shape.dense_neurons)} / {total_neurons}",
                 *metrics.cells(0.0)]
    rows = [first]
    for s in grid:
        try:
            counts = ranking.keep_counts(sparsity=s)
        except BudgetError as error:
            raise ModelCardError(f"Cannot describe sparsity {s}: {error}") from None
        rows.append([percent(s), _count(counts.num_params), _gflops(counts.gflops),
                     f"{sum(counts.heads)} / {shape.num_layers * shape.num_heads}",
                     f"{sum(counts.neurons)} / {shape.num_layers * shape.intermediate_size}", *metrics.cells(s)])
    return columns, rows


def table_intro(described: CheckpointDescription) -> str:
    """The sentence above the size table, saying what its columns count."""
    shape = described.ranking.shape if described.ranking is not None else None
    multiple = resolve_width_multiple(None, shape.intermediate_size) if shape is not None else 1
    aligned = (f" Each block keeps a multiple of {multiple} FFN neurons (`width_multiple`, so that GPU kernels stay "
               "fast); `width_multiple=1` loads exact widths." if multiple > 1 else "")
    if described.layout is None:
        return ("What each sparsity costs and keeps. Parameters count the backbone (embeddings included, task head "
                "excluded); GFLOPs follow the SnapViT paper's formulas for one image, task head included." + aligned)
    return ("This checkpoint, and the larger sparsities its ranking can still serve. Parameters count the backbone "
            "(task head excluded); GFLOPs are for one image." + aligned)


def heatmap_caption(grid: Sequence[float]) -> str:
    """The caption under the allocation heatmap of the sparsities ``grid``."""
    return (f"Kept fraction of each block's attention heads (top) and FFN neurons (bottom) at "
            f"{', '.join(percent(s) for s in grid)} sparsity.")


def summary(described: CheckpointDescription, base_text: str) -> str:
    """The paragraph under the title: what the checkpoint is, which part of it is pruned, and how it loads."""
    text = _summary(described, base_text)
    return f"{text} {described.pruned_part}" if described.pruned_part else text


def _summary(described: CheckpointDescription, base_text: str) -> str:
    shape = described.ranking.shape if described.ranking is not None else None
    model_type = shape.model_type if shape else "vision transformer"
    method = described.ranking.provenance.get("method", "an importance") if described.ranking else None
    layout = described.layout
    family = family_name(shape.model_type if shape else described.model_type)
    if layout is None:
        return (
            f"An **elastic** checkpoint of {base_text}. Every attention head and FFN neuron of its "
            f"{shape.num_layers} blocks (`{model_type}`, {shape.num_heads} heads and {shape.intermediate_size} FFN "
            f"neurons per block) was ranked once with the `{method}` method, and the weights were permuted into rank "
            "order, which does not change the model's outputs. Every smaller model "
            "is a prefix of each projection, so `ElasticViTModel.from_pretrained(repo, sparsity=s)` loads a "
            "physically smaller stock transformers model, without retraining, reading only the weights it keeps. "
            "Stock transformers loads this repository as the dense model."
        )
    return (
        f"A **{percent(float(layout['sparsity']))} sparse** {family} sliced from an elastic checkpoint of {base_text}: "
        "its blocks keep "
        f"{min(layout['num_heads'])}–{max(layout['num_heads'])} attention heads and "
        f"{min(layout['intermediate_size'])}–{max(layout['intermediate_size'])} FFN neurons each, chosen by "
        f"{f'the `{method}` ranking' if method else 'an importance ranking'}, without retraining. Because the "
        "blocks differ in width, stock transformers cannot build it from `config.json` alone; "
        + ("hf_snapvit loads it, and so does transformers with the loading module this repository carries "
           "(`from_pretrained(repo, trust_remote_code=True)`; read the module first)."
           if layout.get("load_with") else "hf_snapvit loads it.")
    )


def usage(described: CheckpointDescription, repo: str, grid: Sequence[float], pipeline_tag: str) -> tuple[str, str]:
    """The usage snippet (Python code loading the checkpoint from ``repo``) and the notes under it."""
    architecture = described.architectures[0] if described.architectures else None
    stock = f"`{architecture}`" if architecture else "transformers model"
    if described.layout is None:
        default_sparsity = next((s for s in grid if s >= 0.3 - 1e-9), grid[0] if grid else 0.3)
        load = f'model = ElasticViTModel.from_pretrained("{repo}", sparsity={default_sparsity:g})'
        notes = ("`sparsity` is the fraction of the backbone's parameters removed (embeddings included, task "
                 "head excluded); `target_params=` or `target_gflops=` set the budget instead. The result is "
                 f"a stock {stock}, usable with pipelines, `Trainer` and PEFT; `model.save_pretrained(...)` stores "
                 "the sliced model.")
    else:
        load = f'model = ElasticViTModel.from_pretrained("{repo}")'
        notes = ("This loads the checkpoint at its saved size"
                 + (" (larger sparsities also work: `sparsity=` / `target_params=` / `target_gflops=`, from the "
                    "ranking kept in `config.json`)" if described.ranking is not None else "")
                 + f". The result is a stock {stock}.")
    lines = ["from hf_snapvit import ElasticViTModel", "from transformers import AutoImageProcessor", "", load,
             f'processor = AutoImageProcessor.from_pretrained("{repo}")']
    if pipeline_tag == "image-classification":
        lines += ["", "from transformers import pipeline",
                  'classify = pipeline("image-classification", model=model, image_processor=processor)',
                  'print(classify("cat.jpg"))']
    else:
        lines += ["", "from PIL import Image", 'inputs = processor(Image.open("cat.jpg"), return_tensors="pt")',
                  "features = model(**inputs).last_hidden_state"]
    return "\n".join(lines), notes


def _method_line(provenance: Mapping[str, Any]) -> str:
    """The method and, where the ranking recorded it, the preset its settings came from.

    SnapViT rankings record ``provenance["preset"]`` and the gradient baselines ``settings["preset"]``: a preset's
    name, or ``None`` for custom settings. Rankings stored before either was recorded say nothing about it.
    """
    method = provenance.get("method", "unknown")
    settings = provenance.get("settings") or {}
    if "preset" in provenance:
        recorded, preset = True, provenance["preset"]
    else:
        recorded, preset = "preset" in settings, settings.get("preset")
    if not recorded:
        return f"`{method}`"
    return f"`{method}`" + (f", preset `{preset}`" if preset else ", custom settings")


# What the search's result is, where the settings record it (rankings made before the option existed do not).
_SOLUTIONS = {"mean": ", the search distribution's mean as the result", "best": ", the best candidate as the result"}


def _settings_line(settings: Mapping[str, Any]) -> str:
    scores = settings.get("scores") or {}
    budget = [f"{settings[k]} {label}" for k, label in (("max_generations", "xNES generations"),
                                                       ("max_evaluations", "candidate evaluations"))
              if settings.get(k) is not None]
    order = settings.get("unit_order")
    sparsities = settings.get("fitness_sparsities")  # the presets differ in them
    return (f"{settings.get('num_gradient_images')} gradient + {settings.get('num_fitness_images')} fitness images, "
            f"score definition `{scores.get('definition', '?')}`"
            + (f", units within a block in `{order}` order" if order not in (None, "scores") else "")
            + f", search budget {' / '.join(budget) or '?'}"
            + _SOLUTIONS.get(settings.get("solution"), "")
            + (f", fitness at {' / '.join(f'{100 * s:g}' for s in sparsities)} % sparsity" if sparsities else "")
            + (", one per generation in turn" if sparsities and settings.get("rotate_fitness_sparsities") else ""))


def _reads(provenance: Mapping[str, Any], what: str) -> bool:
    """Whether the ranking's method reads ``what`` (``"data"``: images, or ``"labels"``), as the registry told
    :func:`~hf_snapvit.rank`; for a ranking made before that was recorded, what the built-in of that name reads."""
    recorded, method = provenance.get(f"needs_{what}"), provenance.get("method")
    if isinstance(recorded, bool):
        return recorded
    return method not in _LEGACY_DATA_FREE if what == "data" else method in _LEGACY_LABELLED


def _calibration_line(provenance: Mapping[str, Any]) -> str:
    calibration = provenance.get("calibration_data")
    if not isinstance(calibration, Mapping):
        if calibration:
            return str(calibration)
        return "not recorded" if _reads(provenance, "data") else "none (data-free method)"
    parts = []
    if calibration.get("num_gradient") is not None:
        parts.append(f"{calibration['num_gradient']} gradient + {calibration.get('num_fitness')} fitness images")
    name, source = calibration.get("name"), calibration.get("source")
    if name in _GENERIC_LOADERS:
        parts.append(f"from local {name} files")
    elif name or source:
        parts.append(f"from `{name or source}`")
    if calibration.get("image_column"):
        parts.append(f"(column `{calibration['image_column']}`)")
    if calibration.get("label_column") and _reads(provenance, "labels"):
        parts.append(f"labels from `{calibration['label_column']}`")
    draw = calibration.get("source_draw") or calibration.get("draw")
    if isinstance(draw, Mapping):
        parts.append(_draw_text(draw))
    return " ".join(parts) or json.dumps(dict(calibration))


def _draw_text(draw: Mapping[str, Any]) -> str:
    """What a calibration draw covered, in words (see :mod:`hf_snapvit.data.coverage`)."""
    if draw.get("method") == "random access":
        text = f"drawn uniformly from all {draw.get('rows_read')} rows"
    else:
        groups = draw.get("shard_groups", 1)
        extent = "the whole stream" if draw.get("complete") else "a stream cut there (prefix)"
        text = (f"drawn uniformly from the first {draw.get('rows_read')} rows of {extent}"
                + (f", over {groups} shard groups" if groups and groups > 1 else ""))
    if draw.get("sample_classes") is not None:
        total = draw.get("label_classes") or draw.get("classes_read")
        text += f"; the sample covers {draw['sample_classes']} of {total} classes"
    if draw.get("neighbour_gap") is not None:
        text += f"; neighbour gap {draw['neighbour_gap']:.2f} (about 0.33 when shuffled)"
    return f"({text})"


def _search_line(search: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    best = search.get("best_loss")
    if not search.get("evaluations") or not is_real(best):  # max_generations=0: the starting factors, unsearched
        return "none (0 generations): the gradient scores and each block's unit order alone"
    return (f"{search.get('evaluations')} candidate evaluations in {search.get('generations')} generations, best "
            f"loss {best:.4g}" + _result_loss(search, settings)
            + ("; stopped early, the loss no longer falling" if search.get("stopped_early") else ""))


def _result_loss(search: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    """The returned ranking's own loss, where it is not the best candidate's (the search's mean as the result)."""
    loss = search.get("loss")
    if settings.get("solution") != "mean" or not is_real(loss):
        return ""
    return f", the result's (the search's mean) {loss:.4g}"


def provenance_lines(ranking: ElasticRanking | None, base_text: str) -> list[tuple[str, str]]:
    """The "How the ranking was made" list: ``(name, value)`` pairs from the ranking's provenance."""
    if ranking is None:
        return [("Ranking", "not stored in this checkpoint (sliced without its ranking)")]
    p = ranking.provenance
    method = p.get("method", "unknown")
    settings = p.get("settings") or {}
    items = [("Method", _method_line(p))]
    if method == "snapvit" and settings:
        items.append(("Settings", _settings_line(settings)))
    search = p.get("search")
    if isinstance(search, Mapping) and search.get("evaluations") is not None:
        items.append(("Search", _search_line(search, settings)))
    items.append(("Calibration data", _calibration_line(p)))
    if "seed" in p:
        items.append(("Seed", str(p["seed"])))
    heads, neurons = ranking.floors()
    items.append(("Ranking mode", (f"`{ranking.mode}`; every block keeps at least {heads} of "
                                  f"{ranking.shape.num_heads} heads and {neurons} of "
                                  f"{ranking.shape.intermediate_size} FFN neurons (max sparsity "
                                  f"{percent(ranking.max_sparsity)})")))
    items.append(("Base model", base_text))
    items.append(("Ranked with", f"hf_snapvit {p.get('library_version', __version__)}"))
    return items


def recovery_section(record: Mapping[str, Any] | None) -> str | None:
    """The card's account of a label-free recovery (``config.json["elastic_recovery"]``): data, steps, the sizes it
    trained, and each checked size's distillation loss on held-out images before and after; ``None`` if there was
    none."""
    if not isinstance(record, Mapping):
        return None
    settings, data = record.get("settings") or {}, record.get("data") or {}
    source = " ".join(str(v) for v in (data.get("source"), data.get("name") and f"`{data['name']}`") if v)
    span = record.get("sparsities") or []
    trained = (f"elastic: every size between sparsity {span[0]:g} and {span[-1]:g} (sizes outside that range were "
               "not trained, and warn when loaded)" if record.get("elastic") and span else "at this size only")
    text = [f"Recovered by label-free distillation from the dense model, {trained}: {record.get('steps')} steps of "
            f"{settings.get('batch_size')} images, drawn from {record.get('num_images')} unlabelled images "
            f"({source or 'images'}, seed {data.get('seed')}), in {float(record.get('seconds') or 0):.0f} s."]
    held = record.get("held_out") or {}
    if held.get("sizes"):
        text += ["", f"Distillation loss against the dense model on {held['num_images']} held-out images the "
                     "recovery never trained on (lower is better):", "",
                 "| sparsity | before recovery | after recovery |", "|---|---|---|"]
        for row in held["sizes"]:
            worse = " (worse)" if row["sparsity"] in held["worse"] else ""
            size = "this size" if row["sparsity"] is None else percent(row["sparsity"])
            text.append(f"| {size} | {row['loss_before']:.4g} | {row['loss_after']:.4g}{worse} |")
    elif held.get("skipped"):
        text += ["", f"No held-out check was made ({held['skipped']})."]
    return "\n".join(text)


def block_rows(layout: Mapping[str, Any] | None) -> list[list[Any]]:
    """The per-block widths of a sliced checkpoint, ``[block, heads, neurons]`` rows, blocks counted from 0 as the
    model's modules are (``encoder.layer.0``); empty for an elastic checkpoint, whose widths depend on the size."""
    if not layout:
        return []
    return [[i, h, f] for i, (h, f) in enumerate(zip(layout["num_heads"], layout["intermediate_size"]))]


def remote_code_usage(described: CheckpointDescription, repo: str, pipeline_tag: str) -> tuple[str, str]:
    """A sliced checkpoint loaded with transformers alone: the snippet, and what ``trust_remote_code=True`` runs."""
    auto = next(iter(described.auto_map or {"AutoModel": ""}))
    code = "\n".join([f"from transformers import {auto}, pipeline", "",
                      f'model = {auto}.from_pretrained("{repo}", trust_remote_code=True)',
                      f'pipe = pipeline("{pipeline_tag}", model="{repo}", trust_remote_code=True)'])
    return code, (f"Stock `{auto}.from_pretrained` without `trust_remote_code=True` fails with a size mismatch: the "
                  "blocks differ in width, which a stock `config.json` cannot describe. `trust_remote_code=True` "
                  f"imports and runs `{REMOTE_FILE}` from this repository (the stock classes, cut to "
                  "`config.elastic_layout`'s widths, generated by hf_snapvit): read it first, and pin `revision=` to "
                  "the commit you read. `config.json[\"elastic_layout\"][\"load_with\"]` says the same.")


def correction_section(record: Mapping[str, Any] | None, *, sliced: bool = False) -> str | None:
    """The card's account of a weight correction: for an elastic checkpoint, the stored prefix correction
    (``prefix_correction.safetensors``: where it applies, on how many images it was fitted); for a ``sliced`` one,
    ``config.json["elastic_correction"]``. ``None`` if there is none."""
    if not isinstance(record, Mapping):
        return None
    if sliced:
        return _sliced_correction(record)
    sizes = record.get("sizes")
    text = [f"`prefix_correction.safetensors` holds a least-squares weight correction fitted once, on "
            f"{record.get('num_images')} unlabelled images, for every size of this checkpoint: `from_pretrained` "
            "compensates the removed heads' and neurons' contribution into the kept output-projection weights of "
            "the size it loads, without images (`prefix_correction=False` loads the plain slice)."]
    if sizes:
        helped = [percent(s["sparsity"]) for s in sizes if s.get("kept")]
        text.append(f"A check on {record.get('num_held_out_images')} held-out images found it helps at "
                    f"{', '.join(helped) if helped else 'no checked size'}; other sizes load uncorrected.")
    else:
        text.append("It is applied at every size (no held-out check was made).")
    return " ".join(text)

def _sliced_correction(record: Mapping[str, Any]) -> str:
    where = "(`config.json[\"elastic_correction\"]`)."
    if record.get("method") == "prefix":
        return ("The removed units' contribution was compensated into the kept weights by the elastic checkpoint's "
                f"prefix correction, fitted once for every size on {record.get('num_images')} calibration images "
                + where)
    return ("The removed units' contribution was compensated into the kept weights from "
            f"{record.get('num_images')} calibration images: mean reconstruction error "
            f"{record.get('mean_error_before')} before, {record.get('mean_error_after')} after " + where)
