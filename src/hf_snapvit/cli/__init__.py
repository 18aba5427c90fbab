"""``hf-snapvit``: rank, export, inspect, evaluate and benchmark elastic checkpoints from the command line.

    hf-snapvit prune ../shared/models/vit-tiny-tinyimagenet \\
        --data ../shared/data/tiny-imagenet-200/train.parquet --preset fast --output vit-tiny-elastic
    hf-snapvit export vit-tiny-elastic --sparsity 0.3 --output vit-tiny-30
    hf-snapvit inspect vit-tiny-elastic --plot allocation.png
    hf-snapvit eval vit-tiny-elastic --sparsity 0.3 --data ../shared/data/tiny-imagenet-200
    hf-snapvit bench vit-tiny-elastic --sparsities 0.3 0.5
    accelerate launch --config_file examples/accelerate_config.yaml -m hf_snapvit prune ...

Every subcommand takes the model it works on as its first argument (``--model`` is deprecated; see
:mod:`.models`). The CLI parses arguments and calls the library, nothing more. Results go to stdout, as text or as
JSON with ``--json``; logs and progress bars go to stderr. Bad input ends the run with one ``error: ...`` line on
stderr and exit status 2. Subcommands are rows of :data:`COMMANDS` (in :mod:`.main`, with the parser and
:func:`main`), one module each: an arguments function, a run function returning a JSON-able dict, and a text
renderer.

The last stage: may import every other package.
"""

from __future__ import annotations

from .app import COMMANDS, Command, build_parser, main

__all__ = ["COMMANDS", "Command", "build_parser", "main"]
