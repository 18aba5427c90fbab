"""Issue 30, disk faults: a save that runs out of disk space leaves the previous checkpoint byte for byte as it was,
leaves no staging folder behind, uploads nothing, and raises an error that says what happened and what to do."""

from __future__ import annotations

import errno
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
import transformers.modeling_utils
from huggingface_hub import HfApi
from safetensors import SafetensorError

import hf_snapvit as hs
from hf_snapvit import ElasticViTModel
from hf_snapvit.utils import files
from hf_snapvit.publishing import hub
from helpers import CASES

CASE = {c.name: c for c in CASES}["vit-cls"]
# What safetensors raises when the disk fills while it writes (seen on a full 64 KiB tmpfs): not an OSError.
SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"
NO_SPACE = os.strerror(errno.ENOSPC)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) by relative path, with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def full_disk_weights(monkeypatch: pytest.MonkeyPatch, kind: str = "safetensors",
                      code: int = errno.ENOSPC) -> list[BaseException]:
    """Make transformers' weight writer fill the disk: it writes a partial file, then fails as safetensors does
    (``kind="safetensors"``) or with a plain ``OSError`` of errno ``code``. Returns the errors raised."""
    raised: list[BaseException] = []

    def save_file(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        with open(filename, "wb") as handle:
            handle.write(b"\0" * 64)
        raised.append(SafetensorError(SAFETENSORS_FULL) if kind == "safetensors"
                      else OSError(code, os.strerror(code), filename))
        raise raised[-1]

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)
    return raised


class _FullFile:
    """A file whose writes fail with ENOSPC after a few bytes, as a write to a full disk does."""

    def __init__(self, handle: Any, raised: list[BaseException]) -> None:
        self.handle, self.raised = handle, raised

    def __enter__(self) -> "_FullFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.close()

    def write(self, data: Any) -> int:
        self.handle.write(data[:8])
        self.raised.append(OSError(errno.ENOSPC, NO_SPACE))
        raise self.raised[-1]


def full_disk_small_files(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Make every file that hf_snapvit writes atomically (config.json rewrites, model cards, the loading module)
    fail with ENOSPC. Returns the errors raised."""
    raised: list[BaseException] = []

    class FullOs:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def fdopen(descriptor: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            handle = os.fdopen(descriptor, mode, *args, **kwargs)
            return _FullFile(handle, raised) if "w" in mode else handle

    monkeypatch.setattr(files, "os", FullOs())
    return raised


def check_disk_full(error: BaseException, folder: Path, cause: BaseException, *, kept: str = "untouched") -> None:
    """``error`` is hf_snapvit's disk-full error about ``folder``: an OSError with errno ENOSPC and ``cause`` as its
    cause, saying what happened, that the folder is as it was (``kept``), the free space, and what to do."""
    assert type(error).__name__ == "DiskFullError", repr(error)
    assert isinstance(error, hs.SnapViTError) and isinstance(error, OSError)
    assert error.errno == errno.ENOSPC and error.filename == str(folder)
    assert error.__cause__ is cause
    text = str(error)
    assert "disk is full" in text.lower() and NO_SPACE in text and str(folder) in text
    assert kept in text and "free" in text and "another disk" in text, text


def leftovers(parent: Path, before: list[str]) -> list[str]:
    """Names in ``parent`` that were not there before (staging and backup folders of a save are hidden ones)."""
    return sorted(set(os.listdir(parent)) - set(before))


@pytest.mark.parametrize("kind", ["safetensors", "oserror"])
def test_save_elastic_on_a_full_disk_keeps_the_previous_checkpoint(kind, tmp_path, monkeypatch):
    target, model = tmp_path / "elastic", CASE.build()
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), target)
    before, listed = snapshot(target), os.listdir(tmp_path)
    raised = full_disk_weights(monkeypatch, kind)
    with pytest.raises(OSError) as info:
        hs.save_elastic(model, hs.rank(model, method="random", seed=2), target)
    assert snapshot(target) == before
    assert leftovers(tmp_path, listed) == []
    check_disk_full(info.value, target, raised[0])
    monkeypatch.undo()  # with room again, the same save goes through (and would have changed the files)
    hs.save_elastic(model, hs.rank(model, method="random", seed=2), target)
    assert snapshot(target) != before


def test_a_save_to_a_new_folder_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    model = CASE.build()
    raised = full_disk_weights(monkeypatch)
    with pytest.raises(OSError) as info:
        hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path / "new")
    assert os.listdir(tmp_path) == []
    check_disk_full(info.value, tmp_path / "new", raised[0], kept="Nothing was written")


def test_a_full_disk_in_a_folder_of_other_files_touches_none_of_them(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine")
    before, model = snapshot(tmp_path), CASE.build()
    raised = full_disk_weights(monkeypatch, "oserror")
    with pytest.raises(OSError) as info:
        hs.save_elastic(model, hs.rank(model, method="magnitude"), tmp_path)
    assert snapshot(tmp_path) == before and os.listdir(tmp_path) == ["notes.txt"]
    check_disk_full(info.value, tmp_path, raised[0])


@pytest.mark.parametrize("fault", ["weights", "small files"])
def test_sliced_save_pretrained_on_a_full_disk_keeps_the_previous_checkpoint(fault, tiny_elastic, tmp_path,
                                                                              monkeypatch):
    target = tmp_path / "sliced"
    ElasticViTModel.from_pretrained(tiny_elastic("vit-cls"), sparsity=0.3).save_pretrained(target)
    before, listed = snapshot(target), os.listdir(tmp_path)
    smaller = ElasticViTModel.from_pretrained(tiny_elastic("vit-cls"), sparsity=0.5)
    raised = full_disk_weights(monkeypatch) if fault == "weights" else full_disk_small_files(monkeypatch)
    with pytest.raises(OSError) as info:
        smaller.save_pretrained(target)
    assert snapshot(target) == before and leftovers(tmp_path, listed) == []
    check_disk_full(info.value, target, raised[0])


@pytest.mark.parametrize("whole", [False, True])
def test_switchable_save_pretrained_on_a_full_disk_keeps_the_previous_checkpoint(whole, tiny_elastic, tmp_path,
                                                                                  monkeypatch):
    target = tmp_path / "switched"
    model = ElasticViTModel.from_pretrained(tiny_elastic("vit-cls"), switchable=True, sparsity=0.3)
    model.save_pretrained(target, whole=whole)
    before, listed = snapshot(target), os.listdir(tmp_path)
    model.set_budget(sparsity=0.5)
    model.add_latency_table(hs.LatencyTable(device="cpu: test (1 threads)", dtype="float32", batch_size=1,
                                            width_multiple=1, sparsities=(0.0, 0.5), gflops=(1.0, 0.5),
                                            latency_ms=(2.0, 1.0)))  # a whole save would now write one more file
    raised = full_disk_weights(monkeypatch, "oserror")
    with pytest.raises(OSError) as info:
        model.save_pretrained(target, whole=whole)
    assert snapshot(target) == before and leftovers(tmp_path, listed) == []
    check_disk_full(info.value, target, raised[0])


def test_an_atomic_file_on_a_full_disk_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "notes.md"
    path.write_text("old")
    raised = full_disk_small_files(monkeypatch)
    with pytest.raises(OSError) as info:
        files.write_text_atomic(path, "new " * 1000)
    assert os.listdir(tmp_path) == ["notes.md"] and path.read_text() == "old"
    check_disk_full(info.value, path, raised[0], kept="is as it was")


def test_other_write_errors_are_not_called_a_full_disk(tmp_path, monkeypatch):
    target, model = tmp_path / "elastic", CASE.build()
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), target)
    before = snapshot(target)
    raised = full_disk_weights(monkeypatch, "oserror", code=errno.EACCES)
    with pytest.raises(OSError) as info:
        hs.save_elastic(model, hs.rank(model, method="random", seed=2), target)
    assert info.value is raised[0]  # as it was raised: not a disk-full error
    assert snapshot(target) == before


def test_the_disk_full_error_keeps_its_errno_through_pickle():
    error = hs.DiskFullError("The disk is full.", errno.ENOSPC, "/somewhere")
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.errno, again.filename) == (str(error), errno.ENOSPC, "/somewhere")
    assert isinstance(again, OSError) and isinstance(again, hs.CheckpointError)


class Uploads:
    """The Hub upload boundary: every call that would reach the Hub is recorded instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name in ("create_repo", "create_branch", "create_commit", "upload_folder", "upload_file"):
            monkeypatch.setattr(HfApi, name, self._record(name))

    def _record(self, name: str) -> Callable[..., Any]:
        def call(api: HfApi, *args: Any, **kwargs: Any) -> None:
            self.calls.append(name)
            raise AssertionError(f"{name} was called: nothing may be uploaded after a failed staging")
        return call


@pytest.fixture
def temp_root(tmp_path, monkeypatch) -> Path:
    """A temporary-files folder of the test's own, so that leftovers there can be seen."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.mark.parametrize("what", ["sliced model", "switchable model"])
def test_push_to_hub_of_a_model_on_a_full_disk_uploads_nothing(what, tiny_elastic, temp_root, monkeypatch):
    if what == "sliced model":
        model = ElasticViTModel.from_pretrained(tiny_elastic("vit-cls"), sparsity=0.3)
    else:
        model = ElasticViTModel.from_pretrained(tiny_elastic("vit-cls"), switchable=True, sparsity=0.3)
    uploads = Uploads(monkeypatch)
    raised = full_disk_weights(monkeypatch)
    with pytest.raises(OSError) as info:
        hub.push_to_hub("me/tiny", model, token="hf_test")
    assert uploads.calls == [] and os.listdir(temp_root) == []
    error = info.value
    assert type(error).__name__ == "DiskFullError" and error.errno == errno.ENOSPC
    assert error.__cause__ is raised[0]
    assert "Nothing was uploaded to 'me/tiny'" in str(error) and "TMPDIR" in str(error), str(error)


def test_push_to_hub_of_a_folder_whose_card_does_not_fit_uploads_nothing(tiny_elastic, temp_root, monkeypatch):
    uploads, raised = Uploads(monkeypatch), []

    def write_model_card(source: Any, folder: Any, **kwargs: Any) -> None:
        (Path(folder) / "README.md").write_text("---\npartial")
        raised.append(OSError(errno.ENOSPC, NO_SPACE))
        raise raised[-1]

    monkeypatch.setattr(hub, "write_model_card", write_model_card)
    with pytest.raises(OSError) as info:
        hub.push_to_hub("me/tiny", tiny_elastic("vit-cls"), token="hf_test")
    assert uploads.calls == [] and os.listdir(temp_root) == []
    assert type(info.value).__name__ == "DiskFullError" and info.value.__cause__ is raised[0]


def test_save_and_push_on_a_full_disk_keeps_the_folder_and_uploads_nothing(tmp_path, monkeypatch):
    target, model = tmp_path / "elastic", CASE.build()
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), target)
    before = snapshot(target)
    uploads = Uploads(monkeypatch)
    raised = full_disk_weights(monkeypatch)
    with pytest.raises(OSError) as info:
        hub.save_and_push(model, hs.rank(model, method="random", seed=2), target, "me/tiny", token="hf_test")
    assert uploads.calls == [] and snapshot(target) == before
    check_disk_full(info.value, target, raised[0])
