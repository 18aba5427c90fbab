"""Atomic writes of files and checkpoint folders: a reader sees the old version or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from transformers.utils import SAFE_WEIGHTS_INDEX_NAME


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


# Files that make up the weights and config of a checkpoint; a save replaces all of them together.
_CHECKPOINT_FILES = ("config.json", SAFE_WEIGHTS_INDEX_NAME, "pytorch_model.bin.index.json")


def _is_checkpoint_file(name: str) -> bool:
    return name in _CHECKPOINT_FILES or (name.startswith(("model", "pytorch_model")) and
                                         name.endswith((".safetensors", ".bin")))


@contextlib.contextmanager
def atomic_directory(save_directory: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging folder; on success it replaces ``save_directory`` in one rename.

    If the body raises (or the process dies), ``save_directory`` is untouched. Files already in ``save_directory``
    that are not part of a checkpoint (a README, a preprocessor config not re-written) are carried over.
    """
    target = Path(save_directory).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
        if target.exists():
            for item in target.iterdir():
                if not _is_checkpoint_file(item.name) and not (staging / item.name).exists():
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, staging / item.name)
            backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.rename(target, backup / "old")
            os.rename(staging, target)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            os.rename(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
