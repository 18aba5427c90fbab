"""Reading images from sources that can fail part-way, without ever shortening a draw silently.

A stream read over the network can raise in the middle (``ConnectionError``, a timeout, any ``OSError``), and any
source can hold an item that is not a readable image:

* a transient error (:func:`transient_errors`) reopens the source and skips the items already read, up to
  :data:`STREAM_RETRIES` times in a row, waiting :data:`RETRY_DELAY_SECONDS` (doubling) in between. That needs a
  source whose ``iter()`` starts over with the same items in the same order: a seeded ``datasets`` stream, a list,
  an iterable object. A generator or iterator cannot start over, so its draw stops at the error;
* an item that cannot be decoded is skipped, logged with a running count, and the draw reads on to replace it; more
  than :data:`MAX_CORRUPT_FRACTION` corrupt items (and more than one) fails, since the source is then more likely
  damaged than holding a few bad images;
* a draw that an error cut short warns, naming the error and the images asked for and obtained, or fails if it
  obtained none (:meth:`Decoder.report`).

The decoding itself is passed in (:func:`hf_snapvit.data.images.to_rgb`, after a ``datasets.Image`` feature's own
decoding), so that :mod:`hf_snapvit.data.images` can use the retries too.
"""

from __future__ import annotations

import itertools
import sys
import time
import warnings
from typing import Any, Callable, Iterable, Iterator, Sequence

from PIL import UnidentifiedImageError

from ..errors import DataError
from ..utils.logs import get_logger

logger = get_logger(__name__)

#: Errors worth reopening a stream for: the network or the disk, not the data (``ConnectionError`` and
#: ``TimeoutError`` are ``OSError``s, as are requests' errors and huggingface_hub's HTTP errors). See
#: :func:`transient_errors` for the network libraries' own.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError,)
# The errors of the HTTP clients that datasets streams through, which are no OSErrors: (module, class) pairs, looked
# up only in modules already imported (a stream cannot have raised an error of a library never imported).
_CLIENT_ERRORS = (("httpx", "TransportError"), ("httpx2", "TransportError"), ("aiohttp", "ClientConnectionError"),
                  ("aiohttp", "ClientPayloadError"))
#: ``OSError``s that say something about the data, not the connection: retrying cannot help.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (FileNotFoundError, PermissionError, IsADirectoryError,
                                                     NotADirectoryError, UnidentifiedImageError)
#: Reopenings in a row, without an item read in between, before a stream is given up.
STREAM_RETRIES = 3
#: Seconds before the first reopening; each further one in a row waits twice as long (1, 2, 4 s).
RETRY_DELAY_SECONDS = 1.0
#: The largest share of the items looked at that may be corrupt (one is always allowed).
MAX_CORRUPT_FRACTION = 0.1


def transient_errors() -> tuple[type[BaseException], ...]:
    """:data:`TRANSIENT_ERRORS` and the connection errors of the HTTP clients (httpx, aiohttp) imported so far."""
    found = [getattr(sys.modules.get(module), name, None) for module, name in _CLIENT_ERRORS]
    return TRANSIENT_ERRORS + tuple(error for error in found if isinstance(error, type))


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class ResilientStream:
    """Iterates ``source`` once, reopening it after a transient error (see the module's description).

    Attributes:
        read: Items yielded so far.
        retries: Reopenings so far.
        failure: The error that ended the stream early, or ``None``.
        reopenable: Whether ``iter(source)`` starts over (``False`` for a generator or iterator).
    """

    def __init__(self, source: Iterable[Any], what: str, *, on_reopen: Callable[[], None] | None = None) -> None:
        self.source, self.what, self.on_reopen = source, what, on_reopen
        self.read = self.retries = 0
        self.failure: BaseException | None = None
        self.reopenable = True

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.source)
        self.reopenable = iterator is not self.source
        in_a_row = 0
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                return
            except transient_errors() as error:
                if isinstance(error, PERMANENT_ERRORS):
                    raise
                if not self.reopenable or in_a_row == STREAM_RETRIES:
                    self.failure = error
                    return
                delay = RETRY_DELAY_SECONDS * 2 ** in_a_row
                in_a_row += 1
                self.retries += 1
                logger.warning("The %s failed after %d items (%s); reopening it in %.3g s (retry %d of %d).",
                               self.what, self.read, _describe(error), delay, in_a_row, STREAM_RETRIES,
                               main_process_only=False)  # each process reads the stream itself
                time.sleep(delay)
                if self.on_reopen is not None:
                    self.on_reopen()
                iterator = itertools.islice(iter(self.source), self.read, None)  # the items read are read again
                continue
            in_a_row = 0
            self.read += 1
            yield item

    def failure_text(self) -> str:
        """Why the stream ended early, for an error message (``""`` when it did not)."""
        if self.failure is None:
            return ""
        why = (f"and still failed after {STREAM_RETRIES} retries" if self.reopenable else
               "and cannot be reopened: a generator or iterator reads once (pass a list or a datasets "
               "IterableDataset to have it retried)")
        return f"the {self.what} failed after {self.read} items ({_describe(self.failure)}) {why}"


class Decoder:
    """Decodes items with ``decode``, skipping (and logging and counting) the ones that cannot be decoded.

    A :class:`~hf_snapvit.errors.DataError` from ``decode`` (an unsupported type, pixel values already normalised)
    is the caller's mistake, not a corrupt item, and propagates.
    """

    def __init__(self, decode: Callable[[Any], Any], what: str) -> None:
        self.decode, self.what = decode, what
        self.looked_at = 0
        self.corrupt: list[str] = []

    def __call__(self, item: Any, where: str) -> Any:
        """The decoded image, or ``None`` for a corrupt item (``where`` names it in the log)."""
        self.looked_at += 1
        try:
            if item is None:
                raise ValueError("the image is missing")
            return self.decode(item)
        except DataError:
            raise
        except Exception as error:  # PIL alone raises many types for bad files (OSError, SyntaxError, ValueError)
            self.corrupt.append(where)
            logger.warning("Skipping corrupt image %s of the %s (%d skipped so far): %s", where, self.what,
                           len(self.corrupt), _describe(error))
            if len(self.corrupt) > max(1, MAX_CORRUPT_FRACTION * self.looked_at) and self.looked_at >= 10:
                self._fail()
            return None

    def _fail(self) -> None:
        shown = ", ".join(self.corrupt[:10]) + (" ..." if len(self.corrupt) > 10 else "")
        raise DataError(
            f"{len(self.corrupt)} of the {self.looked_at} images read from the {self.what} cannot be decoded "
            f"({shown}), more than the {MAX_CORRUPT_FRACTION:.0%} that are skipped: the data is likely damaged. "
            "Drop or re-encode those images.")

    def report(self, asked: int, obtained: int, stream: ResilientStream | None = None) -> None:
        """Fail or warn when fewer than ``asked`` images were obtained because of an error or corrupt items, or
        when an error ended the stream (a sample of a stream cut short comes from its first items only)."""
        if len(self.corrupt) > max(1, MAX_CORRUPT_FRACTION * self.looked_at):
            self._fail()
        failure = stream.failure_text() if stream is not None else ""
        if failure and obtained == 0:
            raise DataError(f"No calibration images: {failure}. Check the network (or the source) and retry.")
        if failure:
            warnings.warn(f"The calibration draw is incomplete: {failure}. It has {obtained} images, drawn from the "
                          f"{stream.read} items read, for the {asked} asked for.", UserWarning, stacklevel=3)
        elif self.corrupt and obtained < asked:
            warnings.warn(f"The calibration draw has {obtained} images, fewer than the {asked} asked for: the "
                          f"{self.what} ran out after {len(self.corrupt)} corrupt images were skipped.", UserWarning,
                          stacklevel=3)


def from_sequence(data: Sequence[Any], order: Iterable[int], count: int, decoder: Decoder) -> list[Any]:
    """The first ``count`` decodable items of ``data`` in ``order``; reading an item is retried like a stream."""
    images = []
    for index in order:
        if len(images) == count:
            break
        image = decoder(_item(data, int(index)), f"at index {int(index)}")
        if image is not None:
            images.append(image)
    return images


def _item(data: Sequence[Any], index: int) -> Any:
    attempt = 0
    while True:
        try:
            return data[index]
        except transient_errors() as error:
            if isinstance(error, PERMANENT_ERRORS):
                raise
            if attempt == STREAM_RETRIES:
                raise DataError(f"Reading item {index} of the calibration data failed {STREAM_RETRIES + 1} times "
                                f"({_describe(error)}); check the network or the storage it reads from.") from error
            delay = RETRY_DELAY_SECONDS * 2 ** attempt
            logger.warning("Reading item %d of the calibration data failed (%s); retrying in %.3g s.", index,
                           _describe(error), delay, main_process_only=False)  # this process's read
            time.sleep(delay)
            attempt += 1
