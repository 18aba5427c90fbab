"""Installing hf-snapvit's extras over an installed torch keeps that torch: fresh virtual environments, plain pip.

1. ``cpu-all``: a new venv with the CPU build of torch 2.13.0 (``pip install torch==2.13.0`` takes the file on our
   machines' disk), then ``pip install "<repo>[all]"``: torch must still be ``2.13.0+cpu`` and ``pip check`` clean.
2. ``cpu-timm-dry-run``: in that venv, what ``pip install --dry-run "<repo>[timm]"`` would install. timm requires
   torchvision, whose wheels pin one torch release each, so without a torchvision built for the installed torch pip
   takes the newest one and the torch it pins: the reason ``[all]`` leaves timm out and the README says to install
   the matching torchvision before ``[timm]``.
3. ``pair-timm``: a new venv with torch 2.14.1 and torchvision 0.29.1 (a matching pair, both on disk), then
   ``pip install "<repo>[all,timm]"``: both must be unchanged. Skipped with ``--skip-pair`` (it installs ~5.5 GB).

Writes ``benchmarks/results/extras_keep_torch/extras_keep_torch.json`` and exits 1 if an install changed torch or
torchvision.
Usage: ``python benchmarks/extras_keep_torch.py [--skip-pair] [--output PATH]``
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "extras_keep_torch" / "extras_keep_torch.json"
VERSIONS = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in ('torch', "
            "'torchvision', 'timm') if __import__('importlib.util').util.find_spec(n)}))")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, text=True, capture_output=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done


def _venv(folder: Path, *torch_requirements: str) -> Path:
    """A new venv in ``folder`` with ``torch_requirements`` installed; its python."""
    _run([sys.executable, "-m", "venv", str(folder)])
    python = folder / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--no-compile", *torch_requirements])
    return python


def _versions(python: Path) -> dict[str, str]:
    return json.loads(_run([str(python), "-c", VERSIONS]).stdout)


def _install_keeps(python: Path, extras: str) -> dict:
    """Install ``<repo>[extras]`` into ``python``'s venv; the torch-side versions before and after, and whether
    pip check passes."""
    before = _versions(python)
    start = time.perf_counter()
    _run([str(python), "-m", "pip", "install", "-q", "--no-compile", f"{ROOT}[{extras}]"])
    seconds = time.perf_counter() - start
    after = _versions(python)
    check = subprocess.run([str(python), "-m", "pip", "check"], text=True, capture_output=True)
    kept = all(after.get(name) == version for name, version in before.items())
    return {"extras": extras, "before": before, "after": after, "kept": kept, "install_s": round(seconds, 1),
            "pip_check": (check.stdout + check.stderr).strip()}


def _dry_run(python: Path, extras: str, folder: Path) -> dict:
    """What ``pip install --dry-run <repo>[extras]`` would install (``name: version``) in ``python``'s venv."""
    report = folder / "report.json"
    _run([str(python), "-m", "pip", "install", "-q", "--dry-run", "--report", str(report), f"{ROOT}[{extras}]"])
    items = json.loads(report.read_text())["install"]
    return {"extras": extras, "would_install": {i["metadata"]["name"]: i["metadata"]["version"] for i in items}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-pair", action="store_true", help="skip the torch 2.14.1 + torchvision 0.29.1 venv")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    results: dict = {"python": platform.python_version(), "machine": platform.machine(),
                     "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True,
                                              capture_output=True).stdout.strip(),
                     "date": time.strftime("%Y-%m-%d"), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="extras-keep-torch-") as tmp:
        cpu = _venv(Path(tmp) / "cpu", "torch==2.13.0")
        results["runs"]["cpu-all"] = _install_keeps(cpu, "all")
        results["runs"]["cpu-timm-dry-run"] = _dry_run(cpu, "timm", Path(tmp))
        if not args.skip_pair:
            pair = _venv(Path(tmp) / "pair", "torch==2.14.1", "torchvision==0.29.1")
            results["runs"]["pair-timm"] = _install_keeps(pair, "all,timm")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    kept = [run["kept"] for run in results["runs"].values() if "kept" in run]
    return 0 if all(kept) else 1


if __name__ == "__main__":
    sys.exit(main())
