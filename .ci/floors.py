"""Print pip constraints that pin every dependency of pyproject.toml (and of the extras named on the command line) to
its declared floor: ``torch>=2.13`` becomes ``torch==2.13``. CI's lowest-versions lane installs through them, so the
floors it proves are the floors declared, by construction. A requirement without a ``>=`` floor is refused: it has no
lowest version to prove.

Usage: python .ci/floors.py [EXTRA ...] > constraints.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:[^;]*?)>=\s*([0-9][^,;\s]*)")


def floors(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """``name==floor`` for every dependency and every requirement of ``extras`` (the project's own, such as
    ``hf-snapvit[plots]``, are left out: what they name is listed by name)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"floors.py: no extra {unknown} in {pyproject.name}; its extras: {sorted(optional)}")
    requirements = list(project["dependencies"]) + [r for extra in extras for r in optional[extra]]
    pins = []
    for requirement in requirements:
        if requirement.startswith(project["name"] + "["):
            continue
        match = FLOOR.match(requirement)
        if match is None:
            raise SystemExit(f"floors.py: {requirement!r} in {pyproject.name} has no '>=' floor; give it one (the "
                             "lowest version that passes CI's lowest-versions lane)")
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


if __name__ == "__main__":
    print("\n".join(floors(sys.argv[1:])))
