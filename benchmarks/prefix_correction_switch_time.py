"""What a prefix correction costs a switchable model: the time of ``set_budget`` with and without it.

Without a correction a switch sets a few integers per block; with one, every output projection of a smaller size
gets its corrected weight (a triangular solve on factors read from the memory-mapped file). Writes the shared
ViT-Tiny's elastic checkpoint with the default SnapViT ranking and its prefix correction into a temporary folder,
then times switches from full size to each sparsity and back:

    python benchmarks/prefix_correction_switch_time.py --num-calibration 256 --sparsities 0.2 0.3 0.5 --repeats 5

Writes JSON (``--output``): per sparsity the median seconds of a switch, plain and corrected, and the sizes of the
weights file and of the factors file.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.correction.prefix_file import PREFIX_FILE

from _harness import timed, write_json, zero_training_arguments, zero_training_setup  # noqa: E402


def switch_seconds(model, sparsity: float, repeats: int) -> float:
    """Median seconds of switching from full size to ``sparsity``."""
    times = []
    for _ in range(repeats):
        model.set_budget(sparsity=0.0)
        times.append(timed(lambda: model.set_budget(sparsity=sparsity))[1])
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = zero_training_arguments(__doc__, "prefix_correction_switch_time.json", [0.2, 0.3, 0.5], 256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.set_defaults(num_val=0, num_bank=0)  # no accuracy is measured here
    args = parser.parse_args(argv)
    setup = zero_training_setup(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hs.save_elastic(setup["model"], setup["ranking"], tmp, model_card=False)
        config = CorrectionConfig(num_samples=None, guard=False)
        record = hs.add_prefix_correction(tmp, setup["calibration"], config=config, show_progress=False)
        sizes = {name: (Path(tmp) / name).stat().st_size for name in ("model.safetensors", PREFIX_FILE)}
        plain = ElasticViTModel.from_pretrained(tmp, switchable=True, prefix_correction=False)
        corrected = ElasticViTModel.from_pretrained(tmp, switchable=True)
        for sparsity in args.sparsities:
            rows.append({"sparsity": sparsity, "plain_seconds": switch_seconds(plain, sparsity, args.repeats),
                         "corrected_seconds": switch_seconds(corrected, sparsity, args.repeats)})
            print(rows[-1], flush=True)
    write_json(args.output, {"hardware": hardware_info(), "repeats": args.repeats,
                             "fit_seconds": record["fit_seconds"], "file_bytes": sizes, "rows": rows}, indent=2)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
