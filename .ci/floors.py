"""Print pip constraints that pin every dependency of pyproject.toml (and of the extras named on the command line) to
its declared floor: ``torch>=2.13`` becomes ``torch==2.13``. CI's lowest-versions lane installs through them, so the
floors it proves are the floors declared, by construction. A requirement without a ``>=`` floor is refused: it has no
lowest version to prove.

Usage: python .ci/floors.py [EXTRA ...] > constraints.txt
       python .ci/floors.py --check [EXTRA ...]   (in the installed environment: each installed version is its floor)
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


def check(extras: list[str]) -> str:
    """One line naming each pinned distribution's installed version; exits if one is not its floor (a constraint
    pip did not apply, or a distribution it could not find)."""
    import importlib.metadata

    def release(version: str) -> tuple[int, ...]:
        numbers = [int(n) for n in re.match(r"[0-9]+(?:\.[0-9]+)*", version).group(0).split(".")]
        return tuple(numbers + [0] * (4 - len(numbers)))

    found, wrong = [], []
    for pin in floors(extras):
        name, floor = pin.split("==")
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = "missing"
        found.append(f"{name} {installed}")
        if installed == "missing" or release(installed) != release(floor):
            wrong.append(f"{name} {installed} (floor {floor})")
    if wrong:
        raise SystemExit(f"floors.py: these are not installed at their floors: {', '.join(wrong)}")
    return ", ".join(found)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == ["--check"]:
        print(check(arguments[1:]))
    else:
        print("\n".join(floors(arguments)))
