"""Every transformers module outside its public API that the package imports is imported under a guard with a
fallback, and each is tested on both sides: with the module (the path every supported release takes) and without it
(the module blocked in ``sys.modules``, as a release that moved or dropped it would leave it).

Public here means what transformers exports at its top level or from ``transformers.utils`` (``cached_file``, the
file-name constants, ``logging``). The CI's lowest-versions lane (``.ci/run``) runs these tests with the oldest
transformers the package declares, the main lane with the newest the machine installs.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

import hf_snapvit as hs
from hf_snapvit.architectures import skeleton as skeleton_module
from hf_snapvit.architectures.registry import auto_class_names, auto_class_table
from hf_snapvit.elastic import remote_code
from hf_snapvit.elastic.saved_names import disk_names, saved_name_transforms
from hf_snapvit.errors import CheckpointError
from hf_snapvit.evaluation.features import has_classifier
from hf_snapvit.loading import sliced
from helpers import CASES

ROOT = Path(__file__).resolve().parents[2]
BY_NAME = {case.name: case for case in CASES}
PUBLIC = {"transformers", "transformers.utils"}
# Each private module the package imports, and the test below that blocks it.
GUARDED = {
    "transformers.conversion_mapping": "test_without_the_conversion_mapping_names_are_read_as_they_are",
    "transformers.core_model_loading": "test_without_the_conversion_mapping_names_are_read_as_they_are",
    "transformers.initialization": "test_without_no_init_weights_the_skeleton_is_built_all_the_same",
    "transformers.utils.output_capturing": "test_without_the_output_registry_a_twin_is_left_unregistered",
    "transformers.models.auto.modeling_auto": "test_without_the_auto_tables_classes_are_told_by_their_names",
}


def _imports(path: Path) -> list[tuple[str, bool, int]]:
    """``(transformers module, guarded, line)`` for every import of a transformers submodule in ``path``; guarded
    means inside the body of a ``try`` one of whose handlers catches ``ImportError``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def guarded(node: ast.AST) -> bool:
        while node in parents:
            parent = parents[node]
            if isinstance(parent, ast.Try) and node in parent.body:
                caught = [h.type for h in parent.handlers]
                names = {n.id for t in caught if t is not None
                         for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name)}
                if None in caught or names & {"ImportError", "ModuleNotFoundError", "Exception"}:
                    return True
            node = parent
        return False

    found = []
    for node in ast.walk(tree):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        found.extend((m, guarded(node), node.lineno) for m in modules if m.split(".")[0] == "transformers")
    return found


def test_every_private_transformers_import_is_guarded_and_its_fallback_tested():
    unguarded, private = [], set()
    for path in sorted((ROOT / "src").rglob("*.py")):
        for module, guarded, line in _imports(path):
            if module in PUBLIC:
                continue
            private.add(module)
            if not guarded:
                unguarded.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not unguarded, ("these import a transformers module outside its public API without a fallback: "
                           f"{unguarded}; use a public API, or import it in a try/except ImportError with a fallback "
                           "and add it, with a test of the fallback, to GUARDED")
    assert private == set(GUARDED), f"GUARDED lists {sorted(set(GUARDED) - private)} that src no longer imports" \
        if set(GUARDED) - private else f"src imports {sorted(private - set(GUARDED))}, which GUARDED lacks"
    here = {node.name for node in ast.parse(Path(__file__).read_text()).body if isinstance(node, ast.FunctionDef)}
    assert set(GUARDED.values()) <= here


def test_the_scan_sees_an_unguarded_import_and_a_guarded_one(tmp_path):
    path = tmp_path / "module.py"
    path.write_text("import transformers\nfrom transformers.masking_utils import sdpa_mask\n\ndef f():\n"
                    "    try:\n        import transformers.initialization as i\n    except (ValueError, ImportError):\n"
                    "        i = None\n    try:\n        from transformers.x import y\n    except KeyError:\n"
                    "        pass\n")
    assert _imports(path) == [("transformers", False, 1), ("transformers.masking_utils", False, 2),
                              ("transformers.initialization", True, 6), ("transformers.x", False, 10)]


def _blocked(monkeypatch, *modules: str) -> None:
    """Make ``import`` of each module raise ImportError, as a transformers release without it would."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _saved(case_name: str, folder: Path) -> tuple[transformers.PreTrainedModel, set[str]]:
    """A tiny model of ``case_name`` saved as an elastic checkpoint in ``folder``, and the tensor names on disk."""
    model = BY_NAME[case_name].build()
    hs.save_elastic(model, hs.rank(model, method="magnitude", show_progress=False), folder, model_card=False)
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        return model, set(handle.keys())


# ------------------------------------------------------------------ transformers' weight-conversion mapping
def test_with_the_conversion_mapping_historical_names_are_found(tmp_path):
    model, keys = _saved("vit-cls", tmp_path)
    assert saved_name_transforms(model) is not None
    renamed = {name for name in model.state_dict() if name not in keys}
    assert renamed, "transformers saves this ViT under names it renames at load time: nothing to test"
    mapping = disk_names(model, keys)
    assert set(mapping) == set(model.state_dict())
    assert {key for key, _ in mapping.values()} <= keys
    assert any(mapping[name][0] != name for name in renamed)
    sliced_model = hs.ElasticViTModel.from_pretrained(tmp_path, sparsity=0.3)
    assert sliced_model.config.elastic_layout["sparsity"] > 0.2


def test_without_the_conversion_mapping_names_are_read_as_they_are(tmp_path, monkeypatch):
    vit, vit_keys = _saved("vit-cls", tmp_path / "vit")
    siglip, siglip_keys = _saved("siglip-vision", tmp_path / "siglip")
    _blocked(monkeypatch, "transformers.conversion_mapping", "transformers.core_model_loading")
    assert saved_name_transforms(vit) is None
    # A checkpoint whose names are its in-memory names (SigLIP's) loads as before.
    assert set(disk_names(siglip, siglip_keys)) == set(siglip.state_dict())
    loaded = hs.ElasticViTModel.from_pretrained(tmp_path / "siglip", sparsity=0.3)
    assert loaded.config.elastic_layout["sparsity"] > 0.2
    # One saved under historical names cannot be read, and the error says why and what to do.
    assert set(disk_names(vit, vit_keys)) < set(vit.state_dict())
    with pytest.raises(CheckpointError, match=r"has no weight-conversion mapping.*historical names.*install"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "vit", sparsity=0.3)


# ------------------------------------------------------------------ transformers.initialization.no_init_weights
def test_with_no_init_weights_the_skeleton_skips_initialisation():
    original = transformers.PreTrainedModel.init_weights
    with skeleton_module.no_init_weights():
        assert transformers.PreTrainedModel.init_weights is not original  # transformers' context is in force
    assert transformers.PreTrainedModel.init_weights is original


def test_without_no_init_weights_the_skeleton_is_built_all_the_same(monkeypatch):
    config = BY_NAME["vit-cls"].build().config
    expected = {name: tuple(p.shape) for name, p in skeleton_module.skeleton(config).state_dict().items()}
    _blocked(monkeypatch, "transformers.initialization")
    original = transformers.PreTrainedModel.init_weights
    with skeleton_module.no_init_weights():
        assert transformers.PreTrainedModel.init_weights is original  # nothing is skipped, nothing breaks
    built = skeleton_module.skeleton(config)
    assert {name: tuple(p.shape) for name, p in built.state_dict().items()} == expected
    assert all(p.device.type == "meta" for p in built.parameters())


# ------------------------------------------------------------------ transformers' output-recording registry
def _twin(tag: str) -> type:
    return type("ViTModel", (transformers.ViTModel,), {"__module__": f"hf_snapvit_test_{tag}"})


def test_with_the_output_registry_a_twin_records_hidden_states():
    from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

    model = BY_NAME["vit"].build()
    twin = _twin("present")
    sliced._record_outputs_as(twin, transformers.ViTModel)
    assert dict.get(_CAN_RECORD_REGISTRY, str(twin)) == transformers.ViTModel._can_record_outputs
    model.__class__ = twin
    with torch.no_grad():
        out = model(pixel_values=torch.randn(1, 3, 32, 32), output_hidden_states=True)
    assert out.hidden_states is not None and len(out.hidden_states) == model.config.num_hidden_layers + 1


def test_without_the_output_registry_a_twin_is_left_unregistered(monkeypatch):
    registry = sys.modules["transformers.utils.output_capturing"]._CAN_RECORD_REGISTRY
    twin = _twin("absent")
    _blocked(monkeypatch, "transformers.utils.output_capturing")
    sliced._record_outputs_as(twin, transformers.ViTModel)  # no error: that transformers records another way
    assert str(twin) not in registry
    # A registry that is not a dict keyed by class name (a future layout) is left alone too.
    monkeypatch.setitem(sys.modules, "transformers.utils.output_capturing",
                        type(sys)("transformers.utils.output_capturing"))
    sys.modules["transformers.utils.output_capturing"]._CAN_RECORD_REGISTRY = frozenset()
    sliced._record_outputs_as(twin, transformers.ViTModel)
    assert str(twin) not in registry


# ------------------------------------------------------------------ transformers' auto-class tables
def test_with_the_auto_tables_classes_are_found_in_them():
    assert auto_class_table("MODEL_MAPPING_NAMES")["vit"] == "ViTModel"
    assert "DeiTForImageClassificationWithTeacher" in auto_class_names("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES")
    assert auto_class_table("NO_SUCH_MAPPING_NAMES") == {}
    assert remote_code.auto_classes(transformers.DPTForDepthEstimation) == ["AutoModelForDepthEstimation"]
    assert remote_code.auto_classes(transformers.ViTModel) == ["AutoModel"]


def test_without_the_auto_tables_classes_are_told_by_their_names(monkeypatch, tmp_path):
    classifier, backbone = BY_NAME["vit-cls"].build(), BY_NAME["vit"].build()
    _blocked(monkeypatch, "transformers.models.auto.modeling_auto")
    assert auto_class_table("MODEL_MAPPING_NAMES") == {} and auto_class_names("MODEL_MAPPING_NAMES") == set()
    assert remote_code.auto_classes(transformers.ViTForImageClassification) == ["AutoModelForImageClassification"]
    assert remote_code.auto_classes(transformers.ViTModel) == ["AutoModel"]
    assert has_classifier(classifier) and not has_classifier(backbone)
    # A config whose "architectures" names another model type's class is still refused, without the example.
    folder = tmp_path / "mismatch"
    classifier.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Dinov2Model"]}))
    with pytest.raises(CheckpointError, match="does not match its config") as error:
        hs.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    assert "the bare model is" not in str(error.value)


# ------------------------------------------------------------------ the load benchmark's pre-import
def test_the_load_benchmark_imports_its_loaders_with_or_without_the_conversion_modules(monkeypatch):
    from transformers.utils import logging

    from hf_snapvit.benchmark import loading

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    try:
        loading._import_loaders()
        assert "transformers.core_model_loading" in sys.modules
        _blocked(monkeypatch, "transformers.conversion_mapping", "transformers.core_model_loading")
        loading._import_loaders()  # a release without them: nothing of theirs to import, and no error
    finally:
        logging.set_verbosity(verbosity)
        (logging.enable_progress_bar if bars else logging.disable_progress_bar)()
