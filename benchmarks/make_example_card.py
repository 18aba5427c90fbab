"""Regenerate the checked-in example model card of the shared ViT-Tiny (model_cards/vit-tiny-tinyimagenet-elastic/).

    python benchmarks/make_example_card.py --elastic PATH/TO/vit-tiny-elastic-snapvit --num-val 500

``--elastic`` is an elastic checkpoint of ``../shared/models/vit-tiny-tinyimagenet`` (``hf_snapvit.save_elastic`` or
``hf-snapvit prune``). ``--num-val N`` measures top-1 with the model's own head on the first N validation images,
dense and at every sparsity of the card, puts the numbers in the table and the ``model-index`` and saves them to
``benchmarks/results/make_example_card/example_card_top1.json``; ``--evaluations FILE.json`` shows measured numbers
instead (that file, to regenerate without re-measuring).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from _harness import RESULTS, ROOT, SHARED_DATA, parser, timed, write_json

GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
BASE_MODEL = "WinKawaks/vit-tiny-patch16-224"
DATASET = "tiny-imagenet-200"


def measure_top1(elastic: Path, num_val: int) -> list[dict]:
    """Top-1 of the dense model and of the model loaded at each sparsity of :data:`GRID`, on the first images."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    from hf_snapvit import ElasticViTModel
    from hf_snapvit.evaluation import Evaluator, load_split

    validation = load_split(SHARED_DATA, "validation").select(range(num_val))
    evaluator = Evaluator(validation, metrics=["top1"], processor=AutoImageProcessor.from_pretrained(elastic),
                          show_progress=False)
    records = []
    for sparsity in (0.0, *GRID):
        model = (AutoModelForImageClassification.from_pretrained(elastic) if sparsity == 0.0
                 else ElasticViTModel.from_pretrained(elastic, sparsity=sparsity)).eval()
        result, seconds = timed(lambda: evaluator.evaluate(model, name=f"sparsity {sparsity}"))
        print(f"sparsity {sparsity:.1f}: top-1 {result.top1:.4f} on {num_val} images ({seconds:.0f} s)",
              file=sys.stderr)
        records.append({"sparsity": sparsity, "metric": "accuracy", "value": round(float(result.top1), 4),
                        "dataset": DATASET, "split": "validation", "num_samples": num_val})
    return records


def main(argv: list[str] | None = None) -> int:
    options = parser(__doc__, shared=False)
    options.add_argument("--elastic", type=Path, required=True, help="elastic checkpoint of the shared ViT-Tiny")
    options.add_argument("--num-val", type=int, default=0, help="measure top-1 on this many validation images")
    options.add_argument("--evaluations", type=Path, help="JSON file of measured results to show instead")
    args = options.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    from hf_snapvit.cards.elastic import write_model_card

    if not (args.elastic / "config.json").is_file():
        options.error(f"--elastic {args.elastic} is not a checkpoint folder (no config.json)")
    if args.num_val and args.evaluations:
        options.error("give --num-val or --evaluations, not both")
    evaluations = json.loads(args.evaluations.read_text()) if args.evaluations else None
    if args.num_val:
        evaluations = measure_top1(args.elastic, args.num_val)
        write_json(RESULTS / "make_example_card" / "example_card_top1.json", evaluations)
    output = ROOT / "model_cards" / "vit-tiny-tinyimagenet-elastic"
    card = write_model_card(
        args.elastic, output, base_model=BASE_MODEL, evaluations=evaluations, eval_dataset=DATASET,
        base_model_description="a ViT-Tiny/16 (224 px, 200 classes) fully fine-tuned on Tiny-ImageNet-200 by a third "
                               f"party, starting from `{BASE_MODEL}` (Google's AugReg ViT-Tiny)",
        eval_split="validation", sparsities=GRID, repo_id="hf-snapvit/vit-tiny-tinyimagenet-elastic",
        model_name="vit-tiny-tinyimagenet-elastic")
    print(f"wrote {output / 'README.md'} ({len(str(card))} characters) and its heatmap")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
