"""Issue 64: the commonest mistakes each get one line saying what was found and the one fix (the CLI's flag where the
CLI is in use), and the CLI has one grammar: the model first, in every subcommand."""

from __future__ import annotations

import logging

import pytest
import transformers
from huggingface_hub import ModelCard

import hf_snapvit
from hf_snapvit.cli import COMMANDS, build_parser, main
from hf_snapvit.cli import bench as bench_command
from hf_snapvit.cli.models import resolve_model
from hf_snapvit.data.images import load_image_dataset
from hf_snapvit.evaluation import load_split
from hf_snapvit.errors import DataError



@pytest.fixture
def folders(tmp_path):
    """An empty folder, and one holding only a text file in a sub-folder."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes" / "a").mkdir(parents=True)
    (tmp_path / "notes" / "a" / "notes.txt").write_text("no images here")
    return tmp_path


def error_line(capsys, *argv) -> str:
    """The one ``error:`` line of a failed command (exit status 2, no traceback)."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and lines and lines[-1].startswith("error: ") and "Traceback" not in err, err
    return lines[-1]


ELASTIC_COMMANDS = [["inspect", "{m}"], ["export", "{m}", "--sparsity", "0.3", "--output", "o"],
                    ["bench", "{m}", "--no-load"]]


@pytest.mark.parametrize("command", [["prune", "{m}", "--method", "magnitude", "--output", "o"], *ELASTIC_COMMANDS,
                                     ["eval", "{m}", "--data", "d.parquet"]], ids=lambda c: c[0])
def test_a_wrong_path_names_the_argument_and_the_fix(command, tmp_path, capsys):
    line = error_line(capsys, *[a.replace("{m}", "./no/such/folder") for a in command])
    assert "'./no/such/folder': no such folder" in line and str(tmp_path) not in line.split("(")[0]
    assert "or a Hub id" in line and "looked up" not in line
    fix = "hf-snapvit prune MODEL --output DIR" if command[0] in ("inspect", "export", "bench") else "save_pretrained"
    assert fix in line


@pytest.mark.parametrize("command", ELASTIC_COMMANDS, ids=lambda c: c[0])
def test_an_empty_checkpoint_folder_says_it_is_empty_and_how_to_make_one(command, folders, capsys):
    line = error_line(capsys, *[a.replace("{m}", str(folders / "empty")) for a in command])
    assert "No config.json in" in line and "(it is empty)" in line and "Hub" not in line
    assert "`hf-snapvit prune MODEL --output DIR` wrote" in line and "save_elastic" not in line  # the CLI's fix


def test_a_name_the_hub_cannot_resolve_says_it_was_looked_up_there(capsys, monkeypatch):
    def unreachable(*args, **kwargs):  # the Hub boundary, as transformers reports it offline
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", unreachable)
    line = error_line(capsys, "inspect", "vit-tiny-elastc")
    assert "ELASTIC 'vit-tiny-elastc' is no folder here" in line and "looked up on the Hub as a model id" in line
    assert "couldn't connect" in line and "correct the path" in line


@pytest.mark.parametrize("argv", [["prune", "{model}", "--output", "o", "--data", "{data}"],
                                  ["eval", "{elastic}", "--sparsity", "0.3", "--data", "{data}"],
                                  ["export", "{elastic}", "--sparsity", "0.3", "--correct", "--output", "o",
                                   "--data", "{data}"]], ids=lambda a: a[0])
@pytest.mark.parametrize("source, found", [("empty", "(it is empty)"), ("notes", "(it holds notes.txt)")])
def test_a_folder_without_images_says_so_with_the_flag(argv, source, found, folders, model_dir, elastic_dir, capsys):
    values = {"{model}": str(model_dir), "{elastic}": str(elastic_dir), "{data}": str(folders / source)}
    line = error_line(capsys, *[values.get(a, a) for a in argv])
    assert line.startswith("error: --data: The folder") and f"holds no images {found}" in line
    assert "Give the folder the image files are in" in line
    assert "looked up" not in line and "Hub" not in line.split("Give")[0]  # it is a local folder, and was read


def test_the_library_says_the_same_without_the_flag(folders):
    for source, found in (("empty", "it is empty"), ("notes", "it holds notes.txt")):
        for load in (lambda path: load_image_dataset(path, num_samples=4), lambda path: load_split(path, "train")):
            with pytest.raises(DataError, match=rf"holds no images \({found}\)") as error:
                load(folders / source)
            assert "--data" not in str(error.value) and "looked up" not in str(error.value)
    with pytest.raises(DataError, match="No such file or folder: './nope'"):
        load_image_dataset("./nope", num_samples=4)
    with pytest.raises(DataError, match="No such file or folder: './nope.parquet'"):  # evaluation opens the same way
        load_split("./nope.parquet", "validation")


def test_a_non_vit_model_is_refused_by_discovery_in_one_line(tmp_path, capsys):
    bert = tmp_path / "bert"
    transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=37, vocab_size=50)).save_pretrained(bert)
    resnet = tmp_path / "resnet"
    transformers.ResNetModel(transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16],
                                                       depths=[1, 1])).save_pretrained(resnet)
    line = error_line(capsys, "prune", bert, "--method", "magnitude", "--output", tmp_path / "o")
    assert "BertModel (bert) takes no images" in line and "not a vision transformer" in line
    assert "register_architecture" not in line  # no longer pointed at discovery from the config alone
    line = error_line(capsys, "prune", resnet, "--method", "magnitude", "--output", tmp_path / "o")
    assert "ResNetModel (resnet) is not a plain ViT" in line and "hierarchical stages" in line
    line = error_line(capsys, "export", resnet, "--sparsity", "0.3", "--output", tmp_path / "o")
    assert "is not an elastic checkpoint" in line and f"hf-snapvit prune {resnet} --output DIR" in line
    assert not (tmp_path / "o").exists()


def test_a_missing_base_model_names_the_flag_that_sets_it(model_dir, elastic_dir, tmp_path, capsys):
    assert main(["export", str(elastic_dir), "--sparsity", "0.3", "--output", str(tmp_path / "s"), "-q"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "base model" in line]
    assert len(warned) == 1 and "pass --base-model org/name" in warned[0] and "base_model=" not in warned[0]
    assert main(["export", str(elastic_dir), "--sparsity", "0.3", "--output", str(tmp_path / "t"), "-q",
                 "--base-model", "google/vit-base-patch16-224"]) == 0
    assert ModelCard.load(tmp_path / "t" / "README.md").data.base_model == "google/vit-base-patch16-224"
    assert main(["prune", str(model_dir), "--method", "magnitude", "--output", str(tmp_path / "e"), "-q",
                 "--base-model", "google/vit-base-patch16-224"]) == 0
    card = ModelCard.load(tmp_path / "e" / "README.md")
    assert card.data.base_model == "google/vit-base-patch16-224" and "huggingface.co/google/vit-base" in card.text
    capsys.readouterr()
    line = error_line(capsys, "prune", model_dir, "--method", "magnitude", "--output", tmp_path / "x",
                      "--base-model", "vit-dense")
    assert "--base-model 'vit-dense' is not a Hub model id" in line and "'org/name'" in line


def test_the_library_warning_names_its_argument(elastic_dir, tmp_path, caplog):
    dense = transformers.ViTForImageClassification.from_pretrained(elastic_dir)
    with caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        hf_snapvit.save_elastic(dense, hf_snapvit.rank(dense, method="random"), tmp_path / "lib-elastic")
    assert any("pass base_model='org/name'" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("row", COMMANDS, ids=lambda row: row.name)
def test_every_subcommand_takes_the_model_first_or_as_deprecated_option(row, caplog):
    required = {"prune": ["--output", "o"], "export": ["--sparsity", "0.3", "--output", "o"], "eval": ["--data", "d"]}
    rest = required.get(row.name, [])
    first = build_parser(row.name).parse_args([row.name, "my-model", *rest])
    resolve_model(first)
    option = build_parser(row.name).parse_args([row.name, *rest, "--model", "my-model"])
    with caplog.at_level(logging.WARNING, logger="hf_snapvit.cli"):
        resolve_model(option)
    assert first.model == option.model == "my-model"
    assert [r.getMessage() for r in caplog.records] == [
        f"--model is deprecated and will be removed in hf_snapvit 0.2: give the model first, hf-snapvit {row.name} "
        "my-model ..."]
    both = build_parser(row.name).parse_args([row.name, "a", *rest, "--model", "b"])
    with pytest.raises(hf_snapvit.ConfigError, match="Two models given, 'a' and --model 'b'"):
        resolve_model(both)
    with pytest.raises(hf_snapvit.ConfigError, match=f"No model given: hf-snapvit {row.name} [A-Z]+ "):
        resolve_model(build_parser(row.name).parse_args([row.name, *rest]))


def test_the_deprecated_option_still_runs(elastic_dir, capsys):
    assert main(["inspect", "--model", str(elastic_dir)]) == 0
    captured = capsys.readouterr()
    assert "checkpoint:   vit-elastic" in captured.out and "--model is deprecated" in captured.err


def test_bench_x_means_a_speedup_in_both_tables():
    result = {"checkpoint": "vit-elastic", "hardware": {},
              "loading": {"results": [{"requested_sparsity": 0.3, "load_s": 0.5,
                                       "ratios_to_elastic_dense": {"load_s": 0.5, "anon_growth": 0.6}}]}}
    text = bench_command.render(result)
    assert "x dense" not in text and bench_command.SPEEDUP in text
    header, row = text.splitlines()[-2:]
    assert header.split() == ["sparsity", "load", "s", "load", "x", "memory"]
    assert row.split() == ["0.30", "0.500", "2.00", "0.60"]  # twice as fast to load as dense, 0.6 of its memory

