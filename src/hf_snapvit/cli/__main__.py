"""``python -m hf_snapvit.cli ...``: the same as ``python -m hf_snapvit ...``."""

import sys

from .app import main

if __name__ == "__main__":
    sys.exit(main())
