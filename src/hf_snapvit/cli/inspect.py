"""``hf-snapvit inspect``: an elastic (or sliced) checkpoint's ranking, keep counts, parameters and GFLOPs."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import RankingFormatError
from ..utils.files import public_name
from .formatting import gflops, millions, widths
from .models import add_model_argument, model_config
from .options import add_width_multiple, fraction

_DEFAULT_GRID = tuple(round(0.1 * i, 1) for i in range(10))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``inspect``."""
    add_model_argument(parser, "ELASTIC", "elastic (or sliced) checkpoint: a Hub id or a folder")
    parser.add_argument("--sparsities", type=fraction, nargs="+", default=None, metavar="S",
                        help="sparsity grid (default: 0, 0.1, ... up to the largest the ranking allows)")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the per-block allocation heatmap")
    add_width_multiple(parser)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Read ``config.json`` of the checkpoint (no weights) and resolve the sparsity grid with its ranking."""
    from ..elastic.checkpoint import elastic_entries

    config = model_config(args.model, "ELASTIC", elastic=True)
    ranking, layout = elastic_entries(config, args.model, how_to_create="'hf-snapvit prune'")
    result: dict[str, Any] = {
        "checkpoint": public_name(args.model),  # output names no local path (it gets pasted into issues)
        "model_type": config.model_type,
        "architectures": list(config.architectures or []),
        "layout": layout,
        "correction": getattr(config, "elastic_correction", None),
        "recovery": getattr(config, "elastic_recovery", None),
        "prefix_correction": None if layout else _prefix_record(args.model),
        "ranking": None,
        "grid": [],
        "plot": None,
    }
    if ranking is None:
        if args.sparsities or args.plot:
            raise RankingFormatError(f"{args.model!r} is a sliced checkpoint without a ranking; --sparsities and "
                                     "--plot need the elastic checkpoint it was exported from.")
        return result
    result["ranking"] = _ranking_summary(ranking, config.elastic_ranking.get("format_version"), args.width_multiple)
    sparsities = args.sparsities or [s for s in _DEFAULT_GRID if s <= result["ranking"]["max_sparsity"]]
    result["grid"] = _grid(ranking, sparsities, layout, args.width_multiple, explicit=bool(args.sparsities))
    if args.plot:
        from ..plots import plot_allocation

        plot_allocation(ranking, args.plot, sparsities=sparsities, width_multiple=args.width_multiple)
        result["plot"] = public_name(args.plot)
    return result


def _prefix_record(checkpoint: str) -> dict[str, Any] | None:
    """The record of the checkpoint's prefix correction (``prefix_correction.safetensors``), if it has one."""
    from ..elastic.prefix_file import find_prefix_file

    found = find_prefix_file(checkpoint)
    return found.record if found is not None else None


def _ranking_summary(ranking: Any, format_version: Any, width_multiple: int | None) -> dict[str, Any]:
    from ..architectures.budget import resolve_width_multiple

    shape = ranking.shape
    provenance = dict(ranking.provenance)
    # Checkpoints written before save_elastic reduced it may hold the full local path.
    provenance["base_model"] = public_name(provenance.get("base_model"))
    head_floor, neuron_floor = ranking.floors(width_multiple)
    return {
        "method": provenance.get("method"),
        "mode": ranking.mode,
        "format_version": format_version,
        "seed": provenance.get("seed"),
        "base_model": provenance["base_model"],
        "library_version": provenance.get("library_version"),
        "calibration_data": provenance.get("calibration_data"),
        "provenance": provenance,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "intermediate_size": shape.intermediate_size,
        "floors": {"heads": head_floor, "neurons": neuron_floor},
        "max_sparsity": float(ranking.max_sparsity_for(width_multiple)),
        "width_multiple": resolve_width_multiple(width_multiple, shape.intermediate_size),
    }


def _grid(ranking: Any, sparsities: list[float], layout: dict[str, Any] | None, width_multiple: int | None, *,
          explicit: bool) -> list[dict[str, Any]]:
    """Keep counts and costs per sparsity; for a sliced checkpoint, whether its weights hold that size."""
    rows = []
    for s in sparsities:
        counts = ranking.keep_counts(sparsity=s, width_multiple=width_multiple)
        row: dict[str, Any] = {"requested_sparsity": s, "num_params": int(counts.num_params),
                               "gflops": float(counts.gflops), "sparsity": float(counts.sparsity),
                               "heads": list(counts.heads), "neurons": list(counts.neurons)}
        if layout:
            row["loadable"] = all(h <= sh and f <= sf for h, f, sh, sf in zip(
                counts.heads, counts.neurons, layout["num_heads"], layout["intermediate_size"]))
            if not row["loadable"] and not explicit:
                continue  # a sliced checkpoint can be cut further, not grown back: its default grid starts at its size
        rows.append(row)
    return rows


def render(r: dict[str, Any]) -> str:
    """The result of :func:`run` as text."""
    lines = [f"checkpoint:   {r['checkpoint']} ({r['model_type']}, {', '.join(r['architectures']) or '?'})"]
    if r["layout"]:
        lay = r["layout"]
        lines.append(f"sliced:       sparsity {lay.get('sparsity', 0):.4f}, {millions(lay.get('num_params', 0))} "
                     f"backbone params, {gflops(lay.get('gflops', 0))} GFLOPs")
        lines.append(f"              heads {widths(lay.get('num_heads', []))}; "
                     f"neurons {widths(lay.get('intermediate_size', []))}")
    if r.get("correction"):
        lines.append(f"corrected:    with {r['correction'].get('num_images')} images")
    if r.get("prefix_correction"):
        sizes = r["prefix_correction"].get("sizes")
        where = ("every size" if sizes is None else
                 ", ".join(f"{s['sparsity']:.3f}" for s in sizes if s["kept"]) or "no checked size")
        lines.append(f"prefix correction: {r['prefix_correction'].get('num_images')} images; applies at {where}")
    if r.get("recovery"):
        rec = r["recovery"]
        kind = "elastic (every size)" if rec.get("elastic") else "at this size"
        lines.append(f"recovered:    {kind}, {rec.get('steps')} steps on {rec.get('num_images')} images, "
                     f"distillation loss {rec.get('first_loss')} -> {rec.get('final_loss')}")
    if r["ranking"] is None:
        return "\n".join(lines)
    lines += _render_ranking(r["ranking"])
    for row in r["grid"]:
        note = "  (not in this sliced checkpoint)" if row.get("loadable") is False else ""
        lines.append(f"{row['requested_sparsity']:>8.2f}  {row['sparsity']:>6.4f}  {millions(row['num_params']):>9}  "
                     f"{gflops(row['gflops']):>7}  {widths(row['heads'])} | {widths(row['neurons'])}{note}")
    if r["plot"]:
        lines += ["", f"plot:         {r['plot']}"]
    return "\n".join(lines)


def _render_ranking(k: dict[str, Any]) -> list[str]:
    """The ranking's provenance and shape, down to the header of the grid table."""
    calibration = k["calibration_data"] or {}
    settings = k["provenance"].get("settings") or {}
    lines = [
        f"ranking:      {k['method']} (mode {k['mode']}, seed {k['seed']}"
        + (f", preset {settings['preset']}" if isinstance(settings, dict) and settings.get("preset") else "")
        + f"), hf_snapvit {k['library_version']}, format {k['format_version']}",
        f"base model:   {k['base_model']}",
    ]
    if calibration:
        parts = [f"{calibration.get(n)} {n.split('_')[1]}" for n in ("num_gradient", "num_fitness")
                 if calibration.get(n)]
        name = calibration.get("name") or calibration.get("source")
        lines.append(f"calibration:  {name}: {' + '.join(parts)} images")
    return lines + [
        (f"shape:        {k['num_layers']} blocks x {k['num_heads']} heads x {k['intermediate_size']} FFN neurons; "
         f"each block keeps >= {k['floors']['heads']} heads and >= {k['floors']['neurons']} neurons"),
        f"max sparsity: {k['max_sparsity']:.4f}; FFN widths in multiples of {k['width_multiple']}",
        "",
        f"{'sparsity':>8}  {'actual':>6}  {'params':>9}  {'GFLOPs':>7}  heads per block | neurons per block",
    ]
