"""The README's 30-second example: rank a ViT from the Hub once, save one elastic checkpoint, load it 30 % smaller.

Steps, line for line as in the README: load ``facebook/dinov2-small`` and its image processor, open unlabelled images
(``zh-plus/tiny-imagenet``'s train split; the ranking reads no labels), rank every attention head and FFN neuron with
SnapViT's ``fast`` preset, write the elastic checkpoint with ``hf_snapvit.save_elastic``, load it at ``--sparsity``
with ``ElasticViTModel.from_pretrained`` and run a stock ``transformers.pipeline`` on it. ``--model`` and ``--data``
take a Hub id or a local path (a checkpoint folder; a parquet file or an image folder), so it runs offline too:

    python examples/quickstart.py                          # downloads facebook/dinov2-small and the images
    python examples/quickstart.py --model ../shared/models/vit-tiny-tinyimagenet \\
        --data ../shared/data/tiny-imagenet-200/train.parquet                      # offline, the shared ViT-Tiny
    python examples/quickstart.py --method magnitude       # the data-free baseline: no images read, seconds

``examples/load_any_size.py`` does the same on the shared ViT-Tiny and measures top-1 at each size.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from datasets import load_dataset
from transformers import AutoImageProcessor, AutoModel, pipeline

import hf_snapvit
from hf_snapvit.pruning.methods.snapvit import PRESETS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="facebook/dinov2-small", help="a Hub id or a local checkpoint folder")
    parser.add_argument("--data", default="zh-plus/tiny-imagenet",
                        help="images the ranking reads: a Hub dataset id (its train split), a parquet file or an "
                             "image folder")
    parser.add_argument("--method", default="snapvit", choices=("snapvit", "magnitude"))
    parser.add_argument("--preset", default="fast", choices=PRESETS, help="SnapViT's preset (default: fast)")
    parser.add_argument("--output", default="dinov2-small-elastic", help="folder for the elastic checkpoint")
    parser.add_argument("--sparsity", type=float, default=0.3)
    return parser.parse_args(argv)


def open_images(source: str):
    """``load_dataset`` on a Hub id, a parquet file or an image folder: the train split, undecoded until read."""
    path = Path(source)
    if path.is_file():
        return load_dataset("parquet", data_files=str(path), split="train")
    if path.is_dir():
        return load_dataset("imagefolder", data_dir=str(path), split="train")
    return load_dataset(source, split="train")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    base = args.model
    model = AutoModel.from_pretrained(base)
    processor = AutoImageProcessor.from_pretrained(base)
    images = open_images(args.data)  # labels, if any, are not read

    # The data-free baseline reads no images and has no preset.
    options = {"data": images, "preset": args.preset} if args.method == "snapvit" else {}
    ranking = hf_snapvit.rank(model, method=args.method, **options)
    hf_snapvit.save_elastic(model, ranking, args.output, image_processor=processor)

    small = hf_snapvit.ElasticViTModel.from_pretrained(args.output, sparsity=args.sparsity)
    layout = small.config.elastic_layout
    print(type(small).__name__, layout["num_heads"], layout["gflops"])
    embed = pipeline("image-feature-extraction", model=small, image_processor=processor)
    features = embed(images[0]["image"].convert("RGB"))
    print(f"features of the first image: {len(features[0])} tokens x {len(features[0][0])}")
    return {"model": type(small).__name__, "num_heads": layout["num_heads"], "gflops": layout["gflops"],
            "tokens": len(features[0]), "width": len(features[0][0])}


if __name__ == "__main__":
    main()
