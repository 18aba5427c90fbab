"""What aligned FFN widths cost in accuracy: top-1 and k-NN of one ranking at each sparsity and ``width_multiple``.

Loads the shared ViT-Tiny and a stored SnapViT ranking of it (by default the one the current defaults produce, from
``benchmarks/defaults_vit_tiny.py``), slices the model at every sparsity for every multiple, and evaluates each copy
with the same validation images and k-NN bank (``hf_snapvit.evaluation.Evaluator``).

    python benchmarks/width_multiple_accuracy.py --multiples 1 8 16 32 64 --sparsities 0.1 0.3 0.5 \\
        --num-val 1000 --num-bank 1000 --output benchmarks/results/width_multiple_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoImageProcessor, AutoModelForImageClassification  # noqa: E402

from hf_snapvit.benchmark import hardware_info, sliced_copy  # noqa: E402
from hf_snapvit.evaluation import Evaluator, load_split  # noqa: E402
from hf_snapvit.files import write_text_atomic  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from defaults_vit_tiny import read_ranking  # noqa: E402  (benchmarks/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEFAULT_RANKING = ROOT / "benchmarks" / "results" / "defaults_vit_tiny" / "rankings" / "obd-global-sigma0.5-g3.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"),
                        help="folder holding train.parquet and validation.parquet")
    parser.add_argument("--ranking", default=str(DEFAULT_RANKING),
                        help="unsorted scores as the rank stage of defaults_vit_tiny.py stores them")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--num-val", type=int, default=1000)
    parser.add_argument("--num-bank", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "width_multiple_accuracy.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    ranking = read_ranking(args.ranking, model)
    evaluator = Evaluator(load_split(args.data, "validation", num_samples=args.num_val, seed=args.seed),
                          bank_data=load_split(args.data, "train", num_samples=args.num_bank, seed=args.seed + 1),
                          processor=AutoImageProcessor.from_pretrained(args.model), metrics=("top1", "knn"),
                          show_progress=False)
    dense = evaluator.evaluate(model, name="dense")
    rows = []
    for multiple in args.multiples:
        for sparsity in args.sparsities:
            counts = ranking.keep_counts(sparsity, width_multiple=multiple)
            result = evaluator.evaluate(sliced_copy(model, ranking, sparsity, multiple), name=f"{multiple}@{sparsity}")
            rows.append({"width_multiple": multiple, "requested_sparsity": sparsity, "sparsity": counts.sparsity,
                         "neurons": counts.neurons, "heads": counts.heads, "top1": result.top1,
                         "knn_top1": result.knn_top1})
            print(f"multiple {multiple:>3}  sparsity {sparsity:.2f} ({counts.sparsity:.4f})  top-1 {result.top1:.3f}"
                  f"  k-NN {result.knn_top1:.3f}", flush=True)
    report = {"command": " ".join(["python", "benchmarks/width_multiple_accuracy.py", *(argv or sys.argv[1:])]),
              "ranking": Path(args.ranking).name, "num_val": args.num_val, "num_bank": args.num_bank,
              "dense": {"top1": dense.top1, "knn_top1": dense.knn_top1}, "rows": rows,
              "hardware": hardware_info()}
    write_text_atomic(args.output, json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
