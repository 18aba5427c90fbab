"""Does mean compensation lift accuracy without training? A screen on the shared ViT-Tiny (issue 29).

Removing heads and FFN neurons removes input columns of two projections per block (attention output, FFN output).
Mean compensation adds to each such projection's bias what the removed columns contributed on average:
``b += W[:, removed] @ mean(x[removed])``, with ``x`` the projection's input over calibration images and tokens. The
means are measured once on the dense model and serve every size (one vector per projection), so unlike the
per-size weight correction (``docs/correction.md``) the statistics would fit in an elastic checkpoint.

    python benchmarks/mean_compensation_vit_tiny.py --num-calibration 256 --sparsities 0.1 0.3 0.5

Top-1 with the model's head and k-NN top-1 (k = 20, train-split bank) on the validation split, for the plain slice
and the compensated one at each sparsity, with the default SnapViT ranking of ``benchmarks/defaults_vit_tiny.py``.
Writes JSON (``--output``).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import nn
from transformers import AutoImageProcessor, AutoModelForImageClassification

from hf_snapvit.sampling import key_order
from hf_snapvit.architectures import get_attention, get_layers, get_mlp, get_spec
from hf_snapvit.architectures.registry import get_projection, head_dim
from hf_snapvit.benchmark import hardware_info, sliced_copy
from hf_snapvit.data import to_rgb
from hf_snapvit.evaluation import knn_accuracy, load_split, top1_accuracy
from hf_snapvit.files import write_text_atomic
from hf_snapvit.ranking import ElasticRanking

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rank_vit_tiny import SHARED, features_and_logits, pixels_and_labels  # noqa: E402  (benchmarks/ is not a package)
from recovery_vit_tiny import stored_ranking  # noqa: E402

RANKING = Path(__file__).parent / "results" / "defaults_vit_tiny" / "rankings" / "obd-global-sigma0.5-g3.json"


def output_projections(model: nn.Module) -> list[tuple[nn.Linear, nn.Linear]]:
    """Per block, the two column-sliced projections: attention output and FFN output."""
    spec = get_spec(model)
    pairs = []
    for layer in get_layers(model, spec):
        mlp, variant = get_mlp(layer, spec)
        pairs.append((get_projection(get_attention(layer, spec), spec.o_proj), getattr(mlp, variant.out_proj)))
    return pairs


@torch.no_grad()
def input_means(model: nn.Module, pixels: torch.Tensor, batch_size: int = 64) -> list[tuple[torch.Tensor, ...]]:
    """Per block, the float64 mean input of each output projection over all images and tokens of ``pixels``."""
    pairs = output_projections(model)
    sums = [[torch.zeros(p.in_features, dtype=torch.float64) for p in pair] for pair in pairs]
    rows = [0]

    def adder(target: torch.Tensor, counts: bool):
        def hook(module, args):
            x = args[0].detach().double().reshape(-1, args[0].shape[-1])
            target.add_(x.sum(0))
            if counts:
                rows[0] += x.shape[0]
        return hook

    hooks = [projection.register_forward_pre_hook(adder(sums[i][j], counts=(i, j) == (0, 0)))
             for i, pair in enumerate(pairs) for j, projection in enumerate(pair)]
    try:
        for start in range(0, len(pixels), batch_size):
            model(pixel_values=pixels[start:start + batch_size])
    finally:
        for hook in hooks:
            hook.remove()
    return [tuple(s / rows[0] for s in pair) for pair in sums]


def compensated(model: nn.Module, ranking: ElasticRanking, sparsity: float,
                means: list[tuple[torch.Tensor, ...]]) -> nn.Module:
    """A copy of the dense ``model`` whose output biases carry the mean contribution of the units ``ranking`` removes
    at ``sparsity`` (slice it with the same ranking and sparsity)."""
    model = copy.deepcopy(model)
    spec = get_spec(model)
    keep = ranking.keep_indices(ranking.keep_counts(sparsity))
    for layer, (heads, neurons), pair, pair_means in zip(get_layers(model, spec), keep, output_projections(model),
                                                         means):
        width = head_dim(get_attention(layer, spec), spec)
        kept_columns = (np.concatenate([np.arange(h * width, (h + 1) * width) for h in heads]), np.asarray(neurons))
        for projection, kept, mean in zip(pair, kept_columns, pair_means):
            removed = np.setdiff1d(np.arange(projection.in_features), kept)
            with torch.no_grad():
                projection.bias += (projection.weight.double()[:, removed] @ mean[removed]).to(projection.bias.dtype)
    return model


def zero_training_arguments(doc: str, output: str, sparsities: list[float], num_calibration: int
                            ) -> argparse.ArgumentParser:
    """The options the zero-training screens share: model, data, ranking, sizes and image counts, output."""
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


#: Seeds of the train-split draws: the k-NN bank (as every ViT-Tiny table) and the calibration images.
BANK_SEED, CALIBRATION_SEED = 1, 7


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
    """The model, its ranking and the images of a zero-training screen: validation images and the k-NN bank (seeds 0
    and 1, as every ViT-Tiny table; none when their count is 0), and calibration images from the train split that are
    not in the bank (:func:`calibration_rows`)."""
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
    """What every zero-training screen's JSON starts with: hardware, the command, the ranking and the image draws."""
    command = ["python", f"benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])]
    return {"hardware": hardware_info(), "command": " ".join(command), "ranking": args.ranking.name,
            "num_calibration": args.num_calibration, "calibration": setup["calibration_draw"],
            "num_val": args.num_val, "num_bank": args.num_bank}


def scores(model: nn.Module, val: tuple, bank: tuple) -> dict[str, float]:
    """Top-1 with the model's head and k-NN top-1 on the validation images."""
    features, logits = features_and_logits(model, val[0])
    bank_features, _ = features_and_logits(model, bank[0])
    return {"top1": top1_accuracy(logits, val[1]), "knn_top1": knn_accuracy(bank_features, bank[1], features, val[1])}


def main(argv: list[str] | None = None) -> None:
    args = zero_training_arguments(__doc__, "mean_compensation_vit_tiny.json", [0.1, 0.3, 0.5], 256).parse_args(argv)
    setup = zero_training_setup(args)
    model, ranking, calibration = setup["model"], setup["ranking"], setup["calibration"]
    means = input_means(model, calibration)
    rows = []
    for sparsity in args.sparsities:
        for variant, base in (("plain", model), ("mean-compensated", compensated(model, ranking, sparsity, means))):
            sliced = sliced_copy(base, ranking, sparsity)
            rows.append({"sparsity": sparsity, "variant": variant, **scores(sliced, setup["val"], setup["bank"])})
            print(rows[-1], flush=True)
    results = {**run_record("mean_compensation_vit_tiny.py", argv, args, setup), "rows": rows}
    write_text_atomic(args.output, json.dumps(results, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
