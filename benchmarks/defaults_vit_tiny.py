"""Choose SnapViT's defaults from evidence: score definition x ranking mode x search budget on the shared ViT-Tiny.

A configuration is ``DEFINITION:MODE:GENERATIONS`` plus ``:key=value`` changes (:data:`SEARCH_OPTIONS`,
:data:`SCORE_OPTIONS`, :data:`CROP_OPTIONS`, ``preset=default``) to a base: the ``fast`` preset as the grid first ran
it (``BASE_*``). One fit per configuration runs the largest of ``--budgets``; the smaller budgets' rankings are read
off its history, which is exactly what a fit with that budget returns (the first g generations do not depend on it).

    python benchmarks/defaults_vit_tiny.py rank --configs obd:global:6 obd:paired:6 obd:global:3:sigma=0.5 \
        --budgets 0 3 6
    python benchmarks/defaults_vit_tiny.py eval --num-val 1000 --num-bank 1000 --sparsities 0.1 0.3 0.5

``rank`` saves every ranking under ``OUTPUT_DIR/rankings`` (with ``*.fit.json``: phase times and history) and skips
those already there; ``eval`` scores every saved ranking (top-1, k-NN top-1 with k = 20) into ``summary.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import numpy as np

import hf_snapvit
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.evaluation import load_split, run_sweep
from hf_snapvit.utils.files import write_text_atomic
from hf_snapvit.pruning.xnes.rules import generations_without_improvement

from _harness import RESULTS, load_classifier, parser, ranking_from_stored, timed, write_json  # noqa: E402

# The committed grid (benchmarks/results/defaults_vit_tiny) ran on the fast preset of its time, sigma 1; a spec without
# a sigma option keeps that, so its name still names its rows and a re-run reproduces them.
BASE_SIGMA = 1.0
# Likewise the grid ran before unit orders existed: a spec without an order option keeps the scores' own order.
BASE_ORDER = "scores"
# ... and before the search's mean became the result: a spec without a solution option takes the best candidate.
BASE_SOLUTION = "best"
# ... and before the fast preset left 60 % out of the fitness: a spec without a sparsities option measures all four.
BASE_SPARSITIES = (0.1, 0.3, 0.5, 0.6)


def floats(value: str) -> tuple[float, ...]:
    """``1.0,1.0`` -> ``(1.0, 1.0)``."""
    return tuple(float(v) for v in value.split(","))


def flag(value: str) -> bool:
    """``1`` / ``0`` -> ``True`` / ``False``."""
    if value not in ("0", "1"):
        raise SystemExit(f"give 1 or 0, not {value!r}")
    return value == "1"


SEARCH_OPTIONS = {"covariance": str, "sigma": float, "fitness": int, "measure": str, "order": str, "solution": str,
                  "init": floats, "sparsities": floats, "split": flag, "rotate": flag, "size": int,
                  "tokens": float, "batch": int}
# Spec keys that name a config field by a shorter word.
FIELD_NAMES = {"fitness": "num_fitness_images", "measure": "fitness_measure", "order": "unit_order",
               "init": "init_mean", "sparsities": "fitness_sparsities", "split": "split_fitness_images",
               "rotate": "rotate_fitness_sparsities", "size": "fitness_image_size", "tokens": "fitness_token_fraction",
               "batch": "fitness_batch_size"}
SCORE_OPTIONS = {"head_rows": str}
# Spec keys of the gradient crops (MultiCropConfig fields).
CROP_OPTIONS = {"local_size": int, "num_local": int}
# Settings that fits recorded before they existed ran with: their whole budget, and the paper's cosine fitness.
NEWER_SETTINGS = {"early_stopping_patience": None, "early_stopping_threshold": 0.0, "fitness_measure": "cosine",
                  "unit_order": "scores", "solution": "best", "split_fitness_images": False,
                  "rotate_fitness_sparsities": False, "fitness_image_size": None, "fitness_token_fraction": 1.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    result = parser(__doc__)
    result.add_argument("stage", choices=("rank", "eval"))
    result.add_argument("--configs", nargs="+", default=["obd:global:6", "obd:paired:6"])
    result.add_argument("--budgets", type=int, nargs="+", default=[0, 3, 6], help="generations to evaluate")
    result.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    result.add_argument("--num-val", type=int, default=1000)
    result.add_argument("--num-bank", type=int, default=1000)
    result.add_argument("--seed", type=int, default=0)
    result.add_argument("--width-multiple", type=int, default=None,
                        help="round kept FFN widths to multiples of this (default: the library's, 64 here; 1: exact "
                             "widths, as the stored results were measured)")
    result.add_argument("--early-stopping", nargs="*", default=[], metavar="PATIENCE:THRESHOLD",
                        help="also save the ranking each of these early-stopping rules would end the search at "
                             "(read off the run's history), e.g. 2:0 3:0.002")
    result.add_argument("--reuse-search", action="store_true",
                        help="take the search history of a fit already recorded in OUTPUT_DIR/rankings (same "
                             "settings) instead of searching again; only the gradient scores are recomputed")
    result.add_argument("--also-mean", action="store_true",
                        help="also save the rankings of the search's mean (NAME-mean-gG.json) beside its best "
                             "sample's: the solution picks from the search, so one fit gives both")
    result.add_argument("--device", default="cpu", help="where the model ranks and is evaluated (cpu, cuda, ...)")
    result.add_argument("--output-dir", type=Path, default=RESULTS / "defaults_vit_tiny")
    return result.parse_args(argv)


def parse_config(spec: str, seed: int) -> tuple[str, hf_snapvit.SnapViTConfig]:
    """``obd:global:6:sigma=0.5`` -> (a file-safe name, the fast preset at ``BASE_SIGMA``, ``BASE_ORDER`` and
    ``BASE_SOLUTION`` with those changes)."""
    definition, mode, generations, *options = spec.split(":")
    base = "fast"
    scores: dict = {"definition": definition}
    crops: dict = {}
    search = {"sigma": BASE_SIGMA, "unit_order": BASE_ORDER, "solution": BASE_SOLUTION,
              "fitness_sparsities": BASE_SPARSITIES}
    for option in options:
        key, _, value = option.partition("=")
        if key == "preset":
            base = value
        elif key in SCORE_OPTIONS:
            scores[key] = SCORE_OPTIONS[key](value)
        elif key in CROP_OPTIONS:
            crops[key] = CROP_OPTIONS[key](value)
        elif key in SEARCH_OPTIONS:
            search[FIELD_NAMES.get(key, key)] = SEARCH_OPTIONS[key](value)
        else:
            raise SystemExit(f"unknown option {key!r} in {spec!r}; use one of "
                             f"{sorted([*SEARCH_OPTIONS, *SCORE_OPTIONS, *CROP_OPTIONS, 'preset'])}")
    preset = hf_snapvit.SnapViTConfig.preset(base)
    if crops:
        scores["crops"] = dataclasses.replace(preset.scores.crops, **crops)
    config = dataclasses.replace(preset, scores=dataclasses.replace(preset.scores, **scores), mode=mode,
                                 max_generations=int(generations), seed=seed, **search)
    name = "-".join([definition, mode] + [o.replace("=", "").replace(",", "_") for o in options])
    return name, config


def early_stop(history: list[dict], patience: int, threshold: float) -> int:
    """The generation a search with this early stopping ends at, read off a longer run's history: the stopped
    search is the start of the longer one (tests/pruning/test_snapvit.py checks this)."""
    for g in range(1, len(history) + 1):
        if generations_without_improvement(history[:g], threshold) >= patience:
            return g
    return len(history)


def fitted(spec: str, config: hf_snapvit.SnapViTConfig, fit_path: Path, reuse: bool, model, calibration,
           processor) -> tuple[hf_snapvit.SnapViTPruner, dict]:
    """Fit ``config`` and record it in ``fit_path``; with ``reuse`` and a recorded fit of the same settings, only its
    scores are recomputed (no search) and its recorded search history is taken instead of searching again."""
    recorded = json.loads(fit_path.read_text()) if reuse and fit_path.is_file() else None
    pruner = hf_snapvit.SnapViTPruner(dataclasses.replace(config, max_generations=0) if recorded else config)
    ranking, wall = timed(lambda: pruner.fit(model, calibration, processor=processor))
    settings = json.loads(json.dumps(ranking.provenance["settings"], default=str))
    if recorded is None:
        fit = {"spec": spec, "settings": settings,  # what ran (the search batch resolved)
               "wall_seconds": wall, "timings": pruner.timings_, "history": pruner.history_,
               "hardware": hardware_info(device=next(model.parameters()).device)}
        write_json(fit_path, fit)
        return pruner, fit
    # The solution picks from the history and does not change the search: a fit recorded with either serves both.
    expected = {**NEWER_SETTINGS, **recorded["settings"], "max_generations": 0, "solution": config.solution}
    if settings != expected:
        raise SystemExit(f"{fit_path} was fitted with other settings than {spec!r}; it cannot be reused")
    pruner.history_ = recorded["history"]
    return pruner, recorded


def rank_stage(args: argparse.Namespace) -> None:
    folder = args.output_dir / "rankings"
    folder.mkdir(parents=True, exist_ok=True)
    model, processor = load_classifier(args.model, args.device)
    calibration = load_split(args.data, "train")
    for spec in args.configs:
        name, config = parse_config(spec, args.seed)
        budgets = [g for g in args.budgets if g <= config.max_generations] or [config.max_generations]
        if not args.early_stopping and all((folder / f"{name}-g{g}.json").is_file() for g in budgets):
            print(f"{spec}: already ranked, skipped")
            continue
        pruner, fit = fitted(spec, config, folder / f"{name}.fit.json", args.reuse_search, model, calibration,
                             processor)
        stops = {}
        for rule in args.early_stopping:
            patience, threshold = rule.split(":")
            stops[rule] = early_stop(fit["history"], int(patience), float(threshold))
        if stops:
            print(f"{spec}: early stopping ends the search at generation {stops}", flush=True)
            write_json(folder / f"{name}.stops.json", stops)
        for g in sorted({*budgets, *stops.values()}):
            write_ranking(folder / f"{name}-g{g}.json", spec, g, pruner, fit)
            if args.also_mean and g and pruner.config.solution == "best":
                write_ranking(folder / f"{name}-mean-g{g}.json", spec, g, pruner, fit, solution="mean")
        print(f"{spec}: ranked in {fit['wall_seconds']:.0f} s {fit['timings']}", flush=True)


def write_ranking(path: Path, spec: str, g: int, pruner: hf_snapvit.SnapViTPruner, fit: dict,
                  solution: str | None = None) -> None:
    """The ranking after ``g`` generations of the fit's search (0: the starting factors), from the factors the
    ``solution`` (default: the fit's) takes: the best so far or the distribution's mean."""
    history, timings = fit["history"], fit["timings"]
    trail = "mean_factors" if (solution or pruner.config.solution) == "mean" else "best_factors"
    if g and trail not in history[g - 1]:
        raise SystemExit(f"the fit of {spec!r} was recorded before the search's mean was; search again (without "
                         "--reuse-search) to read its mean")
    factors = pruner.initial_factors_ if g == 0 else history[g - 1][trail]
    ranking = pruner.ranking_from_factors(factors)
    per_generation = timings["search"] / max(len(history), 1)
    info = {"spec": spec, "generations": g, "solution": trail.split("_")[0],
            "evaluations": history[g - 1]["evaluations"] if g else 0,
            "search_loss": history[g - 1]["best_fitness"] if g else None,
            # gradients + data, plus the search time of g generations (the fitness setup is counted too)
            "ranking_seconds_estimate": timings["data"] + timings["gradients"] + per_generation * g}
    # Unsorted scores (the stored format wants rank order and a permuted model); the eval stage rebuilds them.
    stored = {"head_scores": ranking.head_scores.tolist(), "neuron_scores": ranking.neuron_scores.tolist(),
              "mode": ranking.mode, "min_head_keep_ratio": ranking.min_head_keep_ratio,
              "min_neuron_keep_ratio": ranking.min_neuron_keep_ratio,
              "paired_head_offset": ranking.paired_head_offset, "info": info}
    write_text_atomic(path, json.dumps(stored))


def eval_stage(args: argparse.Namespace) -> None:
    files = sorted(f for f in (args.output_dir / "rankings").glob("*.json") if re.search(r"-g\d+\.json$", f.name))
    if not files:
        raise SystemExit(f"no rankings in {args.output_dir / 'rankings'}; run the 'rank' stage first")
    model, processor = load_classifier(args.model, args.device)
    rankings = {f.stem: ranking_from_stored(json.loads(f.read_text()), model) for f in files}
    info = {name: ranking.provenance["defaults_sweep"] for name, ranking in rankings.items()}
    eval_data = load_split(args.data, "validation", num_samples=args.num_val, seed=args.seed)
    bank_data = load_split(args.data, "train", num_samples=args.num_bank, seed=args.seed + 1)
    result = run_sweep(model, rankings, args.sparsities, eval_data, bank_data=bank_data,
                       processor=processor, output_dir=args.output_dir,
                       metrics=("top1", "knn"), latency=False, ranking_info=info, width_multiple=args.width_multiple)
    summary = {"dense": result.dense, "sparsities": args.sparsities,
               "num_val": args.num_val, "num_bank": args.num_bank,
               "hardware": hardware_info(device=args.device), "rankings": {}}
    for name in rankings:
        rows = [r for r in result.rows if r["method"] == name]
        summary["rankings"][name] = {
            **info[name],
            "mean_top1": float(np.mean([r["top1"] for r in rows])),
            "mean_knn_top1": float(np.mean([r["knn_top1"] for r in rows])),
            "top1": [r["top1"] for r in rows], "knn_top1": [r["knn_top1"] for r in rows],
        }
    write_json(args.output_dir / "summary.json", summary)
    print(f"{'ranking':32s} {'evals':>5s} {'rank s':>7s}  mean top-1  mean k-NN   top-1 @ {args.sparsities}")
    for name, s in sorted(summary["rankings"].items(), key=lambda kv: -kv[1]["mean_top1"]):
        print(f"{name:32s} {s['evaluations']:5d} {s['ranking_seconds_estimate']:7.0f}  {s['mean_top1']:10.3f}"
              f" {s['mean_knn_top1']:9.3f}   {' '.join(f'{v:.3f}' for v in s['top1'])}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    (rank_stage if args.stage == "rank" else eval_stage)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
