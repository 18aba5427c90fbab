"""``hf-snapvit``: rank, export, inspect, evaluate and benchmark elastic checkpoints from the command line.

    hf-snapvit prune --model ../shared/models/vit-tiny-tinyimagenet \\
        --data ../shared/data/tiny-imagenet-200/train.parquet --preset fast --output vit-tiny-elastic
    hf-snapvit export --model vit-tiny-elastic --sparsity 0.3 --output vit-tiny-30
    hf-snapvit inspect vit-tiny-elastic --plot allocation.png
    hf-snapvit eval --model vit-tiny-elastic --sparsity 0.3 --data ../shared/data/tiny-imagenet-200
    hf-snapvit bench vit-tiny-elastic --sparsities 0.3 0.5
    accelerate launch --config_file examples/accelerate_config.yaml -m hf_snapvit prune ...

The CLI parses arguments and calls the library, nothing more. Results go to stdout, as text or as JSON with
``--json``; logs and progress bars go to stderr. Bad input ends the run with one ``error: ...`` line on stderr and
exit status 2. Subcommands are rows of :data:`COMMANDS`: a new one is an arguments function, a run function
returning a JSON-able dict, and a text renderer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ._version import __version__
from .errors import SnapViTError

logger = logging.getLogger("hf_snapvit.cli")

# Methods that read calibration images; every other method (incl. ones added by register_method) is data-free.
_DATA_METHODS = ("snapvit", "snip", "taylor-ce")
_LABEL_METHODS = ("taylor-ce",)
_DEFAULT_GRID = tuple(round(0.1 * i, 1) for i in range(10))


# ------------------------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Command:
    """One subcommand.

    Args:
        name: What the user types after ``hf-snapvit``.
        help: One line for ``hf-snapvit --help``.
        add_arguments: Adds the subcommand's options to its parser.
        run: Does the work; returns a JSON-able result, or ``None`` when this process has nothing to report (the
            non-main processes of a multi-process run).
        render: The result as text for stdout.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], "dict[str, Any] | None"]
    render: Callable[[dict[str, Any]], str]


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one ``error:`` line (exit status 2) instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1), e.g. 0.3")
    return value


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bars, warnings only on stderr")
    group.add_argument("-v", "--verbose", action="store_true", help="debug logs; tracebacks on errors")
    return common


def _add_data_arguments(parser: argparse.ArgumentParser, *, required: bool, labels: bool = False,
                        what: str = "calibration images", default_count: str = "what the method needs") -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=required, metavar="ID_OR_PATH",
                       help=f"{what}: a Hub dataset id, a .parquet file, a folder of parquet files or an image folder")
    group.add_argument("--split", default="train", help="dataset split (default: %(default)s)")
    group.add_argument("--image-column", default=None, metavar="C",
                       help="image column (default: detected from the dataset's features)")
    if labels:
        group.add_argument("--label-column", default="label", metavar="C",
                           help="label column for label-based methods (taylor-ce; default: %(default)s)")
    group.add_argument("--num-samples", type=_positive_int, default=None, metavar="N",
                       help=f"images to read (default: {default_count})")
    group.add_argument("--shuffle-buffer", type=_positive_int, default=None, metavar="N",
                       help="seeded shuffle buffer of the stream, in examples (default: 10000)")


def _load_data(args: argparse.Namespace, num_samples: int, *, label_column: str | None = None,
               show_progress: bool = True) -> Any:
    from .data import DEFAULT_SHUFFLE_BUFFER, load_image_dataset

    return load_image_dataset(
        args.data, split=args.split, image_column=args.image_column, label_column=label_column,
        num_samples=num_samples, seed=args.seed, shuffle_buffer=args.shuffle_buffer or DEFAULT_SHUFFLE_BUFFER,
        show_progress=show_progress,
    )


# -------------------------------------------------------------------------------------------- shared helpers


def _process_state() -> Any:
    """The accelerate process state: N processes under ``accelerate launch``, else one."""
    from .distributed import process_state

    return process_state()


def _check_checkpoint_source(name_or_path: str, option: str) -> None:
    """A path that does not exist fails here, naming the option, instead of as an invalid Hub repo id."""
    from .data import looks_like_path

    if not Path(name_or_path).expanduser().exists() and looks_like_path(name_or_path):
        raise SnapViTError(f"{option} {name_or_path!r}: no such folder. Give a checkpoint folder or a Hub model id.")


def _load_dense_model(name_or_path: str) -> Any:
    """The model class its config names (``ViTForImageClassification``, ``Dinov2Model``, ...), else ``AutoModel``."""
    import transformers
    from transformers import AutoConfig

    from .architectures import get_spec

    _check_checkpoint_source(name_or_path, "--model")
    config = AutoConfig.from_pretrained(name_or_path)
    get_spec(config)  # an unsupported architecture fails before the weights are read
    if getattr(config, "elastic_layout", None):
        raise SnapViTError(
            f"{name_or_path!r} is a sliced checkpoint (config.elastic_layout is set); rank the dense model or the "
            "dense elastic checkpoint instead."
        )
    names = [n for n in (config.architectures or []) if isinstance(getattr(transformers, n, None), type)]
    if names:
        cls = getattr(transformers, names[0])
    elif any("ForImageClassification" in n for n in (config.architectures or [])):
        cls = transformers.AutoModelForImageClassification
    else:
        cls = transformers.AutoModel
    return cls.from_pretrained(name_or_path).eval()


def _load_processor(name_or_path: str, *, required: bool) -> Any:
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        if required:
            raise SnapViTError(
                f"Cannot load the image processor of {name_or_path!r} ({' '.join(str(error).split())}); the chosen "
                "method preprocesses images with it. Save one next to the model (preprocessor_config.json)."
            ) from error
        return None


def _counts_row(counts: Any, requested: float | None = None) -> dict[str, Any]:
    row = {"num_params": int(counts.num_params), "gflops": float(counts.gflops),
           "sparsity": float(counts.sparsity), "heads": list(counts.heads), "neurons": list(counts.neurons)}
    if requested is not None:
        row = {"requested_sparsity": requested, **row}
    return row


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)


def _gflops(value: float) -> str:
    return f"{value:.3f}" if value >= 0.01 else f"{value:.3g}"


def _widths(values: Sequence[int]) -> str:
    return " ".join(str(v) for v in values)


# ------------------------------------------------------------------------------------------------------ prune


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    from .methods import available_methods

    parser.add_argument("--model", required=True, metavar="ID_OR_PATH",
                        help="dense model: a Hub id or a local folder of a supported architecture")
    parser.add_argument("--output", required=True, metavar="DIR", help="folder for the elastic checkpoint")
    parser.add_argument("--method", default="snapvit", choices=available_methods(),
                        help="ranking method (default: %(default)s; magnitude, lamp and random need no data)")
    parser.add_argument("--preset", default=None, choices=("default", "fast", "paper"),
                        help="SnapViT preset, also the image counts of snip/taylor-ce (default: \"default\": OBD scores, "
                             "global mode, 3 xNES generations at sigma 0.5, 1000 + 1000 images)")
    parser.add_argument("--mode", default=None, choices=("global", "paired"),
                        help="ranking mode (default: the preset's for snapvit, global otherwise)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the image draw, crops and search (default: 0)")
    _add_data_arguments(parser, required=False, labels=True)
    hub = parser.add_argument_group("hub")
    hub.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="also upload the checkpoint to this repo")
    hub.add_argument("--private", action="store_true", help="create the Hub repo as private")
    hub.add_argument("--token", default=None, help="Hub write token (default: hf auth login / HF_TOKEN)")


def _images_needed(method: str, preset: str | None) -> int:
    from .methods.snapvit import SnapViTConfig

    config = SnapViTConfig.preset(preset or "default")
    return config.num_gradient_images + (config.num_fitness_images if method == "snapvit" else 0)


def _run_prune(args: argparse.Namespace) -> dict[str, Any] | None:
    from .checkpoint import save_elastic
    from .methods import rank

    needs_data = args.method in _DATA_METHODS
    if needs_data and not args.data:
        raise SnapViTError(f"--method {args.method} ranks with calibration images: pass --data ID_OR_PATH.")
    if not needs_data and args.data:
        logger.warning("--method %s is data-free; --data %s is not read.", args.method, args.data)
    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise SnapViTError(f"--output {args.output!r} is a file; give a folder for the checkpoint.")
    state = _process_state()
    if args.push_to_hub:  # a missing token should fail now, not after the ranking
        from .hub import resolve_token

        resolve_token(args.token)
    show = not args.quiet and state.is_local_main_process

    model = _load_dense_model(args.model)
    processor = _load_processor(args.model, required=needs_data)
    data, label_column = None, None
    if needs_data:
        label_column = args.label_column if args.method in _LABEL_METHODS else None
        data = _load_data(args, args.num_samples or _images_needed(args.method, args.preset),
                          label_column=label_column, show_progress=show)
    start = time.perf_counter()
    ranking = rank(model, method=args.method, data=data, preset=args.preset, processor=processor, mode=args.mode,
                   seed=args.seed, label_column=label_column or "label", show_progress=show)
    seconds = time.perf_counter() - start
    if not state.is_main_process:  # every process ranks (the work is split); one writes
        return None

    stored = save_elastic(model, ranking, output, image_processor=processor)
    dense = stored.keep_counts(sparsity=0.0)
    result: dict[str, Any] = {
        "output": str(output.resolve()),
        "model": args.model,
        "method": args.method,
        "preset": (args.preset or "default") if needs_data else None,
        "mode": stored.mode,
        "seed": args.seed,
        "num_images": len(data) if data is not None else 0,
        "num_processes": state.num_processes,
        "seconds": round(seconds, 3),
        "dense_params": int(dense.num_params),
        "dense_gflops": float(dense.gflops),
        "max_sparsity": float(stored.max_sparsity),
        "pushed": None,
    }
    if args.push_to_hub:
        from .hub import push_to_hub

        commit = push_to_hub(output, args.push_to_hub, private=args.private or None, token=args.token)
        result["pushed"] = getattr(commit, "pr_url", None) or getattr(commit, "commit_url", None) or str(commit)
    return result


def _render_prune(r: dict[str, Any]) -> str:
    how = [f"method {r['method']}"] + ([f"preset {r['preset']}"] if r["preset"] else []) + [
        f"mode {r['mode']}", f"seed {r['seed']}"]
    if r["num_images"]:
        how.append(f"{r['num_images']} images")
    how.append(f"{r['num_processes']} process{'es' if r['num_processes'] > 1 else ''}, {r['seconds']:.1f} s")
    lines = [
        f"wrote elastic checkpoint {r['output']} ({', '.join(how)})",
        f"dense: {_millions(r['dense_params'])} backbone params, {_gflops(r['dense_gflops'])} GFLOPs; "
        f"loads at any sparsity from 0 to {r['max_sparsity']:.4f}",
        f"load:  hf_snapvit.ElasticViTModel.from_pretrained({r['output']!r}, sparsity=0.3)",
    ]
    if r.get("pushed"):
        lines.append(f"pushed: {r['pushed']}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- export


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="ELASTIC", help="elastic checkpoint: a Hub id or a folder")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--sparsity", type=_fraction, metavar="S", help="fraction of backbone parameters to remove")
    budget.add_argument("--target-params", type=_positive_int, metavar="N", help="backbone parameters to keep")
    budget.add_argument("--target-gflops", type=float, metavar="G", help="GFLOPs of one forward pass")
    parser.add_argument("--output", required=True, metavar="DIR", help="folder for the sliced checkpoint")
    parser.add_argument("--correct", action="store_true",
                        help="compensate the removed units in the kept weights with calibration images (--data)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration draw (default: 0)")
    _add_data_arguments(parser, required=False, what="calibration images for --correct",
                        default_count="the correction's default, 1000")


def _run_export(args: argparse.Namespace) -> dict[str, Any]:
    from inspect import signature

    from .budget import backbone_parameters, estimate_gflops, layer_widths
    from .files import atomic_directory
    from .modeling import ElasticViTModel

    output = Path(args.output)
    if output.exists() and not output.is_dir():
        raise SnapViTError(f"--output {args.output!r} is a file; give a folder for the checkpoint.")
    kwargs: dict[str, Any] = {"sparsity": args.sparsity, "target_params": args.target_params,
                              "target_gflops": args.target_gflops}
    if args.data and not args.correct:
        raise SnapViTError("--data is only read with --correct; add --correct or drop --data.")
    if args.correct:
        if "correction_data" not in signature(ElasticViTModel.from_pretrained).parameters:
            raise SnapViTError("--correct needs an hf_snapvit with weight correction (ElasticViTModel.from_pretrained"
                               "(..., correction_data=...)); upgrade hf_snapvit.")
        if not args.data:
            raise SnapViTError("--correct needs calibration images: pass --data ID_OR_PATH.")
        from .correction import CorrectionConfig

        num_samples = args.num_samples or CorrectionConfig().num_samples or 1000
        kwargs["correction_data"] = _load_data(args, num_samples, show_progress=not args.quiet)
        kwargs["correction"] = CorrectionConfig(num_samples=None, seed=args.seed)  # use exactly the images read

    _check_checkpoint_source(args.model, "--model")
    model = ElasticViTModel.from_pretrained(args.model, **kwargs)
    processor = _load_processor(args.model, required=False)
    with atomic_directory(output) as staging:
        model.save_pretrained(staging)
        if processor is not None:
            processor.save_pretrained(staging)
    heads, neurons = layer_widths(model)
    layout = getattr(model.config, "elastic_layout", None) or {}
    return {
        "output": str(output.resolve()),
        "model": args.model,
        "sparsity": layout.get("sparsity", 0.0),
        "num_params": int(backbone_parameters(model)),
        "total_params": int(sum(p.numel() for p in model.parameters())),
        "gflops": float(estimate_gflops(model)),
        "heads": heads,
        "neurons": neurons,
        "correction": getattr(model.config, "elastic_correction", None),
        "architecture": type(model).__name__,
    }


def _render_export(r: dict[str, Any]) -> str:
    lines = [
        f"wrote sliced checkpoint {r['output']} ({r['architecture']}, sparsity {r['sparsity']:.4f})",
        f"backbone: {_millions(r['num_params'])} params ({_millions(r['total_params'])} with task heads), "
        f"{_gflops(r['gflops'])} GFLOPs",
        f"heads per block:   {_widths(r['heads'])}",
        f"neurons per block: {_widths(r['neurons'])}",
    ]
    if r.get("correction"):
        c = r["correction"]
        lines.append(f"corrected with {c.get('num_images')} images: reconstruction error "
                     f"{c.get('mean_error_before')} -> {c.get('mean_error_after')}")
    lines.append(f"load:  hf_snapvit.ElasticViTModel.from_pretrained({r['output']!r})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- inspect


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="ELASTIC", help="elastic (or sliced) checkpoint: a Hub id or a folder")
    parser.add_argument("--sparsities", type=_fraction, nargs="+", default=None, metavar="S",
                        help="sparsity grid (default: 0, 0.1, ... up to the largest the ranking allows)")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw the per-block allocation heatmap")


def _run_inspect(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoConfig

    from .ranking import ElasticRanking

    _check_checkpoint_source(args.checkpoint, "ELASTIC")
    config = AutoConfig.from_pretrained(args.checkpoint)
    stored = getattr(config, "elastic_ranking", None)
    layout = getattr(config, "elastic_layout", None)
    if stored is None and layout is None:
        raise SnapViTError(
            f"{args.checkpoint!r} is not an elastic checkpoint: its config.json has no 'elastic_ranking'. Create one "
            "with 'hf-snapvit prune'."
        )
    result: dict[str, Any] = {
        "checkpoint": args.checkpoint,
        "model_type": config.model_type,
        "architectures": list(config.architectures or []),
        "layout": layout,
        "correction": getattr(config, "elastic_correction", None),
        "ranking": None,
        "grid": [],
        "plot": None,
    }
    if stored is None:
        if args.sparsities or args.plot:
            raise SnapViTError(f"{args.checkpoint!r} is a sliced checkpoint without a ranking; --sparsities and "
                               "--plot need the elastic checkpoint it was exported from.")
        return result
    ranking = ElasticRanking.from_dict(stored)
    shape = ranking.shape
    max_sparsity = float(ranking.max_sparsity)
    sparsities = args.sparsities or [s for s in _DEFAULT_GRID if s <= max_sparsity]
    provenance = dict(ranking.provenance)
    head_floor, neuron_floor = ranking.floors()
    result["ranking"] = {
        "method": provenance.get("method"),
        "mode": ranking.mode,
        "format_version": stored.get("format_version"),
        "seed": provenance.get("seed"),
        "base_model": provenance.get("base_model"),
        "library_version": provenance.get("library_version"),
        "calibration_data": provenance.get("calibration_data"),
        "provenance": provenance,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "intermediate_size": shape.intermediate_size,
        "floors": {"heads": head_floor, "neurons": neuron_floor},
        "max_sparsity": max_sparsity,
    }
    for s in sparsities:
        counts = ranking.keep_counts(sparsity=s)
        row = _counts_row(counts, s)
        if layout:
            row["loadable"] = all(h <= sh and f <= sf for h, f, sh, sf in zip(
                counts.heads, counts.neurons, layout["num_heads"], layout["intermediate_size"]))
            if not row["loadable"] and not args.sparsities:
                continue  # a sliced checkpoint can be cut further, not grown back: its default grid starts at its size
        result["grid"].append(row)
    if args.plot:
        from .plotting import plot_allocation

        plot_allocation(ranking, args.plot, sparsities=sparsities)
        result["plot"] = str(Path(args.plot).resolve())
    return result


def _render_inspect(r: dict[str, Any]) -> str:
    lines = [f"checkpoint:   {r['checkpoint']} ({r['model_type']}, {', '.join(r['architectures']) or '?'})"]
    if r["layout"]:
        lay = r["layout"]
        lines.append(f"sliced:       sparsity {lay.get('sparsity', 0):.4f}, {_millions(lay.get('num_params', 0))} "
                     f"backbone params, {_gflops(lay.get('gflops', 0))} GFLOPs")
        lines.append(f"              heads {_widths(lay.get('num_heads', []))}; "
                     f"neurons {_widths(lay.get('intermediate_size', []))}")
    if r.get("correction"):
        lines.append(f"corrected:    with {r['correction'].get('num_images')} images")
    k = r["ranking"]
    if k is None:
        return "\n".join(lines)
    calibration = k["calibration_data"] or {}
    settings = k["provenance"].get("settings") or {}
    lines += [
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
    lines += [
        f"shape:        {k['num_layers']} blocks x {k['num_heads']} heads x {k['intermediate_size']} FFN neurons; "
        f"each block keeps >= {k['floors']['heads']} heads and >= {k['floors']['neurons']} neurons",
        f"max sparsity: {k['max_sparsity']:.4f}",
        "",
        f"{'sparsity':>8}  {'actual':>6}  {'params':>9}  {'GFLOPs':>7}  heads per block | neurons per block",
    ]
    for row in r["grid"]:
        note = "  (not in this sliced checkpoint)" if row.get("loadable") is False else ""
        lines.append(f"{row['requested_sparsity']:>8.2f}  {row['sparsity']:>6.4f}  {_millions(row['num_params']):>9}  "
                     f"{_gflops(row['gflops']):>7}  {_widths(row['heads'])} | {_widths(row['neurons'])}{note}")
    if r["plot"]:
        lines += ["", f"plot:         {r['plot']}"]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- eval


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    from .evaluation import METRICS

    parser.add_argument("--model", required=True, metavar="CHECKPOINT",
                        help="an elastic checkpoint (loaded at --sparsity), a sliced one, or any supported model")
    parser.add_argument("--sparsity", type=_fraction, default=None, metavar="S",
                        help="budget for an elastic checkpoint")
    parser.add_argument("--data", required=True, metavar="ID_OR_PATH",
                        help="labelled evaluation images: a parquet file, a folder of {split}.parquet, a dataset id")
    parser.add_argument("--split", default="validation", help="evaluation split (default: %(default)s)")
    parser.add_argument("--num-samples", type=_positive_int, default=None, metavar="N",
                        help="evaluate on a seeded subset of this size (default: the whole split)")
    parser.add_argument("--bank-data", default=None, metavar="ID_OR_PATH",
                        help="labelled train images for k-NN and the linear probe (default: none)")
    parser.add_argument("--bank-split", default="train", help="split of --bank-data (default: %(default)s)")
    parser.add_argument("--num-bank", type=_positive_int, default=None, metavar="N", help="bank subset size")
    parser.add_argument("--metrics", nargs="+", choices=METRICS, default=None,
                        help="default: every metric the data and model allow")
    parser.add_argument("--k", type=_positive_int, default=20, help="neighbours of the k-NN (default: %(default)s)")
    parser.add_argument("--batch-size", type=_positive_int, default=64, help="images per forward pass")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subsets (default: 0)")
    parser.add_argument("--output", default=None, metavar="FILE.json", help="also write the result here")


def _run_eval(args: argparse.Namespace) -> dict[str, Any]:
    from .evaluation import evaluate, load_split

    _check_checkpoint_source(args.model, "--model")
    eval_data = load_split(args.data, args.split, num_samples=args.num_samples, seed=args.seed)
    bank = None if args.bank_data is None else load_split(args.bank_data, args.bank_split,
                                                          num_samples=args.num_bank, seed=args.seed)
    result = evaluate(args.model, eval_data, sparsity=args.sparsity, bank_data=bank, metrics=args.metrics, k=args.k,
                      batch_size=args.batch_size, show_progress=not args.quiet, output=args.output)
    return result.to_dict()


def _render_eval(r: dict[str, Any]) -> str:
    metrics = [(name, r.get(key)) for name, key in (("top-1", "top1"), (f"k-NN (k={r.get('k')})", "knn_top1"),
                                                    ("linear probe", "linear_top1"), ("retention", "retention"))]
    bank = f", {r['num_bank']} in the bank" if r.get("num_bank") else ""
    lines = [f"model:     {r.get('name')} ({_millions(r.get('num_params') or 0)} backbone params, "
             f"{_gflops(r.get('gflops') or 0)} GFLOPs, sparsity {r.get('sparsity') or 0:.4f})",
             f"images:    {r.get('num_eval')} evaluated{bank}"]
    lines += [f"{name + ':':<10} {value:.4f}" for name, value in metrics if value is not None]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ bench


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="ELASTIC", help="elastic checkpoint folder (or Hub id with --no-load)")
    parser.add_argument("--sparsities", type=_fraction, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6],
                        metavar="S", help="sparsities compared with the dense model")
    parser.add_argument("--batch-sizes", type=_positive_int, nargs="+", default=[1, 8, 32], metavar="B")
    parser.add_argument("--repeats", type=_positive_int, default=5, help="timed rounds per batch size (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes per model and batch size")
    parser.add_argument("--threads", type=_positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default=None, help="device of the latency benchmark (default: cpu)")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency benchmark")
    parser.add_argument("--no-load", action="store_true", help="skip the load time / memory benchmark")
    parser.add_argument("--load-repeats", type=_positive_int, default=1, help="fresh processes per load setting")
    parser.add_argument("--output", default=None, metavar="FILE.json", help="also write the report here")


def _run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from .benchmark import run_bench

    _check_checkpoint_source(args.checkpoint, "ELASTIC")
    return run_bench(args.checkpoint, sparsities=args.sparsities, batch_sizes=args.batch_sizes, repeats=args.repeats,
                     warmup=args.warmup, threads=args.threads, device=args.device, latency=not args.no_latency,
                     load=not args.no_load, load_repeats=args.load_repeats, output=args.output,
                     show_progress=not args.quiet)


def _render_bench(r: dict[str, Any]) -> str:
    from .benchmark import format_latency_table

    hardware = r.get("hardware") or {}
    lines = [f"checkpoint: {r.get('checkpoint')}",
             "hardware:   " + ", ".join(f"{k} {v}" for k, v in hardware.items() if isinstance(v, (str, int, float)))]
    if r.get("latency"):
        lines += ["", "latency (interleaved with the dense model; x = speedup over dense):",
                  format_latency_table(r["latency"])]
    if r.get("loading"):
        lines += ["", f"{'sparsity':>8}  {'load s':>7}  {'x dense':>7}  {'memory x dense':>14}"]
        for row in r["loading"]["results"]:
            if "error" in row:
                lines.append(f"{row.get('requested_sparsity'):>8}  error: {' '.join(str(row['error']).split())}")
                continue
            ratios = row.get("ratios_to_elastic_dense") or {}
            memory = ratios.get("anon_growth")
            lines.append(f"{row['requested_sparsity']:>8.2f}  {row['load_s']:>7.3f}  {ratios.get('load_s') or 0:>7.2f}"
                         f"  {memory if memory is None else f'{memory:.2f}':>14}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ table

COMMANDS: list[Command] = [
    Command("prune", "rank every head and FFN neuron of a model and write an elastic checkpoint",
            _prune_arguments, _run_prune, _render_prune),
    Command("export", "write a sliced checkpoint of an elastic one at a budget",
            _export_arguments, _run_export, _render_export),
    Command("inspect", "show an elastic checkpoint's ranking, keep counts, parameters and GFLOPs",
            _inspect_arguments, _run_inspect, _render_inspect),
    Command("eval", "evaluate a checkpoint: top-1, k-NN, linear probe, representation retention",
            _eval_arguments, _run_eval, _render_eval),
    Command("bench", "measure latency, load time and memory of an elastic checkpoint at several sparsities",
            _bench_arguments, _run_bench, _render_bench),
]


def build_parser() -> argparse.ArgumentParser:
    """The ``hf-snapvit`` parser, one subparser per row of :data:`COMMANDS`."""
    parser = _Parser(prog="hf-snapvit", description="Elastic vision transformers: rank once, load any size.")
    parser.add_argument("--version", action="version", version=f"hf_snapvit {__version__}")
    commands = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    common = _common_options()
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help, parents=[common])
        command.add_arguments(sub)
        sub.set_defaults(command=command)
    return parser


# ------------------------------------------------------------------------------------------------------- main


@contextlib.contextmanager
def _logging_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """hf_snapvit's logs on the current stderr for the length of one call (main may run many times in a process)."""
    from transformers.utils import logging as hf_logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package = logging.getLogger("hf_snapvit")
    previous_level, previous_propagate = package.level, package.propagate
    package.addHandler(handler)
    package.setLevel(logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO)
    package.propagate = False
    bars = hf_logging.is_progress_bar_enabled()
    if args.quiet:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(previous_level)
        package.propagate = previous_propagate
        if bars:
            hf_logging.enable_progress_bar()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hf-snapvit`` with ``argv`` (default: ``sys.argv[1:]``).

    Args:
        argv: The command line without the program name.

    Returns:
        The exit status: 0 on success, 2 for bad input (one ``error: ...`` line on stderr), 130 when interrupted.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # --help / --version (0) or a usage error (2), already printed
        return exit.code if isinstance(exit.code, int) else 2
    with _logging_to_stderr(args):
        try:
            result = args.command.run(args)
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
        # Bad input surfaces as one of these: hf_snapvit's own errors, transformers/datasets ValueErrors, and
        # OSErrors (missing files, unreachable Hub, FileNotFoundError, ConnectionError). Anything else is a bug
        # and keeps its traceback.
        except (SnapViTError, ValueError, OSError) as error:
            if args.verbose:
                traceback.print_exc()
            print(f"error: {' '.join(str(error).split()) or type(error).__name__}", file=sys.stderr)
            return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=_jsonable) if args.json else args.command.render(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
