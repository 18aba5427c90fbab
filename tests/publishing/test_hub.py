"""Hub uploads, checked at the HfApi boundary (the Hub is unreachable here): exactly what one commit would contain.

``push_to_hub`` uploads with ``HfApi.upload_folder``, which runs here as it is, on its single-commit path (the one it
takes without hf_xet; hf_xet's pipeline needs the network), up to the ``create_commit`` it ends in."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import ModelCard, constants
from huggingface_hub.errors import EntryNotFoundError
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME

import hf_snapvit
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.errors import HubUploadError
from hf_snapvit.publishing.hub import push_to_hub, save_and_push
from hf_snapvit.cards.elastic import GENERATED_MARKER, HEATMAP_FILENAME

from helpers import output_of, tiny_vit_classifier
from support.hub import TOKEN, materialise

@pytest.fixture(scope="module")
def tiny():
    model = tiny_vit_classifier(num_hidden_layers=3)
    processor = transformers.ViTImageProcessor(size={"height": 32, "width": 32})
    ranking = hf_snapvit.rank(model, method="magnitude")
    return model, processor, ranking


@pytest.fixture
def elastic_dir(tiny, tmp_path) -> Path:
    model, processor, ranking = tiny
    folder = tmp_path / "elastic"
    hf_snapvit.save_elastic(model, ranking, folder, image_processor=processor)
    return folder


def pixels(batch: int = 2) -> dict:
    return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))}


def test_folder_upload_is_one_commit_with_weights_config_processor_and_card(tiny, elastic_dir, hub, tmp_path):
    model, _, ranking = tiny
    info = push_to_hub("me/vit-elastic", elastic_dir, private=True, token=TOKEN, revision="v1",
                       commit_message="first upload")
    assert hub.repos == [dict(repo_id="me/vit-elastic", token=TOKEN, private=True, exist_ok=True)]
    assert hub.branches == [dict(repo_id="me/vit-elastic", branch="v1", token=TOKEN, exist_ok=True)]
    commit = hub.only_commit()
    assert (commit["repo_id"], commit["token"], commit["revision"], commit["create_pr"], commit["commit_message"]) \
        == ("me/vit-elastic", TOKEN, "v1", False, "first upload")
    assert set(commit["files"]) == {"config.json", "model.safetensors", "preprocessor_config.json", "README.md",
                                    HEATMAP_FILENAME}
    assert info.commit_url.endswith("/commit/abc")
    [upload] = hub.folder_uploads  # one upload_folder call made the one commit
    assert (upload["repo_id"], upload["commit_message"], upload["revision"]) == ("me/vit-elastic", "first upload",
                                                                                 "v1")
    assert not Path(upload["folder_path"]).exists()  # the staging folder is gone afterwards
    assert commit["files"]["model.safetensors"] == (elastic_dir / "model.safetensors").read_bytes()

    # What was committed is the checkpoint: its ranking parses and resolves budgets as the saved one does.
    stored = ElasticRankingFrom(commit["files"]["config.json"])
    for sparsity in (0.1, 0.3, 0.5):
        assert stored.keep_counts(sparsity).heads == ranking.keep_counts(sparsity).heads
        assert stored.keep_counts(sparsity).neurons == ranking.keep_counts(sparsity).neurons
    # ... and its weights load: dense through stock transformers (equal to the original model), sliced through us.
    uploaded = materialise(commit["files"], tmp_path / "uploaded")
    dense = transformers.AutoModelForImageClassification.from_pretrained(uploaded).eval()
    torch.testing.assert_close(output_of(dense, pixels()), output_of(model, pixels()), atol=1e-5, rtol=1e-4)
    small = hf_snapvit.ElasticViTModel.from_pretrained(uploaded, sparsity=0.3)
    reference = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3)
    torch.testing.assert_close(output_of(small, pixels()), output_of(reference, pixels()))
    assert transformers.AutoImageProcessor.from_pretrained(uploaded).size == {"height": 32, "width": 32}

    card = ModelCard(commit["files"]["README.md"].decode())
    assert card.data.library_name == "transformers"
    assert {"hf-snapvit", "elastic", "pruned", "pruning", "vision-transformer"} <= set(card.data.tags)
    assert card.data.pipeline_tag == "image-classification"
    assert f"({HEATMAP_FILENAME})" in card.text
    assert commit["files"][HEATMAP_FILENAME].startswith(b"\x89PNG")


def ElasticRankingFrom(config_bytes: bytes) -> hf_snapvit.ElasticRanking:
    return hf_snapvit.ElasticRanking.from_dict(json.loads(config_bytes)["elastic_ranking"])


def test_save_and_push_writes_locally_then_commits_once(tiny, hub, tmp_path):
    model, processor, ranking = tiny
    folder = tmp_path / "vit-tiny-elastic"
    stored, info = save_and_push(model, ranking, folder, image_processor=processor, token=TOKEN, create_pr=True,
                                 base_model="google/vit-base-patch16-224")
    assert info.commit_url.endswith("/commit/abc")
    assert (folder / "config.json").is_file()
    assert hub.repos[0]["repo_id"] == "vit-tiny-elastic"  # default repo name: the folder's, as in transformers
    assert hub.branches == []  # a pull request needs no branch
    commit = hub.only_commit()
    assert commit["repo_id"] == "me/vit-tiny-elastic"
    assert commit["create_pr"] is True and commit["revision"] is None
    assert commit["files"]["config.json"] == (folder / "config.json").read_bytes()
    assert commit["files"]["model.safetensors"] == (folder / "model.safetensors").read_bytes()
    uploaded = ElasticRankingFrom(commit["files"]["config.json"])
    np.testing.assert_allclose(uploaded.head_scores, stored.head_scores)
    card = ModelCard(commit["files"]["README.md"].decode())
    assert card.data.base_model == "google/vit-base-patch16-224"
    assert (folder / "README.md").read_bytes() == commit["files"]["README.md"]  # the local card is the uploaded one
    assert "me/vit-tiny-elastic" not in card.text and 'from_pretrained("vit-tiny-elastic"' in card.text


def test_save_and_push_passes_save_pretrained_arguments_to_save_elastic(tiny, hub, tmp_path):
    model, _, ranking = tiny
    folder = tmp_path / "sharded"
    save_and_push(model, ranking, folder, "me/sharded", token=TOKEN, max_shard_size="50KB", model_card=False)
    assert (folder / SAFE_WEIGHTS_INDEX_NAME).is_file() and not (folder / "model.safetensors").exists()
    files = hub.only_commit()["files"]
    assert files[SAFE_WEIGHTS_INDEX_NAME] == (folder / SAFE_WEIGHTS_INDEX_NAME).read_bytes()
    assert "README.md" not in files
    reloaded = hf_snapvit.ElasticViTModel.from_pretrained(materialise(files, tmp_path / "up"), sparsity=0.3)
    reference = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    torch.testing.assert_close(output_of(reloaded, pixels()), output_of(reference, pixels()))


def test_sliced_model_uploads_with_card_through_push_to_hub(elastic_dir, hub, tmp_path):
    small = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.4)
    processor = transformers.AutoImageProcessor.from_pretrained(elastic_dir)
    hf_snapvit.push_to_hub("me/vit-small", small, token=TOKEN, image_processor=processor)
    commit = hub.only_commit()
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md"} <= set(commit["files"])
    assert commit["commit_message"] == "Upload sliced checkpoint with hf_snapvit"
    config = json.loads(commit["files"]["config.json"])
    assert config["elastic_layout"]["num_heads"] == layer_widths(small)[0]
    reloaded = hf_snapvit.ElasticViTModel.from_pretrained(materialise(commit["files"], tmp_path / "up"))
    assert layer_widths(reloaded) == layer_widths(small)
    torch.testing.assert_close(output_of(reloaded, pixels()), output_of(small, pixels()))
    text = commit["files"]["README.md"].decode()
    assert "(this checkpoint)" in text and 'ElasticViTModel.from_pretrained("me/vit-small")' in text
    # The sliced folder carries the loading module, so the card says transformers loads it with remote code.
    assert "modeling_hf_snapvit_sliced.py" in commit["files"] and "trust_remote_code=True" in text


def test_stock_push_to_hub_of_a_sliced_model_commits_a_loadable_checkpoint(elastic_dir, hub, monkeypatch, tmp_path):
    def no_remote_card(*args, **kwargs):  # the repo is new: the Hub has no README yet
        raise EntryNotFoundError("README.md")

    monkeypatch.setattr(ModelCard, "load", no_remote_card)
    small = hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3)
    small.push_to_hub("me/stock", token=TOKEN)
    files = hub.only_commit()["files"]
    reloaded = hf_snapvit.ElasticViTModel.from_pretrained(materialise(files, tmp_path / "stock"))
    torch.testing.assert_close(output_of(reloaded, pixels()), output_of(small, pixels()))


def test_missing_token_fails_clearly_before_writing(tiny, hub, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    model, processor, ranking = tiny
    folder = tmp_path / "never-written"
    with pytest.raises(HubUploadError, match="hf auth login.*HF_TOKEN") as error:
        save_and_push(model, ranking, folder, repo_id="me/x")
    assert isinstance(error.value, hf_snapvit.SnapViTError)
    assert "huggingface-cli login" in str(error.value)
    assert not folder.exists() and hub.repos == [] and hub.commits == []


def test_token_from_environment_is_used(elastic_dir, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    push_to_hub("me/env", elastic_dir)
    assert hub.only_commit()["token"] == "hf_from_env"


def test_bad_inputs_name_the_fix(tiny, elastic_dir, hub, tmp_path):
    model, processor, ranking = tiny
    with pytest.raises(HubUploadError, match="neither elastic nor sliced.*save_elastic"):
        push_to_hub("me/plain", model, token=TOKEN)
    with pytest.raises(HubUploadError, match="no config.json"):
        push_to_hub("me/empty", tmp_path, token=TOKEN)
    with pytest.raises(HubUploadError, match="not a valid Hub repository id"):
        push_to_hub("not a/valid/id", elastic_dir, token=TOKEN)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['push_to_hubb'\].*push_to_hub.*save_elastic"):
        save_and_push(model, ranking, tmp_path / "x", token=TOKEN, push_to_hubb=True)
    with pytest.raises(HubUploadError, match="not a valid Hub repository id"):
        save_and_push(model, ranking, tmp_path / "x", "not a/valid/id", token=TOKEN)
    assert not (tmp_path / "x").exists()  # both refused before writing
    assert hub.commits == []


def test_hand_written_readme_is_kept_and_tagged_stale_generated_one_replaced(elastic_dir, hub):
    (elastic_dir / "README.md").write_text("---\nlicense: mit\n---\n# My own card\n")
    push_to_hub("me/own", elastic_dir, token=TOKEN)
    card = ModelCard(hub.commits[-1]["files"]["README.md"].decode())
    assert "# My own card" in card.text and card.data.license == "mit"
    assert "hf-snapvit" in card.data.tags and card.data.library_name == "transformers"

    (elastic_dir / "README.md").write_text(f"<!-- {GENERATED_MARKER} 0.0.1 -->\nold table\n")
    (elastic_dir / HEATMAP_FILENAME).write_bytes(b"stale")
    push_to_hub("me/own", elastic_dir, token=TOKEN)
    files = hub.commits[-1]["files"]
    assert "old table" not in files["README.md"].decode() and files[HEATMAP_FILENAME].startswith(b"\x89PNG")

    push_to_hub("me/own", elastic_dir, token=TOKEN, model_card=False)
    assert hub.commits[-1]["files"]["README.md"] == (elastic_dir / "README.md").read_bytes()


def test_the_old_argument_order_warns_and_uploads_the_same(tiny, elastic_dir, hub):
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # the new order does not warn
        push_to_hub("me/vit", elastic_dir, token=TOKEN)
    with pytest.warns(FutureWarning, match=r"old argument order.*repo_id first.*push_to_hub\('me/vit'"):
        push_to_hub(elastic_dir, "me/vit", token=TOKEN)
    with pytest.warns(FutureWarning, match="old argument order"):
        push_to_hub(str(elastic_dir), "me/vit", token=TOKEN)
    new, *old = hub.commits
    assert all(commit == new for commit in old)  # the same repository, files, bytes and message
    with pytest.warns(FutureWarning, match="old argument order"), \
            pytest.raises(HubUploadError, match="neither elastic nor sliced"):
        push_to_hub(tiny[0], "me/plain", token=TOKEN)  # swapped, then refused as the new order refuses it


@pytest.mark.parametrize("what", ["folder", "sliced model"])
def test_a_dry_run_lists_what_would_be_sent_without_a_token_or_the_network(what, elastic_dir, hub, monkeypatch,
                                                                           tmp_path):
    source = elastic_dir if what == "folder" else hf_snapvit.ElasticViTModel.from_pretrained(elastic_dir, sparsity=0.3)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    before = sorted(p.name for p in elastic_dir.iterdir())
    plan = push_to_hub("me/dry", source, dry_run=True, commit_message="try")
    assert hub.repos == [] and hub.commits == [] and hub.folder_uploads == []  # nothing sent
    assert sorted(p.name for p in elastic_dir.iterdir()) == before  # nothing written into the folder
    assert plan.repo_id == "me/dry" and plan.commit_message == "try"
    assert 'from_pretrained("me/dry"' in plan.model_card
    push_to_hub("me/dry", source, token=TOKEN, commit_message="try")
    sent = hub.only_commit()["files"]
    assert plan.files == {name: len(data) for name, data in sorted(sent.items())}  # the same files, the same sizes
    assert plan.model_card == sent["README.md"].decode()
    assert list(plan.files) == sorted(plan.files)
