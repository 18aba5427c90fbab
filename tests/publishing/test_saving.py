"""save_elastic: the model card written with the checkpoint, and no local path of the machine in anything written."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import transformers
from huggingface_hub import ModelCard

import hf_snapvit
from hf_snapvit.errors import ModelCardError
from hf_snapvit.utils.files import public_name
from hf_snapvit.cards.elastic import GENERATED_MARKER, HEATMAP_FILENAME
from hf_snapvit.cli import main

from helpers import PROCESSOR, tiny_vit_classifier


@pytest.fixture(scope="module")
def local_model(tmp_path_factory) -> tuple[Path, transformers.PreTrainedModel]:
    """A dense model loaded from a local folder, so that its ``_name_or_path`` is that folder's absolute path."""
    folder = tmp_path_factory.mktemp("machine-specific") / "my-vit"
    tiny_vit_classifier().save_pretrained(folder)
    PROCESSOR.save_pretrained(folder)
    return folder, transformers.ViTForImageClassification.from_pretrained(folder).eval()


def _files_naming(folder: Path, *needles: str) -> list[str]:
    """``file: needle`` for every file under ``folder`` whose bytes contain one of ``needles``."""
    return [f"{path.name}: {needle}" for path in sorted(folder.rglob("*")) if path.is_file()
            for needle in needles if needle.encode() in path.read_bytes()]


def test_saved_elastic_checkpoint_has_a_card_that_the_hub_parses(local_model, tmp_path):
    folder, model = local_model
    out = tmp_path / "vit-elastic"
    ranking = hf_snapvit.rank(model, method="magnitude")
    hf_snapvit.save_elastic(model, ranking, out, image_processor=PROCESSOR, base_model="google/vit-base-patch16-224")
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers"  # stock transformers loads an elastic checkpoint (dense)
    assert {"hf-snapvit", "elastic", "pruned"} <= set(card.data.tags)
    assert card.data.base_model == "google/vit-base-patch16-224"
    assert card.data.pipeline_tag == "image-classification"
    assert GENERATED_MARKER in card.text
    assert "ElasticViTModel.from_pretrained(" in card.text  # how to load it
    assert "**Method**: `magnitude`" in card.text  # the ranking's provenance
    assert "| 0 % (dense) |" in card.text and "| 30 % |" in card.text  # the sizes table
    assert (out / HEATMAP_FILENAME).read_bytes().startswith(b"\x89PNG")
    # What the card describes is what was saved beside it.
    stored = hf_snapvit.ElasticRanking.from_dict(json.loads((out / "config.json").read_text())["elastic_ranking"])
    assert f"{stored.keep_counts(sparsity=0.3).num_params / 1e3:.1f} k" in card.text


def test_no_local_path_in_anything_saved(local_model, tmp_path):
    folder, model = local_model
    assert model.config._name_or_path == str(folder)  # the path the base model was loaded from
    out = tmp_path / "elastic"
    stored = hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), out, image_processor=PROCESSOR)
    assert stored.provenance["base_model"] == "my-vit"  # the folder's name only
    assert (out / "README.md").is_file()
    assert _files_naming(out, str(folder.parent), "/work", "/tmp", "/home") == []
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model is None  # a local folder is no Hub id: no metadata, rather than a wrong one
    assert "`my-vit`" in card.text


def test_inspect_output_names_no_local_path(local_model, tmp_path, capsys):
    folder, model = local_model
    out = tmp_path / "elastic"
    ranking = hf_snapvit.rank(model, method="magnitude")
    ranking.provenance["base_model"] = str(folder)  # as checkpoints written before public_name recorded it
    hf_snapvit.save_elastic(model, ranking, out)
    capsys.readouterr()
    for argv in (["inspect", str(out)], ["inspect", str(out), "--json", "--plot", str(tmp_path / "heat.png")]):
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert "my-vit" in printed and "elastic" in printed
        assert str(tmp_path) not in printed and str(folder.parent) not in printed and "/tmp" not in printed
    assert (tmp_path / "heat.png").is_file()


def test_evaluations_go_into_the_saved_card(local_model, tmp_path):
    _, model = local_model
    out = tmp_path / "e"
    measured = [{"sparsity": s, "metric": "accuracy", "value": v, "dataset": "zh-plus/tiny-imagenet"}
                for s, v in ((0.0, 0.81), (0.3, 0.77))]
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), out, evaluations=measured,
                            card_options={"sparsities": (0.3,)})
    card = ModelCard.load(out / "README.md")
    values = sorted(metric.metric_value for metric in card.data.eval_results)
    assert values == pytest.approx([0.77, 0.81])
    assert "| 30 % |" in card.text and "| 20 % |" not in card.text


def test_card_can_be_left_out_and_a_hand_written_one_is_kept(local_model, tmp_path):
    _, model = local_model
    ranking = hf_snapvit.rank(model, method="magnitude")
    bare = tmp_path / "bare"
    hf_snapvit.save_elastic(model, ranking, bare, model_card=False)
    assert not (bare / "README.md").exists() and not (bare / HEATMAP_FILENAME).exists()
    assert (bare / "config.json").is_file()

    mine = tmp_path / "mine"
    hf_snapvit.save_elastic(model, ranking, mine)
    (mine / "README.md").write_text("my own words")
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="random"), mine)
    assert (mine / "README.md").read_text() == "my own words"

    generated = tmp_path / "generated"
    hf_snapvit.save_elastic(model, ranking, generated, card_options={"model_name": "first"})
    hf_snapvit.save_elastic(model, ranking, generated, card_options={"model_name": "second"})
    assert "# second" in (generated / "README.md").read_text()  # our own card is regenerated


def test_bad_card_arguments_write_nothing(local_model, tmp_path):
    _, model = local_model
    ranking = hf_snapvit.rank(model, method="magnitude")
    out = tmp_path / "never"
    with pytest.raises(ModelCardError, match=r"sparsities must lie in \(0, 1\)"):
        hf_snapvit.save_elastic(model, ranking, out, card_options={"sparsities": (1.5,)})
    with pytest.raises(hf_snapvit.CheckpointError, match="base_model"):
        hf_snapvit.save_elastic(model, ranking, out, card_options={"base_model": "a/b"})
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("given, written", [
    ("google/vit-base-patch16-224", "google/vit-base-patch16-224"),  # a Hub id stays
    ("vit-tiny", "vit-tiny"),
    ("/home/someone/models/vit-tiny", "vit-tiny"),
    ("/home/someone/models/vit-tiny/", "vit-tiny"),
    ("./checkpoints/vit", "vit"),
    ("~/vit", "vit"),
    ("a/b/c", "c"),
    ("C:\\Users\\me\\vit", "vit"),
    (None, None),
])
def test_public_name(given, written):
    assert public_name(given) == written


def test_public_name_of_an_existing_relative_folder(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert public_name("org/name") == "name"  # it is a folder here, so transformers loads it from disk
    assert public_name(".") == tmp_path.name


@pytest.mark.slow
def test_without_matplotlib_the_card_says_how_to_get_the_heatmap(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.modules["matplotlib"] = None  # as if hf-snapvit[plots] were not installed
        import torch, transformers, hf_snapvit
        from hf_snapvit.errors import MissingExtraError
        torch.manual_seed(0)
        config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=37, image_size=32, patch_size=8)
        model = transformers.ViTModel(config).eval()
        ranking = hf_snapvit.rank(model, method="magnitude")
        hf_snapvit.save_elastic(model, ranking, {str(tmp_path / "e")!r})
        try:
            hf_snapvit.plot_allocation(ranking, {str(tmp_path / "x.png")!r})
        except MissingExtraError as error:
            assert isinstance(error, ImportError) and error.name == "matplotlib"
            print("ERROR:", error)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert 'ERROR: plot_allocation (the per-block allocation heatmap) needs matplotlib' in result.stdout
    assert 'pip install "hf-snapvit[plots]"' in result.stdout
    text = (tmp_path / "e" / "README.md").read_text()
    card = ModelCard.load(tmp_path / "e" / "README.md")
    assert "hf-snapvit" in card.data.tags
    assert 'pip install "hf-snapvit[plots]"' in text and "heatmap was left out" in text
    assert HEATMAP_FILENAME not in text and not (tmp_path / "e" / HEATMAP_FILENAME).exists()
    assert not (tmp_path / "x.png").exists()


def test_inspect_plot_without_matplotlib_names_the_extra(local_model, tmp_path, capsys, monkeypatch):
    _, model = local_model
    out = tmp_path / "elastic"
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), out, model_card=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    capsys.readouterr()
    assert main(["inspect", str(out), "--plot", str(tmp_path / "heat.png")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and 'pip install "hf-snapvit[plots]"' in last
    assert not (tmp_path / "heat.png").exists()
