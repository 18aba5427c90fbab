"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (``mkstemp`` creates files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on a clean exit it replaces ``path``, on an error it is removed.

    Args:
        path: The file to write; its folder is created.
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        **open_kwargs: Passed to ``os.fdopen`` (e.g. ``encoding``, ``newline``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, mode, **open_kwargs) as handle:
            yield handle
        os.chmod(temporary, default_file_mode())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)
