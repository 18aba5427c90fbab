"""``python -m hf_snapvit ...`` (also what ``accelerate launch -m hf_snapvit ...`` runs): the ``hf-snapvit`` CLI."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
