"""The suite's multi-process scenarios in one launch: ``accelerate launch`` of 2 processes (gloo, through
examples/accelerate_config.yaml) runs ``tests/launched.py INPUTS OUT SCENARIO...``, and one plain process runs the
same file beside it as the one-process reference. Each scenario writes its results, and each process's stdout and
stderr, to ``OUT/<scenario>/``; the tests that read them (``@pytest.mark.launched(scenario)`` and the ``launched``
fixture of conftest.py, which starts both runs) assert on those files.

A process's start-up (interpreter, torch, transformers) costs more than most scenarios, and a launch of 2 starts three
of them: one launch for every scenario instead of one per test file (issue 66).

The scenarios, each a function ``(inputs, out, rank)`` run by every process in turn, in this order:

* ``rankings`` (test_distributed): SnapViT and the baselines rank as one process does, the work split;
* ``draw`` (test_sampling): every process draws the same calibration sample, under different hash seeds;
* ``recovery`` (test_recovery): recovery per size, resumed, elastic and through the CLI's export;
* ``logging`` (test_logging_once): two CLI prunes whose log lines must appear once per launch;
* ``readme`` (test_cli): the README command, ``-m hf_snapvit prune`` under the example accelerate config.

The CLI closes the process group when it is done (``finish_processes``), as the last act of a launched program; a
later scenario joins a new group, with accelerate's state reset, as a freshly launched process would.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import datasets
import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.utils import distributed
from hf_snapvit.data.calibration import sample_images
from hf_snapvit.data.views import MultiCropConfig
from hf_snapvit.errors import RecoveryError
from hf_snapvit.pruning import scoring
from hf_snapvit.pruning.methods.snapvit import fitness
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.recovery import RecoveryConfig, recover, recover_

from helpers import (CASES, PROCESSOR, free_port, images, save_tiny_vit_folder, sliced, sorted_table,
                     write_image_parquet)

ROOT = Path(__file__).resolve().parents[1]
CASE = {c.name: c for c in CASES}
PER_PROCESS = "this process's own line"


# ----------------------------------------------------------------------------------------- rankings (test_distributed)
GRID = np.round(np.arange(0.05, 0.601, 0.05), 2)
# Odd sizes, so the processes get unequal shares of gradient steps and of each generation's 10 candidates.
TINY = dict(num_gradient_images=5, num_fitness_images=6, max_generations=2, max_evaluations=None,
            fitness_sparsities=(0.1, 0.3), pca_components=8)


def labelled_table(n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"image": images(n), "label": [i % 5 for i in range(n)]}).cast_column(
        "image", datasets.Image())


def scenarios() -> dict:
    """name -> () -> ElasticRanking; each builds its own model and data, identically on every process."""

    def snapvit(data, **overrides):
        def run():
            pruner = hs.SnapViTPruner(hs.SnapViTConfig(**{**TINY, **overrides}))
            return pruner.fit(CASE["vit"].build(), data(), processor=PROCESSOR, show_progress=False)
        return run

    return {
        # Per-image steps (the fast preset's OBD scores) from a list of PIL images.
        "snapvit-obd": snapvit(lambda: images(20), scores=ScoreConfig(
            definition="obd", crops=MultiCropConfig(num_local=2, local_size=16))),
        # Batches of 2 (3 steps for 5 images) from a stream with 2 shards: split_dataset_by_node's "auto" strategy
        # would assign shards here; the "examples" strategy keeps the one-process sample.
        "snapvit-accumulated-stream": snapvit(
            lambda: labelled_table(20).to_iterable_dataset(num_shards=2),
            scores=ScoreConfig(definition="accumulated", batch_size=2, crops=MultiCropConfig(num_local=2))),
        # Steps of 16 over 40 images (16, 16, 8): process 0 takes steps 0 and 2, process 1 step 1.
        "snip": lambda: hs.rank(CASE["vit"].build(), method="snip", data=labelled_table(40), processor=PROCESSOR,
                                preset="fast", show_progress=False),
        # Labels travel with each process's steps of a stream.
        "taylor-ce-stream": lambda: hs.rank(CASE["vit-cls"].build(), method="taylor-ce",
                                            data=labelled_table(40).to_iterable_dataset(num_shards=3),
                                            processor=PROCESSOR, preset="fast", show_progress=False),
        "magnitude": lambda: hs.rank(CASE["vit"].build(), method="magnitude"),
    }


class Counters:
    """Counts the gradient steps and candidate evaluations this process computes, to show the work is split."""

    def __init__(self) -> None:
        self.steps = self.evaluations = 0
        self._batch_loss, self._similarities = scoring._batch_loss, fitness.EmbeddingFitness.similarities

    def __enter__(self) -> "Counters":
        def batch_loss(*args, **kwargs):
            self.steps += 1
            return self._batch_loss(*args, **kwargs)

        def similarities(fit, ranking, *args):  # one candidate evaluation, whether one process or several ask for it
            self.evaluations += 1
            return self._similarities(fit, ranking, *args)

        scoring._batch_loss, fitness.EmbeddingFitness.similarities = batch_loss, similarities
        return self

    def __exit__(self, *exc) -> None:
        scoring._batch_loss, fitness.EmbeddingFitness.similarities = self._batch_loss, self._similarities


def rankings(inputs: Path, out: Path, rank: int) -> None:
    """Rank every scenario with 1 thread and write ``{name}.rank{rank}.npz`` and ``{name}.rank{rank}.json``."""
    torch.set_num_threads(1)  # the same float arithmetic in every process, and in the reference
    for name, run in scenarios().items():
        with Counters() as counts:
            ranking = run()
        keep = [ranking.keep_counts(min(s, ranking.max_sparsity)) for s in GRID]
        np.savez(out / f"{name}.rank{rank}.npz", heads=ranking.head_scores, neurons=ranking.neuron_scores,
                 keep_heads=np.array([k.heads for k in keep]), keep_neurons=np.array([k.neurons for k in keep]))
        state = distributed.process_state()
        (out / f"{name}.rank{rank}.json").write_text(json.dumps({
            "steps": counts.steps, "evaluations": counts.evaluations, "num_processes": state.num_processes,
            "backend": state.backend, "search": ranking.provenance.get("search"),
            "calibration": ranking.provenance.get("calibration_data"),
        }))


# ------------------------------------------------------------------------------------------------ draw (test_sampling)
def draw_of_a_sorted_stream() -> tuple[list, np.ndarray]:
    """The 9 images (and labels) drawn with seed 7 from a class-sorted stream of 60 rows in 4 shards."""
    return sample_images(sorted_table(10, 6).to_iterable_dataset(num_shards=4), 9, seed=7, label_column="label")


def digest(pictures) -> str:
    return hashlib.sha256(b"".join(picture.tobytes() for picture in pictures)).hexdigest()


def draw(inputs: Path, out: Path, rank: int) -> None:
    """Processes share no state: each computes the draw from the source and the seed. Each has its own hash seed
    (the launch leaves PYTHONHASHSEED unset); the hash of a string records it."""
    pictures, labels = draw_of_a_sorted_stream()
    (out / f"draw.rank{rank}.json").write_text(json.dumps({
        "images": digest(pictures), "labels": labels.tolist(), "string_hash": hash("hf_snapvit")}))


# -------------------------------------------------------------------------------------------- recovery (test_recovery)
def interrupted(student, teacher, config: RecoveryConfig) -> None:
    """Recover ``student`` in place, stopped by a KeyboardInterrupt in the 3rd step (the same one on every process)."""
    calls = [0]

    def interrupt(module, args):
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt

    student.register_forward_pre_hook(interrupt)
    with pytest.raises(KeyboardInterrupt):
        recover_(student, teacher, images(20), config, processor=PROCESSOR, show_progress=False)


def recovery(inputs: Path, out: Path, rank: int) -> None:
    """Recover per size and elastically (the elastic checkpoint in ``inputs/elastic``) with 1 thread; write the
    weights of this process."""
    torch.set_num_threads(1)
    processes = distributed.process_state().num_processes
    teacher = CASE["vit-cls"].build()
    # 7 images per step: the processes get unequal shares (4 and 3).
    config = RecoveryConfig(steps=3, batch_size=7, warmup_steps=1, num_images=20)
    per_size, first = recover(sliced(teacher), teacher, images(20), config, processor=PROCESSOR,
                              show_progress=False)
    torch.save(per_size.state_dict(), out / f"per_size.rank{rank}.pt")
    # Interrupted in its 3rd step on every process (after the state of step 2), then resumed: the same weights.
    saving = dict(steps=3, batch_size=7, warmup_steps=1, num_images=20, checkpoint_every=1)
    shared = RecoveryConfig(**saving, output_dir=str(out / "state"))
    interrupted(sliced(teacher), teacher, shared)
    resumed, summary = recover(sliced(teacher), teacher, images(20), shared, processor=PROCESSOR,
                               show_progress=False)
    assert summary.resumed_from == 2, summary.resumed_from
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), per_size.state_dict().values()))
    if processes > 1:  # a state only the main process sees: every process refuses to resume, none waits forever
        private = RecoveryConfig(**saving, output_dir=str(out / f"private{rank}"))
        interrupted(sliced(teacher), teacher, private)
        with pytest.raises(RecoveryError, match=r"different steps \[2, 0\]"):
            recover(sliced(teacher), teacher, images(20), private, processor=PROCESSOR, show_progress=False)
    # ViTModel's pooler takes no part in the loss: no process gives it a gradient, so AdamW must leave it alone.
    pooled, _ = recover(sliced(CASE["vit"].build()), CASE["vit"].build(), images(20), config, processor=PROCESSOR,
                        show_progress=False)
    torch.save(pooled.state_dict(), out / f"pooled.rank{rank}.pt")
    dense = hs.ElasticViTModel.from_pretrained(inputs / "elastic")  # written before the launch (write_inputs)
    elastic, second = recover(dense, None, images(20), RecoveryConfig(steps=3, batch_size=7, warmup_steps=1,
                                                                     elastic=True, elastic_range=(0.1, 0.5)),
                              processor=PROCESSOR, show_progress=False)
    torch.save(elastic.state_dict(), out / f"elastic.rank{rank}.pt")
    (out / f"processes.rank{rank}.json").write_text(json.dumps([first.processes, second.processes]))
    # Last: the CLI ends the process group. Every process recovers, the main one writes the folder.
    from hf_snapvit.cli import main

    folder = out / f"images{rank}"
    folder.mkdir()
    for i, image in enumerate(images(6)):
        image.save(folder / f"{i}.png")
    assert main(["export", "--model", str(inputs / "elastic"), "--sparsity", "0.3", "--output", str(out / "export"),
                 "--recover", "--data", str(folder), "--num-samples", "6", "--steps", "2", "--batch-size", "3",
                 "-q"]) == 0


# ----------------------------------------------------------------------------------------- logging (test_logging_once)
def prunes_that_log(inputs: Path, out: Path, rank: int) -> None:
    """Two prunes that log lines about their inputs (corrupt images skipped, a data-free method given data), then a
    line of this process's own."""
    from hf_snapvit.cli import main
    from hf_snapvit.utils.logs import get_logger

    for method in ("snip", "magnitude"):
        code = main(["prune", "--model", str(inputs / "model"), "--data", str(inputs / "corrupt.parquet"),
                     "--method", method, "--preset", "fast", "--num-samples", "8", "--output", str(out / method),
                     "--no-prefix-correction", "-q"])
        assert code == 0
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    get_logger("hf_snapvit.test").warning(PER_PROCESS, main_process_only=False)
    distributed.finish_processes()


# --------------------------------------------------------------------------------------------------- readme (test_cli)
def readme_argv(inputs: Path) -> list[str]:
    """The README's prune, of the tiny ViT folder on 24 labelled images, printing its JSON summary."""
    return ["prune", str(inputs / "model"), "--data", str(inputs / "calib.parquet"), "--method", "snip", "--preset",
            "fast", "--num-samples", "8", "--json", "-q"]


def readme(inputs: Path, out: Path, rank: int) -> None:
    """``python -m hf_snapvit prune ...``, as ``accelerate launch ... -m hf_snapvit`` runs it, into ``out/pruned``."""
    argv = sys.argv
    sys.argv = ["hf_snapvit", *readme_argv(inputs), "--output", str(out / "pruned")]
    try:
        with pytest.raises(SystemExit) as exit:
            runpy.run_module("hf_snapvit", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = argv
    assert exit.value.code == 0, exit.value.code


SCENARIOS: dict[str, Callable[[Path, Path, int], None]] = {
    "rankings": rankings, "draw": draw, "recovery": recovery, "logging": prunes_that_log, "readme": readme}


def write_inputs(inputs: Path) -> None:
    """What the scenarios read, written once before both runs start."""
    save_tiny_vit_folder(inputs / "model")
    write_image_parquet(inputs / "calib.parquet")
    write_image_parquet(inputs / "corrupt.parquet", 16, corrupt=(3, 9))
    teacher = CASE["vit-cls"].build()
    hs.save_elastic(teacher, hs.rank(teacher, method="magnitude"), inputs / "elastic", image_processor=PROCESSOR)


# ---------------------------------------------------------------------------------------------------------- the worker
@contextlib.contextmanager
def captured(folder: Path, rank: int) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2, so child loggers and C code too) into
    ``folder/stdout.rank{rank}`` and ``folder/stderr.rank{rank}`` for the length of the block."""
    saved = []
    for stream, name in ((sys.stdout, "stdout"), (sys.stderr, "stderr")):
        stream.flush()
        descriptor = stream.fileno()
        saved.append((stream, descriptor, os.dup(descriptor)))
        with open(folder / f"{name}.rank{rank}", "wb") as target:
            os.dup2(target.fileno(), descriptor)
    try:
        yield
    finally:
        for stream, descriptor, original in saved:
            stream.flush()
            os.dup2(original, descriptor)
            os.close(original)


def next_port() -> int | None:
    """A free port the main process picked, on every process: where a new process group meets if the next scenario
    closes this one. None for one process."""
    if distributed.process_state().num_processes == 1:
        return None
    port = [free_port() if distributed.process_state().is_main_process else None]
    torch.distributed.broadcast_object_list(port, src=0)
    return port[0]


def rejoin(port: int | None) -> None:
    """After a scenario closed the process group: a fresh accelerate state and a new group on ``port`` (its own
    store, hosted by the main process), as a freshly launched process would have."""
    if port is None or torch.distributed.is_initialized():
        return
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    os.environ.update(MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="False")
    distributed.process_state()


def worker(inputs: Path, out: Path, names: list[str]) -> None:
    """What every process runs: the scenarios ``names`` in order, each into ``out/<name>``, marking each done."""
    torch.set_num_threads(1)
    for name in names:
        port, rank = next_port(), distributed.process_state().process_index
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with captured(folder, rank):
            SCENARIOS[name](inputs, folder, rank)
        # The marker the tests look for, with the scenario's seconds: where a launch's time goes.
        (folder / f"done.rank{rank}").write_text(f"{time.perf_counter() - start:.1f} s\n")
        rejoin(port)
    distributed.finish_processes()


if __name__ == "__main__":
    worker(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])
