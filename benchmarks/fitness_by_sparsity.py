"""Where a SnapViT search's fitness moves: each saved ranking's similarity to the dense model at each fitness sparsity,
on train images the search never saw (issue 29).

The search's loss is one minus the mean, over the fitness sparsities, of the cosine similarity of the pruned and dense
PCA embeddings. A longer search lowers that loss; this script shows at which sparsities it gains and loses, on other
images than the ones it searched on, for the rankings ``benchmarks/defaults_vit_tiny.py rank`` saved (one per
generation budget):

    python benchmarks/fitness_by_sparsity.py --rankings OUT/rankings --num-images 1000 --seed 7

Writes JSON (``--output``): per ranking, its similarity at each sparsity and the loss they give.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit as hs
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.data import to_rgb
from hf_snapvit.distributed import resolve_precision
from hf_snapvit.evaluation import load_split
from hf_snapvit.files import write_text_atomic
from hf_snapvit.fitness import EmbeddingFitness

sys.path.insert(0, str(Path(__file__).resolve().parent))
from defaults_vit_tiny import read_ranking  # noqa: E402  (benchmarks/ is not a package)
from rank_vit_tiny import SHARED  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rankings", type=Path, required=True, help="a folder of NAME-gG.json rankings")
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--num-images", type=int, default=1000, help="train images to measure on")
    parser.add_argument("--sparsities", type=float, nargs="+", default=list(hs.SnapViTConfig().fitness_sparsities))
    parser.add_argument("--seed", type=int, default=7, help="draws the images (not a search seed's draw)")
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--output", type=Path, default=None, help="default: RANKINGS/../fitness_by_sparsity.json")
    return parser.parse_args(argv)


def load_rankings(folder: Path, model: torch.nn.Module) -> dict[str, hs.ElasticRanking]:
    """The saved rankings of ``folder``, by file name, in the order of their generation budgets."""
    files = [f for f in folder.glob("*.json") if re.search(r"-g\d+\.json$", f.name)]
    if not files:
        raise SystemExit(f"no NAME-gG.json rankings in {folder}")
    by_budget = sorted(files, key=lambda f: (f.name.rsplit("-g", 1)[0], int(f.stem.rsplit("-g", 1)[1])))
    return {path.stem: read_ranking(path, model) for path in by_budget}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    processor = AutoImageProcessor.from_pretrained(args.model)
    rankings = load_rankings(args.rankings, model)
    rows = load_split(args.data, "train", num_samples=args.num_images, seed=args.seed)
    pixels = processor(images=[to_rgb(image) for image in rows["image"]], return_tensors="pt")["pixel_values"]
    precision = resolve_precision(args.precision, torch.device("cpu"))
    fitness = EmbeddingFitness(model, pixels, sparsities=args.sparsities, precision=precision)
    results = {}
    for name, ranking in rankings.items():
        similarities = [fitness.similarity(ranking, s) for s in args.sparsities]
        results[name] = {"similarity": dict(zip(map(str, args.sparsities), similarities)),
                         "loss": 1.0 - float(np.mean(similarities))}
        print(f"{name:60s} loss {results[name]['loss']:.4f}  "
              + "  ".join(f"{s:.0%}: {v:.4f}" for s, v in zip(args.sparsities, similarities)), flush=True)
    output = args.output or args.rankings.parent / "fitness_by_sparsity.json"
    write_text_atomic(output, json.dumps({"rankings": results, "num_images": args.num_images, "seed": args.seed,
                                          "sparsities": args.sparsities, "precision": precision,
                                          "hardware": hardware_info()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
