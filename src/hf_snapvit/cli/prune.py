"""``hf-snapvit prune``: rank a dense model and write (and optionally upload) its elastic checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError, HubUploadError
from .formatting import gflops, millions
from .models import add_model_argument, check_base_model, load_dense_model
from .options import add_data_arguments, load_data, load_processor, output_folder
from ..utils.logs import get_logger

logger = get_logger("hf_snapvit.cli")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``prune``."""
    from ..pruning.methods import available_methods
    from ..pruning.methods.config import PRESETS

    add_model_argument(parser, "MODEL", "dense model: a Hub id or a local folder of a vision transformer")
    parser.add_argument("--output", required=True, metavar="DIR", help="folder for the elastic checkpoint")
    parser.add_argument("--base-model", default=None, metavar="ORG/NAME",
                        help="Hub id of MODEL, when MODEL is a local copy: the card's base_model metadata, which links "
                             "the checkpoint to it on the Hub (default: MODEL when it is a Hub id)")
    parser.add_argument("--method", default="snapvit", choices=available_methods(),
                        help="ranking method (default: %(default)s; magnitude, lamp and random need no data)")
    parser.add_argument("--preset", default=None, choices=PRESETS,
                        help="SnapViT preset, also the image counts of snip/taylor-ce. fast: 128 + 128 images and "
                             "96-px local crops, the search scored at 30 %% only, for a CPU (docs/cli.md: times); "
                             "default: 1000 + 1000 images, OBD scores, global mode, 3 xNES generations at sigma 0.5 "
                             "and their mean as the result; paper: the reference code's settings (default: default)")
    parser.add_argument("--mode", default=None, choices=("global", "paired"),
                        help="ranking mode (default: the preset's for snapvit, global otherwise)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the image draw, crops and search (default: 0)")
    parser.add_argument("--generations", type=int, default=None, metavar="N",
                        help="xNES generations of the SnapViT search (default: the preset's, 3 for default and fast); "
                             "0 ranks by the gradient scores and each block's unit order alone. On a CPU without bf16 "
                             "matrix units the fast preset then takes about 41 s instead of 152-182 s, with about 1 "
                             "point less top-1 at 30 %% on the shared ViT-Tiny (docs/results.md)")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                        help="SnapViT forward passes: auto = bf16 on CUDA and on CPUs with bf16 matrix units (AMX, "
                             "AVX512-BF16), float32 elsewhere, or accelerate's "
                             "--mixed_precision when it sets one; fp32 uses TF32 products on CUDA (default: auto)")
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="memory budget of every ranking phase, e.g. 40GiB or 512MB: the gradient steps, the "
                             "search and the unit order run in micro-batches planned to fit it, with the same ranking "
                             "up to float rounding; a budget below one image's needs is refused with the figure "
                             "(default: 90%% of the GPU's free memory, on a CPU half the available host memory)")
    parser.add_argument("--prefix-correction", action=argparse.BooleanOptionalAction, default=None,
                        help="also fit the weight correction for every size on the --data images the command read "
                             "and store it beside the weights (prefix_correction.safetensors; applied at load where "
                             "held-out images say it helps, see docs/correction.md). Default: on when the method "
                             "reads images (snapvit, snip, taylor-ce); --no-prefix-correction leaves it out (a "
                             "checkpoint half the size, switches without triangular solves)")
    add_data_arguments(parser, required=False, labels=True)
    hub = parser.add_argument_group("hub")
    hub.add_argument("--push-to-hub", default=None, metavar="REPO_ID", help="also upload the checkpoint to this repo")
    hub.add_argument("--private", action="store_true", help="create the Hub repo as private")
    hub.add_argument("--token", default=None, help="Hub write token (default: hf auth login / HF_TOKEN)")


def _method(name: str) -> Any:
    """The registered method ``name`` (:mod:`hf_snapvit.pruning.methods.registry`): whether it reads images and
    labels, and its config class."""
    from ..pruning.methods import ranking_method

    return ranking_method(name)


def _corrects(args: argparse.Namespace) -> bool:
    """Whether to store the prefix correction: when asked, and by default when the method reads images (it is what
    lifts the plain slices most without training). A default one is left out, with a warning, when the command reads
    too few images to check it; an asked-for one is refused before the ranking."""
    from ..correction.prefix import MIN_CHECKED_IMAGES

    if args.prefix_correction is False or (args.prefix_correction is None and not _method(args.method).needs_data):
        return False
    count = _images_read(args)
    if count >= MIN_CHECKED_IMAGES:
        return True
    if args.prefix_correction:
        raise ConfigError(f"--prefix-correction holds some of its images out to check where it helps, so it needs at "
                          f"least {MIN_CHECKED_IMAGES} calibration images; --num-samples {count} reads {count}. "
                          "Read more, or leave --prefix-correction out.")
    logger.warning("%d calibration image(s) are too few to check the prefix correction (it needs at least %d); the "
                   "checkpoint is written without it. Pass --num-samples %d or more to store it.", count,
                   MIN_CHECKED_IMAGES, MIN_CHECKED_IMAGES)
    return False


def _images_read(args: argparse.Namespace) -> int:
    """How many images of ``--data`` the command reads: ``--num-samples``, else what the method needs (a data-free
    method with ``--prefix-correction``: the correction's own sample count)."""
    from ..correction.config import CorrectionConfig

    return args.num_samples or _images_needed(args.method, args.preset) or CorrectionConfig.num_samples


def _images_needed(method: str, preset: str | None) -> int:
    return _method(method).config_cls.preset(preset or "default").images_needed


# The flags that set a field of the method's config: flag -> (field, the value that means "not given").
_CONFIG_FLAGS = {"--preset": ("preset", None), "--mode": ("mode", None), "--seed": ("seed", 0),
                 "--precision": ("precision", "auto"), "--generations": ("max_generations", None)}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """rank()'s settings from the flags, each passed where the method's config has the field (a flag given for a
    method without it is refused); a bad value fails here, before anything is loaded."""
    if args.generations is not None and args.generations < 0:
        raise ConfigError(f"--generations {args.generations}: give 0 (no search) or more generations, e.g. 3.")
    config_cls = _method(args.method).config_cls
    known = config_cls.setting_names()
    settings: dict[str, Any] = {}
    for flag, (name, unset) in _CONFIG_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if name == "preset" or name in known:
            if value != unset:
                settings[name] = value
        elif value != unset and name == "precision":  # ignored before methods had their own configs: a warning
            logger.warning("--precision %s sets precision, which --method %s has not; it is ignored (and refused "
                           "from the next release): leave --precision out.", value, args.method)
        elif value != unset:
            raise ConfigError(f"{flag} {value} sets {name}, which --method {args.method} has not (its settings: "
                              f"{', '.join(known)}); leave {flag} out.")
    max_memory = getattr(args, "max_memory", None)
    if max_memory is not None:
        from ..pruning.memory_plan import parse_memory

        max_memory = parse_memory(max_memory, "--max-memory")  # a bad size fails before anything is loaded
    config_cls.preset(settings.get("preset") or "default", **{k: v for k, v in settings.items() if k != "preset"})
    return dict(settings, max_memory=max_memory)


def _correction_config(ranking: Any) -> Any:
    """The prefix correction's settings: the defaults, with the forward batch of the ranking's memory plan."""
    from ..correction.config import CorrectionConfig

    planned = ranking.provenance.get("memory_plan", {}).get("correction", {}).get("batch")
    return CorrectionConfig() if planned is None else CorrectionConfig(batch_size=min(CorrectionConfig.batch_size,
                                                                                      planned))


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    """Rank ``--model`` with ``--method`` and save the elastic checkpoint; ``None`` on non-main processes."""
    from ..publishing.saving import save_elastic
    from ..utils.distributed import process_state
    from ..pruning.methods import rank

    check_base_model(args.base_model)
    if args.prefix_correction and not args.data:
        raise ConfigError("--prefix-correction fits on calibration images: pass --data ID_OR_PATH.")
    correct = _corrects(args)
    settings = _settings(args)  # a bad --generations fails now, not after loading the model and the data
    method = _method(args.method)
    needs_data = method.needs_data or correct
    if needs_data and not args.data:
        raise ConfigError(f"--method {args.method} ranks with calibration images: pass --data ID_OR_PATH.")
    if not needs_data and args.data:
        logger.warning("--method %s is data-free; --data %s is not read.", args.method, args.data)
    output = output_folder(args.output)
    state = process_state()  # N processes under accelerate launch, else one
    if args.push_to_hub:  # a missing token should fail now, not after the ranking
        from ..publishing.hub import resolve_token

        try:
            resolve_token(args.token)
        except HubUploadError as error:  # its words name the library's token= argument
            raise HubUploadError(
                f"--push-to-hub {args.push_to_hub} needs a Hugging Face token with write access and none was found: "
                "log in with `hf auth login`, set the HF_TOKEN environment variable, or pass --token hf_... (from "
                "https://huggingface.co/settings/tokens)."
            ) from error
    show = not args.quiet and state.is_local_main_process

    model = load_dense_model(args.model)
    processor = load_processor(args.model, required=needs_data)
    data, label_column = None, None
    if needs_data:
        label_column = args.label_column if method.needs_labels else None
        data = load_data(args, _images_read(args), label_column=label_column, show_progress=show)
    ranking = rank(model, method=args.method, data=data if method.needs_data else None,
                   processor=processor, label_column=label_column or "label", show_progress=show, **settings)
    if not state.is_main_process:  # every process ranks (the work is split); one writes
        return None

    stored = save_elastic(model, ranking, output, image_processor=processor, base_model=args.base_model)
    correction = None
    if correct:
        from ..publishing.saving import add_prefix_correction

        # The card save_elastic just wrote, rewritten with the correction's section (a hand-written one is kept).
        record = add_prefix_correction(output, data, processor, refresh_card=True, show_progress=show,
                                       config=_correction_config(ranking))
        correction = [s["requested"] for s in record.get("sizes", []) if s["kept"]]
    dense = stored.keep_counts(sparsity=0.0)
    result: dict[str, Any] = {
        "output": str(output.resolve()),
        "model": args.model,
        "method": args.method,
        "preset": (args.preset or "default") if needs_data else None,
        "mode": stored.mode,
        "seed": args.seed,
        "generations": ranking.provenance.get("settings", {}).get("max_generations"),
        "num_images": len(data) if data is not None else 0,
        "num_processes": state.num_processes,
        "seconds": round(ranking.provenance["timings"]["wall_seconds"], 3),
        "dense_params": int(dense.num_params),
        "dense_gflops": float(dense.gflops),
        "max_sparsity": float(stored.max_sparsity),
        "pushed": None,
        "prefix_correction": correction,
    }
    if args.push_to_hub:
        from ..publishing.hub import push_to_hub

        commit = push_to_hub(args.push_to_hub, output, private=args.private or None, token=args.token)
        result["pushed"] = getattr(commit, "pr_url", None) or getattr(commit, "commit_url", None) or str(commit)
    return result


def render(r: dict[str, Any]) -> str:
    """The result of :func:`run` as text."""
    how = [f"method {r['method']}"] + ([f"preset {r['preset']}"] if r["preset"] else []) + [
        f"mode {r['mode']}", f"seed {r['seed']}"] + ([f"{r['generations']} generations"]
                                                     if r.get("generations") is not None else [])
    if r["num_images"]:
        how.append(f"{r['num_images']} images")
    how.append(f"{r['num_processes']} process{'es' if r['num_processes'] > 1 else ''}, {r['seconds']:.1f} s")
    lines = [
        f"wrote elastic checkpoint {r['output']} ({', '.join(how)})",
        (f"dense: {millions(r['dense_params'])} backbone params, {gflops(r['dense_gflops'])} GFLOPs; "
         f"loads at any sparsity from 0 to {r['max_sparsity']:.4f}"),
        f"load:  hf_snapvit.ElasticViTModel.from_pretrained({r['output']!r}, sparsity=0.3)",
    ]
    if r.get("prefix_correction") is not None:
        helped = ", ".join(f"{s:g}" for s in r["prefix_correction"]) or "none"
        lines.append(f"prefix correction stored; it helped on held-out images at sparsities: {helped}")
    if r.get("pushed"):
        lines.append(f"pushed: {r['pushed']}")
    return "\n".join(lines)
