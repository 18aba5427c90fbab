"""Issue 16, items 1, 3 and 5: the caller's model is never changed, a ranking is tied to the weight order it
describes, and saved folders behave like ``save_pretrained``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

import hf_snapvit as hs
from hf_snapvit.utils import files
from hf_snapvit.architectures import get_layers, get_mlp, get_spec
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.elastic.ranking import ElasticRanking
from helpers import CASES, PROCESSOR, TINY_SNAPVIT, images

CASE = {c.name: c for c in CASES}
UNVERIFIED = "cannot be verified"


def load(path, **kwargs):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=f".*{UNVERIFIED}")
        return hs.ElasticViTModel.from_pretrained(path, **kwargs)


# ------------------------------------------------------------------ item 1: the caller's model is untouched
def test_save_elastic_keeps_every_parameter_object(case, tmp_path):
    model = case.build()
    params = dict(model.named_parameters())
    values = {k: v.detach().clone() for k, v in params.items()}
    config_before = model.config.to_dict()
    hs.save_elastic(model, hs.rank(model, method="random", seed=3), tmp_path / "e")
    after = dict(model.named_parameters())
    assert after.keys() == params.keys()
    assert all(after[k] is params[k] for k in params), [k for k in params if after[k] is not params[k]]
    assert all(torch.equal(after[k], values[k]) for k in params)
    assert model.config.to_dict() == config_before


def test_an_optimizer_made_before_the_save_steps_every_tensor(tmp_path):
    model = CASE["vit-cls"].build().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), tmp_path / "e")
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    logits = model(**CASE["vit-cls"].inputs(2)).logits
    (logits**2).sum().backward()
    optimizer.step()
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    # Every tensor with a gradient that moves it changes, and only tensors with a gradient change. k_proj biases get
    # tiny gradients (softmax ignores them in exact arithmetic): whether lr x 1e-10 moves one depends on the CPU's
    # rounding, so they may change or not.
    moved = {k for k, v in model.named_parameters() if v.grad is not None and v.grad.abs().max() > 1e-6}
    nonzero = {k for k, v in model.named_parameters() if v.grad is not None and bool(v.grad.any())}
    changed = {k for k, v in model.named_parameters() if not torch.equal(v.detach(), before[k])}
    assert moved <= changed <= nonzero and len(moved) > 0.9 * len(before)


def _set_grads(model):
    generator = torch.Generator().manual_seed(5)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    return {name: (p.grad, p.grad.clone(), p.requires_grad) for name, p in model.named_parameters()}


def _assert_grads_kept(model, grads):
    for name, p in model.named_parameters():
        tensor, value, flag = grads[name]
        assert p.grad is tensor and (value is None or torch.equal(p.grad, value)), name
        assert p.requires_grad == flag, name


@pytest.mark.parametrize("method", ["snapvit", "snip"])
def test_rank_leaves_grads_as_it_found_them(method):
    model = CASE["vit"].build()
    model.embeddings.patch_embeddings.projection.weight.requires_grad_(False)
    grads = _set_grads(model)
    config = hs.SnapViTConfig(**TINY_SNAPVIT)
    hs.rank(model, method=method, data=images(12), config=config, processor=PROCESSOR, show_progress=False)
    _assert_grads_kept(model, grads)
    assert not model.training


def test_fit_leaves_grads_as_it_found_them_and_none_stays_none():
    model = CASE["vit"].build().train()
    grads = _set_grads(model)
    name, first = next(iter(model.named_parameters()))
    first.grad, grads[name] = None, (None, None, True)
    hs.SnapViTPruner(hs.SnapViTConfig(**TINY_SNAPVIT)).fit(model, images(12), processor=PROCESSOR,
                                                           show_progress=False)
    _assert_grads_kept(model, grads)
    assert model.training


# ------------------------------------------------------------- item 3: a ranking is tied to its weight order
def _fingerprint(path):
    return json.loads((Path(path) / "config.json").read_text())["elastic_ranking"]["provenance"]["weights_fingerprint"]


def test_save_elastic_writes_a_fingerprint_that_loads_on_every_architecture(case, tmp_path):
    model = case.build()
    stored = hs.save_elastic(model, hs.rank(model, method="random", seed=2), tmp_path / "e", model_card=False)
    fingerprint = _fingerprint(tmp_path / "e")
    assert len(fingerprint["heads"]) == stored.shape.num_layers
    loaded = load(tmp_path / "e", sparsity=0.5 * stored.max_sparsity)
    # A sliced checkpoint keeps the ranking and its fingerprint; its prefixes still match it.
    loaded.save_pretrained(tmp_path / "sliced")
    again = load(tmp_path / "sliced")
    assert layer_widths(again) == layer_widths(loaded)
    load(tmp_path / "sliced", sparsity=0.9 * stored.max_sparsity)


def test_the_fingerprint_survives_ranking_round_trips(tmp_path):
    model = CASE["vit"].build()
    stored = hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    fingerprint = _fingerprint(tmp_path / "e")
    assert stored.provenance["weights_fingerprint"] == fingerprint
    assert ElasticRanking.from_dict(stored.to_dict()).to_dict()["provenance"]["weights_fingerprint"] == fingerprint


def test_a_ranking_saved_with_plain_save_pretrained_warns_and_names_the_fix(tmp_path):
    model = CASE["vit"].build()
    ranking = hs.rank(model, method="random", seed=4)
    model.config.elastic_ranking = ranking.sorted().to_dict()  # the public API allows it; the weights stay unpermuted
    model.save_pretrained(tmp_path / "plain")
    with pytest.warns(UserWarning, match=f"{UNVERIFIED}.*save_elastic"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "plain", sparsity=0.3)


def test_a_stored_ranking_pasted_into_the_original_checkpoint_is_refused(tmp_path):
    model = CASE["vit"].build()
    stored = hs.save_elastic(model, hs.rank(model, method="random", seed=4), tmp_path / "e")
    # Through the API: the ranking save_elastic returned, stored beside the original (unpermuted) weights.
    model.config.elastic_ranking = stored.to_dict()
    model.save_pretrained(tmp_path / "api")
    with pytest.raises(hs.RankingFormatError, match="weight order.*save_elastic"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "api", sparsity=0.3)
    # By hand: the elastic checkpoint's config.json copied over the original's.
    del model.config.elastic_ranking
    model.save_pretrained(tmp_path / "pasted")
    (tmp_path / "pasted" / "config.json").write_text((tmp_path / "e" / "config.json").read_text())
    with pytest.raises(hs.RankingFormatError, match="weight order.*save_elastic"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "pasted", sparsity=0.3)


def test_a_ranking_of_another_elastic_checkpoint_is_refused(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model, method="random", seed=1), tmp_path / "a")
    hs.save_elastic(model, hs.rank(model, method="random", seed=2), tmp_path / "b")
    (tmp_path / "b" / "config.json").write_text((tmp_path / "a" / "config.json").read_text())
    with pytest.raises(hs.RankingFormatError, match="weight order"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "b", sparsity=0.3)


def test_a_lower_precision_resave_still_matches(tmp_path):
    model = CASE["vit"].build()
    stored = hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    AutoModel.from_pretrained(tmp_path / "e", dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    loaded = load(tmp_path / "bf16", sparsity=0.5 * stored.max_sparsity)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}


def test_a_fine_tuned_sliced_model_reloads_and_a_reordered_one_warns_when_sliced_further(tmp_path):
    """Fine-tuning moves weights by some percent (within the tolerance); another unit order moves them by ~140 %.
    At its saved size a sliced checkpoint's order is never used; slicing it further follows the ranking's order,
    which a reordered (or heavily fine-tuned) checkpoint no longer has, so that warns."""
    model = CASE["vit"].build()
    stored = hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    small = load(tmp_path / "e", sparsity=0.5 * stored.max_sparsity)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.1 * p.abs().mean() * torch.randn(p.shape, generator=generator))  # fine-tuning by ~10 %
    small.save_pretrained(tmp_path / "tuned")
    assert layer_widths(load(tmp_path / "tuned")) == layer_widths(small)
    spec = get_spec(small)
    mlp, variant = get_mlp(get_layers(small, spec)[0], spec)
    fc1 = getattr(mlp, variant.in_proj[0])
    with torch.no_grad():  # reverse block 0's FFN input rows: the stored order no longer holds
        fc1.weight.copy_(fc1.weight.flip(0))
    small.save_pretrained(tmp_path / "reordered")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = load(tmp_path / "reordered")
    torch.testing.assert_close(dict(same.state_dict()), dict(small.state_dict()))
    with pytest.warns(UserWarning, match="units reordered"):
        load(tmp_path / "reordered", sparsity=0.75 * stored.max_sparsity)


@pytest.mark.parametrize("bad", ["abc", {"heads": [[1.0]]}, {"heads": "x", "neurons": []}])
def test_a_corrupt_fingerprint_is_a_ranking_format_error(tmp_path, bad):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    config["elastic_ranking"]["provenance"]["weights_fingerprint"] = bad
    (tmp_path / "e" / "config.json").write_text(json.dumps(config))
    with pytest.raises(hs.RankingFormatError, match="weights_fingerprint.*save_elastic"):
        hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)


# ------------------------------------------------------------ item 5: folders behave like save_pretrained's
@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path):
    return os.stat(path).st_mode & 0o777


def test_a_new_folder_takes_its_mode_from_the_umask(tmp_path, umask_022):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    assert _mode(tmp_path / "e") == 0o755
    assert {_mode(p) for p in (tmp_path / "e").iterdir()} == {0o644}
    (tmp_path / "e").chmod(0o750)  # a replaced folder keeps its mode, as save_pretrained leaves it
    hs.save_elastic(model, hs.rank(model, method="random"), tmp_path / "e")
    assert _mode(tmp_path / "e") == 0o750


def test_saving_into_the_working_directory_keeps_it_and_its_links(tmp_path, monkeypatch):
    model = CASE["vit"].build()
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "elsewhere.txt").write_text("data")
    (work / "notes.txt").write_text("mine")
    (work / "link.txt").symlink_to(tmp_path / "elsewhere.txt")
    inode = os.stat(work).st_ino
    monkeypatch.chdir(work)
    for seed in (1, 2):  # a plain folder, then one that holds a checkpoint
        stored = hs.save_elastic(model, hs.rank(model, method="random", seed=seed), ".")
        assert os.getcwd() == str(work) and os.stat(work).st_ino == inode
        assert (work / "link.txt").is_symlink() and (work / "notes.txt").read_text() == "mine"
        assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []
        loaded = load(".", sparsity=0.5 * stored.max_sparsity)
        assert sum(layer_widths(loaded)[1]) < 2 * 37
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.txt", "work"]


def test_a_folder_that_is_no_checkpoint_is_written_into_file_by_file(tmp_path):
    model = CASE["vit"].build()
    target = tmp_path / "project"
    (target / "data").mkdir(parents=True)
    (target / "data" / "a.txt").write_text("a")
    (target / "link").symlink_to(target / "data")
    inode = os.stat(target).st_ino
    hs.save_elastic(model, hs.rank(model), target)
    assert os.stat(target).st_ino == inode and (target / "link").is_symlink()
    assert sorted(p.name for p in target.iterdir()) == ["README.md", "allocation_heatmap.png", "config.json", "data",
                                                        "link", "model.safetensors"]
    load(target, sparsity=0.3)


def test_replacing_a_checkpoint_keeps_links_as_links(tmp_path):
    model = CASE["vit"].build()
    target = tmp_path / "e"
    hs.save_elastic(model, hs.rank(model), target, model_card=False)
    (tmp_path / "card.md").write_text("card")
    (target / "README.md").symlink_to("../card.md")
    (target / "extra").mkdir()
    (target / "extra" / "l").symlink_to("../README.md")
    hs.save_elastic(model, hs.rank(model, method="random"), target)
    assert (target / "README.md").is_symlink() and (target / "README.md").read_text() == "card"
    assert (target / "extra" / "l").is_symlink()


def test_a_symlinked_target_stays_a_link(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "real")
    (tmp_path / "alias").symlink_to("real")
    hs.save_elastic(model, hs.rank(model, method="random"), tmp_path / "alias")
    assert (tmp_path / "alias").is_symlink()
    load(tmp_path / "alias", sparsity=0.3)


def test_a_file_as_target_is_refused(tmp_path):
    model = CASE["vit"].build()
    (tmp_path / "e").write_text("not a folder")
    with pytest.raises(hs.CheckpointError, match="is a file.*folder"):
        hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    assert (tmp_path / "e").read_text() == "not a folder"


def test_an_interrupt_between_the_two_renames_restores_the_old_checkpoint(tmp_path, monkeypatch):
    model = CASE["vit"].build()
    target = tmp_path / "e"
    hs.save_elastic(model, hs.rank(model), target)
    (target / "README.md").write_text("card")
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    rename = os.rename

    def interrupted(source, destination):  # the second rename: staging folder -> target
        if Path(destination) == target and ".tmp-" in Path(source).name:
            raise KeyboardInterrupt
        rename(source, destination)

    monkeypatch.setattr(files.os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hs.save_elastic(model, hs.rank(model, method="random"), target)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["e"]


def _dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_stale_staging_folders_of_a_killed_save_are_cleaned(tmp_path):
    model = CASE["vit"].build()
    dead = _dead_pid()
    for name in (f".e.tmp-{dead}-abc", ".e.tmp-k2j4h5", f".e.old-{dead}-abc/old", f".e.tmp-{os.getpid()}-live"):
        (tmp_path / name).mkdir(parents=True)
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    # A staging folder of a process that still runs may be a concurrent save: it is left alone.
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".e.tmp-{os.getpid()}-live", "e"]


def test_a_save_killed_between_the_renames_is_recovered_by_the_next(tmp_path):
    model = CASE["vit"].build()
    hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    (tmp_path / "e" / "README.md").write_text("card")
    backup = tmp_path / f".e.old-{_dead_pid()}-abc"
    backup.mkdir()
    os.rename(tmp_path / "e", backup / "old")  # killed here: the old checkpoint is only in the backup
    hs.save_elastic(model, hs.rank(model, method="random"), tmp_path / "e")
    assert (tmp_path / "e" / "README.md").read_text() == "card"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]


def test_writing_into_a_folder_removes_the_shards_of_an_earlier_save_only(tmp_path, monkeypatch):
    model = CASE["vit"].build()
    monkeypatch.chdir(tmp_path)
    hs.save_elastic(model, hs.rank(model), ".", max_shard_size="20KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    (tmp_path / "model_backup.safetensors").write_text("mine")
    hs.save_elastic(model, hs.rank(model, method="random"), ".")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "allocation_heatmap.png", "config.json",
                                                          "model.safetensors", "model_backup.safetensors"]
    load(".", sparsity=0.3)


def test_an_interrupted_save_into_the_working_directory_changes_nothing(tmp_path, monkeypatch):
    model = CASE["vit"].build()
    monkeypatch.chdir(tmp_path)
    hs.save_elastic(model, hs.rank(model), ".")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def crash(self, folder, **kwargs):
        (Path(folder) / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(type(model), "save_pretrained", crash)
    with pytest.raises(KeyboardInterrupt):
        hs.save_elastic(model, hs.rank(model, method="random"), ".")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_the_recipe_in_the_warning_adds_a_fingerprint_to_an_old_checkpoint(tmp_path):
    model = CASE["vit"].build()
    stored = hs.save_elastic(model, hs.rank(model), tmp_path / "e")
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    del config["elastic_ranking"]["provenance"]["weights_fingerprint"]  # as written before fingerprints
    (tmp_path / "e" / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match=UNVERIFIED):
        hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3)
    old = AutoModel.from_pretrained(tmp_path / "e")
    hs.save_elastic(old, hs.ElasticRanking.from_dict(old.config.elastic_ranking), tmp_path / "new")
    sparsity = 0.5 * stored.max_sparsity
    inputs = CASE["vit"].inputs(2)
    torch.testing.assert_close(load(tmp_path / "new", sparsity=sparsity)(**inputs).last_hidden_state,
                               hs.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=sparsity)(
                                   **inputs).last_hidden_state)
