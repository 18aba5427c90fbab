"""What an elastic checkpoint with a prefix correction gives at every size, without training (issue 29).

Writes the elastic checkpoint of the shared ViT-Tiny with the default SnapViT ranking (``--ranking``) into a
temporary folder, adds its prefix correction from unlabelled train images (``hf_snapvit.add_prefix_correction``:
with its size check, the default, and without it), and loads each size the way a user does,
``ElasticViTModel.from_pretrained(folder, sparsity=s)`` (default width multiple), against the plain slice
(``prefix_correction=False``):

    python benchmarks/prefix_correction_vit_tiny.py --num-calibration 500 --sparsities 0.1 0.2 0.3 0.4 0.5 0.6

Top-1 with the model's head and k-NN top-1 (k = 20, train-split bank) on the validation split. Writes JSON
(``--output``) with the size check's record. ``--switch-repeats N`` also times what a correction costs a switchable
model: ``set_budget`` from full size to each sparsity, plain and corrected (median of N), with the sizes of the weights
and factors files (``--num-val 0 --num-bank 0`` skip the scores):

    python benchmarks/prefix_correction_vit_tiny.py --variants every-size --num-calibration 256 --num-val 0 \
        --num-bank 0 --sparsities 0.2 0.3 0.5 --switch-repeats 5 \
        --output benchmarks/results/prefix_correction_switch_time/prefix_correction_switch_time.json
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.correction.prefix_file import PREFIX_FILE
from hf_snapvit.data.sampling import key_order
from hf_snapvit.evaluation import load_split

from _harness import (RANKING, RESULTS, command, load_classifier, parser, pixels, preprocess, scores, stored_ranking,
                      timed, write_json)

#: variant -> the add_prefix_correction guard setting (None: no correction, the plain slice)
VARIANTS = {"plain": None, "checked": True, "every-size": False}
#: Seeds of the train-split draws: the k-NN bank (as every ViT-Tiny table) and the calibration images.
BANK_SEED, CALIBRATION_SEED = 1, 7


def calibration_rows(data: str, count: int, bank_count: int) -> Any:
    """``count`` train rows drawn with :data:`CALIBRATION_SEED` from those the k-NN bank (the first ``bank_count``
    of the split shuffled with :data:`BANK_SEED`, as ``load_split`` draws it) does not hold: images fitted on must
    not be the bank's, or the bank's features would be the ones fitted. Each row keeps its split index (``row``)."""
    train = load_split(data, "train")
    train = train.add_column("row", list(range(len(train))))
    bank = {int(row) for row in key_order(len(train), BANK_SEED)[:bank_count]}
    rest = train.filter(lambda row: row not in bank, input_columns="row")
    return rest.select(key_order(len(rest), CALIBRATION_SEED)[:count])


def switch_record(folder: Path, sparsities: list[float], repeats: int) -> dict:
    """Median seconds of a switchable model's switch from full size to each sparsity, without and with the folder's
    correction (a switch then solves each smaller output projection's weight), and the files' sizes."""
    models = {name: ElasticViTModel.from_pretrained(folder, switchable=True, prefix_correction=name == "corrected")
              for name in ("plain", "corrected")}

    def seconds(model: ElasticViTModel, sparsity: float) -> float:
        times = []
        for _ in range(repeats):
            model.set_budget(sparsity=0.0)
            times.append(timed(lambda: model.set_budget(sparsity=sparsity))[1])
        return statistics.median(times)

    files = ("model.safetensors", PREFIX_FILE)
    return {"repeats": repeats, "file_bytes": {name: (folder / name).stat().st_size for name in files},
            "rows": [{"sparsity": s, **{f"{name}_seconds": seconds(model, s) for name, model in models.items()}}
                     for s in sparsities]}


def main(argv: list[str] | None = None) -> None:
    options = parser(__doc__)
    options.add_argument("--ranking", type=Path, default=RANKING)
    options.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    options.add_argument("--num-calibration", type=int, default=500)
    options.add_argument("--num-val", type=int, default=1000)
    options.add_argument("--num-bank", type=int, default=1000)
    options.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    options.add_argument("--switch-repeats", type=int, default=0,
                         help="also time a switchable model's switches with and without each correction (median of N)")
    options.add_argument("--output", type=Path,
                         default=RESULTS / "prefix_correction_vit_tiny" / "prefix_correction_vit_tiny.json")
    args = options.parse_args(argv)
    model, processor = load_classifier(args.model)
    ranking = stored_ranking(args.ranking, model)

    def drawn(split: str, count: int, seed: int) -> dict | None:  # validation seed 0, bank seed 1: every table's
        return pixels(processor, load_split(args.data, split, num_samples=count, seed=seed)) if count else None

    val, bank = drawn("validation", args.num_val, 0), drawn("train", args.num_bank, BANK_SEED)
    calibration = calibration_rows(args.data, args.num_calibration, args.num_bank)
    images = preprocess(processor, calibration["image"])
    rows, records = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            folder = Path(tmp) / variant
            hs.save_elastic(model, ranking, folder, model_card=False)
            if VARIANTS[variant] is not None:
                config = CorrectionConfig(num_samples=None, guard=VARIANTS[variant])
                records[variant], seconds = timed(lambda: hs.add_prefix_correction(folder, images, config=config))
                records[variant]["wall_seconds"] = seconds
                if args.switch_repeats:
                    records[variant]["switch"] = switch_record(folder, args.sparsities, args.switch_repeats)
            for sparsity in args.sparsities if args.num_val else []:
                sliced, seconds = timed(lambda: ElasticViTModel.from_pretrained(folder, sparsity=sparsity))
                rows.append({"sparsity": sparsity, "variant": variant, **scores(sliced, val, bank),
                             "corrected": getattr(sliced.config, "elastic_correction", None) is not None,
                             "load_seconds": seconds})
                print(rows[-1], flush=True)
    write_json(args.output, {
        "hardware": hardware_info(), "command": command("prefix_correction_vit_tiny.py", argv),
        "ranking": args.ranking.name, "num_calibration": args.num_calibration,
        "calibration": f"{len(calibration)} train images (seed {CALIBRATION_SEED}) not in the k-NN bank",
        "num_val": args.num_val, "num_bank": args.num_bank, "records": records, "rows": rows}, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
