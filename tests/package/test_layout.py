"""The package's shape: imports follow the data flow, modules and functions stay small, one home for errors.

Data flow, one package a stage: architectures -> surgery -> data -> elastic (the ranking format and checkpoints on
disk) -> correction, recovery -> cards (text) -> loading -> fitting, pruning -> benchmark -> evaluation -> publishing
-> cli.
A module may import only modules of its own or an earlier stage; loading a model never reaches the pruner,
publishing, evaluation, benchmarks, plots or the CLI, and no module of loading/ reaches correction, recovery or
fitting (the loader only loads); no module imports, even for type checking, a module that
imports it back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "hf_snapvit"

# Stage of each top-level module or package (or of a package's module of another stage), in data-flow order.
STAGES: dict[str, int] = {
    # Shared by every stage: the version, exceptions, and utils/ (argument checks, extras, atomic files, checkpoint
    # sources, accelerate's processes, precision, the loggers).
    "_version": 0, "errors": 0, "utils": 0,
    "elastic.file_names": 0,  # the checkpoint folder's file names, which the atomic folder write reads
    "architectures": 1,
    "surgery": 2,
    "data": 3,
    "elastic": 4,
    "correction": 5, "recovery": 5,
    # Text-only card pieces (no plotting, upload or evaluation): saving a sliced model writes its card.
    "cards": 6,
    "loading": 7,
    # Fitting a checkpoint to one size (hf_snapvit.correct), above the loader it hands its fit step to.
    "fitting": 8, "pruning": 8,
    "plots": 8,  # every plot hf_snapvit draws
    "benchmark": 9,
    "evaluation": 10,
    "cards.elastic": 11,  # the elastic checkpoint's card: plots and evaluation results
    "publishing": 12,
    "cli": 13, "__main__": 13, "__init__": 13,
}
LOADING = "hf_snapvit.loading.modeling"
# The text-only cards are allowed: a sliced model's save_pretrained writes its card (see cards.sliced).
NOT_FOR_LOADING = ("pruning", "evaluation", "benchmark", "cli", "publishing", "cards.elastic", "plots")
# The loader only loads: fitting a model to a size is hf_snapvit.fitting's, above it (loading runs its FitStep).
NOT_FOR_ANY_LOADING_MODULE = ("correction", "recovery", "fitting")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    names = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, list[str], int]]:
    """``(imported module, imported names, line)`` for every import in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((target, [alias.name for alias in node.names], node.lineno))
    return found


def _internal_targets(name: str) -> list[tuple[str, int]]:
    """Modules of this package that ``name`` imports (``from . import x`` counts as importing ``x``)."""
    out = []
    for target, names, line in _imports(name, MODULES[name]):
        if not target.startswith("hf_snapvit"):
            continue
        submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
        out += [(t, line) for t in submodules] or [(target, line)]
    return out


def _place(module: str) -> str:
    """The key of ``module`` in :data:`STAGES`: its own dotted name below hf_snapvit where it has one (a package's
    module of another stage, such as cards.elastic), else its top-level module or package."""
    inner = module.split(".", 1)[1] if "." in module else "__init__"
    return inner if inner in STAGES else inner.split(".")[0]


def _stage(module: str) -> int:
    top = _place(module)
    assert top in STAGES, f"{module} has no stage in tests/package/test_layout.py: give it one in data-flow order"
    return STAGES[top]


# The package's public surface and its entry point import from every stage.
@pytest.mark.parametrize("name", sorted(set(MODULES) - {"hf_snapvit", "hf_snapvit.__main__"}))
def test_imports_follow_the_data_flow(name):
    backward = [f"line {line}: {target} (stage {_stage(target)})" for target, line in _internal_targets(name)
                if _stage(target) > _stage(name)]
    assert not backward, f"{name} (stage {_stage(name)}) imports later stages: {backward}"


def _reached(start: str) -> set[str]:
    """Every module of this package that importing ``start`` imports, at any depth of the file (function bodies and
    ``TYPE_CHECKING`` blocks included) and through every module in between."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen or module not in MODULES:
            continue
        seen.add(module)
        todo += [t for t, _ in _internal_targets(module)]
    return seen


def test_loading_never_reaches_the_pruner_evaluation_or_publishing():
    reached = sorted(m for m in _reached(LOADING) if _place(m) in NOT_FOR_LOADING)
    assert not reached, f"loading ({LOADING}) imports {reached}"


def test_no_loading_module_reaches_correction_recovery_or_fitting():
    loading = [name for name in MODULES if _place(name) == "loading"]
    assert "hf_snapvit.loading.modeling" in loading and "hf_snapvit.loading.switchable" in loading
    reached = {name: sorted(m for m in _reached(name) if _place(m) in NOT_FOR_ANY_LOADING_MODULE) for name in loading}
    assert not any(reached.values()), f"loading modules that import correction, recovery or fitting: {reached}"


def test_no_module_imports_one_that_imports_it_back():
    graph = {name: {t for t, _ in _internal_targets(name) if t in MODULES and t != name} for name in MODULES}
    # A package's __init__ re-exports its modules: importing the package is importing them, so it is not a circle.
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    circles, state = [], {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, f"import circles: {circles}"


def test_the_top_level_shows_the_wings():
    modules = sorted(p.stem for p in SRC.glob("*.py") if p.stem not in ("__init__", "__main__"))
    packages = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())
    assert len(packages) >= 12 and len(modules) <= 9, (packages, modules)
    # Each wing says what it owns and what it may import.
    silent = [package for package in packages
              if "may import" not in (ast.get_docstring(ast.parse((SRC / package / "__init__.py").read_text())) or "")
              .lower()]
    assert not silent, f"packages whose __init__ docstring does not say what they may import: {silent}"


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for name, path in MODULES.items():
        for target, names, line in _imports(name, path):
            if target.startswith("hf_snapvit") and target != "hf_snapvit._version":
                offenders += [f"{name}:{line} imports {target}.{n}" for n in names if n.startswith("_")]
    assert not offenders, offenders


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_and_functions_are_small(name):
    tree = ast.parse(MODULES[name].read_text())
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{name} has {lines} lines (at most {MAX_MODULE_LINES}): split it by concern"
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_error_lives_in_errors_and_none_is_raised_bare():
    stray, bare = [], []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and name != "hf_snapvit.errors" and any(
                    isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception")) for b in node.bases):
                if not node.name.startswith("_"):  # private control-flow exceptions stay where they are used
                    stray.append(f"{name}.{node.name}")
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                    and isinstance(node.exc.func, ast.Name) and node.exc.func.id == "SnapViTError":
                bare.append(f"{name}:{node.lineno}")
    assert not stray, f"exceptions defined outside hf_snapvit.errors: {stray}"
    assert not bare, f"bare SnapViTError raised (use a specific subclass from hf_snapvit.errors): {bare}"


def test_every_error_is_a_snapvit_error_and_a_builtin():
    from hf_snapvit import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SnapViTError)
        if cls is not errors.SnapViTError:
            assert issubclass(cls, (ValueError, RuntimeError)), name


# Package __init__s allowed logic of their own (name -> why): none.
LOGIC_IN_THE_FACE: dict[str, str] = {}


def _face_logic(path: Path) -> list[str]:
    """What a package's ``__init__`` holds besides its docstring, imports, ``__all__``, registration calls and the
    PEP 562 lazy re-exports (``__getattr__``, ``__dir__`` and their table)."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    found = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (isinstance(node, ast.Expr)
                                                               and isinstance(node.value, ast.Call)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names = [t.id for t in targets if isinstance(t, ast.Name)] or [getattr(node, "name", type(node).__name__)]
        if not set(names) <= {"__all__", "_LAZY", "__getattr__", "__dir__"}:
            found += names
    return found


def test_every_package_init_is_a_docstring_plus_re_exports():
    faces = {name: _face_logic(path) for name, path in MODULES.items() if path.name == "__init__.py"}
    assert len(faces) >= 15 and _face_logic(MODULES["hf_snapvit.correction.per_size"])  # the gate sees logic
    bearing = {name: found for name, found in faces.items() if found}
    assert sorted(bearing) == sorted(LOGIC_IN_THE_FACE), (
        f"package __init__s with logic of their own (move it to a module of the package and re-export it): {bearing}")
    assert all(LOGIC_IN_THE_FACE[name] in found for name, found in bearing.items()), bearing


def test_the_moved_module_paths_still_import_and_warn_per_name():
    import warnings

    import hf_snapvit.distributed as old
    from hf_snapvit.utils import distributed, moved, precision

    for name, module in (("process_state", distributed), ("autocast", precision)):  # precision left distributed
        with pytest.warns(FutureWarning, match=rf"hf_snapvit\.distributed is deprecated.*{module.__name__}"):
            assert getattr(old, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        old.nothing_here  # noqa: B018
    for path, targets in moved.MOVED.items():  # each old path is gone from the tree and its new home exists
        assert path not in MODULES and all(t in MODULES for t in targets), path
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        from hf_snapvit.validation import __doc__ as doc  # a module attribute: no warning
    assert "moved to hf_snapvit.utils.validation" in doc
