"""Issue 30: a SnapViT ranking and a recovery run killed part-way (SIGKILL, no clean-up) resume from their saved state
and end exactly where an uninterrupted run ends; a state of another run is refused, naming what differs."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.errors import ConfigError
from hf_snapvit.pruning.methods.snapvit import pruner as snapvit_module
from hf_snapvit.pruning.methods.snapvit.search_state import STATE_FILE
from hf_snapvit.recovery import RecoveryConfig, recover
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.data.views import MultiCropConfig

from helpers import CASES, PROCESSOR, images, interrupted_in_generation

CASE = {c.name: c for c in CASES}
TESTS = Path(__file__).resolve().parent
TINY = dict(num_gradient_images=3, num_fitness_images=6, scores=ScoreConfig(crops=MultiCropConfig(num_local=2)),
            max_generations=5, fitness_sparsities=(0.1, 0.3), pca_components=8, seed=2)
RECOVERY = dict(steps=6, batch_size=4, warmup_steps=1, num_images=8, held_out_images=4)

# The children hang (instead of finishing) at a point after some state was saved, so the kill always lands mid-run
# however slow the machine is. Before hanging they leave a marker, and the parent kills only then: killing as soon as
# some state appears could cut a later save short, which is the torn case's business, not the plain one's.
SNAPVIT_CHILD = """
import json, sys, time
import hf_snapvit as hs
from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness
from helpers import CASES, PROCESSOR, images
from test_resume import TINY, hang

evaluate, calls = EmbeddingFitness.batch_loss, [0]
def hang_in_generation_4(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == 4:
        hang()
    return evaluate(self, *args, **kwargs)
dump = json.dump
def hang_in_writing_generation_3(payload, handle, **kwargs):
    if payload.get("generations") == 3:
        handle.write('{"format": 1, "generations": 3, '); handle.flush(); hang()
    return dump(payload, handle, **kwargs)
if sys.argv[2] == "True":
    json.dump = hang_in_writing_generation_3
else:
    EmbeddingFitness.batch_loss = hang_in_generation_4
config = hs.SnapViTConfig(**TINY, checkpoint_every=1, output_dir=sys.argv[1])
hs.SnapViTPruner(config).fit(CASES[0].build(), images(12), processor=PROCESSOR, show_progress=False)
"""

RECOVERY_CHILD = """
import sys, time
import torch
import hf_snapvit.recovery as recovery
from helpers import CASES, images
from test_resume import RECOVERY, hang, student_of, recovery_pixels

forward, calls = recovery.distillation.forward_outputs, [0]
def hang_in_step_5(*args, **kwargs):
    calls[0] += 1
    if calls[0] == 2 * 4 + 2:  # a teacher and a student forward per step
        hang()
    return forward(*args, **kwargs)
save = torch.save
def hang_in_writing_step_3(payload, handle, *args, **kwargs):
    if isinstance(payload, dict) and payload.get("step") == 3:
        handle.write(b"PK half a state"); handle.flush(); hang()
    return save(payload, handle, *args, **kwargs)
if sys.argv[2] == "True":
    torch.save = hang_in_writing_step_3
else:
    # The teacher's forward is the loop's, the student's runs inside recovery.parallel.Distilled.
    recovery.distillation.forward_outputs = recovery.parallel.forward_outputs = hang_in_step_5
teacher = CASES[1].build()
config = recovery.RecoveryConfig(**RECOVERY, checkpoint_every=1, output_dir=sys.argv[1])
recovery.recover(student_of(teacher), teacher, recovery_pixels(), config, show_progress=False)
"""


HANGING = "child-hangs"

# One process imports what the children need once and forks a child per kill: a fresh interpreter's start-up (torch,
# transformers) costs more than the run it is killed in. The fork happens before any computation, so each child starts
# as a fresh process would, its threads its own.
FORKER = """
import json, os, sys, traceback
import torch, hf_snapvit, hf_snapvit.recovery, helpers, test_resume  # the children's imports, once
for line in iter(sys.stdin.readline, ""):
    child, out, torn, stderr, ended = json.loads(line)
    pid = os.fork()
    if pid == 0:
        with open(stderr, "w") as err:
            os.dup2(err.fileno(), 2)
        sys.argv, code = ["-c", out, torn], 1
        try:
            exec(compile(child, "<child>", "exec"), {"__name__": "__main__"})
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    with open(ended + ".tmp", "w") as record:
        record.write(str(os.waitstatus_to_exitcode(status)))
    os.replace(ended + ".tmp", ended)
"""


def hang() -> None:
    """In a child: say so (a marker beside the state), then wait to be killed."""
    (Path(sys.argv[1]) / HANGING).touch()
    time.sleep(600)


def recovery_pixels() -> torch.Tensor:
    return torch.randn(12, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def student_of(teacher):
    return slice_model_(copy.deepcopy(teacher), [(np.arange(2), np.arange(10))] * 2)


@pytest.fixture(scope="module")
def forker(tmp_path_factory):
    """The forking process of this module's children, started once."""
    # The children compute with as many threads as this process: another count sums in another order, and the
    # resumed run must match the uninterrupted one bit for bit.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=str(torch.get_num_threads()), HF_HUB_OFFLINE="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
               PYTHONWARNINGS="ignore")
    with open(tmp_path_factory.mktemp("forker") / "stderr", "w+") as err:
        process = subprocess.Popen([sys.executable, "-c", FORKER], env=env, cwd=TESTS, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            yield process
        finally:
            process.kill()  # it holds nothing to save, and an interpreter with torch loaded is slow to finalise
            process.wait()
            process.stdin.close()
            process.stdout.close()


def kill_mid_run(forker, child: str, out: Path, saved_step, last: int, *, torn: bool = False) -> int:
    """Run ``child`` (with ``out`` and ``torn`` as arguments) in a new process forked by ``forker`` and SIGKILL it once
    ``saved_step(out)`` is a step in ``[1, last)`` and the child has begun to hang (for ``torn``, in the middle of
    writing the next state); return the saved step."""
    # The forking process writes the child's exit status to ``ended`` when the child is gone.
    stderr, ended = out / "child.stderr", out / "child.ended"
    forker.stdin.write(json.dumps([child, str(out), str(torn), str(stderr), str(ended)]) + "\n")
    forker.stdin.flush()
    pid = int(forker.stdout.readline())
    deadline, step = time.monotonic() + 240, None
    try:
        while time.monotonic() < deadline and not ended.exists():
            step = saved_step(out)
            if (out / HANGING).exists():
                break
            time.sleep(0.02)
        assert not ended.exists(), f"the child ended before it was killed: {stderr.read_text()[-3000:]}"
        assert step is not None and 1 <= step < last, f"no state mid-run within the deadline (last seen: {step})"
        os.kill(pid, signal.SIGKILL)
        assert _ended(ended) == str(-signal.SIGKILL)
        (out / HANGING).unlink()
    finally:
        if not ended.exists():
            os.kill(pid, signal.SIGKILL)
            _ended(ended)
        stderr.unlink(missing_ok=True)
        ended.unlink(missing_ok=True)
    return saved_step(out)  # the child may have saved once more between the last look and the kill


def _ended(status: Path, timeout: float = 60) -> str:
    """The exit status the forking process wrote to ``status`` once the child was gone (waiting up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return status.read_text() if status.exists() else "still running"


def _temporaries(out: Path) -> list[Path]:
    """The half-written state files (atomic_file's temporaries) in ``out``."""
    return list(out.glob(".*.tmp"))


def _search_generation(out: Path) -> int | None:
    try:
        return json.loads((out / STATE_FILE).read_text())["generations"]
    except (OSError, ValueError):  # not written yet
        return None


def _recovery_step(out: Path) -> int | None:
    try:
        return int(torch.load(out / "recovery_state.pt", weights_only=True)["step"])
    except (OSError, RuntimeError, EOFError):
        return None


def fit(config: hs.SnapViTConfig, data=None, model=None):
    pruner = hs.SnapViTPruner(config)
    ranking = pruner.fit(model or CASE["vit"].build(), images(12) if data is None else data, processor=PROCESSOR,
                         show_progress=False)
    return pruner, ranking


def assert_same_ranking(a, b):
    assert np.array_equal(a.head_scores, b.head_scores) and np.array_equal(a.neuron_scores, b.neuron_scores)
    assert a.provenance == b.provenance


# ------------------------------------------------------------------------------------------------ SnapViT search
# The kill mid-write is in the slow lane: the recovery test below checks the same clean-up in the fast one.
@pytest.mark.parametrize("torn", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["killed-in-a-generation", "killed-while-writing-the-state"])
def test_a_killed_snapvit_search_resumes_to_the_uninterrupted_ranking(forker, tmp_path, monkeypatch, torn):
    assert CASES[0].name == "vit"
    generation = kill_mid_run(forker, SNAPVIT_CHILD, tmp_path, _search_generation, last=TINY["max_generations"],
                              torn=torn)
    assert 1 <= generation < 5 and bool(_temporaries(tmp_path)) == torn
    if torn:  # the write that was cut short never replaced the state before it
        assert generation == 2
    full_pruner, full = fit(hs.SnapViTConfig(**TINY))

    def no_gradients(*args, **kwargs):
        raise AssertionError("the resumed run recomputed what the saved state holds")

    with monkeypatch.context() as patch:
        patch.setattr(snapvit_module, "gradient_scores", no_gradients)
        pruner, resumed = fit(hs.SnapViTConfig(**TINY, checkpoint_every=1, output_dir=str(tmp_path)))
    assert pruner.resumed_from_ == generation
    assert_same_ranking(resumed, full)
    assert pruner.history_ == full_pruner.history_
    assert json.loads((tmp_path / STATE_FILE).read_text())["generations"] == 5
    assert not _temporaries(tmp_path)  # the torn write's leftover went with the next save
    # The finished state answers a rerun without searching again: the one evaluation left is the search's mean, the
    # result, for its own loss.
    evaluate, evaluated = snapvit_module.EmbeddingFitness.batch_loss, []

    def counted(self, rankings, candidates, **kwargs):
        evaluated.append(len(candidates))
        return evaluate(self, rankings, candidates, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(snapvit_module, "gradient_scores", no_gradients)
        patch.setattr(snapvit_module.EmbeddingFitness, "batch_loss", counted)
        again_pruner, again = fit(hs.SnapViTConfig(**TINY, checkpoint_every=1, output_dir=str(tmp_path)))
    assert again_pruner.resumed_from_ == 5 and evaluated == [1]
    assert_same_ranking(again, full)


def test_a_search_interrupted_in_a_partial_generation_resumes_to_the_same_ranking(tmp_path, monkeypatch):
    # 7 evaluations with a population of 3: two updates, then a partial generation of 1 candidate.
    settings = {**TINY, "max_generations": None, "max_evaluations": 7, "population_size": 3}
    _, full = fit(hs.SnapViTConfig(**settings))
    config = hs.SnapViTConfig(**settings, checkpoint_every=2, output_dir=str(tmp_path))
    with monkeypatch.context() as patch:
        patch.setattr(snapvit_module.EmbeddingFitness, "batch_loss", interrupted_in_generation(3))
        with pytest.raises(KeyboardInterrupt):
            fit(config)
    assert _search_generation(tmp_path) == 2
    pruner, resumed = fit(config)
    assert pruner.resumed_from_ == 2 and resumed.provenance["search"]["evaluations"] == 7
    assert_same_ranking(resumed, full)


def test_a_saved_search_of_other_settings_data_or_model_is_refused(tmp_path):
    config = hs.SnapViTConfig(**{**TINY, "max_generations": 1}, checkpoint_every=1, output_dir=str(tmp_path))
    fit(config)
    with pytest.raises(ConfigError, match=r"settings\.sigma \(saved 0\.5, now 0\.4\)"):
        fit(hs.SnapViTConfig(**{**TINY, "max_generations": 1, "sigma": 0.4}, checkpoint_every=1,
                             output_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="fitness_pixels"):
        fit(config, data=images(12, seed=5))
    other = CASE["vit"].build()
    with torch.no_grad():
        next(other.parameters()).add_(1e-3)
    with pytest.raises(ConfigError, match="model.weights"):
        fit(config, model=other)
    # Where and how often the state is saved is not a setting of the search.
    fit(hs.SnapViTConfig(**{**TINY, "max_generations": 1}, checkpoint_every=3, output_dir=str(tmp_path)))
    (tmp_path / STATE_FILE).write_text('{"format": 1, "key": ')  # a torn file from some other writer
    with pytest.raises(ConfigError, match="cannot be read.*delete it"):
        fit(config)
    # A state of the layout before each generation's mean was recorded is refused by its format, not misread.
    (tmp_path / STATE_FILE).write_text('{"format": 1, "key": {}, "best_factors": []}')
    with pytest.raises(ConfigError, match="format 1, this version reads format 2.*delete it"):
        fit(config)


def test_checkpointing_options_are_checked_and_not_part_of_the_ranking(tmp_path):
    with pytest.raises(ConfigError, match=r"checkpoint_every=2\) needs output_dir"):
        hs.SnapViTConfig(checkpoint_every=2)
    with pytest.raises(ConfigError, match="checkpoint_every=0"):
        hs.SnapViTConfig(checkpoint_every=0, output_dir="x")
    with pytest.raises(ConfigError, match="output_dir=3"):
        hs.SnapViTConfig(output_dir=3)
    assert hs.SnapViTConfig.preset("fast", checkpoint_every=2, output_dir=tmp_path).preset_name() == "fast"
    assert hs.SnapViTConfig(output_dir=tmp_path).output_dir == str(tmp_path)
    _, plain = fit(hs.SnapViTConfig(**{**TINY, "max_generations": 2}))
    _, saved = fit(hs.SnapViTConfig(**{**TINY, "max_generations": 2}, checkpoint_every=1, output_dir=str(tmp_path)))
    assert_same_ranking(saved, plain)  # the provenance names neither option, nor the local folder
    assert "output_dir" not in saved.provenance["settings"]
    assert str(tmp_path) not in json.dumps(saved.sorted().to_dict())


# ------------------------------------------------------------------------------------------------------ recovery
@pytest.mark.parametrize("torn", [False, True], ids=["killed-in-a-step", "killed-while-writing-the-state"])
def test_a_killed_recovery_resumes_to_the_uninterrupted_weights_and_record(forker, tmp_path, torn):
    assert CASES[1].name == "vit-cls"
    step = kill_mid_run(forker, RECOVERY_CHILD, tmp_path, _recovery_step, last=RECOVERY["steps"], torn=torn)
    assert 1 <= step < RECOVERY["steps"] and bool(_temporaries(tmp_path)) == torn
    if torn:
        assert step == 2
    teacher = CASE["vit-cls"].build()
    full, full_summary = recover(student_of(teacher), teacher, recovery_pixels(), RecoveryConfig(**RECOVERY),
                                 show_progress=False)
    resumed, summary = recover(student_of(teacher), teacher, recovery_pixels(),
                               RecoveryConfig(**RECOVERY, checkpoint_every=1, output_dir=str(tmp_path)),
                               show_progress=False)
    assert summary.resumed_from == step and summary.losses == full_summary.losses
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), full.state_dict().values()))
    # The held-out check compares with the weights before training, not with those the killed run left.
    assert summary.held_out == full_summary.held_out and summary.held_out["sizes"]
    record, expected = dict(resumed.config.elastic_recovery), dict(full.config.elastic_recovery)
    for entry in (record, expected):
        entry.pop("seconds")
        entry["settings"] = {k: v for k, v in entry["settings"].items() if k not in ("checkpoint_every", "output_dir")}
    assert record == expected
    assert not _temporaries(tmp_path)  # a state is about three models' size: the torn write's leftover is gone
