"""pytest set-up: offline Hub, quiet transformers, and the `case` fixture over every tiny architecture."""

from __future__ import annotations

import os

# Before transformers and huggingface_hub are imported: they read these settings once, at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest
from transformers.utils import logging

logging.set_verbosity_error()
logging.disable_progress_bar()

from helpers import CASES, PROCESSOR, Case  # noqa: E402


@pytest.fixture(params=CASES, ids=lambda c: c.name)
def case(request) -> Case:
    return request.param


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
