"""How close a recorded ranking's search forwards ran to this CPU's matrix-multiply peak, and the floor that leaves.

A fit record (``defaults_vit_tiny.py``'s ``*.fit.json``) gives the search's forward time and its evaluations; a
ranking of the same settings stands in for every candidate's theoretical GFLOPs at each fitness sparsity (the paper's
formulas: candidates of one sparsity remove the same share of parameters and differ only in their mix of heads and
neurons). Measured in this run, beside them: the CPU's float32 matrix-multiply rate (square products, the best of
``--sizes``) and the dense model's float32 forward rate at the search's batch size (as ``bench_ranking_time``
measures it). The **floor** is the search's GFLOPs at that matrix-multiply rate: what no faster forward (compiled,
fused, other kernels) can go below without forwarding fewer images or cheaper ones. The fit must come from this
machine's CPU model.

    python benchmarks/cpu_search_floor.py --fit benchmarks/results/fast_preset_generations_avx2/seed0.fresh.fit.json \\
        --ranking benchmarks/results/snapvit_fast_three_sparsities/rankings/fast-seed0-g3.json --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModel

from hf_snapvit.benchmark import hardware_info
from hf_snapvit.budget import estimate_gflops
from hf_snapvit.files import write_text_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ranking_time import dense_throughput  # noqa: E402  (benchmarks/ is not a package)
from defaults_vit_tiny import read_ranking  # noqa: E402
from rank_vit_tiny import SHARED  # noqa: E402

# Fit settings this floor cannot count: it assumes every fitness image is forwarded whole at every sparsity.
FULL_FORWARDS = {"split_fitness_images": False, "rotate_fitness_sparsities": False, "fitness_image_size": None,
                 "fitness_token_fraction": 1.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=Path, required=True, help="a defaults_vit_tiny.py fit record (*.fit.json)")
    parser.add_argument("--ranking", type=Path, required=True, help="a ranking of the same settings (its -gG.json)")
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048], help="square matrix sides timed")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "cpu_search_floor.json")
    return parser.parse_args(argv)


def _timed(run, repeats: int) -> float:
    """Seconds per call of ``run``, the best of ``repeats`` after two warm-up calls."""
    for _ in range(2):
        run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_gflops(sizes: list[int], repeats: int) -> dict[int, float]:
    """Float32 GFLOP/s of an ``n x n`` by ``n x n`` product, per side ``n``."""
    rates = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        rates[n] = 2 * n ** 3 / _timed(lambda: a @ b, repeats) / 1e9
    return rates


def search_work(fit: dict[str, Any], ranking, dense_gflops: float) -> dict[str, Any]:
    """The images the fit's search forwarded and their GFLOPs: the teacher's dense pass over the fitness images, then
    every evaluation at every fitness sparsity."""
    settings = fit["settings"]
    other = {k: settings.get(k, v) for k, v in FULL_FORWARDS.items() if settings.get(k, v) != v}
    if other:
        raise SystemExit(f"{other}: this floor counts whole forwards of every fitness image at every sparsity; give a "
                         f"fit with {FULL_FORWARDS}")
    images, evaluations = settings["num_fitness_images"], fit["history"][-1]["evaluations"]
    per_sparsity = {s: ranking.keep_counts(s).gflops for s in settings["fitness_sparsities"]}
    gflops = images * (dense_gflops + evaluations * sum(per_sparsity.values()))
    return {"fitness_images": images, "evaluations": evaluations, "gflops_per_image": per_sparsity,
            "images_forwarded": images * (1 + evaluations * len(per_sparsity)), "gflops": gflops}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    fit = json.loads(args.fit.read_text())
    hardware = hardware_info()
    if fit["hardware"].get("cpu_model") != hardware["cpu_model"]:
        raise SystemExit(f"{args.fit} ran on {fit['hardware'].get('cpu_model')!r}, this machine is "
                         f"{hardware['cpu_model']!r}: measure the floor where the fit ran")
    transformers.utils.logging.set_verbosity_error()  # the classifier's weights, unused by the backbone
    model = AutoModel.from_pretrained(args.model, add_pooling_layer=False).eval()
    dense_gflops = estimate_gflops(model)
    work = search_work(fit, read_ranking(args.ranking, model), dense_gflops)
    matmul = matmul_gflops(args.sizes, args.repeats)
    peak = max(matmul.values())
    batch = fit["settings"]["fitness_batch_size"]
    dense_rate = dense_throughput(model, batch, "no", args.repeats)  # float32, as the fit's search ran here
    timings = fit["timings"]
    achieved = work["gflops"] / timings["search_forward"]
    floor = work["gflops"] / peak
    rest = timings["search"] - timings["search_forward"]
    others = sum(v for k, v in timings.items() if k not in ("search", "search_forward"))
    report = {
        "command": " ".join(["python", "benchmarks/cpu_search_floor.py", *(argv if argv is not None
                                                                         else sys.argv[1:])]),
        "hardware": hardware, "fit": str(args.fit), "ranking": str(args.ranking), "fit_timings": timings,
        "matmul_gflops_per_second": matmul, "dense_gflops_per_image": dense_gflops,
        "dense_forward": {"batch_size": batch, "images_per_second": dense_rate,
                          "gflops_per_second": dense_rate * dense_gflops, "of_matmul_peak": dense_rate * dense_gflops
                          / peak},
        "search": {**work, "forward_seconds": timings["search_forward"], "gflops_per_second": achieved,
                   "of_matmul_peak": achieved / peak, "forward_floor_seconds": floor},
        # The search at the matrix-multiply peak, with its other phases as the fit measured them.
        "ranking_floor_seconds": floor + rest + others, "fit_wall_seconds": fit["wall_seconds"],
    }
    write_text_atomic(args.output, json.dumps(report, indent=1) + "\n")
    print(f"matmul peak {peak:.0f} GFLOP/s; dense forward {dense_rate * dense_gflops:.0f} GFLOP/s "
          f"({dense_rate:.1f} images/s); search forwards {work['gflops'] / 1e3:.1f} TFLOP in "
          f"{timings['search_forward']:.0f} s = {achieved:.0f} GFLOP/s ({100 * achieved / peak:.0f} % of the peak); "
          f"at the peak {floor:.0f} s, the ranking {report['ranking_floor_seconds']:.0f} s (measured "
          f"{fit['wall_seconds']:.0f} s); wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
