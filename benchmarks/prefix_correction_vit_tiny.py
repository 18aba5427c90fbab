"""What an elastic checkpoint with a prefix correction gives at every size, without training (issue 29).

Writes the elastic checkpoint of the shared ViT-Tiny with the default SnapViT ranking (``--ranking``) into a
temporary folder, adds its prefix correction from unlabelled train images (``hf_snapvit.add_prefix_correction``:
with its size check, the default, and without it), and loads each size the way a user does,
``ElasticViTModel.from_pretrained(folder, sparsity=s)`` (default width multiple), against the plain slice
(``prefix_correction=False``):

    python benchmarks/prefix_correction_vit_tiny.py --num-calibration 500 --sparsities 0.1 0.2 0.3 0.4 0.5 0.6

Top-1 with the model's head and k-NN top-1 (k = 20, train-split bank) on the validation split. Writes JSON
(``--output``) with the size check's record.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel
from hf_snapvit.correction import CorrectionConfig

from _harness import run_record, scores, timed, write_json, zero_training_arguments, zero_training_setup  # noqa: E402

#: variant -> the add_prefix_correction guard setting (None: no correction, the plain slice)
VARIANTS = {"plain": None, "checked": True, "every-size": False}


def main(argv: list[str] | None = None) -> None:
    parser = zero_training_arguments(__doc__, "prefix_correction_vit_tiny.json", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 500)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args(argv)
    setup = zero_training_setup(args)
    rows, records = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            folder = Path(tmp) / variant
            hs.save_elastic(setup["model"], setup["ranking"], folder, model_card=False)
            if VARIANTS[variant] is not None:
                config = CorrectionConfig(num_samples=None, guard=VARIANTS[variant])
                records[variant], seconds = timed(lambda: hs.add_prefix_correction(folder, setup["calibration"],
                                                                                   config=config))
                records[variant]["wall_seconds"] = seconds
            for sparsity in args.sparsities:
                sliced, seconds = timed(lambda: ElasticViTModel.from_pretrained(folder, sparsity=sparsity))
                rows.append({"sparsity": sparsity, "variant": variant, **scores(sliced, setup["val"], setup["bank"]),
                             "corrected": getattr(sliced.config, "elastic_correction", None) is not None,
                             "load_seconds": seconds})
                print(rows[-1], flush=True)
    write_json(args.output, {**run_record("prefix_correction_vit_tiny.py", argv, args, setup), "records": records,
                             "rows": rows}, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
