"""Rank the shared ViT-Tiny from the same images opened the ways users open them; top-1 of each ranking.

Every source holds the shared Tiny-ImageNet train images (labels ignored by the ranking), which the file stores
sorted by class. Each is ranked with the calls a user makes, ``hf_snapvit.rank(model, method="snapvit", data=...,
preset=..., seed=...)``, saved with ``save_elastic``, loaded with ``ElasticViTModel.from_pretrained(path,
sparsity=s)`` and evaluated (top-1) on the validation split by ``hf_snapvit.evaluation.Evaluator``:

* ``map``: ``datasets.load_dataset("parquet", data_files=...)["train"]``, map-style;
* ``stream``: the same file with ``streaming=True``;
* ``cli``: ``load_image_dataset(file, num_samples=<the preset's images>)``, what ``hf-snapvit prune --data`` reads;
* ``sorted-generator``: a Python generator of 100,000 undecoded images, class by class (each class's 50 images
  repeated ``--repeats`` times), no labels;
* ``sorted-stream``: the same rows as a ``datasets.IterableDataset.from_generator`` with the ``ClassLabel`` column.

    python benchmarks/calibration_sources.py --sources map stream cli sorted-generator sorted-stream \\
        --sparsities 0.1 0.3 0.5 --num-bank 1000 --seed 0 \\
        --output benchmarks/results/calibration_sources/fast-seed0.json

Writes JSON with, per source, the top-1 at each sparsity, the ranking's recorded draw (coverage), the ranking time
and whether its keep orders equal the ``map`` source's.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

import datasets
import numpy as np

import hf_snapvit
from _harness import load_classifier, parser, timed, write_json
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.evaluation import Evaluator, load_split

SOURCES = ("map", "stream", "cli", "sorted-generator", "sorted-stream")


def parse_args(argv: list[str] | None = None) -> Any:
    options = parser(__doc__)
    options.add_argument("--sources", nargs="+", choices=SOURCES, default=list(SOURCES))
    options.add_argument("--preset", default="fast")
    options.add_argument("--seed", type=int, default=0)
    options.add_argument("--sparsities", type=float, nargs="+", default=[0.3])
    options.add_argument("--num-val", type=int, default=None, help="validation images (default: all)")
    options.add_argument("--num-bank", type=int, default=0, help="train images in the k-NN bank (0: no k-NN)")
    options.add_argument("--repeats", type=int, default=10, help="times each image appears in the sorted sources")
    options.add_argument("--config", default=None, help="JSON of SnapViTConfig fields, replacing --preset (tests)")
    options.add_argument("--output", type=Path, required=True)
    args = options.parse_args(argv)
    args.train = str(Path(args.data) / "train.parquet")
    return args


def sorted_rows(train: str, repeats: int) -> tuple[list[dict[str, Any]], datasets.ClassLabel]:
    """The train file's rows, undecoded, class by class, each class's rows repeated ``repeats`` times."""
    table = datasets.load_dataset("parquet", data_files={"train": train}, split="train")
    feature = table.features["label"]
    table = table.cast_column("image", datasets.Image(decode=False))
    labels = np.asarray(table["label"])
    rows = []
    for label in np.unique(labels):
        members = table.select(np.flatnonzero(labels == label))
        rows += [{"image": row["image"], "label": int(label)} for row in members] * repeats
    return rows, feature


def open_source(name: str, args: Any, num_images: int) -> Any:
    """The calibration data as a user of that kind would pass it."""
    files = {"train": args.train}
    if name == "map":
        return datasets.load_dataset("parquet", data_files=files)["train"]
    if name == "stream":
        return datasets.load_dataset("parquet", data_files=files, streaming=True)["train"]
    if name == "cli":
        return hf_snapvit.load_image_dataset(args.train, num_samples=num_images, seed=args.seed, show_progress=False)
    rows, feature = sorted_rows(args.train, args.repeats)
    if name == "sorted-generator":
        def images() -> Iterator[Any]:
            for row in rows:
                yield row["image"]

        return images()
    features = datasets.Features({"image": datasets.Image(), "label": feature})
    return datasets.IterableDataset.from_generator(lambda: iter(rows), features=features)


def score(result: Any) -> dict[str, float]:
    """Top-1 and (with a bank) k-NN top-1 of an evaluation, in %."""
    found = {"top1": result.top1, "knn": result.knn_top1}
    return {metric: round(100 * value, 2) for metric, value in found.items() if value is not None}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    datasets.disable_progress_bars()
    model, processor = load_classifier(args.model)
    config = (hf_snapvit.SnapViTConfig(seed=args.seed, **json.loads(args.config)) if args.config else
              hf_snapvit.SnapViTConfig.preset(args.preset, seed=args.seed))
    num_images = config.images_needed
    validation = load_split(args.data, "validation", num_samples=args.num_val, seed=0)
    bank = load_split(args.train, "train", num_samples=args.num_bank, seed=1) if args.num_bank else None
    metrics = ["top1", "knn"] if bank is not None else ["top1"]
    evaluator = Evaluator(validation, bank_data=bank, processor=processor, metrics=metrics, show_progress=False)
    dense = score(evaluator.evaluate(model))
    results: dict[str, Any] = {}
    reference = None
    for name in args.sources:
        data = open_source(name, args, num_images)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ranking, seconds = timed(lambda: hf_snapvit.rank(model, method="snapvit", data=data, config=config,
                                                             processor=processor, show_progress=False))
        orders = [[np.asarray(part).tolist() for part in block] for block in ranking.orders()]
        reference = orders if reference is None and name == "map" else reference
        entry: dict[str, Any] = {
            "seconds": round(seconds, 1),
            "calibration": ranking.provenance.get("calibration_data"),
            "warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)],
            "same_ranking_as_map": None if reference is None else orders == reference,
            "top1": {}, "knn": {},
        }
        with tempfile.TemporaryDirectory() as folder:
            hf_snapvit.save_elastic(model, ranking, folder, model_card=False)
            for sparsity in args.sparsities:
                sliced = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=sparsity).eval()
                for metric, value in score(evaluator.evaluate(sliced)).items():
                    entry[metric][f"{sparsity:g}"] = value
        results[name] = entry
        print(f"{name:18s} top-1 {entry['top1']} k-NN {entry['knn']} ({seconds:.0f} s; draw "
              f"{entry['calibration'].get('draw')})", flush=True)
    record = {
        "benchmark": "calibration_sources", "command": " ".join(sys.argv), "hardware": hardware_info(),
        "model": Path(args.model).name, "preset": None if args.config else args.preset, "seed": args.seed,
        "num_val": len(validation), "num_bank": args.num_bank, "dense": dense, "repeats": args.repeats,
        "sources": results,
    }
    write_json(args.output, record, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
