"""Weight correction with and without the held-out guard on the shared ViT-Tiny, at 10-60 % sparsity.

For each sparsity the elastic checkpoint is loaded through the public API as:

* ``uncorrected``: sliced as is;
* ``old``: corrected the way the library did before the guard (``CorrectionConfig(guard=False)``: every image fits,
  every correction is kept);
* ``guarded``: the current default (``guard=True``: a quarter of the calibration batches is held out and a block's
  corrections are kept only where they bring its output on those images closer to the dense model's);
* ``guarded-sequential`` (with ``--sequential``): the guard with ``propagation="sequential"``.

Calibration images come from the Tiny-ImageNet train split (labels ignored) and go through the model's own processor.
Every model is scored (top-1 with its classifier) on the same validation images under two preprocessings: the
processor's (resize to 224 x 224) and resize-256 / centre-crop-224 (shorter side to 256, bilinear), which the
calibration images never saw. The elastic checkpoint is built from a stored ranking (``--ranking``, default: the
SnapViT default-settings ranking of ``benchmarks/defaults_vit_tiny.py``) unless ``--model`` names one.

    python benchmarks/correction_guard_vit_tiny.py                       # 0.1 ... 0.6, 300 val, 300 calibration
    python benchmarks/correction_guard_vit_tiny.py --sparsities 0.5 --sequential

Rows merge into ``--output`` (written atomically after each row), so sparsities can be run one at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.data import to_rgb
from hf_snapvit.evaluation import extract_features, load_split, top1_accuracy
from hf_snapvit.files import public_name, write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from defaults_vit_tiny import read_ranking  # noqa: E402  (benchmarks/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
RANKING = ROOT / "benchmarks" / "results" / "defaults_vit_tiny" / "rankings" / "obd-global-sigma0.5-g3.json"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an elastic checkpoint (default: build one from --ranking)")
    parser.add_argument("--base", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--ranking", type=Path, default=RANKING, help="stored scores from defaults_vit_tiny.py")
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--num-calibration", type=int, default=300)
    parser.add_argument("--num-val", type=int, default=300)
    parser.add_argument("--sequential", action="store_true", help="also the guard with sequential propagation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--print-table", action="store_true", help="print --output as a markdown table and exit")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "correction_guard_vit_tiny.json")
    return parser.parse_args()


def build_elastic(base: str, ranking_file: Path) -> str:
    """An elastic checkpoint of ``base`` from scores stored by ``benchmarks/defaults_vit_tiny.py``."""
    model = AutoModelForImageClassification.from_pretrained(base).eval()
    ranking = read_ranking(ranking_file, model)
    folder = Path(tempfile.mkdtemp(prefix="correction-guard-")) / "elastic"
    hf_snapvit.save_elastic(model, ranking, folder, image_processor=AutoImageProcessor.from_pretrained(base))
    return str(folder)


def resize_crop(images: list[Image.Image], mean: list[float], std: list[float]) -> torch.Tensor:
    """Shorter side to 256 (bilinear), centre 224 x 224 crop, then the processor's rescale and normalisation."""
    out = []
    for image in images:
        scale = 256 / min(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
        left, top = (image.width - 224) // 2, (image.height - 224) // 2
        array = np.asarray(image.crop((left, top, left + 224, top + 224)), dtype=np.float32) / 255.0
        out.append((array - np.array(mean, dtype=np.float32)) / np.array(std, dtype=np.float32))
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()


@torch.no_grad()
def top1(model, views: dict[str, torch.Tensor], labels: torch.Tensor) -> dict[str, float]:
    return {name: top1_accuracy(extract_features(model, pixels, logits=True, batch_size=100,
                                                 show_progress=False).logits, labels)
            for name, pixels in views.items()}


def print_table(path: Path) -> None:
    """Top-1 (%) per sparsity: uncorrected, old and guarded correction, under both preprocessings."""
    results = json.loads(path.read_text())
    variants = [v for v in ("uncorrected", "old", "guarded", "guarded-sequential")
                if any(r["variant"] == v for r in results["rows"])]
    views = list(next(r for r in results["rows"] if r["variant"] == "dense")["top1"])
    print("| sparsity | " + " | ".join(f"{v} ({view})" for view in views for v in variants) + " | corrections kept |")
    print("|---|" + "---|" * (len(views) * len(variants) + 1))
    for sparsity in sorted({r["sparsity"] for r in results["rows"] if r["variant"] != "dense"}):
        got = {r["variant"]: r for r in results["rows"] if r["sparsity"] == sparsity}
        cells = [f"{100 * got[v]['top1'][view]:.1f}" if v in got else "–" for view in views for v in variants]
        kept = got.get("guarded", {}).get("correction", {}).get("kept", {})
        count = f"{sum(sum(flags) for flags in kept.values())} / {sum(len(flags) for flags in kept.values())}"
        print(f"| {100 * sparsity:.0f} % | " + " | ".join(cells) + f" | {count if kept else '–'} |")


def main() -> None:
    args = parse_args()
    if args.print_table:
        return print_table(args.output)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model_dir = args.model or build_elastic(args.base, args.ranking)
    processor = AutoImageProcessor.from_pretrained(model_dir)
    train, validation = load_split(args.data, "train"), load_split(args.data, "validation")
    # The same draws as benchmarks/correction_vit_tiny.py: calibration after its 1000-image k-NN bank.
    calibration = train.select(np.random.default_rng(args.seed).permutation(len(train))[1000:1000 + args.num_calibration])
    rows = validation.select(np.random.default_rng(args.seed).permutation(len(validation))[:args.num_val])
    images = [to_rgb(image) for image in rows["image"]]
    views = {"processor": processor(images=images, return_tensors="pt")["pixel_values"],
             "resize256_crop224": resize_crop(images, processor.image_mean, processor.image_std)}
    labels = torch.tensor(rows["label"])

    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results.update({
        "hardware": hardware_info(), "model": public_name(args.model) or f"{public_name(args.base)} ranked by {args.ranking.name}",
        "protocol": {"num_calibration": args.num_calibration, "num_val": args.num_val, "seed": args.seed,
                     "calibration": "Tiny-ImageNet train, labels ignored, the model's processor",
                     "validation": "Tiny-ImageNet validation, top-1 with the model's classifier"},
    })
    table = results.setdefault("rows", [])

    def record(row: dict) -> None:
        row["command"] = " ".join(["python", "benchmarks/correction_guard_vit_tiny.py", *sys.argv[1:]])
        table[:] = [r for r in table if (r["sparsity"], r["variant"]) != (row["sparsity"], row["variant"])] + [row]
        table.sort(key=lambda r: (r["sparsity"], r["variant"]))
        write_text_atomic(args.output, json.dumps(results, indent=2, default=str))
        print(f"s={row['sparsity']:.2f} {row['variant']:20s} " +
              "  ".join(f"{k} {v:.3f}" for k, v in row["top1"].items()), flush=True)

    if not any(r["variant"] == "dense" for r in table):
        record({"sparsity": 0.0, "variant": "dense",
                "top1": top1(hf_snapvit.ElasticViTModel.from_pretrained(model_dir), views, labels)})
    variants = {"old": CorrectionConfig(guard=False), "guarded": CorrectionConfig()}
    if args.sequential:
        variants["guarded-sequential"] = CorrectionConfig(propagation="sequential")
    for sparsity in args.sparsities:
        record({"sparsity": sparsity, "variant": "uncorrected",
                "top1": top1(hf_snapvit.ElasticViTModel.from_pretrained(model_dir, sparsity=sparsity), views, labels)})
        for variant, config in variants.items():
            config = CorrectionConfig(**{**config.to_dict(), "num_samples": args.num_calibration, "seed": args.seed})
            start = time.perf_counter()
            model = hf_snapvit.ElasticViTModel.from_pretrained(model_dir, sparsity=sparsity,
                                                               correction_data=calibration, correction=config)
            record({"sparsity": sparsity, "variant": variant, "seconds": time.perf_counter() - start,
                    "correction": model.config.elastic_correction, "top1": top1(model, views, labels)})
            del model


if __name__ == "__main__":
    main()
