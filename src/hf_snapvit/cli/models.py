"""The model every subcommand works on: its argument, and the checks that make the commonest mistakes one line.

Every subcommand takes the model as its first positional argument (``hf-snapvit prune MODEL``, ``hf-snapvit
inspect ELASTIC``); ``--model MODEL`` still works until hf_snapvit :data:`MODEL_OPTION_REMOVED_IN`, with a warning.
A path that does not exist, a folder without a checkpoint, a Hub id that cannot be looked up, a dense model where
an elastic checkpoint is needed and a model that is no vision transformer each fail before any work, saying what
was found and the command that fixes it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, CheckpointNotFoundError, ConfigError, RankingFormatError
from ..utils.logs import get_logger

logger = get_logger("hf_snapvit.cli")

#: The release that drops ``--model`` (the model is the first positional argument of every subcommand).
MODEL_OPTION_REMOVED_IN = "0.2"
# Where each kind of checkpoint comes from, as the CLI makes it.
_DENSE_FIX = ("Give a model folder (what a transformers model's save_pretrained writes: config.json and "
              "model.safetensors)")
_ELASTIC_FIX = "Give the folder `hf-snapvit prune MODEL --output DIR` wrote (DIR: config.json and model.safetensors)"


def add_model_argument(parser: argparse.ArgumentParser, metavar: str, help: str) -> None:
    """The model as the first positional argument, and the deprecated ``--model`` (see :func:`resolve_model`)."""
    parser.add_argument("model", nargs="?", default=None, metavar=metavar, help=help)
    # Left out of --help: the usage shows one grammar; the warning tells those who still type it.
    parser.add_argument("--model", dest="model_option", default=None, metavar=metavar, help=argparse.SUPPRESS)
    parser.set_defaults(model_metavar=metavar)


def resolve_model(args: argparse.Namespace) -> None:
    """Set ``args.model`` from the positional argument or ``--model`` (with a deprecation warning).

    Raises:
        ConfigError: No model was given, or two different ones.
    """
    if not hasattr(args, "model_option"):
        return
    command, metavar, option = args.command.name, args.model_metavar, args.model_option
    if option is not None:
        if args.model is not None and args.model != option:
            raise ConfigError(f"Two models given, {args.model!r} and --model {option!r}: give one, first: "
                              f"hf-snapvit {command} {metavar} ...")
        logger.warning("--model is deprecated and will be removed in hf_snapvit %s: give the model first, "
                       "hf-snapvit %s %s ...", MODEL_OPTION_REMOVED_IN, command, option)
        args.model = option
    if args.model is None:
        raise ConfigError(f"No model given: hf-snapvit {command} {metavar} ... (see 'hf-snapvit {command} --help').")


@contextlib.contextmanager
def hub_lookup_explained(name: str, what: str) -> Iterator[None]:
    """A name that is no folder here is a Hub id to transformers: when that lookup fails (no network, no such repo),
    say so, and that a local folder of that name does not exist."""
    from ..utils.sources import looks_local

    try:
        yield
    except OSError as error:
        if isinstance(error, CheckpointNotFoundError) or os.path.exists(name) or looks_local(name):
            raise
        cause = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise CheckpointNotFoundError(
            f"{what} {name!r} is no folder here ({os.path.abspath(name)!r} does not exist), so it was looked up on "
            f"the Hub as a model id, and that failed: {cause} If you meant a local folder, correct the path; "
            "else check the id, the network and HF_HUB_OFFLINE.") from error


def model_config(name: str, what: str, *, elastic: bool) -> Any:
    """The config of the model ``name`` (argument ``what``), once the commonest mistakes are ruled out.

    Args:
        name: A local folder or a Hub id, as typed.
        what: How the message names the argument (``MODEL``, ``--dense-model``).
        elastic: The command needs an elastic (or sliced) checkpoint, not a dense model.
    """
    from transformers import AutoConfig

    from ..data.folders import looks_like_path
    from ..utils.sources import check_source

    fix = _ELASTIC_FIX if elastic else _DENSE_FIX
    if not Path(name).expanduser().exists() and looks_like_path(name):
        raise CheckpointNotFoundError(f"{what} {name!r}: no such folder ({os.path.abspath(name)!r}). {fix}, or a "
                                      "Hub id such as 'org/name'.")
    try:
        check_source(name, fix=fix)
    except CheckpointNotFoundError as error:
        raise CheckpointNotFoundError(f"{what}: {error}") from error
    with hub_lookup_explained(name, what):
        config = AutoConfig.from_pretrained(name)
    if elastic and getattr(config, "elastic_ranking", None) is None and getattr(config, "elastic_layout", None) is None:
        raise RankingFormatError(f"{what} {name!r} is not an elastic checkpoint: its config.json has no "
                                 f"'elastic_ranking'. Rank it first, `hf-snapvit prune {name} --output DIR`, and give "
                                 "DIR.")
    return config


def load_dense_model(name: str, what: str = "MODEL") -> Any:
    """The dense model ``name``, as the class its config names, in eval mode. A model type no registry holds is
    discovered in the loaded model, whose refusal (no images taken, hierarchical stages, ...) is then the message."""
    from ..architectures import get_spec, model_class
    from ..elastic.checkpoint import check_architecture
    from ..errors import UnsupportedArchitectureError

    config = model_config(name, what, elastic=False)
    check_architecture(config, name)  # else transformers would build another model type's class
    if getattr(config, "elastic_layout", None):
        raise CheckpointError(
            f"{what} {name!r} is a sliced checkpoint (config.elastic_layout is set); rank the dense model or the "
            "dense elastic checkpoint instead.")
    try:
        get_spec(config)  # a registered architecture it cannot prune fails before the weights are read
        discover = False
    except UnsupportedArchitectureError:
        discover = True  # the config alone shows no structure: the model itself does
    model = model_class(config).from_pretrained(name).eval()
    if discover:
        get_spec(model)
    return model


def check_base_model(base_model: str | None) -> None:
    """``--base-model`` must be a Hub model id, which is what the card's metadata links to."""
    from ..cards.sections import hub_id

    if base_model is not None and hub_id(base_model) is None:
        raise ConfigError(f"--base-model {base_model!r} is not a Hub model id: give the id of the model on the Hub, "
                          "'org/name' (e.g. google/vit-base-patch16-224).")
