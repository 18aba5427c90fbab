"""The quick path, timed as a user runs it: the README's first example and ``hf-snapvit prune --preset fast``.

Each runs as its own process, one after the other, exactly as a user types it (the example through
``examples/load_any_size.py``, the CLI through the installed ``hf-snapvit`` command), on the shared ViT-Tiny and
Tiny-ImageNet train images. The JSON records each command's wall seconds and CPU seconds, the load average before and
after (an idle machine shows about 0 before), the example's own step times and top-1 figures and the CLI's summary.

    python benchmarks/quick_path.py                       # both, about 10 minutes on 2 vCPUs
    python benchmarks/quick_path.py --only example --num-images 200
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import RESULTS, ROOT, SHARED_DATA, SHARED_MODEL, command, parser, write_json

from hf_snapvit.benchmark import hardware_info


def _run(argv: list[str]) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """``argv`` as a child process, and its wall and CPU seconds and the load average around it."""
    before, usage, start = os.getloadavg(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    return result, {"command": " ".join(argv), "wall_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
                    "load_average_before": before, "load_average_after": os.getloadavg()}


def example(args: Any, folder: Path) -> dict[str, Any]:
    """The README's first example (``examples/load_any_size.py``, SnapViT ``fast``) with its own figures."""
    figures = folder / "example.json"
    _, record = _run([sys.executable, "examples/load_any_size.py", "--model", args.model,
                      "--train-data", f"{args.data}/train.parquet", "--data", f"{args.data}/validation.parquet",
                      "--num-images", str(args.num_images), "--sparsities", *map(str, args.sparsities),
                      "--json", str(figures)])
    reported = json.loads(figures.read_text())
    return {**record, "seconds": reported["seconds"], "rows": reported["rows"],
            "num_validation_images": reported["num_validation_images"]}


def cli(args: Any, folder: Path) -> dict[str, Any]:
    """``hf-snapvit prune MODEL --data ... --preset fast`` (ranking and the stored correction, as the docs show)."""
    executable = shutil.which("hf-snapvit") or "hf-snapvit"
    result, record = _run([executable, "prune", args.model, "--data", f"{args.data}/train.parquet",
                           "--preset", "fast", "--output", str(folder / "vit-tiny-elastic"), "--json", "-q"])
    summary = json.loads(result.stdout)
    config = json.loads((folder / "vit-tiny-elastic" / "config.json").read_text())
    timings = config.get("elastic_ranking", {}).get("provenance", {}).get("timings")
    return {**record, "summary": summary, "ranking_timings": timings}


def main(argv: list[str] | None = None) -> None:
    options = parser(__doc__, shared=False)
    options.add_argument("--model", default=SHARED_MODEL)
    options.add_argument("--data", default=SHARED_DATA, help="folder with train.parquet and validation.parquet")
    options.add_argument("--only", choices=("example", "cli"), default=None, help="run one of the two")
    options.add_argument("--num-images", type=int, default=1000, help="validation images the example scores")
    options.add_argument("--sparsities", type=float, nargs="+", default=[0.0, 0.3, 0.5])
    options.add_argument("--output", default=str(RESULTS / "quick_path" / "quick_path_vit_tiny.json"))
    args = options.parse_args(argv)
    report: dict[str, Any] = {"command": command("quick_path.py", argv), "hardware": hardware_info(),
                              "settings": {k: v for k, v in vars(args).items() if k != "output"}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, step in (("example", example), ("cli", cli)):
            if args.only in (None, name):
                report[name] = step(args, Path(tmp))
                print(f"{name}: {report[name]['wall_seconds']} s wall, {report[name]['cpu_seconds']} s CPU")
    write_json(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
