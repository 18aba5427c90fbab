"""The doc-coverage gate of the public API: every exported class and function, and every public method of an exported
class, has a docstring of its own, and docs/api.md lists exactly the names ``hf_snapvit.__all__`` exports."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import hf_snapvit

ROOT = Path(__file__).resolve().parents[2]
API_PAGE = ROOT / "docs" / "api.md"


def _documented(obj) -> bool:
    doc = obj.__doc__ or ""
    # A dataclass without a docstring gets its signature, "Name(field: type, ...)", as __doc__.
    return bool(doc.strip()) and not (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("))


def _public_methods(cls) -> dict[str, object]:
    """Functions, properties, class and static methods defined in ``cls`` itself (not inherited, not fields)."""
    fields = {field.name for field in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    methods = {}
    for name, value in vars(cls).items():
        if name.startswith("_") or name in fields:
            continue
        function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        function = function.fget if isinstance(function, property) else function
        if inspect.isfunction(function):
            methods[name] = function
    return methods


def test_every_exported_class_function_and_public_method_has_a_docstring():
    exported = [(name, getattr(hf_snapvit, name)) for name in hf_snapvit.__all__]
    callables = [(name, obj) for name, obj in exported if inspect.isclass(obj) or inspect.isfunction(obj)]
    assert len(callables) >= 40  # every name but the two constants
    missing = [name for name, obj in callables if not _documented(obj)]
    missing += [f"{name}.{method}" for name, obj in callables if inspect.isclass(obj)
                for method, function in _public_methods(obj).items() if not _documented(function)]
    assert missing == [], f"public API without a docstring: {missing}"


def test_the_api_page_lists_exactly_the_exported_names():
    rows = re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)` \|", API_PAGE.read_text(), flags=re.MULTILINE)
    assert len(rows) == len(set(rows)), "a name is listed twice in docs/api.md"
    exported = set(hf_snapvit.__all__) - {"__version__"}
    assert sorted(exported - set(rows)) == [], "exported but missing from docs/api.md"
    assert sorted(set(rows) - exported) == [], "listed in docs/api.md but not exported"


def test_the_gate_sees_a_missing_docstring():
    class Exported:
        """Documented."""

        def documented(self):
            """Yes."""

        @property
        def bare(self):
            return 1

    @dataclasses.dataclass
    class Settings:
        value: int = 0

    assert {name: _documented(f) for name, f in _public_methods(Exported).items()} == {"documented": True,
                                                                                       "bare": False}
    assert not _documented(Settings) and _public_methods(Settings) == {}


def test_the_model_card_readme_names_files_and_functions_that_exist():
    """model_cards/README.md is the card's module map: its source paths and dotted names must still resolve."""
    text = (ROOT / "model_cards" / "README.md").read_text()
    paths = re.findall(r"`(src/hf_snapvit/[\w/.]+)`", text)
    dotted = re.findall(r"`(hf_snapvit(?:\.\w+)+)`", text)
    assert paths and len(dotted) >= 3
    assert [path for path in paths if not (ROOT / path).is_file()] == []
    for name in dotted:
        module, _, attribute = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attribute), name
