"""One correction for every size, screened (issue 29): which projections to correct, without the size check.

:class:`hf_snapvit.correction.prefix.PrefixCorrection` accumulates each output projection's Hessian on the dense
model once and factorises it in rank order; any size's correction is then a triangular solve. For each sparsity this
script scores the plain slice and the corrected one (attention and FFN output projections, or one of them), fitted
on every calibration image and applied at every size (``benchmarks/prefix_correction_vit_tiny.py`` measures what
``add_prefix_correction`` ships, with its size check):

    python benchmarks/prefix_correction_screen.py --num-calibration 500 --sparsities 0.1 0.2 0.3 0.4 0.5 0.6

Top-1 with the model's head and k-NN top-1 (k = 20, train-split bank) on the validation split, with the default
SnapViT ranking of ``benchmarks/defaults_vit_tiny.py`` (``--ranking`` for another). Writes JSON (``--output``).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from hf_snapvit.benchmark import sliced_copy
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.correction.prefix import KINDS, PrefixCorrection
from hf_snapvit.files import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mean_compensation_vit_tiny import (  # noqa: E402
    run_record, scores, zero_training_arguments, zero_training_setup)

VARIANTS = {"plain": (), "both": KINDS, "ffn": ("ffn_output",), "attention": ("attention_output",)}


def main(argv: list[str] | None = None) -> None:
    parser = zero_training_arguments(__doc__, "prefix_correction_screen.json", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 500)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["plain", "both", "ffn"])
    parser.add_argument("--damping-fraction", type=float, default=0.01)
    parser.add_argument("--width-multiple", type=int, default=None)
    args = parser.parse_args(argv)
    setup = zero_training_setup(args)
    model, ranking, calibration = setup["model"], setup["ranking"], setup["calibration"]
    config = CorrectionConfig(num_samples=None, damping_fraction=args.damping_fraction, guard=False)
    correction = PrefixCorrection.fit(model, calibration, config=config, orders=ranking.orders())
    print(f"fitted in {correction.seconds:.1f} s on {correction.num_images} images", flush=True)
    rows = []
    for sparsity in args.sparsities:
        keep = ranking.keep_indices(ranking.keep_counts(sparsity, width_multiple=args.width_multiple))
        for variant in args.variants:
            start = time.perf_counter()
            base = copy.deepcopy(model)
            correction.correct_(base, keep, VARIANTS[variant])
            sliced = sliced_copy(base, ranking, sparsity, width_multiple=args.width_multiple)
            seconds = time.perf_counter() - start
            rows.append({"sparsity": sparsity, "variant": variant, **scores(sliced, setup["val"], setup["bank"]),
                         "correct_and_slice_seconds": seconds})
            print(rows[-1], flush=True)
    results = {**run_record("prefix_correction_screen.py", argv, args, setup), "damping_fraction": args.damping_fraction,
               "width_multiple": args.width_multiple, "fit_seconds": correction.seconds, "rows": rows}
    write_text_atomic(args.output, json.dumps(results, indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
