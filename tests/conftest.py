"""pytest set-up: offline Hub, one torch thread, quiet transformers, the `case` fixture over every tiny architecture,
a tiny elastic checkpoint and model card heatmaps shared by the session, the folders the CLI's tests run on, and the
session's one multi-process launch (tests/launched.py)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# Before transformers and huggingface_hub are imported: they read these settings once, at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# One intra-op thread, here and (through the environment) in the processes tests start, unless the caller sets one: the
# tiny models' kernels are too small for a thread pool, and on a shared 2-vCPU machine its synchronisation cost several
# times the work (test_snapvit.py and test_slicing.py: 91 s with torch's default threads, 12 s with one).
THREADS = int(os.environ.setdefault("OMP_NUM_THREADS", "1"))

import pytest
import torch
from transformers.utils import logging

torch.set_num_threads(THREADS)

logging.set_verbosity_error()
logging.disable_progress_bar()

from helpers import CASES, PROCESSOR, Case, save_tiny_vit_folder, write_image_parquet  # noqa: E402
from support.hub import FakeHub  # noqa: E402


@pytest.fixture(params=CASES, ids=lambda c: c.name)
def case(request) -> Case:
    return request.param


@pytest.fixture
def hub(monkeypatch) -> FakeHub:
    """The Hub's stand-in, installed at the ``HfApi`` boundary for one test: what each commit would hold."""
    fake = FakeHub()
    fake.install(monkeypatch)
    return fake


@pytest.fixture
def no_accelerator(monkeypatch):
    """As in a fresh process: no Accelerator yet and no mixed precision in the environment."""
    from accelerate.state import AcceleratorState

    monkeypatch.setattr(AcceleratorState, "_shared_state", {})  # as in a fresh process: no Accelerator yet
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    return monkeypatch


@pytest.fixture
def fresh_process(monkeypatch):
    """hf_snapvit's per-process caches emptied for the test: the discovered specs, the parsed stored specs, the stored
    specs already held to a model, and the proven specs. The test discovers, reads and proves from scratch, as a new
    process would (test files use it as ``pytestmark = pytest.mark.usefixtures("fresh_process")``)."""
    from hf_snapvit.architectures import discovery
    from hf_snapvit.surgery import proof

    monkeypatch.setattr(discovery, "_DISCOVERED", {})
    monkeypatch.setattr(discovery, "_STORED", {})
    monkeypatch.setattr(discovery, "_CHECKED", set())
    monkeypatch.setattr(proof, "_PROVEN", set())


def pytest_configure(config) -> None:
    """The processes tests start (a worker module under ``accelerate launch``, ``python -c``) import the tests' shared
    modules as the tests do: pyproject's ``pythonpath`` folders go on their PYTHONPATH too."""
    folders = [str(path) for path in config.getini("pythonpath")]
    os.environ["PYTHONPATH"] = os.pathsep.join([*filter(None, [os.environ.get("PYTHONPATH")]), *folders])
    config.addinivalue_line("markers", "launched(scenario): the test reads SCENARIO of tests/launched.py from the "
                            "session's one 2-process launch, through the `launched` fixture")


def _heatmap_key(ranking, sparsities) -> tuple:
    """Everything of ``ranking`` (its timings aside, which no heatmap shows) and the rows: equal keys, equal PNGs."""
    import numpy as np

    parts = []
    for name, value in sorted(vars(ranking).items()):
        if name == "_cache":
            continue
        if name == "provenance":
            value = {k: v for k, v in value.items() if k != "timings"}
        parts.append((name, (value.shape, value.dtype.str, value.tobytes()) if isinstance(value, np.ndarray)
                      else repr(value)))
    return type(ranking).__name__, tuple(parts), tuple(float(s) for s in sparsities)


@pytest.fixture(autouse=True, scope="session")
def draw_each_card_heatmap_once():
    """A saved model card's heatmap is drawn once per distinct ranking and rows in the session; a later save of the
    same ranking writes the same PNG bytes through the same atomic write (a full disk still fails it).

    Drawing the heatmap (matplotlib) is most of a tiny save's time, and many tests save the same tiny ranking. The
    drawing itself is tested with fresh draws: ``plot_allocation`` is left alone (tests/plots, ``inspect --plot``);
    only the card writer's name for it is wrapped, and without matplotlib it is the real one."""
    from hf_snapvit.cards import elastic
    from hf_snapvit.utils.files import atomic_file

    real, drawn = elastic.plot_allocation, {}

    def plot_allocation(ranking, path, sparsities, **kwargs):
        if kwargs or sys.modules.get("matplotlib", False) is None:
            return real(ranking, path, sparsities=sparsities, **kwargs)
        key = _heatmap_key(ranking, sparsities)
        if key not in drawn:
            real(ranking, path, sparsities=sparsities)
            drawn[key] = path.read_bytes()
            return None
        with atomic_file(path, "wb") as handle:
            handle.write(drawn[key])
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(elastic, "plot_allocation", plot_allocation)
        yield


class _Checkpoints(dict):
    """``name -> folder``, each folder written when its name is first looked up."""

    def __init__(self, write: Callable[[str], Path]) -> None:
        super().__init__()
        self._write = write

    def __missing__(self, name: str) -> Path:
        self[name] = self._write(name)
        return self[name]


@pytest.fixture(scope="session")
def elastic(tmp_path_factory) -> dict[str, Path]:
    """``elastic[name]``: folder of an elastic checkpoint of the tiny ``name`` model of ``helpers.CASES``, ranked at
    random (seed 1: every unit moves, so sizes differ in every block), without a model card (drawing its heatmap is
    most of a save's time); written on first use, once per session; tests must not modify it."""
    import hf_snapvit as hs

    cases = {c.name: c for c in CASES}

    def write(name: str) -> Path:
        model, folder = cases[name].build(), tmp_path_factory.mktemp(f"random-{name}")
        hs.save_elastic(model, hs.rank(model, method="random", seed=1), folder, model_card=False)
        return folder

    return _Checkpoints(write)


@pytest.fixture(scope="session")
def tiny_elastic(tmp_path_factory):
    """``tiny_elastic(name)``: folder of an elastic checkpoint (magnitude ranking, :data:`helpers.PROCESSOR` saved
    beside it) of the tiny ``name`` model of ``helpers.CASES``, written once per session; tests must not modify it."""
    import hf_snapvit as hs

    cases = {c.name: c for c in CASES}
    built = {}

    def build(name: str):
        if name not in built:
            model = cases[name].build()
            built[name] = tmp_path_factory.mktemp(f"elastic-{name}")
            hs.save_elastic(model, hs.rank(model, method="magnitude"), built[name], image_processor=PROCESSOR)
        return built[name]

    return build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A dense model folder, ``vit-dense``: the 2-block tiny ViT classifier and its 32-px image processor."""
    return save_tiny_vit_folder(tmp_path_factory.mktemp("model") / "vit-dense")


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    """24 labelled random images in one parquet file."""
    return write_image_parquet(tmp_path_factory.mktemp("data") / "calib.parquet")


@pytest.fixture(scope="module")
def elastic_dir(model_dir, tmp_path_factory):
    """An elastic checkpoint of ``model_dir``, ``vit-elastic``, written by the library (magnitude ranking)."""
    import hf_snapvit as hs
    import transformers

    folder = tmp_path_factory.mktemp("elastic") / "vit-elastic"
    model = transformers.ViTForImageClassification.from_pretrained(model_dir).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(model_dir)
    hs.save_elastic(model, hs.rank(model, method="magnitude"), folder, image_processor=processor)
    return folder


@dataclass
class LaunchedRun:
    """One scenario's folders: in the one-process reference (``one``) and in the 2-process launch (``two``)."""

    one: Path
    two: Path
    inputs: Path

    def output(self, which: str, stream: str = "stderr") -> str:
        """The ``stream`` of every process of run ``which`` ("one" or "two") during the scenario, rank by rank."""
        folder = getattr(self, which)
        return "".join((folder / f"{stream}.rank{rank}").read_text() for rank in range(1 if which == "one" else 2))


class Launch:
    """tests/launched.py's scenarios run under ``root``: ``root/inputs``, ``root/one`` (the reference) and
    ``root/two`` (the launch), and ``root/launch.json``, how each run ended."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def start(self, names: list[str]) -> None:
        """Write the inputs, run the launch and the reference at once, and record how each ended."""
        import launched

        launched.write_inputs(self.root / "inputs")
        env = dict(os.environ, ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   HF_HUB_DISABLE_PROGRESS_BARS="1", PYTHONWARNINGS="ignore")
        env.pop("PYTHONHASHSEED", None)  # every process its own hash seed (the draw scenario shows it is irrelevant)
        script = [launched.__file__, str(self.root / "inputs")]
        # On a CPU-only machine the config's MULTI_GPU is what makes accelerate start N processes (torchrun);
        # hf_snapvit then joins them over gloo (distributed.process_state).
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                  str(launched.ROOT / "examples" / "accelerate_config.yaml"), "--main_process_port",
                  str(launched.free_port()), *script, str(self.root / "two"), *names]
        alone = [sys.executable, *script, str(self.root / "one"), *names]
        processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      cwd=launched.ROOT) for command in (launch, alone)]
        record = {}
        try:
            for which, process in zip(("two", "one"), processes):
                try:
                    _, err = process.communicate(timeout=600)
                except subprocess.TimeoutExpired:
                    process.kill()
                    _, err = process.communicate()
                record[which] = {"returncode": process.returncode, "stderr": err[-4000:]}
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        (self.root / "launch.json").write_text(json.dumps(record))

    def __call__(self, name: str) -> LaunchedRun:
        """The folders of scenario ``name``; fails the test (with the runs' stderr) if a process did not finish it."""
        run = LaunchedRun(self.root / "one" / name, self.root / "two" / name, self.root / "inputs")
        missing = [f"{which} rank {rank}" for which, ranks in (("one", 1), ("two", 2)) for rank in range(ranks)
                   if not (getattr(run, which) / f"done.rank{rank}").exists()]
        if missing:
            record = json.loads((self.root / "launch.json").read_text())
            scenario = {which: (getattr(run, which) / "stderr.rank0").read_text()[-3000:]
                        for which in ("one", "two") if (getattr(run, which) / "stderr.rank0").exists()}
            pytest.fail(f"scenario {name!r} not finished by {missing}: {record}; its stderr: {scenario}")
        return run


@pytest.fixture(scope="session")
def launches(request, tmp_path_factory) -> Launch:
    """The session's launch of every scenario a collected test names in its ``launched`` mark, in
    ``launched.SCENARIOS`` order: run once per session; with pytest-xdist, the first worker to ask runs it under a
    file lock and the others read its folder."""
    from launched import SCENARIOS

    wanted = {mark.args[0] for item in request.session.items for mark in item.iter_markers("launched")}
    names = [name for name in SCENARIOS if name in wanted]
    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    base = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.mktemp("launched")
    launch = Launch(base / f"launch-{'-'.join(names)}")
    launch.root.mkdir(exist_ok=True)
    with open(base / f"{launch.root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held until the launch is recorded; released when the file closes
        if not (launch.root / "launch.json").exists():
            launch.start(names)
    return launch


@pytest.fixture
def launched(request, launches) -> LaunchedRun:
    """The folders (``.one``, ``.two``, ``.inputs``) of the scenario named by the test's ``launched`` mark."""
    return launches(request.node.get_closest_marker("launched").args[0])
