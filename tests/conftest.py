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

from helpers import CASES, Case  # noqa: E402


@pytest.fixture(params=CASES, ids=lambda c: c.name)
def case(request) -> Case:
    return request.param
