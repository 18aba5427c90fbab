"""Post-pruning weight correction on the shared ViT-Tiny: top-1 and k-NN top-1 with and without correction.

For each sparsity, the elastic checkpoint is loaded three ways through the public API: sliced as is
(``ElasticViTModel.from_pretrained(model, sparsity=s)``), and corrected with dense or sequential propagation
(``hf_snapvit.correct(model, sparsity=s, data=calibration, config=CorrectionConfig(propagation=...))``).
Calibration images come from the Tiny-ImageNet train split (labels ignored) and are disjoint from the k-NN memory bank (also train); accuracy is
measured on the validation split (``_harness.scores``: k = 20).

    python benchmarks/correction_vit_tiny.py --model ELASTIC --sparsities 0.3 0.5 0.6

Results merge into ``--output`` (JSON, written atomically after every row), so the sparsities can be run one at a
time and a re-run replaces only its own rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoImageProcessor

import hf_snapvit
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.correction import CorrectionConfig

from _harness import RESULTS, disjoint_draw, parser, pixels, scores, timed, write_json  # noqa: E402

K, SEED = 20, 0


def parse_args(argv: list[str] | None = None):
    result = parser(__doc__)
    result.set_defaults(model=None)
    result.add_argument("--sparsities", type=float, nargs="+", default=[0.3, 0.5, 0.6])
    result.add_argument("--num-calibration", type=int, default=500)
    result.add_argument("--num-val", type=int, default=500)
    result.add_argument("--num-bank", type=int, default=1000, help="train images in the k-NN memory bank")
    result.add_argument("--no-guard", action="store_true",
                        help="CorrectionConfig(guard=False): fit on every image, keep every correction")
    result.add_argument("--output", type=Path, default=RESULTS / "correction_vit_tiny" / "correction_vit_tiny.json")
    return result.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model is None or not Path(args.model, "config.json").exists():
        raise SystemExit(f"No elastic checkpoint at {args.model}; pass --model PATH.")
    load = hf_snapvit.ElasticViTModel.from_pretrained
    processor = AutoImageProcessor.from_pretrained(args.model)
    calibration, val_rows, bank_rows = disjoint_draw(args.data, SEED, args.num_bank, args.num_calibration,
                                                     args.num_val)
    val, bank = pixels(processor, val_rows), pixels(processor, bank_rows)
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results["hardware"] = hardware_info()
    protocol = {"num_calibration": args.num_calibration, "num_val": args.num_val, "num_bank": args.num_bank,
                "k": K, "seed": SEED, "data": args.data,
                "calibration": "train split, disjoint from the k-NN bank; labels ignored"}
    rows = results.setdefault("rows", [])
    source = Path(args.model).name

    def record(row: dict) -> None:
        row = {"source": source, **row, "protocol": protocol}
        key = (row["source"], row["sparsity"], row["variant"])
        rows[:] = [r for r in rows if (r["source"], r["sparsity"], r["variant"]) != key] + [row]
        rows.sort(key=lambda r: (r["source"], r["sparsity"], r["variant"]))
        write_json(args.output, results, indent=2)
        print(f"s={row['sparsity']:.2f} {row['variant']:28s} top-1 {row['top1']:.3f}  k-NN {row['knn_top1']:.3f}",
              flush=True)

    def same_evaluation(other: dict) -> bool:  # the dense row does not depend on the calibration set
        return {**other, "num_calibration": None} == {**protocol, "num_calibration": None}

    if not any(r["source"] == source and r["variant"] == "dense" and same_evaluation(r["protocol"]) for r in rows):
        record({"sparsity": 0.0, "variant": "dense", **scores(load(args.model), val, bank, K)})
    for sparsity in args.sparsities:
        plain, seconds = timed(lambda: load(args.model, sparsity=sparsity))
        record({"sparsity": sparsity, "variant": "uncorrected", "load_seconds": seconds,
                "gflops": plain.config.elastic_layout["gflops"], **scores(plain, val, bank, K)})
        for propagation in ("dense", "sequential"):
            config = CorrectionConfig(num_samples=args.num_calibration, propagation=propagation, seed=SEED,
                                      guard=not args.no_guard)
            corrected, seconds = timed(lambda: hf_snapvit.correct(args.model, sparsity=sparsity, data=calibration,
                                                                  config=config))
            record({"sparsity": sparsity, "variant": f"corrected-{propagation}" + ("-unguarded" if args.no_guard
                                                                                   else ""),
                    "correction_seconds": seconds, "correction": corrected.config.elastic_correction,
                    **scores(corrected, val, bank, K)})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
