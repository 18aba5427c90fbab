"""Where a checkpoint is: a local folder or a Hub repo id, and a clear error for a local one that holds none.

transformers takes a local path that does not exist for a malformed Hub repo id ("Repo id must be in the form ...")
and a folder without ``config.json`` for a config without ``model_type``; :func:`check_source` fails first, with our
message, and leaves Hub repo ids to transformers.
"""

from __future__ import annotations

import os

from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_NAME

from ..errors import CheckpointNotFoundError

_SAVED_BY = ("Give the folder that hf_snapvit.save_elastic(model, ranking, folder) or save_pretrained wrote (it holds "
             f"{CONFIG_NAME} and {SAFE_WEIGHTS_NAME})")


def looks_local(source: str | os.PathLike) -> bool:
    """Whether ``source`` can only mean a local path: a Hub repo id is ``name`` or ``owner/name``, so anything that
    starts with ``.``, ``/``, ``~`` or a drive letter, holds a backslash or more than one ``/`` is a path."""
    text = os.fspath(source)
    return (text.startswith((".", "/", "~", "\\")) or "\\" in text or text.count("/") > 1
            or (len(text) > 1 and text[1] == ":"))


def check_source(source: str | os.PathLike, subfolder: str | None = None, *, fix: str | None = None) -> None:
    """Fail early, and clearly, on a local checkpoint that is not there.

    transformers takes a local path that does not exist for a malformed Hub repo id ("Repo id must be in the form
    ..."), and a folder without ``config.json`` for a config without ``model_type``; a Hub repo id (``owner/name``)
    is left to transformers.

    Args:
        source: A local folder or a Hub repo id.
        subfolder: The checkpoint's folder inside ``source``.
        fix: Where a checkpoint comes from, as the caller makes one (the CLI names its command); default: the
            library's ``save_elastic`` / ``save_pretrained``.

    Raises:
        CheckpointNotFoundError: ``source`` looks like a local path and does not exist, is a file, or is a folder
            (or ``subfolder`` of one) without ``config.json``.
    """
    text, saved_by = os.fspath(source), fix or _SAVED_BY
    if not os.path.exists(text):
        if not looks_local(text):
            return
        where = os.path.abspath(os.path.expanduser(text))
        if text.startswith("~") and os.path.isdir(where):
            raise CheckpointNotFoundError(
                f"{text!r} does not exist: transformers does not expand '~', so it looks for a folder literally named "
                f"'~'. Pass the expanded path, os.path.expanduser({text!r}) = {where!r}.")
        raise CheckpointNotFoundError(
            f"{text!r} does not exist: there is no such folder on this machine ({where!r}), and it is not a Hub repo "
            f"id ('name' or 'owner/name'). {saved_by}, or a Hub repo id such as 'owner/name'.")
    if os.path.isfile(text):
        raise CheckpointNotFoundError(f"{text!r} is a file, not a checkpoint folder. {saved_by}: here probably "
                                      f"{os.path.dirname(text) or '.'!r}.")
    folder = os.path.join(text, subfolder) if subfolder else text
    if not os.path.isfile(os.path.join(folder, CONFIG_NAME)):
        raise CheckpointNotFoundError(f"No {CONFIG_NAME} in {folder!r} ({_folder_contents(folder)}), so it is not a "
                                      f"checkpoint. {_saved_in(folder, saved_by)}.")


def _folder_contents(folder: str) -> str:
    """What ``folder`` holds instead of a checkpoint."""
    if not os.path.isdir(folder):
        return "that folder does not exist"
    names = sorted(os.listdir(folder))
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"it holds {shown}" if names else "it is empty"


def _saved_in(folder: str, saved_by: str) -> str:
    """The fix for a folder without ``config.json``: the checkpoints one level down (a parent folder was given), else
    where a checkpoint comes from."""
    below = sorted(n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n, CONFIG_NAME))) \
        if os.path.isdir(folder) else []
    if below:
        return (f"It holds checkpoints one level down, in {', '.join(map(repr, below))}: pass that folder, or "
                f"subfolder={below[0]!r}")
    return saved_by
