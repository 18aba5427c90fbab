"""Atomic writes of files and checkpoint folders: a reader sees the old version or the new one, never half of one.

:func:`public_name` is what everything we write (config.json, model cards, plots, JSON results, CLI output) calls a
model or folder: a Hub id as it is, a local path reduced to its folder name, so no file names the machine's paths.
A write that runs out of disk space fails with a :class:`~hf_snapvit.errors.DiskFullError` that says what was kept
(:func:`disk_full_reported`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

from ..elastic.file_names import CONFIG_FILE, WEIGHT_BOUND_FILES

from ..errors import CheckpointError, DiskFullError
from .sources import looks_local


def public_name(name_or_path: str | os.PathLike | None) -> str | None:
    """How files we write name a model or folder: a Hub id (``org/name``) as it is, a local path by its last
    component (``/home/me/models/vit-tiny`` -> ``vit-tiny``), a staging folder of :func:`atomic_directory` by the
    folder it becomes.

    A local path is one that is absolute, starts with ``.`` or ``~``, has a backslash or more than one ``/``, or
    exists on this machine; anything else (``org/name``, ``vit-tiny``) is kept, as transformers would resolve it
    on the Hub. ``None`` and ``""`` stay as they are.
    """
    if name_or_path is None:
        return None
    text = os.fspath(name_or_path)
    if not text:
        return text
    if not (looks_local(text) or os.path.isabs(text) or os.path.exists(text)):
        return text
    if os.path.exists(text) and (final := final_path(text)) != Path(os.path.abspath(text)):
        return final.name  # a folder being staged is named as the folder it becomes
    name = Path(text.replace("\\", "/").rstrip("/")).name
    return name or Path(text).resolve().name or text


# errno values of a full disk or quota, and how writers that wrap the OS error in their own exception spell them
# (safetensors raises SafetensorError("... No space left on device (os error 28)"), not an OSError).
_FULL = tuple(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code is not None)
_FULL_TEXT = tuple(os.strerror(code) for code in _FULL) + tuple(f"(os error {code})" for code in _FULL)


def disk_full_cause(error: BaseException) -> BaseException | None:
    """The error in ``error``'s chain (itself, then its causes and contexts) that says the disk or the quota is full,
    or ``None`` for any other failure. A :class:`DiskFullError` gives its own cause."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return current.__cause__ or current
        if (isinstance(current, OSError) and current.errno in _FULL) or any(t in str(current) for t in _FULL_TEXT):
            return current
        current = current.__cause__ or current.__context__
    return None


def _free_space(path: Path) -> str:
    """How much room the disk of ``path`` (or of its nearest existing parent) has left, as a sentence."""
    folder = next((p for p in (path, *path.parents) if p.exists()), path)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "How much space is free there could not be read."
    size = next(f"{free / 2**power:.1f} {unit}" for power, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B"))
                if free >= 2**power or power == 0)
    return f"That disk has {size} free now."


@contextlib.contextmanager
def disk_full_reported(place: str | os.PathLike, kept: str,
                       advice: str = "Free some space, or save to a folder on another disk.") -> Iterator[None]:
    """Turn an error raised inside that says the disk is full into a :class:`DiskFullError` about ``place``: what
    happened, ``kept`` (what is still as it was), the free space and ``advice``, with the original error as its
    ``__cause__`` and its ``errno``. Other errors, and a DiskFullError about ``place`` already, pass unchanged."""
    try:
        yield
    except Exception as error:
        cause = disk_full_cause(error)
        if cause is None or (isinstance(error, DiskFullError) and error.filename == os.fspath(place)):
            raise
        code = cause.errno if isinstance(cause, OSError) and cause.errno in _FULL else errno.ENOSPC
        raise DiskFullError(f"The disk is full: writing to {os.fspath(place)!r} failed ({type(cause).__name__}: "
                            f"{cause}). {kept} {_free_space(Path(place))} {advice}", code, os.fspath(place)) from cause


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (``mkstemp`` creates files 0600)."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
    """Open a temporary file next to ``path``; on a clean exit it replaces ``path``, on an error it is removed.

    Args:
        path: The file to write; its folder is created.
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        **open_kwargs: Passed to ``os.fdopen`` (e.g. ``encoding``, ``newline``).
    """
    path = Path(path)
    kept = f"{str(path)!r} is as it was" if path.exists() else f"{str(path)!r} was not created"
    with disk_full_reported(path, f"{kept}; the partial file was removed."):
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


def remove_torn_writes(path: str | os.PathLike) -> None:
    """Delete the temporary files :func:`atomic_file` left beside ``path`` in a process killed mid-write: nothing
    reads them, and a training state is several times a model's size. Only for a file one writer owns (a run's
    state), since another writer's file in progress has the same form."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)


# The staging folders of this process's atomic_directory writes in progress, each with the folder it becomes.
_STAGED: dict[Path, Path] = {}


def final_path(path: str | os.PathLike) -> Path:
    """Where ``path`` will be once the :func:`atomic_directory` write staging it is done: a staging folder (or a
    file in one) maps to the target folder (or that file in it); any other path is ``path`` itself, made absolute.
    Writers name folders by this, so nothing written names a staging folder."""
    absolute = Path(os.path.abspath(path))
    for staging, target in list(_STAGED.items()):
        if absolute == staging or staging in absolute.parents:
            return target / absolute.relative_to(staging)
    return absolute


@contextlib.contextmanager
def _staged(staging: Path, target: Path) -> Iterator[Path]:
    _STAGED[staging] = target
    try:
        yield staging
    finally:
        _STAGED.pop(staging, None)


# Files that make up the weights and config of a checkpoint; a save replaces all of them together.
_CHECKPOINT_FILES = WEIGHT_BOUND_FILES


# Weight files by the names transformers gives them (a single file, its shards and their index).
_WEIGHTS = re.compile(r"(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?")


def _is_checkpoint_file(name: str) -> bool:
    return name in _CHECKPOINT_FILES or (name.startswith(("model", "pytorch_model")) and
                                         name.endswith((".safetensors", ".bin")))


@contextlib.contextmanager
def atomic_directory(save_directory: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging folder; on success its files become ``save_directory``, as ``save_pretrained`` would
    have written them.

    * A new folder, or one that holds a checkpoint (``config.json`` and weights), is swapped in by renames: if the
      body raises or the process dies, ``save_directory`` is as it was. An interrupt between the two renames puts the
      old folder back; a save killed there is recovered, and its staging folders removed, by the next save. Files of
      the old folder that are not part of a checkpoint (a README, a preprocessor config not re-written) are carried
      over, symbolic links as links. The folder's mode is the old folder's, or for a new one the umask's.
    * Files and folders written into the staging folder get the modes the umask gives new ones.
    * Any other existing folder (the working directory or one holding it, a folder of other files, a symbolic link
      to a folder) is kept: the staged files are moved into it one by one, each atomically, ``config.json`` last,
      after the weight files of an earlier save that this one does not write (stale shards) are removed. Nothing
      else in it is touched.
    * A save that runs out of disk space raises a :class:`~hf_snapvit.errors.DiskFullError` once its staging folder
      is removed, saying that the previous checkpoint is untouched and how much space is free.
    * Inside another atomic write (``save_directory`` is its staging folder, as when a sliced model's
      ``save_pretrained`` is called on it), the files go straight into that folder: one atomic write, not two, and
      :func:`final_path` names the folder it becomes.

    Raises:
        CheckpointError: ``save_directory`` exists and is not a folder.
        DiskFullError: the disk (or quota) filled up; ``save_directory`` is as it was.
    """
    target = Path(os.path.abspath(save_directory))
    if target in _STAGED:  # the outer write moves these files into place with its own
        yield target
        return
    if os.path.lexists(target) and not target.is_dir():
        raise CheckpointError(
            f"Cannot save a checkpoint to {str(target)!r}: it is a file (or a broken link), not a folder. Choose a folder path (it is "
            "created if missing), or remove the file."
        )
    kept = (f"The previous checkpoint in {str(target)!r} is untouched" if target.is_dir() and _is_checkpoint(target)
            else f"The files already in {str(target)!r} are untouched" if target.is_dir()
            else f"Nothing was written to {str(target)!r}")
    with disk_full_reported(target, f"{kept}, and the partial save was removed."):
        target.parent.mkdir(parents=True, exist_ok=True)
        _clean_stale(target.parent, target.name, target)
        if target.is_dir() and (target.is_symlink() or _holds_working_directory(target) or not _is_checkpoint(target)):
            with _into_existing(target) as staging:
                yield staging
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-", dir=target.parent))
        try:
            with _staged(staging, target):
                yield staging
            _umask_modes(staging)
            os.chmod(staging, stat.S_IMODE(target.stat().st_mode) if target.exists() else 0o777 & ~_umask())
            if target.exists():
                _carry_over(target, staging)
                _swap(staging, target)
            else:
                os.rename(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _umask_modes(staging: Path) -> None:
    """Give the staged files and folders the modes the umask gives new ones (safetensors writes files 0600)."""
    umask = _umask()
    for root, folders, names in os.walk(staging):
        for name, mode in [(n, 0o777 & ~umask) for n in folders] + [(n, 0o666 & ~umask) for n in names]:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), mode)


def _is_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint: a ``config.json`` and weights."""
    names = {item.name for item in folder.iterdir()}
    return CONFIG_FILE in names and any(_is_checkpoint_file(n) for n in names - {CONFIG_FILE})


def _holds_working_directory(folder: Path) -> bool:
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    folder = folder.resolve()
    return cwd == folder or folder in cwd.parents


def _staging_pattern(name: str) -> re.Pattern:
    """Names of staging (``tmp``) and backup (``old``) folders for ``name``, with the pid of the saving process."""
    return re.compile(rf"\.{re.escape(name)}\.(tmp|old)-(?:(\d+)-)?[A-Za-z0-9_]+")


def _running(pid: str | None) -> bool:
    """Whether process ``pid`` may still be saving (folders of older versions carry no pid: never)."""
    if pid is None:
        return False
    if int(pid) == os.getpid() or os.name == "nt":  # on Windows, os.kill(pid, 0) would end the process
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _clean_stale(folder: Path, name: str, target: Path | None = None) -> None:
    """Remove the staging and backup folders of saves to ``name`` that were killed; if ``target`` is missing because
    a save was killed between its two renames, put the newest backup back first."""
    pattern = _staging_pattern(name)
    try:
        items = list(folder.iterdir())
    except OSError:  # a folder we may write to but not list: nothing to clean
        return
    stale = [(match.group(1), item) for item in items
             if (match := pattern.fullmatch(item.name)) and item.is_dir() and not item.is_symlink()
             and not _running(match.group(2))]
    backups = [item / "old" for kind, item in stale if kind == "old" and (item / "old").is_dir()]
    if target is not None and backups and not os.path.lexists(target):
        os.rename(max(backups, key=lambda old: old.stat().st_mtime), target)
    for _, item in stale:
        shutil.rmtree(item, ignore_errors=True)


def _carry_over(target: Path, staging: Path) -> None:
    """Copy the files of ``target`` that are not part of a checkpoint into ``staging``; links stay links."""
    leftovers = _staging_pattern("hf_snapvit")
    for item in target.iterdir():
        destination = staging / item.name
        if _is_checkpoint_file(item.name) or os.path.lexists(destination) or leftovers.fullmatch(item.name):
            continue
        if item.is_symlink():
            os.symlink(os.readlink(item), destination)
        elif item.is_dir():
            shutil.copytree(item, destination, symlinks=True)
        else:
            shutil.copy2(item, destination)


def _swap(staging: Path, target: Path) -> None:
    """Replace ``target`` by ``staging`` in two renames; an interrupt between them puts ``target`` back."""
    backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-{os.getpid()}-", dir=target.parent))
    old = backup / "old"
    try:
        os.rename(target, old)
        os.rename(staging, target)
    except BaseException:
        if old.exists() and not os.path.lexists(target):
            os.rename(old, target)
        raise
    finally:
        if os.path.lexists(target):  # else the old checkpoint is only in the backup: the next save restores it
            shutil.rmtree(backup, ignore_errors=True)


@contextlib.contextmanager
def _into_existing(target: Path) -> Iterator[Path]:
    """Stage inside ``target``, then move the staged files into it one by one (``config.json`` last)."""
    _clean_stale(target, "hf_snapvit")
    staging = Path(tempfile.mkdtemp(prefix=f".hf_snapvit.tmp-{os.getpid()}-", dir=target))
    try:
        with _staged(staging, target):
            yield staging
        _umask_modes(staging)
        staged = {item.name: item for item in staging.iterdir()}
        config = staged.pop(CONFIG_FILE, None)
        # Renames need next to no space, but a folder that grows may need a block: then say what is mixed.
        with disk_full_reported(target, f"Some of the new files may already be in {str(target)!r} next to the old "
                                "ones (a folder that is not a checkpoint is updated file by file); save again."):
            for item in staged.values():
                _replace(item, target / item.name)
            for stale in target.iterdir():  # the weights of an earlier, differently sharded save
                if _WEIGHTS.fullmatch(stale.name) and stale.name not in staged and not stale.is_dir():
                    stale.unlink()
            if config is not None:
                _replace(config, target / config.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace(item: Path, destination: Path) -> None:
    if destination.is_dir() and not destination.is_symlink():
        shutil.rmtree(destination)
    os.replace(item, destination)
