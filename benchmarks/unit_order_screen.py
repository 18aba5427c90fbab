"""Which units of a block to keep, screened (issue 29): the gradient scores' own order against second-order orders.

:func:`hf_snapvit.methods.block_order.block_orders` orders each block's heads and neurons by greedy elimination on
the dense model's calibration covariance (``"output"``: the error of the plain slice; ``"obs"``: the error after the
least-squares re-fit of the kept columns), and :func:`~hf_snapvit.methods.block_order.reorder_scores` hands every
block's scores out in that order. Each block keeps as many units at every size as with the ranking's own order, so
the FLOPs are the same and only *which* units are kept changes: a paired comparison. Every order is scored plain and
with the prefix correction (fitted on the same calibration images, on that order, applied at every size):

    python benchmarks/unit_order_screen.py --num-calibration 1000 --sparsities 0.1 0.3 0.5

Top-1 with the model's head and k-NN top-1 (k = 20, train-split bank) on the validation split, with the default
SnapViT ranking of ``benchmarks/defaults_vit_tiny.py`` (``--ranking`` for another). Writes JSON (``--output``).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
from pathlib import Path

from hf_snapvit.benchmark import sliced_copy
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.correction.prefix import KINDS, PrefixCorrection
from hf_snapvit.files import write_text_atomic
from hf_snapvit.methods.block_order import UNIT_ORDERS, block_orders, reorder_scores

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mean_compensation_vit_tiny import (  # noqa: E402
    run_record, scores, zero_training_arguments, zero_training_setup)


def reordered(ranking, model, calibration, order: str, config: CorrectionConfig):
    """The ranking with each block's scores handed out in ``order`` (itself for ``"scores"``), and the seconds."""
    if order == "scores":
        return ranking, 0.0
    start = time.perf_counter()
    orders = block_orders(model, calibration, order=order, config=config)
    heads = reorder_scores(ranking.head_scores, [h for h, _ in orders])
    neurons = reorder_scores(ranking.neuron_scores, [n for _, n in orders])
    return dataclasses.replace(ranking, head_scores=heads, neuron_scores=neurons), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = zero_training_arguments(__doc__, "unit_order_screen.json", [0.1, 0.3, 0.5], 1000)
    parser.add_argument("--orders", nargs="+", choices=UNIT_ORDERS, default=list(UNIT_ORDERS))
    parser.add_argument("--width-multiple", type=int, default=None)
    args = parser.parse_args(argv)
    setup = zero_training_setup(args)
    model, calibration = setup["model"], setup["calibration"]
    config = CorrectionConfig(num_samples=None, guard=False)
    rows, seconds = [], {}
    for order in args.orders:
        ranking, seconds[order] = reordered(setup["ranking"], model, calibration, order, config)
        correction = PrefixCorrection.fit(model, calibration, config=config, orders=ranking.orders())
        for sparsity in args.sparsities:
            keep = ranking.keep_indices(ranking.keep_counts(sparsity, width_multiple=args.width_multiple))
            for corrected in (False, True):
                base = copy.deepcopy(model)
                if corrected:
                    correction.correct_(base, keep, KINDS)
                sliced = sliced_copy(base, ranking, sparsity, width_multiple=args.width_multiple)
                rows.append({"order": order, "sparsity": sparsity, "corrected": corrected,
                             "params": sum(p.numel() for p in sliced.parameters()),
                             **scores(sliced, setup["val"], setup["bank"])})
                print(rows[-1], flush=True)
    results = {**run_record("unit_order_screen.py", argv, args, setup), "width_multiple": args.width_multiple,
               "order_seconds": seconds, "rows": rows}
    write_text_atomic(args.output, json.dumps(results, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
