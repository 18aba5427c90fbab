"""``hf-snapvit export``: write the sliced checkpoint of an elastic one at a budget, optionally weight-corrected
and/or recovered by distillation from the dense weights."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .formatting import gflops, millions, widths
from .models import add_model_argument, check_base_model, model_config
from .options import (
    add_data_arguments,
    fraction,
    load_data,
    load_processor,
    add_width_multiple,
    output_folder,
    positive_int,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``export``."""
    add_model_argument(parser, "ELASTIC", "elastic checkpoint: a Hub id or a folder")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--sparsity", type=fraction, metavar="S", help="fraction of backbone parameters to remove")
    budget.add_argument("--target-params", type=positive_int, metavar="N", help="backbone parameters to keep")
    budget.add_argument("--target-gflops", type=float, metavar="G", help="GFLOPs of one forward pass")
    add_width_multiple(parser)
    parser.add_argument("--output", required=True, metavar="DIR", help="folder for the sliced checkpoint")
    parser.add_argument("--correct", action="store_true",
                        help="compensate the removed units in the kept weights with calibration images (--data)")
    parser.add_argument("--recover", action="store_true",
                        help="distil the sliced model from the dense one on unlabelled images (--data)")
    parser.add_argument("--steps", type=positive_int, default=None, metavar="N",
                        help="optimizer steps of --recover (default: RecoveryConfig's)")
    parser.add_argument("--batch-size", type=positive_int, default=None, metavar="B",
                        help="images per step of --recover (default: RecoveryConfig's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the calibration draw (default: 0)")
    parser.add_argument("--base-model", default=None, metavar="ORG/NAME",
                        help="Hub id of the model ELASTIC was ranked from, for the card's base_model metadata "
                             "(default: the one ELASTIC records, when it is a Hub id)")
    add_data_arguments(parser, required=False, what="calibration images for --correct / --recover",
                       default_count="the correction's default, 1000")


def _fit_step(args: argparse.Namespace) -> Any:
    """The load's correction and/or recovery (:func:`hf_snapvit.fitting.fit_step`, as :func:`hf_snapvit.correct`
    runs it): the images of ``--data``, all of them used; ``None`` without ``--correct`` or ``--recover``."""
    if args.data and not (args.correct or args.recover):
        raise ConfigError("--data is only read with --correct or --recover; add one or drop --data.")
    if not args.recover and (args.steps or args.batch_size):
        raise ConfigError("--steps and --batch-size are settings of --recover; add --recover or drop them.")
    if not (args.correct or args.recover):
        return None
    if not args.data:
        raise ConfigError("--correct and --recover need calibration images: pass --data ID_OR_PATH.")
    from ..correction import CorrectionConfig
    from ..fitting import fit_step
    from ..recovery import RecoveryConfig

    defaults = RecoveryConfig()
    num_samples = args.num_samples or (defaults.num_images if args.recover else CorrectionConfig().num_samples) or 1000
    images = load_data(args, num_samples, show_progress=not args.quiet)
    correction = CorrectionConfig(num_samples=None, seed=args.seed) if args.correct else None
    recovery = RecoveryConfig(steps=args.steps or defaults.steps, batch_size=args.batch_size or defaults.batch_size,
                              num_images=None, seed=args.seed) if args.recover else None  # exactly the images read
    return fit_step(images if args.correct else None, correction, images if args.recover else None, recovery)


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Load the elastic checkpoint at the budget and save it, with its image processor, to ``--output`` in one
    atomic write: the one ``save_pretrained`` makes, which writes the card and the loading module too."""
    from ..architectures.budget import backbone_parameters, layer_widths
    from ..architectures.flops import estimate_gflops
    from ..utils.distributed import process_state
    from ..utils.files import atomic_directory
    from ..loading.modeling import load_elastic

    output = output_folder(args.output)
    check_base_model(args.base_model)
    model_config(args.model, "ELASTIC", elastic=True)
    model = load_elastic(args.model, args.sparsity, target_params=args.target_params,
                         target_gflops=args.target_gflops, width_multiple=args.width_multiple, fit=_fit_step(args))
    if not process_state().is_main_process:  # under accelerate launch every process recovers (DDP); one writes
        return None
    _record_base_model(model, args.base_model, output.name)
    processor = load_processor(args.model, required=False)
    # save_pretrained is itself an atomic write; inside this one it writes into this staging folder (no second
    # one), and names the checkpoint as the folder it becomes.
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
        "width_multiple": layout.get("width_multiple"),
        "correction": getattr(model.config, "elastic_correction", None),
        "recovery": getattr(model.config, "elastic_recovery", None),
        "architecture": type(model).__name__,
    }


def _record_base_model(model: Any, base_model: str | None, name: str) -> None:
    """``--base-model`` into the ranking the sliced checkpoint keeps, where its card reads it; without it and no Hub
    id recorded, a warning names the flag."""
    from ..cards.render import warn_missing_base_model
    from ..cards.sliced import base_model_id

    ranking = getattr(model.config, "elastic_ranking", None)
    if base_model is not None and isinstance(ranking, dict):
        ranking["provenance"] = {**(ranking.get("provenance") or {}), "base_model": base_model}
    elif base_model_id(model.config.to_dict(), model.config.name_or_path) is None:
        warn_missing_base_model(((ranking or {}).get("provenance") or {}).get("base_model"), name)


def render(r: dict[str, Any]) -> str:
    """The result of :func:`run` as text."""
    lines = [
        f"wrote sliced checkpoint {r['output']} ({r['architecture']}, sparsity {r['sparsity']:.4f})",
        (f"backbone: {millions(r['num_params'])} params ({millions(r['total_params'])} with task heads), "
         f"{gflops(r['gflops'])} GFLOPs"),
        f"heads per block:   {widths(r['heads'])}",
        f"neurons per block: {widths(r['neurons'])}",
    ]
    if r.get("correction"):
        c = r["correction"]
        lines.append(f"corrected with {c.get('num_images')} images: reconstruction error "
                     f"{c.get('mean_error_before')} -> {c.get('mean_error_after')}")
    if r.get("recovery"):
        c = r["recovery"]
        lines.append(f"recovered with {c.get('num_images')} images, {c.get('steps')} steps: distillation loss "
                     f"{c.get('first_loss')} -> {c.get('final_loss')}")
    lines.append(f"load:  hf_snapvit.ElasticViTModel.from_pretrained({r['output']!r})")
    return "\n".join(lines)
