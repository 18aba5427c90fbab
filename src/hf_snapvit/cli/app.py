"""The ``hf-snapvit`` command itself: the :data:`COMMANDS` rows, the parser built from them and :func:`main`, which
runs one subcommand with the package's logs and progress bars on stderr and turns bad input into one ``error:`` line
(exit status 2); the command's overview is :mod:`hf_snapvit.cli`."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..utils.distributed import finish_processes
from ..errors import SnapViTError
from . import bench as bench_command
from . import eval as eval_command
from . import export as export_command
from . import inspect as inspect_command
from . import prune as prune_command
from .models import resolve_model
from .options import common_options


@dataclass(frozen=True)
class Command:
    """One subcommand.

    Args:
        name: What the user types after ``hf-snapvit``.
        help: One line for ``hf-snapvit --help``.
        add_arguments: Adds the subcommand's options to its parser.
        run: Does the work; returns a JSON-able result, or ``None`` when this process has nothing to report (the
            non-main processes of a multi-process run).
        render: The result as text for stdout.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], dict[str, Any] | None]
    render: Callable[[dict[str, Any]], str]


COMMANDS: list[Command] = [
    Command("prune", "rank every head and FFN neuron of a model and write an elastic checkpoint",
            prune_command.add_arguments, prune_command.run, prune_command.render),
    Command("export", "write a sliced checkpoint of an elastic one at a budget",
            export_command.add_arguments, export_command.run, export_command.render),
    Command("inspect", "show an elastic checkpoint's ranking, keep counts, parameters and GFLOPs",
            inspect_command.add_arguments, inspect_command.run, inspect_command.render),
    Command("eval", "evaluate a checkpoint: top-1, k-NN, linear probe, representation retention",
            eval_command.add_arguments, eval_command.run, eval_command.render),
    Command("bench", "measure latency, load time and memory of an elastic checkpoint at several sparsities",
            bench_command.add_arguments, bench_command.run, bench_command.render),
]


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one ``error:`` line (exit status 2) instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``hf-snapvit`` parser, one subparser per row of :data:`COMMANDS`.

    Args:
        command: Give only this subcommand its options (every subcommand keeps its name and help line), so that a
            run imports what its own options need and no more (``inspect`` does not import the evaluation code).
            Default: every subcommand gets its options.
    """
    parser = _Parser(prog="hf-snapvit", description="Elastic vision transformers: rank once, load any size.")
    parser.add_argument("--version", action="version", version=f"hf_snapvit {__version__}")
    commands = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    common = common_options()
    for row in COMMANDS:
        sub = commands.add_parser(row.name, help=row.help, description=row.help, parents=[common])
        if command is None or command == row.name:
            row.add_arguments(sub)
        sub.set_defaults(command=row)
    return parser


@contextlib.contextmanager
def _logging_to_stderr(args: argparse.Namespace) -> Iterator[None]:
    """hf_snapvit's logs on the current stderr for the length of one call (main may run many times in a process)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package = logging.getLogger("hf_snapvit")
    previous_level, previous_propagate = package.level, package.propagate
    package.addHandler(handler)
    package.setLevel(logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO)
    package.propagate = False
    with _progress_bars_off(args.quiet):
        try:
            yield
        finally:
            package.removeHandler(handler)
            package.setLevel(previous_level)
            package.propagate = previous_propagate


@contextlib.contextmanager
def _progress_bars_off(quiet: bool) -> Iterator[None]:
    """With ``quiet``, no progress bars from transformers, datasets or huggingface_hub for the length of one call;
    each library's setting is restored afterwards."""
    if not quiet:
        yield
        return
    import datasets
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    switches = [(hf_logging.is_progress_bar_enabled(), hf_logging.disable_progress_bar,
                 hf_logging.enable_progress_bar),
                (not datasets.utils.are_progress_bars_disabled(), datasets.disable_progress_bars,
                 datasets.enable_progress_bars),
                (not hub_utils.are_progress_bars_disabled(), hub_utils.disable_progress_bars,
                 hub_utils.enable_progress_bars)]
    for _, disable, _ in switches:
        disable()
    try:
        yield
    finally:
        for was_on, _, enable in switches:
            if was_on:
                enable()


@contextlib.contextmanager
def _card_advice(args: argparse.Namespace) -> Iterator[None]:
    """A subcommand with ``--base-model``: the card's missing-base-model warning names that flag."""
    if not hasattr(args, "base_model"):
        yield
        return
    from ..cards.render import base_model_advice

    with base_model_advice("pass --base-model org/name (the Hub id the model was downloaded from)"):
        yield


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hf-snapvit`` with ``argv`` (default: ``sys.argv[1:]``).

    Args:
        argv: The command line without the program name.

    Returns:
        The exit status: 0 on success, 2 for bad input (one ``error: ...`` line on stderr), 130 when interrupted.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # The top-level parser has no option taking a value, so the first non-option word is the subcommand.
    parser = build_parser(next((word for word in argv if not word.startswith("-")), ""))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # --help / --version (0) or a usage error (2), already printed
        return exit.code if isinstance(exit.code, int) else 2
    with _logging_to_stderr(args):
        try:
            resolve_model(args)
            with _card_advice(args):
                result = args.command.run(args)
            finish_processes()  # a failure above ends this process, and accelerate then stops the others
        except KeyboardInterrupt:
            print("error: interrupted", file=sys.stderr)
            return 130
        # Bad input surfaces as one of these: hf_snapvit's own errors, transformers/datasets ValueErrors, and
        # OSErrors (missing files, unreachable Hub, FileNotFoundError, ConnectionError). Anything else is a bug
        # and keeps its traceback.
        except (SnapViTError, ValueError, OSError) as error:
            if args.verbose:
                traceback.print_exc()
            print(f"error: {' '.join(str(error).split()) or type(error).__name__}", file=sys.stderr)
            return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=_jsonable) if args.json else args.command.render(result))
    return 0


__all__ = ["COMMANDS", "Command", "build_parser", "main"]
