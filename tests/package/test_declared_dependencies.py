"""Every third-party package the project's code imports is declared in pyproject.toml (a dependency or an extra).

A package that is merely present (installed by hand, or pulled in by another package) hides a missing declaration
until a user installs into a fresh environment; this test catches it in the fast lane, before CI."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests", "benchmarks", "examples")
PROJECT = "hf-snapvit"


def normalise(name: str) -> str:
    """A distribution name in PEP 503 normal form (``Pillow`` and ``pillow``, ``torch_pruning`` and ``torch-pruning``
    are the same distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution a PEP 508 requirement string names (``"torch>=2.6"`` -> ``torch``)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"cannot read a distribution name from the requirement {requirement!r}")
    return normalise(match.group(1))


def declared_distributions(pyproject: Path = ROOT / "pyproject.toml") -> set[str]:
    """The distributions pyproject.toml declares: its dependencies and every extra, the project's own extras
    (``hf-snapvit[all]``) resolved to what they contain."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed metadata holds the same lists
        requirements = importlib.metadata.requires(PROJECT) or []
    else:
        project = tomllib.loads(pyproject.read_text())["project"]
        requirements = list(project["dependencies"])
        for extra in project.get("optional-dependencies", {}).values():
            requirements.extend(extra)
    names = {requirement_name(r) for r in requirements}
    names.discard(PROJECT)
    return names


def imported_top_levels(path: Path) -> set[str]:
    """The top-level module names ``path`` imports absolutely, anywhere in the file (lazy imports in functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def first_party(files: list[Path]) -> set[str]:
    """The project's own import names: its packages under src/ and the sibling scripts and packages tests and
    benchmarks import from their own folders (``helpers``, ``support``, ``recovery_vit_tiny``)."""
    names = {p.stem for p in files}
    names.update(p.parent.name for p in files if p.name == "__init__.py" and p.parent.parent.name == "tests")
    names.update(p.name for p in (ROOT / "src").iterdir() if (p / "__init__.py").is_file())
    return names


def undeclared_imports(files: list[Path], declared: set[str]) -> dict[str, list[str]]:
    """For each imported third-party module that no declared distribution provides, the files importing it. A module
    no installed distribution provides counts as undeclared too (nothing a fresh install makes would supply it),
    unless it is a declared distribution's own name: an extra this environment left out (CI's lowest-versions lane
    installs no timm, whose torchvision must match torch)."""
    providers = importlib.metadata.packages_distributions()
    own = first_party(files)
    missing: dict[str, list[str]] = {}
    for path in files:
        for module in imported_top_levels(path):
            if module in sys.stdlib_module_names or module in own:
                continue
            if module not in providers and normalise(module) in declared:
                continue
            if not declared & {normalise(d) for d in providers.get(module, [])}:
                missing.setdefault(module, []).append(str(path.relative_to(ROOT)))
    return missing


def project_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py") if "egg-info" not in str(p))


def test_every_imported_third_party_package_is_declared():
    missing = undeclared_imports(project_files(), declared_distributions())
    assert not missing, (
        "these imports are not declared in pyproject.toml (a fresh `pip install -e .[test]` would not install "
        f"them): {missing}; add each one's distribution to `dependencies` or to an extra"
    )


def test_the_check_flags_an_import_that_only_arrives_through_another_package(tmp_path, monkeypatch):
    # PyYAML is installed (transformers needs it) but the project declares it nowhere: importing it must be flagged.
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "src").mkdir()
    script = tmp_path / "uses_yaml.py"
    script.write_text("import json\nimport torch\n\ndef load():\n    from yaml import safe_load\n    return safe_load\n")
    declared = declared_distributions(Path(__file__).resolve().parents[2] / "pyproject.toml")
    assert "pyyaml" not in declared and "torch" in declared
    assert undeclared_imports([script], declared) == {"yaml": ["uses_yaml.py"]}


def test_the_check_flags_an_import_nothing_installed_provides(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "src").mkdir()
    script = tmp_path / "uses_missing.py"
    script.write_text("from no_such_distribution_anywhere.sub import thing\n")
    assert undeclared_imports([script], {"torch"}) == {"no_such_distribution_anywhere": ["uses_missing.py"]}
    # Declared but not installed here (an extra this environment leaves out): not flagged.
    assert undeclared_imports([script], {"torch", "no-such-distribution-anywhere"}) == {}


@pytest.mark.parametrize(
    "requirement, name",
    [("torch>=2.6", "torch"), ("hf-snapvit[plots,eval]", "hf-snapvit"), ("Pillow>=10", "pillow"),
     ("torch_pruning >= 1.5", "torch-pruning"), ("transformers>=5.18,<6", "transformers")],
)
def test_requirement_names_are_read_in_normal_form(requirement, name):
    assert requirement_name(requirement) == name


def _floors_script():
    """``.ci/floors.py`` as a module: what CI's lowest-versions lane pins the dependencies with."""
    spec = importlib.util.spec_from_file_location("ci_floors", ROOT / ".ci" / "floors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_lowest_versions_lane_pins_every_dependency_to_its_declared_floor():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(pin.split("==") for pin in _floors_script().floors(["plots", "eval"]))
    expected = {}
    for requirement in project["dependencies"] + project["optional-dependencies"]["plots"] \
            + project["optional-dependencies"]["eval"]:
        expected[requirement_name(requirement)] = re.search(r">=\s*([0-9][^,;\s]*)", requirement).group(1)
    assert {normalise(name): floor for name, floor in pins.items()} == expected
    assert {"torch", "transformers", "huggingface-hub", "accelerate", "datasets", "safetensors"} <= set(expected)
    # The lane runs the files it names, and each exists (a renamed test file would silently drop out of it).
    run = (ROOT / ".ci" / "run").read_text()
    named = re.search(r"lowest_tests=\((.*?)\)", run, re.S).group(1).split()
    assert named and all((ROOT / name).is_file() for name in named), named
    assert "floors.py plots eval" in run and "--check plots eval" in run


def test_a_requirement_without_a_floor_or_an_unknown_extra_is_refused(tmp_path):
    floors = _floors_script().floors
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "p"\ndependencies = ["torch>=2.13", "numpy<3"]\n'
                         '[project.optional-dependencies]\nplots = ["matplotlib>=3.8.4", "p[x]"]\n')
    with pytest.raises(SystemExit, match=r"'numpy<3' in pyproject.toml has no '>=' floor"):
        floors([], pyproject)
    pyproject.write_text('[project]\nname = "p"\ndependencies = ["torch>=2.13", "transformers>=5.18,<6"]\n'
                         '[project.optional-dependencies]\nplots = ["matplotlib>=3.8.4", "p[x]"]\n')
    assert floors(["plots"], pyproject) == ["torch==2.13", "transformers==5.18", "matplotlib==3.8.4"]
    with pytest.raises(SystemExit, match=r"no extra \['nope'\].*its extras: \['plots'\]"):
        floors(["nope"], pyproject)
