"""Recovery on 1 and N processes through accelerate (DDP): the same recovered weights, and each process's seconds
and peak memory.

    python benchmarks/recovery_processes.py --shape tiny --processes 1 2 --steps 3      # CPU processes (gloo)
    python benchmarks/recovery_processes.py --device cuda --shape vit-b16 --processes 1 2 --steps 20   # N GPUs

Each count of processes is one ``accelerate launch`` of this script's ``worker``: a random-weight ViT of ``--shape``
(benchmarks/_harness.py) is the teacher, its first half of heads and FFN neurons in every block the student, and
``--images`` seeded random pixel tensors the data, so nothing is downloaded. The worker records its process's
recovery seconds and peak memory (CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS, VmHWM);
the main process of each launch saves the recovered weights, and the JSON gives each count's largest difference from
the first count's weights. A count needing more GPUs than the machine has is recorded as skipped (NCCL runs one
process per GPU).
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import hf_snapvit
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.benchmark.environment import read_status
from hf_snapvit.surgery.slicing import slice_model_

from _harness import SHAPES, build, command, parser, write_json


def parse_args(argv: list[str] | None = None):
    result = parser(__doc__, shared=False)
    result.add_argument("mode", nargs="?", choices=("main", "worker"), default="main")
    result.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    result.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    result.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    result.add_argument("--steps", type=int, default=3)
    result.add_argument("--batch-size", type=int, default=8, help="images per step over all processes")
    result.add_argument("--images", type=int, default=32)
    result.add_argument("--precision", default="auto", choices=("auto", "bf16", "no"))
    result.add_argument("--seed", type=int, default=0)
    result.add_argument("--work", type=Path, default=Path("/tmp/recovery_processes"),
                        help="folder of each launch's weights and records")
    result.add_argument("--output", type=Path, default=Path("/tmp/recovery_processes.json"))
    return result.parse_args(argv)


def worker(args) -> None:
    """One process of a launch: recover the half-width student and record this process's seconds and memory."""
    from hf_snapvit.utils.distributed import finish_processes, process_state

    state = process_state()
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())  # the same sums in every launch
    teacher = build(args.shape, args.seed)
    heads, neurons = teacher.config.num_attention_heads // 2, teacher.config.intermediate_size // 2
    student = slice_model_(copy.deepcopy(teacher), [(np.arange(heads), np.arange(neurons))] *
                           teacher.config.num_hidden_layers)
    size = teacher.config.image_size
    pixels = torch.randn(args.images, 3, size, size, generator=torch.Generator().manual_seed(args.seed))
    if args.device == "cuda":
        teacher, student = teacher.to(state.device), student.to(state.device)
        torch.cuda.reset_peak_memory_stats(state.device)
    config = hf_snapvit.RecoveryConfig(steps=args.steps, batch_size=args.batch_size, warmup_steps=1,
                                       num_images=args.images, held_out_images=0, mixed_precision=args.precision,
                                       seed=args.seed)
    start = time.perf_counter()
    trained, summary = hf_snapvit.recover(student, teacher, pixels, config, show_progress=False)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(state.device) if args.device == "cuda" else read_status().get("VmHWM")
    out = args.work / f"n{state.num_processes}"
    out.mkdir(parents=True, exist_ok=True)
    if state.is_main_process:
        torch.save({k: v.cpu() for k, v in trained.state_dict().items()}, out / "weights.pt")
    (out / f"rank{state.process_index}.json").write_text(json.dumps({
        "process": state.process_index, "seconds": round(seconds, 3), "peak_bytes": peak,
        "peak_kind": "torch.cuda.max_memory_allocated" if args.device == "cuda" else "peak RSS (VmHWM)",
        "final_loss": summary.final_loss(), **summary.processes}))
    finish_processes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, n: int, argv: list[str]) -> dict:
    """One ``accelerate launch`` of ``n`` workers; their records, or why the count was skipped."""
    if args.device == "cuda" and n > torch.cuda.device_count():
        return {"processes": n, "skipped": f"needs {n} GPUs, the machine has {torch.cuda.device_count()}"}
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    if args.device == "cpu":
        env["ACCELERATE_USE_CPU"] = "1"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(n), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port())]
    launcher += ["--multi_gpu"] if n > 1 else (["--cpu"] if args.device == "cpu" else [])
    start = time.perf_counter()
    done = subprocess.run([*launcher, __file__, "worker", *argv], env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"the launch of {n} processes failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    out = args.work / f"n{n}"
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]
    return {"processes": n, "launch_seconds": round(time.perf_counter() - start, 1), "ranks": ranks}


def compare(args, rows: list[dict]) -> None:
    """Add each run's largest weight difference from the first run's weights, the tensor it is in, and that
    difference over the model's largest weight magnitude.

    The largest differences are expected in the attention key biases: softmax ignores them, so their true gradient
    is 0 and AdamW turns the float noise of their computed gradient into steps of about ``lr``.
    """
    ran = [row for row in rows if "ranks" in row]
    reference = torch.load(args.work / f"n{ran[0]['processes']}" / "weights.pt")
    largest = max(float(v.float().abs().max()) for v in reference.values() if v.numel())
    for row in ran:
        weights = torch.load(args.work / f"n{row['processes']}" / "weights.pt")
        gap, name = max((float((weights[k].float() - v.float()).abs().max()), k)
                        for k, v in reference.items() if v.numel())
        row.update(max_abs_diff=gap, max_diff_tensor=name if gap else None,
                   max_diff_over_largest_weight=gap / largest)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.mode == "worker":
        worker(args)
        return {}
    passed = [a for a in argv if a != "main"]
    rows = [launch(args, n, passed) for n in args.processes]
    compare(args, rows)
    result = {"command": command("recovery_processes.py", argv), "hardware": hardware_info(device=args.device),
              "shape": args.shape, "steps": args.steps, "batch_size": args.batch_size, "runs": rows}
    write_json(args.output, result)
    for row in rows:
        print(json.dumps({k: v for k, v in row.items() if k != "ranks"}))
    return result


if __name__ == "__main__":
    main()
