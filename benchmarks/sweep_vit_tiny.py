"""Sweep the shared ViT-Tiny (Tiny-ImageNet-200): every ranking method x sparsity, evaluated and timed.

For each method the dense model is ranked on unlabelled train images (``hf_snapvit.rank``, whose provenance records
the ranking wall time and SnapViT's per-phase times). Every sparsity is then evaluated on a seeded subset of the
validation split: top-1 with the model's head, k-NN (k = 20, L2-normalised final-norm CLS features, a seeded subset of
the train split as the memory bank), the linear probe (trained on the bank, epoch chosen on 20 % of it) and
representation retention; each sliced model is also timed against the dense one at batch 8 (interleaved, random
input). ``hf_snapvit.evaluation.sweep_from_paths`` writes ``sweep.json``, ``sweep.csv`` and the plots to
``--output-dir``.

    python benchmarks/sweep_vit_tiny.py --width-multiple 1 --methods snip taylor-ce lamp magnitude random \\
        --num-val 1000 --num-bank 1000 --sparsities 0.1 0.2 0.3 0.4 0.5 0.6 --threads 2 --latency-repeats 3
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local

import torch  # noqa: E402
import transformers  # noqa: E402

from _harness import RESULTS, parser  # noqa: E402
from hf_snapvit.evaluation import sweep_from_paths  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    options = parser(__doc__)
    options.add_argument("--methods", nargs="+",
                         default=["snapvit", "snip", "taylor-ce", "lamp", "magnitude", "random"],
                         help="methods to rank with (hf_snapvit.available_methods())")
    options.add_argument("--width-multiple", type=int, default=None,
                         help="round kept FFN widths to multiples of this (default: the library's, 64 here; 1: exact "
                              "widths, as the stored results were measured)")
    options.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    options.add_argument("--num-val", type=int, default=1000, help="validation images evaluated on (seeded subset)")
    options.add_argument("--num-bank", type=int, default=2000, help="train images in the k-NN / probe bank")
    options.add_argument("--latency-repeats", type=int, default=5)
    options.add_argument("--threads", type=int, default=1,
                         help="torch threads (default 1: multi-threaded timings on small shared VMs are bimodal)")
    options.add_argument("--output-dir", default=str(RESULTS / "sweep_vit_tiny"))
    args = options.parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    result = sweep_from_paths(args.model, args.data, output_dir=args.output_dir, methods=args.methods,
                              sparsities=args.sparsities, num_eval=args.num_val, num_bank=args.num_bank,
                              latency_repeats=args.latency_repeats, width_multiple=args.width_multiple)
    for method, entry in result.methods.items():
        seconds = entry.get("ranking_seconds")
        print(f"{method}: ranking {'-' if seconds is None else f'{seconds:.1f} s'} {entry.get('phases') or ''}")
    print(result.to_markdown(("top1", "knn_top1", "linear_top1", "retention")))
    print("\nspeedup over dense (measured / GFLOP ratio), batch 8")
    for row in result.rows:
        print(f"  {row['method']:>10} s={row['sparsity']:.3f}: {row['speedup']:.2f} / {row['theoretical_speedup']:.2f}")
    print(f"wrote {', '.join(sorted(result.files.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
