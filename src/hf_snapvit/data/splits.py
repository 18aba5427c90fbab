"""Opening one split of a dataset source: a ``.parquet`` or ``.arrow`` file, a folder (of split files, parquet shards
or images), or a Hub dataset id, streamed or prepared.

:func:`open_split` is the one path by which hf_snapvit opens a split: calibration images
(:func:`~hf_snapvit.data.images.load_image_dataset`) and evaluation splits (:func:`hf_snapvit.evaluation.load_split`)
both read through it, so a source that opens for one opens for the other, with the same errors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import DataError
from .folders import check_image_source

_FILE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow"}


def open_split(source: str | os.PathLike, split: str, *, streaming: bool, revision: str | None = None,
               token: str | bool | None = None) -> Any:
    """Split ``split`` of ``source`` as ``datasets.load_dataset`` reads it, every column as stored.

    A ``.parquet`` (``.arrow``) file is read through the ``parquet`` (``arrow``) builder as ``split``; a folder
    holding ``{split}.parquet`` through that file alone (preparing it prepares none of the folder's other splits);
    any other folder through the builder datasets infers from its files (``parquet``, or ``imagefolder`` for
    images, with sub-folder names as labels), its splits named by its file names; anything else as a Hub dataset
    id.

    Args:
        source: A file, a folder or a Hub dataset id (``"user/name"``).
        split: The split to read.
        streaming: ``True``: a lazy ``datasets.IterableDataset``; ``False``: a prepared ``datasets.Dataset``
            (datasets' cache).
        revision, token: For Hub datasets (a branch, tag or commit; a token for gated or private ones).

    Raises:
        DataError: A local path that does not exist or holds no images or data files, a single file that is not
            parquet or arrow, a split the source does not have, or a Hub dataset that cannot be reached.
    """
    import datasets

    check_image_source(source)
    path = Path(source).expanduser()
    if path.is_dir() and (path / f"{split}.parquet").is_file():
        path = path / f"{split}.parquet"
    kwargs: dict[str, Any] = {"split": split, "streaming": streaming}
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"Cannot read {str(source)!r} as a dataset: a single file must be .parquet or .arrow. For images, "
                "give the folder that holds them (one sub-folder per class is read as labels), or a Hub dataset id."
            )
        args: tuple[str, ...] = (builder,)
        kwargs["data_files"] = {split: str(path)}
    elif path.is_dir():
        args = (str(path),)  # datasets infers parquet / arrow / imagefolder and the splits from the file names
    else:
        args = (str(source),)
        kwargs.update(revision=revision, token=token)
    try:
        return datasets.load_dataset(*args, **kwargs)
    except (ConnectionError, FileNotFoundError) as error:  # also datasets' DatasetNotFoundError
        if path.exists():
            raise DataError(f"datasets cannot read the local {'folder' if path.is_dir() else 'file'} "
                            f"{str(source)!r}: {error}") from error
        raise DataError(
            f"Cannot load the dataset {str(source)!r}: {error}. It is not a local file or folder, so it was looked up "
            "on the Hub; check the id, the network, the token for gated datasets, and that HF_HUB_OFFLINE is unset."
        ) from error
    except ValueError as error:  # e.g. 'Unknown split "test". Should be one of [...]', or no data files
        raise DataError(f"Cannot load split {split!r} of {str(source)!r}: {error}") from error
