"""Label-free recovery on the shared ViT-Tiny: top-1 and k-NN top-1 at 10-60 % sparsity, five ways.

Each size of the elastic checkpoint is loaded through the public API as is (``none``), weight-corrected
(``correction``), recovered at that size (``recovery``), both (``correction+recovery``), and from one elastically
recovered checkpoint (``elastic``: ``recover(..., RecoveryConfig(elastic=True))``, saved, loaded at every size).
Recovery images are train images (labels never read) outside the k-NN bank; accuracy is on the validation split.

    python benchmarks/recovery_vit_tiny.py --preset cpu                 # <= 30 min on 2 CPU cores
    python benchmarks/recovery_vit_tiny.py --preset full                # an H100: the probe's scale
    python benchmarks/recovery_vit_tiny.py --preset full --variants recovery --sparsities 0.3 0.5 \
        --steps 300 --lr 3e-4 --batch-size 128 --hidden-weight 1 --logits-weight 0 --tag lr3e-4-nologits

``--model`` takes an elastic checkpoint, or a base model ranked with the preset's method (or ``--ranking``). Rows
merge into ``--output`` after each one (a re-run replaces only its own; ``--tag`` keeps a sweep's apart), with a plot
of top-1 against sparsity beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

import hf_snapvit

from _harness import (  # noqa: E402  (benchmarks/ is not a package)
    RESULTS, SHARED_MODEL, disjoint_draw, load_classifier, parser, pixels, scores, stored_ranking, timed, write_json)

VARIANTS = ("none", "correction", "recovery", "correction+recovery", "elastic")
PRESETS: dict[str, dict[str, Any]] = {
    # Sized for a shared 2-vCPU machine: a few tens of steps of 16 images per size.
    # Ranked with snip (28 s on 2 CPU cores, docs/results.md), the cheapest ranking that keeps some accuracy at 30 %.
    "cpu": dict(sparsities=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], method="snip", rank_preset="fast", num_calibration=1000,
                num_val=300, num_bank=300, steps=15, elastic_steps=20, batch_size=16, num_correction=256),
    # The probe's scale (4000 calibration images, batches of 128) for one H100.
    "full": dict(sparsities=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], method="snapvit", rank_preset="default",
                 num_calibration=4000, num_val=5000, num_bank=6000, steps=1500, elastic_steps=3000, batch_size=128,
                 num_correction=1000),
}
# Flags that map one to one onto RecoveryConfig fields (None: the preset's value or RecoveryConfig's default).
CONFIG_FLAGS = ("lr", "weight_decay", "warmup_steps", "hidden_weight", "embedding_weight", "logits_weight",
                "temperature", "flip", "elastic_samples", "mixed_precision")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    result = parser(__doc__)
    result.set_defaults(model=None)  # an elastic checkpoint, or a base model to rank (default: the shared ViT-Tiny)
    result.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    result.add_argument("--ranking", type=Path, default=None,
                        help="a stored ranking of the shared ViT-Tiny (e.g. benchmarks/results/defaults_vit_tiny/"
                             "rankings/obd-global-sigma0.5-g3.json, the default SnapViT ranking) instead of ranking")
    result.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    result.add_argument("--sparsities", type=float, nargs="+", default=None)
    for name in ("num_calibration", "num_val", "num_bank", "num_correction", "steps", "elastic_steps",
                 "batch_size"):
        result.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    for name in CONFIG_FLAGS:
        kind = str if name == "mixed_precision" else int if name in ("warmup_steps", "elastic_samples") else float
        result.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    result.add_argument("--crop-scale", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"))
    result.add_argument("--elastic-range", type=float, nargs=2, default=None, metavar=("LOW", "HIGH"),
                        help="sparsities elastic recovery trains (default: 0 to the largest of --sparsities)")
    result.add_argument("--k", type=int, default=20)
    result.add_argument("--seed", type=int, default=0)
    result.add_argument("--tag", default="", help="suffix of the recovered rows' variant names (settings sweeps)")
    result.add_argument("--output", type=Path, default=RESULTS / "recovery_vit_tiny" / "recovery_vit_tiny.json")
    args = result.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def recovery_config(args: argparse.Namespace, *, elastic: bool) -> hf_snapvit.RecoveryConfig:
    """The RecoveryConfig of a row: the preset's steps and batch, RecoveryConfig's defaults, the flags given."""
    given = {name: getattr(args, name) for name in CONFIG_FLAGS if getattr(args, name) is not None}
    if args.crop_scale is not None:
        given["crop_scale"] = tuple(args.crop_scale)
    # Every calibration image is trained on (held_out_images=0), as in the rows stored before the held-out check;
    # the benchmark's own "none" rows on the validation images are its never-worse reference.
    given.setdefault("held_out_images", 0)
    return hf_snapvit.RecoveryConfig(steps=args.elastic_steps if elastic else args.steps,
                                     batch_size=args.batch_size, num_images=None, seed=args.seed, elastic=elastic,
                                     elastic_range=tuple(args.elastic_range or (0.0, max(args.sparsities))),
                                     **given)


def recovered(args: argparse.Namespace, model_dir: str, sparsity: float, calibration: Any, *, corrected: bool,
              where: dict) -> tuple[Any, dict]:
    """One size distilled from the dense model with ``hf_snapvit.recover`` (weight-corrected first if ``corrected``),
    and what its row records. These are the steps ``from_pretrained(..., recovery_data=...)`` ran before it was
    deprecated: the dense teacher as loaded, the student sliced from the stored weights (no stored prefix correction,
    which a fitted load never applied), the checkpoint's own image processor."""
    load = hf_snapvit.ElasticViTModel.from_pretrained
    config = recovery_config(args, elastic=False)
    teacher = load(model_dir, **where)
    if corrected:
        correction = hf_snapvit.CorrectionConfig(num_samples=args.num_correction, seed=args.seed)
        student = hf_snapvit.correct(model_dir, sparsity=sparsity, data=calibration, config=correction, **where)
    else:
        student = load(model_dir, sparsity=sparsity, prefix_correction=False, **where)
    model, _ = hf_snapvit.recover(student, teacher, calibration, config)
    extra = {"settings": config.to_dict(), "final_loss": model.config.elastic_recovery["final_loss"]}
    if corrected:
        extra["correction"] = model.config.elastic_correction
    return model, extra


def run(args: argparse.Namespace, model_dir: str, calibration: Any, val: dict, bank: dict, device: str,
        record: Callable[[dict], None]) -> None:
    """Evaluate every variant at every sparsity; ``record`` receives each row as soon as it exists."""
    load = hf_snapvit.ElasticViTModel.from_pretrained
    where = {"device_map": device} if device != "cpu" else {}
    record({"sparsity": 0.0, "variant": "dense", **scores(load(model_dir, **where), val, bank, args.k)})
    elastic_dir = None
    if "elastic" in args.variants:
        config = recovery_config(args, elastic=True)
        dense = load(model_dir, **where)
        (trained, summary), seconds = timed(lambda: hf_snapvit.recover(dense, None, calibration, config))
        elastic_dir = Path(tempfile.mkdtemp(prefix="recovery-bench-")) / "elastic"
        ranking = hf_snapvit.ElasticRanking.from_dict(trained.config.elastic_ranking)
        hf_snapvit.save_elastic(trained.to("cpu"), ranking, elastic_dir)
        elastic_cost = {"fit_seconds": round(seconds, 3), "settings": config.to_dict(),
                        "final_loss": summary.final_loss()}
    for sparsity in args.sparsities:
        for variant in args.variants:
            extra: dict[str, Any] = {}
            if variant == "none":
                model, seconds = timed(lambda: load(model_dir, sparsity=sparsity, **where))
            elif variant == "correction":
                config = hf_snapvit.CorrectionConfig(num_samples=args.num_correction, seed=args.seed)
                model, seconds = timed(lambda: hf_snapvit.correct(model_dir, sparsity=sparsity, data=calibration,
                                                                  config=config, **where))
                extra = {"settings": config.to_dict()}
            elif variant in ("recovery", "correction+recovery"):
                (model, extra), seconds = timed(lambda: recovered(args, model_dir, sparsity, calibration,
                                                                  corrected=variant != "recovery", where=where))
            else:
                model, seconds = timed(lambda: load(elastic_dir, sparsity=sparsity, **where))
                extra = dict(elastic_cost, fit_seconds_shared_by_all_sizes=elastic_cost["fit_seconds"])
                extra.pop("fit_seconds")
            name = variant if variant in ("none", "correction") or not args.tag else f"{variant}-{args.tag}"
            record({"sparsity": sparsity, "variant": name, "load_seconds": round(seconds, 3),
                    "gflops": model.config.elastic_layout["gflops"], **extra, **scores(model, val, bank, args.k)})


def plot(results: dict, path: Path, preset: str | None = None) -> None:
    """Top-1 against sparsity, one line per variant (the rows of ``preset`` only, when given)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in results.get("rows", []) if preset is None or r["protocol"]["preset"] == preset]
    for variant in sorted({r["variant"] for r in rows if r["variant"] != "dense"}):
        points = sorted((r["sparsity"], r["top1"]) for r in rows if r["variant"] == variant)
        ax.plot(*zip(*points), marker="o", label=variant)
    for r in rows:
        if r["variant"] == "dense":
            ax.axhline(r["top1"], color="grey", linestyle="--", label="dense")
            break
    ax.set_xlabel("sparsity")
    ax.set_ylabel("top-1")
    ax.set_title(f"ViT-Tiny, Tiny-ImageNet val ({results.get('device', '?')})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def prepare(args: argparse.Namespace) -> tuple[str, Any, dict, dict]:
    """The elastic checkpoint, the recovery images (train, disjoint from the bank) and the evaluation sets."""
    calibration, val_rows, bank_rows = disjoint_draw(args.data, args.seed, args.num_bank, args.num_calibration,
                                                     args.num_val)
    calibration = calibration.remove_columns("label")
    model_dir = args.model
    if model_dir is None or "elastic_ranking" not in json.loads((Path(model_dir) / "config.json").read_text()):
        base, processor = load_classifier(model_dir or SHARED_MODEL)  # a base model: ranked (or --ranking) here
        ranking = stored_ranking(args.ranking, base) if args.ranking else hf_snapvit.rank(
            base, method=args.method, data=calibration, processor=processor, seed=args.seed, preset=args.rank_preset)
        model_dir = str(Path(tempfile.mkdtemp(prefix="recovery-bench-")) / "elastic")
        hf_snapvit.save_elastic(base, ranking, model_dir, image_processor=processor)
    processor = load_classifier(model_dir)[1]
    return model_dir, calibration, pixels(processor, val_rows), pixels(processor, bank_rows)


def main(argv: list[str] | None = None) -> None:
    from hf_snapvit.benchmark import hardware_info

    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir, calibration, val, bank = prepare(args)
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results.update(hardware=hardware_info(), device=torch.cuda.get_device_name() if device == "cuda" else "cpu")
    protocol = {"preset": args.preset, "num_calibration": args.num_calibration, "num_val": args.num_val,
                "num_bank": args.num_bank, "k": args.k, "seed": args.seed, "method": args.method,
                "rank_preset": args.rank_preset, "ranking": args.ranking.name if args.ranking else None,
                "argv": list(argv) if argv is not None else sys.argv[1:],
                "model": args.model, "calibration": "train split, disjoint from the k-NN bank; labels not read"}
    rows = results.setdefault("rows", [])

    def record(row: dict) -> None:
        row = {**row, "device": results["device"], "protocol": protocol}
        key = (row["sparsity"], row["variant"], args.preset)
        rows[:] = [r for r in rows if (r["sparsity"], r["variant"], r["protocol"]["preset"]) != key] + [row]
        rows.sort(key=lambda r: (r["protocol"]["preset"], r["sparsity"], r["variant"]))
        write_json(args.output, results, indent=2)
        print(f"s={row['sparsity']:.2f} {row['variant']:24s} top-1 {row['top1']:.3f}  k-NN {row['knn_top1']:.3f}",
              flush=True)

    start = time.perf_counter()
    run(args, model_dir, calibration, val, bank, device, record)
    results["wall_seconds"] = round(time.perf_counter() - start, 1)
    write_json(args.output, results, indent=2)
    plot(results, args.output.with_suffix(".png"), args.preset)


if __name__ == "__main__":
    main()
