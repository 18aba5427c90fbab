"""Rank the shared ViT-Tiny with SnapViT and the baselines; report top-1 and k-NN top-1 at a sparsity grid.

Calibration images come from the Tiny-ImageNet train split (labels ignored), accuracy from the validation split.
k-NN: k = 20, L2-normalised final-norm CLS features, majority vote, train split as the memory bank.

    python benchmarks/rank_vit_tiny.py --preset fast --methods snapvit snip taylor-ce lamp magnitude random \
        --num-val 500 --num-bank 1000 --sparsities 0.1 0.3 0.5

Writes JSON (``--output``) with the ranking wall time per phase and the accuracies; prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit
from hf_snapvit.benchmark import hardware_info, sliced_copy
from hf_snapvit.data import to_rgb
from hf_snapvit.evaluation import extract_features, knn_accuracy, load_split, top1_accuracy
from hf_snapvit.files import public_name, write_text_atomic

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--methods", nargs="+", default=["snapvit", "magnitude", "random"])
    parser.add_argument("--preset", default="fast")
    parser.add_argument("--mode", default=None, choices=[None, "global", "paired"])
    parser.add_argument("--score-definition", default=None, help="override the preset's SnapViT score definition")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--num-val", type=int, default=1000)
    parser.add_argument("--num-bank", type=int, default=2000, help="train images in the k-NN memory bank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all)")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                        help="SnapViTConfig.precision of the SnapViT search forwards")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "rank_vit_tiny.json")
    return parser.parse_args()


def pixels_and_labels(data_dir: str, split: str, n: int, seed: int, processor) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded draw of ``n`` images of ``split`` (:func:`hf_snapvit.evaluation.load_split`), preprocessed once."""
    rows = load_split(data_dir, split, num_samples=n, seed=seed)
    pixels = processor(images=[to_rgb(image) for image in rows["image"]], return_tensors="pt")["pixel_values"]
    return pixels, torch.tensor(rows["label"])


def features_and_logits(model, pixels: torch.Tensor, batch: int = 100):
    features = extract_features(model, pixels, batch_size=batch, logits=True, show_progress=False)
    return features.embeddings, features.logits


def snapvit_ranking(model, calibration, processor, args: argparse.Namespace):
    """SnapViT with ``--preset``/``--mode``/``--score-definition``: (ranking, phase timings, search history)."""
    config = hf_snapvit.SnapViTConfig.preset(args.preset, seed=args.seed, precision=args.precision,
                                             **({"mode": args.mode} if args.mode else {}))
    if args.score_definition:
        config = dataclasses.replace(config, scores=dataclasses.replace(config.scores,
                                                                        definition=args.score_definition))
    pruner = hf_snapvit.SnapViTPruner(config)  # the pruner, not rank(): the JSON keeps its per-generation history
    ranking = pruner.fit(model, calibration, processor=processor)
    return ranking, pruner.timings_, pruner.history_


def main() -> None:
    args = parse_args()
    transformers.utils.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    processor = AutoImageProcessor.from_pretrained(args.model)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    calibration = load_split(args.data, "train")
    val_pixels, val_labels = pixels_and_labels(args.data, "validation", args.num_val, args.seed, processor)
    bank_pixels, bank_labels = pixels_and_labels(args.data, "train", args.num_bank, args.seed + 1, processor)

    # Paths by their last component only: results files never name this machine's folders.
    results = {"hardware": hardware_info(), "methods": {},
               "args": {k: public_name(v) if k in ("model", "data", "output") else str(v)
                        for k, v in vars(args).items()}}
    feats, logits = features_and_logits(model, val_pixels)
    bank, _ = features_and_logits(model, bank_pixels)
    results["dense"] = {"top1": top1_accuracy(logits, val_labels),
                        "knn_top1": knn_accuracy(bank, bank_labels, feats, val_labels)}
    print(f"dense: top-1 {results['dense']['top1']:.3f}  k-NN {results['dense']['knn_top1']:.3f}")
    for method in args.methods:
        start = time.perf_counter()
        if method == "snapvit":
            ranking, timings, history = snapvit_ranking(model, calibration, processor, args)
        else:
            ranking = hf_snapvit.rank(model, method=method, data=calibration, processor=processor,
                                      preset=args.preset, seed=args.seed, mode=args.mode)
            timings, history = ranking.provenance["timings"]["phases"], []
        wall = time.perf_counter() - start
        rows = []
        for sparsity in args.sparsities:
            counts = ranking.keep_counts(min(sparsity, ranking.max_sparsity))
            sliced = sliced_copy(model, ranking, min(sparsity, ranking.max_sparsity))
            f, lg = features_and_logits(sliced, val_pixels)
            b, _ = features_and_logits(sliced, bank_pixels)
            row = {"sparsity": counts.sparsity, "gflops": counts.gflops,
                   "top1": top1_accuracy(lg, val_labels),
                   "knn_top1": knn_accuracy(b, bank_labels, f, val_labels)}
            rows.append(row)
            print(f"{method:10s} s={row['sparsity']:.3f} GFLOPs={row['gflops']:.3f} top-1 {row['top1']:.3f} "
                  f"k-NN {row['knn_top1']:.3f}")
        results["methods"][method] = {"wall_seconds": wall, "timings": timings, "history": history, "rows": rows,
                                      "mode": ranking.mode, "settings": ranking.provenance.get("settings")}
        print(f"{method}: ranked in {wall:.1f} s {timings}")
    write_text_atomic(args.output, json.dumps(results, indent=2, default=str))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
