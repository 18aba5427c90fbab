"""Peak memory of a stream draw against the rows read and the size of each image: bounded by the sample.

A stream draw (:func:`hf_snapvit.data.sampling.stream_candidates`, what every ``data=`` stream goes through) reads up
to its prefix and keeps only the candidates of smallest key. This reads generators of ``rows`` fresh byte strings of
``size`` bytes each (as undecoded images are) and measures the draw's peak Python allocation with ``tracemalloc``,
beside the bytes the kept candidates hold and the bytes a shuffle buffer of the rows read would hold:

    python benchmarks/draw_memory.py --rows 10000 100000 300000 --sizes 2000 20000 200000 \\
        --output benchmarks/results/draw_memory.json
"""

from __future__ import annotations

import json
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Iterator

from _harness import parser, write_json
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.data.sampling import spare, stream_candidates


def payloads(rows: int, size: int) -> Iterator[bytes]:
    for i in range(rows):
        yield i.to_bytes(8, "little") * (size // 8)  # a new object per row, as a stream decodes none of them


def measure(rows: int, size: int, count: int) -> dict:
    tracemalloc.start()
    start = time.perf_counter()
    found = stream_candidates(payloads(rows, size), count + spare(count), seed=0, prefix=rows, show_progress=False)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = sum(len(item) for item in found.items)
    return {"rows": rows, "image_bytes": size, "count": count, "candidates": len(found.items),
            "peak_bytes": peak, "candidate_bytes": held, "peak_over_candidates": round(peak / held, 3),
            "rows_read_bytes": rows * size, "peak_over_rows_read": round(peak / (rows * size), 5),
            "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    options = parser(__doc__, shared=False)
    options.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 300_000])
    options.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000, 200_000], help="bytes per image")
    options.add_argument("--count", type=int, default=256, help="images drawn")
    options.add_argument("--output", type=Path, required=True)
    args = options.parse_args(argv)
    results = []
    for size in args.sizes:
        for rows in args.rows:
            results.append(measure(rows, size, args.count))
            print(json.dumps(results[-1]), flush=True)
    write_json(args.output, {"benchmark": "draw_memory", "command": " ".join(sys.argv), "hardware": hardware_info(),
                             "results": results}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
