"""What several subcommands share: argument types, the output and data options, and loading processors and images
from what the user typed (the model argument and its checks are :mod:`.models`'s)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, DataError


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def fraction(text: str) -> float:
    """argparse type: a sparsity in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1), e.g. 0.3")
    return value


def common_options() -> argparse.ArgumentParser:
    """The parent parser of every subcommand: ``--json``, ``--quiet``, ``--verbose``."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bars, warnings only on stderr")
    group.add_argument("-v", "--verbose", action="store_true", help="debug logs; tracebacks on errors")
    return common


def add_data_arguments(parser: argparse.ArgumentParser, *, required: bool, labels: bool = False,
                       what: str = "calibration images", default_count: str = "what the method needs") -> None:
    """The options :func:`load_data` reads: ``--data``, ``--split``, ``--image-column``, ``--num-samples``, ..."""
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=required, metavar="ID_OR_PATH",
                       help=f"{what}: a Hub dataset id, a .parquet file, a folder of parquet files or an image folder")
    group.add_argument("--split", default="train", help="dataset split (default: %(default)s)")
    group.add_argument("--image-column", default=None, metavar="C",
                       help="image column (default: detected from the dataset's features)")
    if labels:
        group.add_argument("--label-column", default="label", metavar="C",
                           help="label column for label-based methods (taylor-ce; default: %(default)s)")
    group.add_argument("--num-samples", type=positive_int, default=None, metavar="N",
                       help=f"images to read (default: {default_count})")
    group.add_argument("--stream-prefix", type=positive_int, default=None, metavar="N",
                       help="rows of a stream the draw reads at most, spread over its shards (default: 100000)")


def load_data(args: argparse.Namespace, num_samples: int, *, label_column: str | None = None,
              show_progress: bool = True) -> Any:
    """``num_samples`` images of ``--data``, drawn with ``--seed``, as :func:`hf_snapvit.data.images.load_image_dataset`
    returns them."""
    from ..data.images import load_image_dataset

    with data_option("--data"):
        return load_image_dataset(
            args.data, split=args.split, image_column=args.image_column, label_column=label_column,
            num_samples=num_samples, seed=args.seed, stream_prefix=args.stream_prefix, show_progress=show_progress,
        )


@contextlib.contextmanager
def data_option(option: str) -> Iterator[None]:
    """Errors about the images (and a Hub dataset that cannot be reached) name the option that gave them."""
    try:
        yield
    except (DataError, ConnectionError) as error:
        raise DataError(f"{option}: {error}") from error


def add_width_multiple(parser: argparse.ArgumentParser) -> None:
    """``--width-multiple``: the multiple kept FFN widths are rounded to."""
    parser.add_argument("--width-multiple", type=positive_int, default=None, metavar="M",
                        help="round kept FFN widths to multiples of M, so GPU kernels stay fast (default: 64 for FFNs "
                             "of >= 256 neurons, else exact; 1: exact widths)")


def output_folder(text: str) -> Path:
    """``--output`` as a folder to write a checkpoint to; an existing file there fails before any work."""
    output = Path(text)
    if output.exists() and not output.is_dir():
        raise CheckpointError(f"--output {text!r} is a file; give a folder for the checkpoint.")
    return output


def load_processor(name_or_path: str, *, required: bool) -> Any:
    """The image processor saved with ``name_or_path``; ``None`` when there is none and it is not ``required``."""
    from ..data.views import load_processor as load

    try:
        return load(name_or_path, purpose="preprocess the calibration images")
    except DataError as error:
        if not required:
            return None
        cause = error.__cause__ or error  # the loader's own words, without the library-call fix
        raise DataError(
            f"Cannot load the image processor of {name_or_path!r} ({' '.join(str(cause).split())}); the chosen "
            "method preprocesses images with it. Save one next to the model (preprocessor_config.json)."
        ) from error
