"""The README's first example on the shared ViT-Tiny: rank it once, save one elastic checkpoint, load it at any size.

Steps: load the shared ViT-Tiny (Tiny-ImageNet-200) and its train images (``load_dataset("parquet", ...)``; the
ranking reads no labels), rank every attention head and FFN neuron with SnapViT's ``fast`` preset
(``hf_snapvit.rank(model, method="snapvit", data=train_images, preset="fast")``; ``--method magnitude`` for the
data-free baseline, seconds), write an elastic checkpoint with ``hf_snapvit.save_elastic`` and, with
``--prefix-correction``, the weight correction of every size (``hf_snapvit.add_prefix_correction``), then load it at
each sparsity with ``ElasticViTModel.from_pretrained``. For each size it prints the parameter count, the theoretical
GFLOPs, the top-1 accuracy on the first validation images, and what a stock ``transformers.pipeline`` predicts for the
first one; then the seconds each step took. ``--json FILE`` writes those figures with the machine they ran on.

    python examples/load_any_size.py                      # SnapViT fast: a few minutes on 2 CPU cores
    python examples/load_any_size.py --method magnitude   # the data-free baseline, seconds
    python examples/load_any_size.py --num-images 1000 --json benchmarks/results/quick_path/quick_path_vit_tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import transformers
from datasets import load_dataset
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit
from hf_snapvit.pruning.methods import ranking_method
from hf_snapvit.pruning.methods.config import PRESETS

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DATA = SHARED / "data" / "tiny-imagenet-200"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--train-data", default=str(DATA / "train.parquet"), help="images the ranking reads")
    parser.add_argument("--data", default=str(DATA / "validation.parquet"), help="images top-1 is measured on")
    parser.add_argument("--output", default=None, help="where to write the elastic checkpoint (default: a temp dir)")
    parser.add_argument("--method", default="snapvit", choices=hf_snapvit.available_methods())
    parser.add_argument("--preset", default="fast", choices=PRESETS, help="SnapViT's preset (default: fast)")
    parser.add_argument("--prefix-correction", action="store_true",
                        help="also store the weight correction of every size (hf_snapvit.add_prefix_correction)")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.3])
    parser.add_argument("--num-images", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--json", default=None, metavar="FILE", help="write the figures and the machine to FILE")
    return parser.parse_args()


@torch.no_grad()
def top1(model, pixel_values: torch.Tensor, labels: torch.Tensor, batch_size: int) -> float:
    correct = 0
    for start in range(0, len(labels), batch_size):
        logits = model(pixel_values=pixel_values[start:start + batch_size]).logits
        correct += (logits.argmax(-1) == labels[start:start + batch_size]).sum().item()
    return correct / len(labels)


def main() -> None:
    args = parse_args()
    transformers.utils.logging.set_verbosity_error()
    # No transformers.utils.logging.disable_progress_bar(): in transformers 5 it turns off every huggingface_hub
    # bar, the ranking's and the correction's (with their time left) among them.
    load_before, start = os.getloadavg(), time.perf_counter()
    seconds: dict[str, float] = {}

    # The README's first example (examples/quickstart.py), on a model with a classifier and its train images.
    processor = AutoImageProcessor.from_pretrained(args.model)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    train_images = load_dataset("parquet", data_files=args.train_data, split="train")  # labels are not read

    # The first N validation images, preprocessed once and reused for every size.
    stream = load_dataset("parquet", data_files={"validation": args.data}, split="validation", streaming=True)
    images, labels = [], []
    for example in stream.take(args.num_images):
        images.append(example["image"].convert("RGB"))  # a few Tiny-ImageNet images are greyscale
        labels.append(example["label"])
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    labels = torch.tensor(labels)
    first_label = model.config.id2label[labels[0].item()]
    seconds["load_model_and_data"] = time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        output = args.output or str(Path(tmp) / "vit-tiny-elastic")
        step = time.perf_counter()
        reads_images = ranking_method(args.method).needs_data
        ranking = hf_snapvit.rank(model, method=args.method, data=train_images if reads_images else None,
                                  preset=args.preset)
        seconds["rank"] = time.perf_counter() - step
        step = time.perf_counter()
        hf_snapvit.save_elastic(model, ranking, output, image_processor=processor)
        seconds["save"] = time.perf_counter() - step
        if args.prefix_correction:
            step = time.perf_counter()
            hf_snapvit.add_prefix_correction(output, train_images)
            seconds["prefix_correction"] = time.perf_counter() - step
        print(f"elastic checkpoint: {output}")
        print(f"first validation image: true label {first_label!r}\n")

        rows = []
        for sparsity in args.sparsities:
            step = time.perf_counter()
            small = hf_snapvit.ElasticViTModel.from_pretrained(output, sparsity=sparsity)
            load_seconds = time.perf_counter() - step
            layout = getattr(small.config, "elastic_layout", None)
            gflops = layout["gflops"] if layout else hf_snapvit.estimate_gflops(small)
            accuracy = top1(small, pixel_values, labels, args.batch_size)
            classifier = transformers.pipeline("image-classification", model=small, image_processor=processor)
            prediction = classifier(images[0], top_k=1)[0]
            params = sum(p.numel() for p in small.parameters())
            print(f"sparsity {sparsity:.2f}: {params / 1e6:.2f} M params, {gflops:.3f} GFLOPs, "
                  f"top-1 {accuracy:.1%} on {len(labels)} images, "
                  f"pipeline: {prediction['label']!r} ({prediction['score']:.2f})")
            rows.append({"sparsity": sparsity, "params": params, "gflops": gflops, "top1": accuracy,
                         "corrected": getattr(small.config, "elastic_correction", None) is not None,
                         "load_seconds": load_seconds})
    seconds["total"] = time.perf_counter() - start
    print("\nseconds: " + ", ".join(f"{name} {value:.1f}" for name, value in seconds.items()))
    if args.json:
        from hf_snapvit.benchmark import hardware_info

        record = {"hardware": hardware_info(), "load_average_1_5_15_min": {"before": load_before,
                                                                          "after": os.getloadavg()},
                  "settings": {k: v for k, v in vars(args).items() if k != "json"},
                  "num_validation_images": len(labels), "seconds": seconds, "rows": rows}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
