"""What the zero-training benchmarks of the shared ViT-Tiny share (``prefix_correction_vit_tiny.py``,
``prefix_correction_switch_time.py``): their options, the model with its stored ranking, the validation images, the
k-NN bank and calibration images drawn apart from the bank, and the top-1 / k-NN scores.

These helpers lived in ``mean_compensation_vit_tiny.py`` and ``rank_vit_tiny.py`` until those scripts left the tree
(both are in commit 1336aae); the code is unchanged, so the stored results' draws are the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoImageProcessor, AutoModelForImageClassification

from hf_snapvit.benchmark import hardware_info
from hf_snapvit.data.images import to_rgb
from hf_snapvit.evaluation import extract_features, knn_accuracy, load_split, top1_accuracy
from hf_snapvit.data.sampling import key_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recovery_vit_tiny import stored_ranking  # noqa: E402  (benchmarks/ is not a package)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
RANKING = Path(__file__).parent / "results" / "defaults_vit_tiny" / "rankings" / "obd-global-sigma0.5-g3.json"

#: Seeds of the train-split draws: the k-NN bank (as every ViT-Tiny table) and the calibration images.
BANK_SEED, CALIBRATION_SEED = 1, 7


def pixels_and_labels(data_dir: str, split: str, n: int, seed: int, processor) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded draw of ``n`` images of ``split`` (:func:`hf_snapvit.evaluation.load_split`), preprocessed once."""
    rows = load_split(data_dir, split, num_samples=n, seed=seed)
    pixels = processor(images=[to_rgb(image) for image in rows["image"]], return_tensors="pt")["pixel_values"]
    return pixels, torch.tensor(rows["label"])


def features_and_logits(model, pixels: torch.Tensor, batch: int = 100):
    features = extract_features(model, pixels, batch_size=batch, logits=True, show_progress=False)
    return features.embeddings, features.logits


def zero_training_arguments(doc: str, output: str, sparsities: list[float], num_calibration: int
                            ) -> argparse.ArgumentParser:
    """The options the zero-training benchmarks share: model, data, ranking, sizes and image counts, output."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--ranking", type=Path, default=RANKING)
    parser.add_argument("--sparsities", type=float, nargs="+", default=sparsities)
    parser.add_argument("--num-calibration", type=int, default=num_calibration)
    parser.add_argument("--num-val", type=int, default=1000)
    parser.add_argument("--num-bank", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / output)
    return parser


def calibration_rows(data: str, count: int, bank_count: int) -> object:
    """``count`` train rows drawn with :data:`CALIBRATION_SEED` from those the k-NN bank (the first ``bank_count``
    of the split shuffled with :data:`BANK_SEED`, as ``load_split`` draws it) does not hold: images fitted on must
    not be the bank's, or the bank's features would be the ones fitted. Each row keeps its split index (``row``)."""
    train = load_split(data, "train")
    train = train.add_column("row", list(range(len(train))))
    bank = {int(row) for row in key_order(len(train), BANK_SEED)[:bank_count]}
    rest = train.filter(lambda row: row not in bank, input_columns="row")
    return rest.select(key_order(len(rest), CALIBRATION_SEED)[:count])


def zero_training_setup(args: argparse.Namespace) -> dict:
    """The model, its ranking and the images of a zero-training benchmark: validation images and the k-NN bank
    (seeds 0 and 1, as every ViT-Tiny table; none when their count is 0), and calibration images from the train
    split that are not in the bank (:func:`calibration_rows`)."""
    transformers.utils.logging.set_verbosity_error()
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    processor = AutoImageProcessor.from_pretrained(args.model)
    val = pixels_and_labels(args.data, "validation", args.num_val, 0, processor) if args.num_val else None
    bank = pixels_and_labels(args.data, "train", args.num_bank, BANK_SEED, processor) if args.num_bank else None
    rows = calibration_rows(args.data, args.num_calibration, args.num_bank)
    calibration = processor(images=[to_rgb(image) for image in rows["image"]], return_tensors="pt")["pixel_values"]
    return {"model": model, "ranking": stored_ranking(args.ranking, model), "val": val, "bank": bank,
            "calibration": calibration,
            "calibration_draw": f"{len(rows)} train images (seed {CALIBRATION_SEED}) not in the k-NN bank"}


def run_record(script: str, argv: list[str] | None, args: argparse.Namespace, setup: dict) -> dict:
    """What every zero-training benchmark's JSON starts with: hardware, the command, the ranking and the draws."""
    command = ["python", f"benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])]
    return {"hardware": hardware_info(), "command": " ".join(command), "ranking": args.ranking.name,
            "num_calibration": args.num_calibration, "calibration": setup["calibration_draw"],
            "num_val": args.num_val, "num_bank": args.num_bank}


def scores(model: nn.Module, val: tuple, bank: tuple) -> dict[str, float]:
    """Top-1 with the model's head and k-NN top-1 on the validation images."""
    features, logits = features_and_logits(model, val[0])
    bank_features, _ = features_and_logits(model, bank[0])
    return {"top1": top1_accuracy(logits, val[1]), "knn_top1": knn_accuracy(bank_features, bank[1], features, val[1])}
