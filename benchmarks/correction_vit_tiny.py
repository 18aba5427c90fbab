"""Post-pruning weight correction on the shared ViT-Tiny: top-1 and k-NN top-1 with and without correction.

For each sparsity, the elastic checkpoint is loaded three ways through the public API: sliced as is
(``ElasticViTModel.from_pretrained(model, sparsity=s)``), and corrected with dense or sequential propagation
(``..., correction_data=calibration, correction=CorrectionConfig(propagation=...)``). Calibration images come from
the Tiny-ImageNet train split (labels ignored) and are disjoint from the k-NN memory bank (also train); accuracy is
measured on the validation split. k-NN (``hf_snapvit.evaluation``): k = 20, cosine on L2-normalised final-norm CLS
features, majority vote.

    python benchmarks/correction_vit_tiny.py --model ELASTIC       # everything: 0.3, 0.5, 0.6 x {none, dense, sequential}
    python benchmarks/correction_vit_tiny.py --model ELASTIC --sparsities 0.5 --propagations dense  # one row group
    python benchmarks/correction_vit_tiny.py --model ELASTIC --sparsities 0.5 --propagations sequential \
        --skip-uncorrected
    python benchmarks/correction_vit_tiny.py --base ../shared/models/vit-tiny-tinyimagenet --method magnitude

On a shared 2-vCPU VM one evaluation (500 val + 1000 bank images) takes 2-5 min and one correction (500 images)
1-5 min, so the published table was made one row group per run, as above.

Results merge into ``--output`` (JSON, written atomically after every row), so the sparsities can be run one at a
time and a re-run replaces only its own rows.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.data.images import to_rgb
from hf_snapvit.evaluation import extract_features, knn_accuracy, load_split, top1_accuracy
from hf_snapvit.files import write_text_atomic

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="elastic checkpoint (ignored when --base is given)")
    parser.add_argument("--base", default=None, help="rank this model with --method first (e.g. the shared ViT-Tiny)")
    parser.add_argument("--method", default="magnitude", help="ranking method for --base (hf_snapvit.rank)")
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.3, 0.5, 0.6])
    parser.add_argument("--propagations", nargs="+", default=["dense", "sequential"], choices=["dense", "sequential"])
    parser.add_argument("--damping", default="mean", choices=["mean", "max", "percentile"])
    parser.add_argument("--damping-fraction", type=float, default=0.01)
    parser.add_argument("--num-calibration", type=int, default=500)
    parser.add_argument("--num-val", type=int, default=500)
    parser.add_argument("--num-bank", type=int, default=1000, help="train images in the k-NN memory bank")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-guard", action="store_true",
                        help="CorrectionConfig(guard=False): fit on every image, keep every correction")
    parser.add_argument("--skip-uncorrected", action="store_true", help="only the corrected rows")
    parser.add_argument("--tag", default="", help="suffix of the corrected rows' names (for ablations, e.g. damp0.1)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all)")
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).parent / "results" / "correction_vit_tiny.json")
    return parser.parse_args()


@torch.no_grad()
def evaluate(model, val: dict, bank: dict, k: int) -> dict:
    """Top-1 with the model's head on ``val``; k-NN top-1 of ``val`` against ``bank`` (final-norm CLS features)."""
    start = time.perf_counter()
    queries = extract_features(model, val["pixels"], logits=True, batch_size=100, show_progress=False)
    memory = extract_features(model, bank["pixels"], logits=False, batch_size=100, show_progress=False)
    return {"top1": top1_accuracy(queries.logits, val["labels"]),
            "knn_top1": knn_accuracy(memory.embeddings, bank["labels"], queries.embeddings, val["labels"], k=k),
            "eval_seconds": time.perf_counter() - start}


def write_atomic(path: Path, results: dict) -> None:
    write_text_atomic(path, json.dumps(results, indent=2, default=str))


def build_elastic(args, train, processor_dir: str) -> str:
    """Rank ``--base`` with ``--method`` (calibration from the train split) and save a temporary elastic checkpoint."""
    processor = AutoImageProcessor.from_pretrained(processor_dir)
    base = AutoModelForImageClassification.from_pretrained(args.base).eval()
    ranking = hf_snapvit.rank(base, method=args.method, data=train, processor=processor, seed=args.seed)
    folder = Path(tempfile.mkdtemp(prefix="correction-bench-")) / "elastic"
    hf_snapvit.save_elastic(base, ranking, folder, image_processor=processor)
    return str(folder)


def main() -> None:
    args = parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    train = load_split(args.data, "train")
    validation = load_split(args.data, "validation")
    if not args.base and (args.model is None or not Path(args.model, "config.json").exists()):
        where = f"No elastic checkpoint at {args.model}" if args.model else "No elastic checkpoint given"
        raise SystemExit(f"{where}; pass --model PATH, or --base MODEL --method NAME to rank one first.")
    model_dir = build_elastic(args, train, args.base) if args.base else args.model
    processor = AutoImageProcessor.from_pretrained(model_dir)

    # One seeded permutation of the train split: the k-NN bank first, the calibration images after it (disjoint).
    order = np.random.default_rng(args.seed).permutation(len(train))
    bank_rows = train.select(order[:args.num_bank])
    calibration = train.select(order[args.num_bank:args.num_bank + args.num_calibration])
    val_rows = validation.select(np.random.default_rng(args.seed).permutation(len(validation))[:args.num_val])

    def prepared(rows) -> dict:
        images = [to_rgb(image) for image in rows["image"]]
        return {"pixels": processor(images=images, return_tensors="pt")["pixel_values"],
                "labels": torch.tensor(rows["label"])}

    val, bank = prepared(val_rows), prepared(bank_rows)
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results["hardware"] = hardware_info()
    protocol = {"num_calibration": args.num_calibration, "num_val": args.num_val, "num_bank": args.num_bank,
                "k": args.k, "seed": args.seed, "data": args.data,
                "calibration": "train split, disjoint from the k-NN bank; labels ignored"}
    rows = results.setdefault("rows", [])
    source = args.method if args.base else Path(model_dir).name

    def record(row: dict) -> None:
        row = {"source": source, **row, "protocol": protocol}
        rows[:] = [r for r in rows if (r["source"], r["sparsity"], r["variant"]) !=
                   (row["source"], row["sparsity"], row["variant"])] + [row]
        rows.sort(key=lambda r: (r["source"], r["sparsity"], r["variant"]))
        write_atomic(args.output, results)
        extra = f"  correction {row['correction_seconds']:.0f} s" if "correction_seconds" in row else ""
        print(f"s={row['sparsity']:.2f} {row['variant']:28s} top-1 {row['top1']:.3f}  k-NN {row['knn_top1']:.3f}"
              f"{extra}", flush=True)

    def same_evaluation(other: dict) -> bool:  # the dense row does not depend on the calibration set
        return {**other, "num_calibration": None} == {**protocol, "num_calibration": None}

    if not any(r["source"] == source and r["variant"] == "dense" and same_evaluation(r["protocol"]) for r in rows):
        record({"sparsity": 0.0, "variant": "dense",
                **evaluate(hf_snapvit.ElasticViTModel.from_pretrained(model_dir), val, bank, args.k)})
    for sparsity in args.sparsities:
        if not args.skip_uncorrected:
            start = time.perf_counter()
            plain = hf_snapvit.ElasticViTModel.from_pretrained(model_dir, sparsity=sparsity)
            load = time.perf_counter() - start
            record({"sparsity": sparsity, "variant": "uncorrected", "load_seconds": load,
                    "gflops": plain.config.elastic_layout["gflops"], **evaluate(plain, val, bank, args.k)})
            del plain
        for propagation in args.propagations:
            config = CorrectionConfig(num_samples=args.num_calibration, propagation=propagation,
                                      damping=args.damping, damping_fraction=args.damping_fraction, seed=args.seed,
                                      guard=not args.no_guard)
            start = time.perf_counter()
            corrected = hf_snapvit.ElasticViTModel.from_pretrained(model_dir, sparsity=sparsity,
                                                                   correction_data=calibration, correction=config)
            seconds = time.perf_counter() - start
            variant = f"corrected-{propagation}" + ("-unguarded" if args.no_guard else "") + \
                (f"-{args.tag}" if args.tag else "")
            record({"sparsity": sparsity, "variant": variant,
                    "correction_seconds": seconds, "correction": corrected.config.elastic_correction,
                    **evaluate(corrected, val, bank, args.k)})
            del corrected
    write_atomic(args.output, results)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
