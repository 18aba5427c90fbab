"""Issue 64: nothing hf_snapvit writes names a temporary or an absolute path, and a checkpoint is written once.

Every file each CLI subcommand writes (model cards, config.json, the remote-code module, the prefix correction's
metadata, JSON results, plots) and every file the Python API writes or would upload (save_elastic, a sliced model's
save_pretrained, push_to_hub's staged folder, transformers' own push_to_hub of a sliced model) is searched for the
test's folders, the working directory, the temporary directory and the names of staging folders.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import pytest
import transformers
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl, hf_api
from huggingface_hub.errors import EntryNotFoundError

import hf_snapvit
from hf_snapvit.cli import main
from hf_snapvit.utils.files import atomic_directory, final_path, public_name


# Staging and backup folders of atomic_directory, and push_to_hub's and transformers' temporary folders.
STAGING = re.compile(rb"\.(tmp|old)-\d+-|hf_snapvit-push-|/tmp[a-z0-9_]{8}\b")


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """Commands run in a folder of their own, so relative outputs are tested too."""
    folder = tmp_path / "work"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def leaks(data: bytes, *roots: Path) -> list[str]:
    """The forbidden things ``data`` holds: one of ``roots`` (absolute folders), the working directory, the
    temporary directory, or a staging folder's name."""
    places = {str(Path(r).resolve()) for r in roots} | {os.getcwd(), tempfile.gettempdir() + os.sep}
    found = [place for place in places if place.encode() in data]
    return found + [m.group().decode(errors="replace") for m in STAGING.finditer(data)]


def written(*places: Path) -> dict[str, bytes]:
    """Every file under ``places`` (folders) or each place itself (files), by path."""
    files = {}
    for place in places:
        for path in ([place] if place.is_file() else sorted(p for p in place.rglob("*") if p.is_file())):
            files[str(path)] = path.read_bytes()
    return files


def assert_clean(files: dict[str, bytes], *roots: Path) -> None:
    assert files, "nothing was written"
    dirty = {name: found for name, data in files.items() if (found := leaks(data, *roots))}
    assert not dirty, dirty


def run(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def card_of(folder: Path) -> ModelCard:
    return ModelCard((folder / "README.md").read_text(encoding="utf-8"))


def test_the_check_catches_what_the_issue_found(tmp_path):
    """The card the CLI's export wrote before the fix: its title and snippets named the staging folder."""
    old = b'# .vit-tiny-30.tmp-12411-1foqk_go\nmodel = ElasticViTModel.from_pretrained(".vit-tiny-30.tmp-12411-1f")'
    assert leaks(old, tmp_path) == [".tmp-12411-", ".tmp-12411-"]
    assert str(tmp_path.resolve()) in leaks(f"saved in {tmp_path}/x".encode(), tmp_path)
    assert leaks(b"model = ElasticViTModel.from_pretrained(\"vit-tiny-30\")", tmp_path) == []


@pytest.mark.parametrize("relative", [True, False], ids=["relative-output", "absolute-output"])
def test_prune_with_correction_and_export_write_no_path(model_dir, data_file, workdir, capsys, relative):
    elastic, sliced = (Path("vit-elastic"), Path("vit-tiny-30")) if relative else \
        (workdir / "vit-elastic", workdir / "vit-tiny-30")
    run(capsys, "prune", model_dir, "--method", "magnitude", "--data", data_file, "--num-samples", "8",
        "--prefix-correction", "--output", elastic, "-q")
    assert (elastic / "prefix_correction.safetensors").is_file()
    run(capsys, "export", elastic, "--sparsity", "0.3", "--output", sliced, "--correct", "--data", data_file,
        "--num-samples", "8", "-q")
    assert_clean(written(workdir), model_dir, data_file.parent, workdir)
    card = card_of(sliced)
    assert card.text.count('from_pretrained("vit-tiny-30"') == 3  # hf_snapvit, the processor, transformers alone
    assert "# vit-tiny-30\n" in card.text and "# vit-elastic\n" in card_of(elastic).text
    assert not [p.name for p in workdir.iterdir() if p.name.startswith(".")]  # no staging folder left behind


def test_export_writes_the_checkpoint_in_one_atomic_write(elastic_dir, workdir, capsys, monkeypatch):
    """save_pretrained inside the CLI's atomic folder writes into it: one staging folder, named as its target."""
    from hf_snapvit.utils import files

    made = []
    real = files.tempfile.mkdtemp
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda *a, **k: made.append(k.get("prefix")) or real(*a, **k))
    run(capsys, "export", elastic_dir, "--sparsity", "0.3", "--output", "small", "-q")
    assert made == [f".small.tmp-{os.getpid()}-"]
    assert (workdir / "small" / "preprocessor_config.json").is_file() and "# small\n" in card_of(workdir / "small").text


def test_inspect_eval_and_bench_write_no_path(elastic_dir, data_file, workdir, capsys):
    run(capsys, "inspect", elastic_dir, "--plot", "allocation.png", "-q")
    run(capsys, "eval", elastic_dir, "--sparsity", "0.3", "--data", data_file, "--split", "train", "--metrics",
        "top1", "--output", workdir / "eval.json", "-q")
    run(capsys, "bench", elastic_dir, "--sparsities", "0.3", "--batch-sizes", "1", "--repeats", "1", "--warmup", "0",
        "--no-load", "--output", "bench.json", "-q")
    assert_clean(written(workdir), elastic_dir, data_file.parent, workdir)
    assert json.loads((workdir / "bench.json").read_text())["checkpoint"] == "vit-elastic"
    assert (workdir / "allocation.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_latency_tables_write_no_path(elastic_dir, tmp_path, workdir, capsys):
    import shutil

    local = shutil.copytree(elastic_dir, tmp_path / "copy" / "vit-elastic")
    run(capsys, "bench", local, "--latency-table", "--sparsities", "0.3", "--batch-sizes", "1", "--repeats", "1",
        "--warmup", "0", "--output", "tables.json", "-q")
    assert_clean(written(local / "elastic_latency.json", workdir / "tables.json"), local, workdir)


def test_prune_push_to_hub_sends_no_path(model_dir, workdir, capsys, monkeypatch):
    sent = capture_commits(monkeypatch)
    run(capsys, "prune", model_dir, "--method", "random", "--output", "vit-elastic", "--push-to-hub",
        "me/vit-elastic", "--token", "hf_test", "--base-model", "google/vit-base-patch16-224", "-q")
    assert_clean(sent[0], model_dir, workdir)
    card = ModelCard(sent[0]["README.md"].decode())
    assert card.data.base_model == "google/vit-base-patch16-224"
    assert 'from_pretrained("me/vit-elastic", sparsity=0.3)' in card.text and "# vit-elastic\n" in card.text


def capture_commits(monkeypatch) -> list[dict[str, bytes]]:
    """Stop uploads at the HfApi boundary; each commit is recorded as {path in the repo: bytes sent}."""
    commits: list[dict[str, bytes]] = []

    def content(source) -> bytes:
        if isinstance(source, (str, os.PathLike)):
            return Path(source).read_bytes()
        return source if isinstance(source, bytes) else source.read()

    def create_commit(self, repo_id, operations, *, commit_message="", **kwargs):
        commits.append({op.path_in_repo: content(op.path_or_fileobj) for op in operations})
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/abc", commit_message=commit_message,
                          commit_description="", oid="abc", pr_url=None)

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    # upload_folder's single-commit path (hf_xet's pipeline needs the network), without its YAML check on the Hub
    monkeypatch.setattr(hf_api, "is_xet_available", lambda: False)
    monkeypatch.setattr(HfApi, "_validate_yaml", lambda self, content, **kwargs: None)
    return commits


def test_python_saves_and_uploads_name_no_path(elastic_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sent = capture_commits(monkeypatch)
    small = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3)
    processor = transformers.AutoImageProcessor.from_pretrained(elastic_dir)
    small.save_pretrained(tmp_path / "vit-small")
    dense = transformers.ViTForImageClassification.from_pretrained(elastic_dir)
    hf_snapvit.save_elastic(dense, hf_snapvit.rank(dense, method="random"), "vit-again")
    hf_snapvit.push_to_hub(small, "me/vit-small", token="hf_test", image_processor=processor)  # staged in a temp dir
    hf_snapvit.push_to_hub(tmp_path / "vit-again", "me/vit-again", token="hf_test")
    monkeypatch.setattr(ModelCard, "load", lambda *a, **k: (_ for _ in ()).throw(EntryNotFoundError("README.md")))
    small.push_to_hub("me/stock", token="hf_test")  # transformers' own, through a temporary folder
    assert_clean(written(tmp_path / "vit-small", tmp_path / "vit-again"), elastic_dir, tmp_path)
    assert len(sent) == 3
    for commit in sent:
        assert_clean(commit, elastic_dir, tmp_path)
    for repo, commit in zip(("me/vit-small", "me/vit-again", "me/stock"), sent):
        text = commit["README.md"].decode()
        assert f'from_pretrained("{repo}"' in text and f"# {repo.split('/')[1]}\n" in text
    assert "# vit-small\n" in card_of(tmp_path / "vit-small").text


def test_the_cards_of_one_checkpoint_agree(elastic_dir, tmp_path):
    """The local card of a sliced save and the one push_to_hub renders differ only in the names they give it;
    blocks are counted from 0, and the base model is named alike."""
    from hf_snapvit.cards.elastic import make_model_card

    small = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3)
    small.save_pretrained(tmp_path / "vit-small")
    local = card_of(tmp_path / "vit-small").text
    published = make_model_card(tmp_path / "vit-small", repo_id="me/vit-small", heatmap_path=None).text
    assert published.replace("me/vit-small", "vit-small") == local
    heads = small.config.elastic_layout["num_heads"]
    assert f"| 0 | {heads[0]} |" in local and f"| {len(heads)} |" not in local
    assert "**Base model**: `vit-dense`" in local and "**Base model**: `vit-dense`" in card_of(elastic_dir).text


def test_a_write_inside_another_one_is_named_as_its_target(tmp_path):
    with atomic_directory(tmp_path / "outer") as staging:
        assert staging.name.startswith(".outer.tmp-") and final_path(staging) == tmp_path / "outer"
        assert public_name(staging) == "outer" and final_path(staging / "README.md") == tmp_path / "outer/README.md"
        with atomic_directory(staging) as inner:
            assert inner == staging  # no second staging folder
            (inner / "config.json").write_text("{}")
    assert (tmp_path / "outer" / "config.json").read_text() == "{}"
    assert final_path(staging) == staging and sorted(p.name for p in tmp_path.iterdir()) == ["outer"]
