"""Issue 30, loading messages: a local folder that does not exist, a folder without ``config.json``, a config.json
whose ``architectures`` names another model's class, and a task model whose vision tower is not the one its ranking
was made on. Each is one error of ours naming the path or value and the fix, from ``ElasticViTModel.from_pretrained``
(sized and switchable) and from the CLI; Hub repo ids (``owner/name``) still go to the Hub."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import hf_snapvit as hs
from hf_snapvit.cli import main as cli_main
from hf_snapvit.errors import CheckpointError, CheckpointNotFoundError, SnapViTError
from hf_snapvit.utils.sources import check_source
from helpers import CASES, PROCESSOR
from support.task_models import TASKS

CASE = {c.name: c for c in CASES}
TASK = {t.name: t for t in TASKS}
LOADS = [{"sparsity": 0.3}, {"switchable": True}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A dense elastic checkpoint of the tiny ViT (copied by the tests that edit it)."""
    folder = tmp_path_factory.mktemp("saved") / "vit-elastic"
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model, method="magnitude"), folder, image_processor=PROCESSOR)
    return folder


def cli(capsys, *argv) -> tuple[int, str]:
    """Run the CLI; its exit code and its one error line (stderr)."""
    code = cli_main([str(a) for a in argv])
    return code, capsys.readouterr().err.strip()


# ------------------------------------------------------------------------ a local folder that does not exist
@pytest.mark.parametrize("path", ["./no/such/folder", "../no/such/folder", "no/such/folder", "~/no-such-hf-snapvit",
                                  "{tmp}/missing"])
@pytest.mark.parametrize("load", LOADS, ids=["sized", "switchable"])
def test_a_missing_local_folder_says_it_does_not_exist(path, load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = path.replace("{tmp}", str(tmp_path))
    with pytest.raises(CheckpointNotFoundError, match=r"does not exist") as caught:
        hs.ElasticViTModel.from_pretrained(path, **load)
    message = str(caught.value)
    assert repr(path) in message and "owner/name" in message and "save_elastic" in message
    assert "Repo id must" not in message
    # Callers that caught transformers' OSError (or our CheckpointError) keep catching it.
    assert isinstance(caught.value, OSError) and isinstance(caught.value, CheckpointError)


def test_a_home_path_that_exists_only_expanded_says_to_expand_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(CheckpointNotFoundError, match=r"'~/ckpt'.*expanduser"):
        hs.ElasticViTModel.from_pretrained("~/ckpt", sparsity=0.3)


@pytest.mark.parametrize("repo_id", ["hf-snapvit-test/no-such-model", "no-such-model-hf-snapvit"])
def test_hub_repo_ids_still_go_to_the_hub(repo_id, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_source(repo_id)  # not a local path: nothing to check here
    with pytest.raises(OSError) as caught:  # transformers' own error: offline, the repo is not in the cache
        hs.ElasticViTModel.from_pretrained(repo_id, sparsity=0.3, local_files_only=True)
    assert not isinstance(caught.value, SnapViTError), caught.value


# ------------------------------------------------------------------------ a folder without config.json
@pytest.mark.parametrize("load", LOADS, ids=["sized", "switchable"])
def test_an_empty_folder_says_it_has_no_config_json(load, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFoundError, match=r"[Nn]o config\.json in") as caught:
        hs.ElasticViTModel.from_pretrained(empty, **load)
    message = str(caught.value)
    assert str(empty) in message and "empty" in message and "save_elastic" in message
    assert "model_type" not in message


def test_a_folder_holding_checkpoints_one_level_down_names_them(saved, tmp_path):
    parent = tmp_path / "models"
    shutil.copytree(saved, parent / "vit-elastic")
    (parent / "notes.txt").write_text("x")
    with pytest.raises(CheckpointNotFoundError, match=r"No config\.json in .*'vit-elastic'.*subfolder"):
        hs.ElasticViTModel.from_pretrained(parent, sparsity=0.3)
    # ... and the subfolder= it suggests loads.
    model = hs.ElasticViTModel.from_pretrained(parent, sparsity=0.3, subfolder="vit-elastic")
    assert model.config.num_hidden_layers == 2


def test_a_missing_subfolder_is_named(saved):
    with pytest.raises(CheckpointNotFoundError, match=r"No config\.json in .*nope.*does not exist"):
        hs.ElasticViTModel.from_pretrained(saved, sparsity=0.3, subfolder="nope")


def test_a_file_instead_of_the_folder_says_to_give_the_folder(saved):
    with pytest.raises(CheckpointNotFoundError, match=r"config\.json.*is a file.*folder"):
        hs.ElasticViTModel.from_pretrained(saved / "config.json", sparsity=0.3)


@pytest.mark.parametrize("command", [["inspect", "{path}"], ["export", "--model", "{path}", "--sparsity", "0.3",
                                                               "--output", "{out}"]])
def test_the_cli_says_an_empty_folder_has_no_config_json(command, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    paths = {"{path}": str(tmp_path / "empty"), "{out}": str(tmp_path / "out")}
    code, err = cli(capsys, *[paths.get(a, a) for a in command])
    assert code == 2 and "No config.json in" in err and "model_type" not in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------ architectures naming another model
def _edit_architectures(saved: Path, tmp_path: Path, architectures: list[str]) -> Path:
    path = tmp_path / "edited"
    shutil.copytree(saved, path)
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = architectures
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("load", LOADS, ids=["sized", "switchable"])
def test_architectures_of_another_model_type_is_a_clear_error(saved, tmp_path, load):
    path = _edit_architectures(saved, tmp_path, ["Dinov2Model"])
    with pytest.raises(CheckpointError, match=r"Dinov2Model.*'dinov2'.*'vit'.*does not match") as caught:
        hs.ElasticViTModel.from_pretrained(path, **load)
    message = str(caught.value)
    assert str(path) in message and "ViTModel" in message and "architectures" in message
    assert "save_pretrained" in message  # the fix


def test_the_cli_export_reports_the_architecture_mismatch(saved, tmp_path, capsys):
    path = _edit_architectures(saved, tmp_path, ["Dinov2Model"])
    code, err = cli(capsys, "export", "--model", path, "--sparsity", "0.3", "--output", tmp_path / "out")
    assert code == 2 and "does not match" in err and "Dinov2Model" in err, err


def test_the_cli_prune_refuses_a_dense_model_of_mismatched_architecture(saved, tmp_path, capsys):
    path = _edit_architectures(saved, tmp_path, ["Dinov2Model"])
    code, err = cli(capsys, "prune", "--model", path, "--method", "magnitude", "--output", tmp_path / "out")
    assert code == 2 and "does not match" in err and "Dinov2Model" in err, err


def test_architectures_transformers_does_not_know_still_load(saved, tmp_path):
    # The check compares a class with its config only where transformers exports the class; an unknown name (custom
    # code) leaves the choice to AutoModel, as before.
    path = _edit_architectures(saved, tmp_path, ["MyCustomViTModel"])
    model = hs.ElasticViTModel.from_pretrained(path, sparsity=0.3)
    assert type(model).__name__ == "ViTModel"


# ------------------------------------------------------------------------ a task model's vision tower
TOWER_PATHS = {"llava": "model.vision_tower", "depth_anything": "backbone"}


@pytest.fixture(scope="module", params=sorted(TOWER_PATHS))
def towers(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """A tiny task model saved elastically, and another of the same shape (other random weights) saved beside it."""
    case, root = TASK[request.param], tmp_path_factory.mktemp(request.param)
    for seed, name in ((0, "ours"), (1, "other")):
        model = case.model(seed)
        hs.save_elastic(model, hs.rank(model, "magnitude"), root / name, image_processor=PROCESSOR)
    return request.param, root / "ours", root / "other"


def _is_tower(key: str) -> bool:
    # Stored names: LLaVA's legacy "vision_tower." (or "model.vision_tower."), a depth model's "backbone.".
    return key.startswith(("vision_tower.", "model.vision_tower.", "backbone."))


def _swap_tower(ours: Path, other: Path, target: Path) -> Path:
    """A copy of ``ours`` whose vision tower tensors are ``other``'s (every other tensor and config.json ours)."""
    shutil.copytree(ours, target)
    tensors, replacement = load_file(ours / "model.safetensors"), load_file(other / "model.safetensors")
    tower = [key for key in tensors if _is_tower(key)]
    assert len(tower) > 20 and all(tensors[k].shape == replacement[k].shape for k in tower)
    tensors.update({key: replacement[key] for key in tower})
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def _assert_tower_refused(path: Path, name: str, load: dict) -> None:
    with pytest.raises(hs.RankingFormatError) as caught:
        hs.ElasticViTModel.from_pretrained(path, **load)
    message = str(caught.value)
    assert str(path) in message and f"vision encoder {TOWER_PATHS[name]!r}" in message, message
    assert f"this {name} model" in message and "replaced" in message and "another tower" in message, message
    assert "hf_snapvit.rank" in message and "save_elastic" in message, message  # the fix


@pytest.mark.parametrize("load", LOADS, ids=["sized", "switchable"])
def test_a_task_model_whose_vision_tower_was_replaced_is_refused(towers, load, tmp_path):
    name, ours, other = towers
    _assert_tower_refused(_swap_tower(ours, other, tmp_path / "swapped"), name, load)
    model = hs.ElasticViTModel.from_pretrained(ours, **load)  # the intact checkpoint still loads
    assert type(model).__name__ == type(TASK[name].model()).__name__


@pytest.mark.parametrize("load", LOADS, ids=["sized", "switchable"])
def test_a_task_model_whose_ranking_was_made_for_another_tower_is_refused(towers, load, tmp_path):
    name, ours, other = towers
    path = tmp_path / "pasted"
    shutil.copytree(ours, path)
    config = json.loads((path / "config.json").read_text())
    config["elastic_ranking"] = json.loads((other / "config.json").read_text())["elastic_ranking"]
    (path / "config.json").write_text(json.dumps(config))
    _assert_tower_refused(path, name, load)
