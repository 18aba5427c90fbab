"""Rank a trained ViT once, save one elastic checkpoint, and load it at any size.

Steps: load the shared ViT-Tiny (Tiny-ImageNet-200), rank its heads and FFN neurons by weight magnitude (or, with
``--method snapvit``, by SnapViT with ``--preset``, default ``fast``, on Tiny-ImageNet train images), write an
elastic checkpoint with ``hf_snapvit.save_elastic``, then load it at several sparsities with
``ElasticViTModel.from_pretrained``. For each size it prints the parameter count, the theoretical GFLOPs, the
top-1 accuracy on the first validation images, and what a stock ``transformers.pipeline`` predicts for the first one.

    python examples/load_any_size.py --sparsities 0.0 0.3 0.5 --num-images 200
    python examples/load_any_size.py --method snapvit --preset fast      # minutes, not seconds; far better top-1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
import transformers
from datasets import load_dataset
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit
from hf_snapvit.data.images import load_image_dataset
from hf_snapvit.pruning.methods.snapvit import PRESETS

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200" / "validation.parquet"))
    parser.add_argument("--output", default=None, help="where to write the elastic checkpoint (default: a temp dir)")
    parser.add_argument("--method", default="magnitude", choices=hf_snapvit.available_methods(),
                        help="ranking method (default: %(default)s, data-free; snapvit, snip and taylor-ce read "
                             "--calibration-data)")
    parser.add_argument("--preset", default="fast", choices=PRESETS,
                        help="SnapViT preset, for the methods that read images (default: %(default)s, for a CPU)")
    parser.add_argument("--calibration-data", default=str(SHARED / "data" / "tiny-imagenet-200" / "train.parquet"),
                        help="calibration images of the methods that read them (default: the Tiny-ImageNet train "
                             "parquet)")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.3])
    parser.add_argument("--num-images", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=50)
    return parser.parse_args()


def calibration_images(args: argparse.Namespace):
    """The images the method reads, as many as the preset asks for; ``None`` for a data-free method."""
    if args.method not in ("snapvit", "snip", "taylor-ce"):
        return None
    config = hf_snapvit.SnapViTConfig.preset(args.preset)
    needed = config.num_gradient_images + (config.num_fitness_images if args.method == "snapvit" else 0)
    return load_image_dataset(args.calibration_data, num_samples=needed, show_progress=False,
                              label_column="label" if args.method == "taylor-ce" else None)


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
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars

    processor = AutoImageProcessor.from_pretrained(args.model)
    dense = AutoModelForImageClassification.from_pretrained(args.model).eval()

    # The first N validation images, preprocessed once and reused for every size.
    stream = load_dataset("parquet", data_files={"validation": args.data}, split="validation", streaming=True)
    images, labels = [], []
    for example in stream.take(args.num_images):
        images.append(example["image"].convert("RGB"))  # a few Tiny-ImageNet images are greyscale
        labels.append(example["label"])
    pixel_values = processor(images=images, return_tensors="pt")["pixel_values"]
    labels = torch.tensor(labels)
    first_label = dense.config.id2label[labels[0].item()]

    with tempfile.TemporaryDirectory() as tmp:
        output = args.output or str(Path(tmp) / "vit-tiny-elastic")
        ranking = hf_snapvit.rank(dense, method=args.method, preset=args.preset, processor=processor,
                                  data=calibration_images(args))
        hf_snapvit.save_elastic(dense, ranking, output, image_processor=processor)
        print(f"elastic checkpoint: {output}")
        print(f"first validation image: true label {first_label!r}\n")

        for sparsity in args.sparsities:
            model = hf_snapvit.ElasticViTModel.from_pretrained(output, sparsity=sparsity)
            layout = getattr(model.config, "elastic_layout", None)
            gflops = layout["gflops"] if layout else hf_snapvit.estimate_gflops(model)
            accuracy = top1(model, pixel_values, labels, args.batch_size)
            classifier = transformers.pipeline("image-classification", model=model, image_processor=processor)
            prediction = classifier(images[0], top_k=1)[0]
            params = sum(p.numel() for p in model.parameters())
            print(f"sparsity {sparsity:.2f}: {params / 1e6:.2f} M params, {gflops:.3f} GFLOPs, "
                  f"top-1 {accuracy:.1%} on {len(labels)} images, "
                  f"pipeline: {prediction['label']!r} ({prediction['score']:.2f})")


if __name__ == "__main__":
    main()
