"""Regenerate the checked-in example model card of the shared ViT-Tiny (model_cards/vit-tiny-tinyimagenet-elastic/).

    python benchmarks/make_example_card.py --elastic PATH/TO/vit-tiny-elastic-snapvit --num-val 500

``--elastic`` is an elastic checkpoint of ``../shared/models/vit-tiny-tinyimagenet`` (from ``hf_snapvit.save_elastic``
or ``hf-snapvit prune``). With ``--num-val N`` the script measures top-1 with the model's own head on the first N
images of the Tiny-ImageNet-200 validation split, dense and at every sparsity of the card, and puts the numbers in
the table and the ``model-index`` (and saves them to ``benchmarks/results/example_card_top1.json``);
``--evaluations FILE.json`` takes measured numbers instead (a list of ``{sparsity, metric, value, dataset, split,
num_samples}`` records, or ``hf_snapvit.evaluation`` results), e.g. that file to regenerate without re-measuring.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
BASE_MODEL = "WinKawaks/vit-tiny-patch16-224"
BASE_DESCRIPTION = (
    "a ViT-Tiny/16 (224 px, 200 classes) fully fine-tuned on Tiny-ImageNet-200 by a third party, starting from "
    f"`{BASE_MODEL}` (Google's AugReg ViT-Tiny)"
)
DATASET = "tiny-imagenet-200"


def measure_top1(elastic: Path, num_val: int, sparsities: tuple[float, ...]) -> list[dict]:
    """Top-1 of the dense model and of the model loaded at each sparsity, on the first ``num_val`` images."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_snapvit import ElasticViTModel
    from hf_snapvit.evaluation import Evaluator, load_split

    validation = load_split(SHARED / "data" / "tiny-imagenet-200", "validation").select(range(num_val))
    processor = AutoImageProcessor.from_pretrained(elastic)
    evaluator = Evaluator(validation, metrics=["top1"], processor=processor, show_progress=False)
    records = []
    for sparsity in (0.0, *sparsities):
        start = time.perf_counter()
        model = (AutoModelForImageClassification.from_pretrained(elastic) if sparsity == 0.0
                 else ElasticViTModel.from_pretrained(elastic, sparsity=sparsity)).eval()
        result = evaluator.evaluate(model, name=f"sparsity {sparsity}")
        print(f"sparsity {sparsity:.1f}: top-1 {result.top1:.4f} on {num_val} images "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
        records.append({"sparsity": sparsity, "metric": "accuracy", "value": round(float(result.top1), 4),
                        "dataset": DATASET, "split": "validation", "num_samples": num_val})
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elastic", type=Path, required=True, help="elastic checkpoint of the shared ViT-Tiny")
    parser.add_argument("--output", type=Path, default=ROOT / "model_cards" / "vit-tiny-tinyimagenet-elastic")
    parser.add_argument("--repo-id", default="hf-snapvit/vit-tiny-tinyimagenet-elastic",
                        help="repository id shown in the usage snippet")
    parser.add_argument("--num-val", type=int, default=0, help="measure top-1 on this many validation images")
    parser.add_argument("--evaluations", type=Path, help="JSON file of measured results to show instead")
    parser.add_argument("--save-evaluations", type=Path,
                        default=ROOT / "benchmarks" / "results" / "example_card_top1.json",
                        help="where --num-val writes its measurements (reuse them with --evaluations)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

    from hf_snapvit.cards.elastic import write_model_card

    if not (args.elastic / "config.json").is_file():
        parser.error(f"--elastic {args.elastic} is not a checkpoint folder (no config.json)")
    if args.num_val and args.evaluations:
        parser.error("give --num-val or --evaluations, not both")
    evaluations = None
    if args.evaluations:
        evaluations = json.loads(args.evaluations.read_text())
    elif args.num_val:
        evaluations = measure_top1(args.elastic, args.num_val, GRID)
        from hf_snapvit.files import write_text_atomic

        write_text_atomic(args.save_evaluations, json.dumps(evaluations, indent=1) + "\n")
    card = write_model_card(
        args.elastic,
        args.output,
        base_model=BASE_MODEL,
        base_model_description=BASE_DESCRIPTION,
        evaluations=evaluations,
        eval_dataset=DATASET,
        eval_split="validation",
        sparsities=GRID,
        repo_id=args.repo_id,
        model_name="vit-tiny-tinyimagenet-elastic",
    )
    print(f"wrote {args.output / 'README.md'} ({len(str(card))} characters) and its heatmap")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
