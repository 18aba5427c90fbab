"""The prefix correction's file, kept importable here for one release: its format is written, read and applied in
:mod:`hf_snapvit.elastic.prefix_file`, beside the checkpoint's other files (import it from there)."""

from __future__ import annotations

from ..elastic.prefix_file import (COLUMN_TOLERANCE, FORMAT_VERSION, PREFIX_FILE, REFIT, PrefixFile, find_prefix_file,
                                   pack_lower, prefix_file_for, unpack_lower, write_prefix_file)

__all__ = ["COLUMN_TOLERANCE", "FORMAT_VERSION", "PREFIX_FILE", "REFIT", "PrefixFile", "find_prefix_file",
           "pack_lower", "prefix_file_for", "unpack_lower", "write_prefix_file"]
