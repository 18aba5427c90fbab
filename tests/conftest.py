"""pytest set-up: offline Hub, one torch thread, quiet transformers, the `case` fixture over every tiny architecture,
a tiny elastic checkpoint and model card heatmaps shared by the session, and the folders the CLI's tests run on."""

from __future__ import annotations

import os
import sys
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


def pytest_configure(config) -> None:
    """The processes tests start (a worker module under ``accelerate launch``, ``python -c``) import the tests' shared
    modules as the tests do: pyproject's ``pythonpath`` folders go on their PYTHONPATH too."""
    folders = [str(path) for path in config.getini("pythonpath")]
    os.environ["PYTHONPATH"] = os.pathsep.join([*filter(None, [os.environ.get("PYTHONPATH")]), *folders])


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
    drawing itself is tested with fresh draws: ``plot_allocation`` is left alone (test_plotting, ``inspect --plot``);
    only the card writer's name for it is wrapped, and without matplotlib it is the real one."""
    from hf_snapvit.cards import elastic
    from hf_snapvit.files import atomic_file

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
