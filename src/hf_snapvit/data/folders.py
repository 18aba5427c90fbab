"""Local image sources: whether a path means a local file rather than a Hub dataset id, and a clear error for one
that cannot hold images, before ``datasets`` reads it (an empty folder, or one of text files, would be read as an
empty or a text dataset and fail obscurely, or be reported as a Hub lookup)."""

from __future__ import annotations

import os
from pathlib import Path

from PIL import Image

from ..errors import DataError

_PATH_SUFFIXES = (".parquet", ".arrow", ".jpg", ".jpeg", ".png", ".webp", ".zip", ".tar", ".csv", ".json", ".jsonl")
# Files datasets reads tables from; with image files, what a folder of calibration images may hold.
_TABLE_SUFFIXES = (".parquet", ".arrow", ".csv", ".json", ".jsonl", ".tar")


def looks_like_path(source: str) -> bool:
    """True for a string meant as a local path rather than a Hub id (``name`` or ``org/name``)."""
    return (source.startswith((".", "/", "~", "\\")) or source.count("/") > 1 or "\\" in source
            or (len(source) > 1 and source[1] == ":") or source.lower().endswith(_PATH_SUFFIXES))


def check_image_source(source: str | os.PathLike) -> None:
    """Fail clearly on a local source that cannot hold images: a path that does not exist, or a folder with no image
    or data file anywhere below it (datasets would read it as an empty or a text dataset, and fail obscurely).

    Raises:
        DataError: Saying what was found, and what to give instead.
    """
    path = Path(source).expanduser()
    if not path.exists():
        if looks_like_path(str(source)):
            raise DataError(f"No such file or folder: {str(source)!r}. Give a .parquet file, a folder of parquet "
                            "files or images, or a Hub dataset id such as 'user/name'.")
        return  # a Hub dataset id
    if not path.is_dir():
        return
    images, others, count = set(Image.registered_extensions()), [], 0
    for _, folders, names in os.walk(path):
        folders[:] = sorted(f for f in folders if not f.startswith("."))  # caches, not data
        for name in sorted(names):
            if name.lower().endswith(_TABLE_SUFFIXES) or os.path.splitext(name)[1].lower() in images:
                return
            count += 1
            others += [name][:5 - len(others)]
    holds = f"it holds {', '.join(others)}" + (f" and {count - len(others)} more files" if count > len(others) else "")
    raise DataError(f"The folder {str(source)!r} holds no images ({holds if count else 'it is empty'}). Give the folder "
                    "the image files are in (.jpg, .png, ...; one sub-folder per class gives labels), a .parquet file "
                    "or a folder of them, or a Hub dataset id.")
