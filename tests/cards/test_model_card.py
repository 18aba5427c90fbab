"""Model cards: metadata, the size table checked against real sliced models, evaluations, snippet, provenance."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace
from pathlib import Path

import pytest
import transformers
from huggingface_hub import ModelCard

import hf_snapvit
from hf_snapvit.architectures.budget import backbone_parameters, layer_widths
from hf_snapvit.architectures.flops import estimate_gflops
from hf_snapvit.errors import ModelCardError
from hf_snapvit.cards.elastic import (
    HEATMAP_FILENAME,
    TEMPLATE_PATH,
    Evaluation,
    make_model_card,
    parse_evaluations,
    write_model_card,
)

from helpers import CASES, PROCESSOR, SHARED, SHARED_MODEL, images, requires_shared, tiny_vit_classifier


@pytest.fixture(scope="module")
def card_checkpoint(tmp_path_factory):
    model = tiny_vit_classifier(num_hidden_layers=3)
    ranking = hf_snapvit.rank(model, method="random", seed=3)
    folder = tmp_path_factory.mktemp("card") / "elastic"
    hf_snapvit.save_elastic(model, ranking, folder,
                            image_processor=transformers.ViTImageProcessor(size={"height": 32, "width": 32}))
    return folder, ranking


def table(card: ModelCard) -> dict[str, list[str]]:
    """The size table (the one headed "| sparsity"; a sliced card's per-block table is another) as {first cell:
    cells}."""
    lines = card.text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| sparsity")) + 2  # past the header and rule
    rows = itertools.takewhile(lambda line: line.startswith("| "), lines[start:])
    return {cells[0]: cells for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


def test_metadata_follows_hub_conventions(card_checkpoint):
    folder, _ = card_checkpoint
    card = ModelCard(str(make_model_card(folder, base_model="google/vit-base-patch16-224", license="apache-2.0")))
    assert card.data.base_model == "google/vit-base-patch16-224"
    assert card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "image-classification"
    assert {"hf-snapvit", "elastic", "pruned", "pruning", "vision-transformer"} <= set(card.data.tags)
    assert card.data.license == "apache-2.0"
    assert card.data.eval_results is None  # no evaluations, no model-index


def test_backbone_gets_feature_extraction_tag_and_local_base_is_left_out(tmp_path):
    model = transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         intermediate_size=37, image_size=32, patch_size=8))
    ranking = hf_snapvit.rank(model, method="magnitude")
    ranking = replace(ranking, provenance={**ranking.provenance, "base_model": str(tmp_path)})  # a local path
    card = make_model_card(ranking)  # the default grid stops at this small model's max_sparsity
    assert ranking.max_sparsity < 0.6 and "60 %" not in table(card) and "10 %" in table(card)
    assert card.data.pipeline_tag == "image-feature-extraction"
    assert card.data.base_model is None
    ranking = replace(ranking, provenance={**ranking.provenance, "base_model": "facebook/dino-vits16"})
    assert make_model_card(ranking).data.base_model == "facebook/dino-vits16"


def test_table_matches_models_actually_loaded_at_each_sparsity(card_checkpoint):
    folder, _ = card_checkpoint
    rows = table(make_model_card(folder, sparsities=(0.2, 0.4)))
    assert set(rows) == {"0 % (dense)", "20 %", "40 %"}
    for label, sparsity in (("20 %", 0.2), ("40 %", 0.4)):
        small = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=sparsity)
        heads, neurons = layer_widths(small)
        params = backbone_parameters(small)
        assert rows[label][1] == (f"{params / 1e3:.1f} k")
        assert rows[label][3] == f"{sum(heads)} / 12" and rows[label][4] == f"{sum(neurons)} / 111"
        assert float(rows[label][2]) == pytest.approx(small.config.elastic_layout["gflops"], rel=1e-3)
    dense = transformers.AutoModelForImageClassification.from_pretrained(folder)
    assert rows["0 % (dense)"][1] == f"{backbone_parameters(dense) / 1e3:.1f} k"


def test_evaluations_fill_table_and_model_index(card_checkpoint):
    folder, _ = card_checkpoint
    evaluations = [
        {"sparsity": 0.0, "metric": "accuracy", "value": 0.71, "dataset": "zh-plus/tiny-imagenet",
         "split": "validation", "num_samples": 500},
        Evaluation(0.3, "accuracy", 0.5, "zh-plus/tiny-imagenet", "validation", 500),
        {"sparsity": 0.3, "metric": "knn_accuracy", "value": 0.25, "dataset": "zh-plus/tiny-imagenet"},
        {"sparsity": 0.35, "metric": "accuracy", "value": 0.4, "dataset": "zh-plus/tiny-imagenet",
         "split": "validation"},
    ]
    card = ModelCard(str(make_model_card(folder, evaluations=evaluations, repo_id="me/vit-elastic")))
    rows = table(card)
    assert rows["0 % (dense)"][5] == "71.0 %" and rows["30 %"][5] == "50.0 %" and rows["30 %"][6] == "25.0 %"
    assert rows["35 %"][5] == "40.0 %"  # a measured sparsity off the grid gets its own row
    assert rows["10 %"][5] == "–"
    results = card.data.eval_results
    assert sorted((r.metric_type, r.metric_value, r.metric_args["sparsity"]) for r in results) == [
        ("accuracy", 0.4, 0.35), ("accuracy", 0.5, 0.3), ("accuracy", 0.71, 0.0), ("knn_accuracy", 0.25, 0.3)]
    assert {r.dataset_type for r in results} == {"zh-plus/tiny-imagenet"}
    assert results[0].task_type == "image-classification" and card.data.model_name == "vit-elastic"
    assert "500 images" in card.text


class _Result:  # the shape of hf_snapvit.evaluation.EvaluationResult
    def __init__(self, **fields):
        self.fields = fields

    def to_dict(self):
        return dict(self.fields)


def test_evaluation_results_objects_expand_to_one_record_per_metric():
    results = [_Result(sparsity=0.3, top1=0.5, knn_top1=0.4, linear_top1=None, retention=0.9, num_eval=200)]
    records = parse_evaluations(results, eval_dataset="tiny", eval_split="validation")
    assert [(r.metric, r.value, r.dataset, r.split, r.num_samples) for r in records] == [
        ("accuracy", 0.5, "tiny", "validation", 200), ("knn_accuracy", 0.4, "tiny", "validation", 200),
        ("retention", 0.9, "tiny", "validation", 200)]
    assert parse_evaluations({"results": [{"sparsity": 0.1, "metric": "m", "value": 1, "dataset": "d"}]})[0].value == 1
    with pytest.raises(ModelCardError, match="eval_dataset"):
        parse_evaluations(results)


def test_results_with_realised_sparsity_land_on_their_grid_row(card_checkpoint):
    folder, ranking = card_checkpoint
    realised = ranking.keep_counts(0.3).sparsity  # what an evaluation of the 30 % model reports
    assert realised != 0.3
    card = make_model_card(folder, evaluations=[_Result(sparsity=realised, top1=0.42, num_eval=10)],
                           eval_dataset="tiny", eval_split="validation")
    rows = table(card)
    assert rows["30 %"][5] == "42.0 %" and len(rows) == 7  # dense + the 6 grid rows, no extra row


@pytest.mark.parametrize("bad, message", [
    ([{"sparsity": 0.3, "metric": "accuracy", "value": 0.5}], r"lacks \['dataset'\]"),
    ([{"sparsity": 1.5, "metric": "accuracy", "value": 0.5, "dataset": "d"}], r"sparsity=1.5 .*\[0, 1\)"),
    ([{"sparsity": 0.3, "metric": "accuracy", "value": float("nan"), "dataset": "d"}], "finite number"),
    ([{"sparsity": 0.3, "metric": "", "value": 0.5, "dataset": "d"}], "non-empty string"),
    ({"accuracy": 0.5}, "without a 'results' list"),
    ("accuracy", "must be a list"),
])
def test_bad_evaluations_raise_clear_errors(bad, message):
    with pytest.raises(ModelCardError, match=message) as error:
        parse_evaluations(bad)
    assert isinstance(error.value, (hf_snapvit.SnapViTError, ValueError))


def test_sliced_checkpoint_card_describes_its_own_size(card_checkpoint, tmp_path):
    folder, _ = card_checkpoint
    small = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    small.save_pretrained(tmp_path / "small")
    card = make_model_card(tmp_path / "small", sparsities=(0.1, 0.3, 0.5), repo_id="me/small")
    rows = table(card)
    saved = small.config.elastic_layout
    this = next(label for label in rows if "this checkpoint" in label)
    assert rows[this][3] == f"{sum(saved['num_heads'])} / 12"
    assert "10 %" not in rows and "50 %" in rows  # a sliced checkpoint cannot grow back
    assert 'ElasticViTModel.from_pretrained("me/small")' in card.text
    with pytest.raises(ModelCardError, match="below this checkpoint's saved sparsity"):
        make_model_card(tmp_path / "small", evaluations=[{"sparsity": 0.1, "metric": "a", "value": 1, "dataset": "d"}])


def test_usage_snippet_runs_against_the_checkpoint(card_checkpoint):
    folder, _ = card_checkpoint
    card = make_model_card(folder, repo_id=str(folder))
    code = re.search(r"```python\n(.*?)```", card.text, re.S).group(1)
    load = [line for line in code.splitlines() if "from_pretrained" in line or " import " in line]
    namespace: dict = {}
    exec("\n".join(load), namespace)  # the card's own import and load lines, pointed at the local folder
    heads, _ = layer_widths(namespace["model"])
    assert sum(heads) < 12 and namespace["processor"] is not None


def test_provenance_citation_and_preset(card_checkpoint):
    folder, ranking = card_checkpoint
    text = make_model_card(folder).text
    assert "`random`" in text and "**Seed**: 3" in text
    assert "Elastic ViTs from Pretrained Models without Retraining" in text and "@inproceedings" in text
    assert "Neural Information Processing Systems" in text and "2025" in text
    settings = hf_snapvit.SnapViTConfig.preset("fast", seed=7).to_dict()
    snap = replace(ranking.sorted(), provenance={"method": "snapvit", "preset": "fast", "settings": settings,
                                                 "seed": 7,
                                                 "calibration_data": {"num_gradient": 128, "num_fitness": 128,
                                                                      "source": "Dataset", "image_column": "image"}})
    text = make_model_card(snap).text
    assert "preset `fast`" in text and "128 gradient + 128 fitness images" in text and "column `image`" in text
    assert "score definition `obd`, units within a block in `output` order, search budget 3 xNES generations" in text
    plain = replace(snap, provenance={**snap.provenance, "settings": {**settings, "unit_order": "scores"}})
    assert "order" not in next(line for line in make_model_card(plain).text.splitlines()
                               if line.startswith("- **Settings**"))
    assert "3 xNES generations, the search distribution's mean as the result" in text  # the presets' result
    assert "the result, fitness at 30 % sparsity" in text  # the fast preset's, unlike the default's
    four = replace(snap, provenance={**snap.provenance, "settings": hf_snapvit.SnapViTConfig().to_dict()})
    assert "fitness at 10 / 30 / 50 / 60 % sparsity" in make_model_card(four).text
    best = replace(snap, provenance={**snap.provenance, "settings": {**settings, "solution": "best"}})
    best_text = make_model_card(best).text
    assert "3 xNES generations, the best candidate as the result" in best_text and "mean" not in best_text
    del settings["solution"]  # recorded before the option existed: nothing said
    assert "as the result" not in make_model_card(snap).text


def test_search_line_says_when_the_search_stopped_early(card_checkpoint):
    _, ranking = card_checkpoint

    def search_line(solution=None, **search) -> str:
        provenance = {"method": "snapvit", "search": {"best_loss": 0.5, "evaluations": 45, "generations": 3, **search}}
        if solution:
            provenance["settings"] = {"solution": solution}
        text = make_model_card(replace(ranking.sorted(), provenance=provenance)).text
        return next(line for line in text.splitlines() if line.startswith("- **Search**"))

    assert search_line() == "- **Search**: 45 candidate evaluations in 3 generations, best loss 0.5"
    assert search_line(stopped_early=False) == search_line()
    assert search_line(stopped_early=True).endswith("best loss 0.5; stopped early, the loss no longer falling")
    # The search's mean as the result: its own loss beside the best candidate's; not for the best as the result.
    assert search_line("mean", loss=0.5123, stopped_early=True).endswith(
        "best loss 0.5, the result's (the search's mean) 0.5123; stopped early, the loss no longer falling")
    assert search_line("best", loss=0.5) == search_line() == search_line("mean", loss=None)


def method_line(card: ModelCard) -> str:
    return next(line for line in card.text.splitlines() if line.startswith("- **Method**"))


def test_preset_comes_from_the_recorded_provenance(card_checkpoint):
    _, ranking = card_checkpoint
    settings = hf_snapvit.SnapViTConfig.preset("fast").to_dict()

    def card_of(**provenance) -> ModelCard:
        return make_model_card(replace(ranking.sorted(), provenance={"settings": settings, **provenance}))

    assert method_line(card_of(method="snapvit", preset="fast")) == "- **Method**: `snapvit`, preset `fast`"
    assert method_line(card_of(method="snapvit", preset=None)) == "- **Method**: `snapvit`, custom settings"
    # Stored before the preset was recorded: the card does not guess it from the settings.
    assert method_line(card_of(method="snapvit")) == "- **Method**: `snapvit`"


def test_gradient_baseline_cards_name_the_preset_they_ran_with():
    model = next(c for c in CASES if c.name == "vit-cls").build()
    fast = hf_snapvit.rank(model, method="snip", data=images(4), processor=PROCESSOR, preset="fast",
                           show_progress=False)
    assert method_line(make_model_card(fast)) == "- **Method**: `snip`, preset `fast`"
    custom = hf_snapvit.rank(model, method="snip", data=images(4), processor=PROCESSOR,
                             config=hf_snapvit.SnapViTConfig.preset("fast", num_gradient_images=4),
                             show_progress=False)
    assert method_line(make_model_card(custom)) == "- **Method**: `snip`, custom settings"


def test_write_model_card_writes_readme_and_heatmap(card_checkpoint, tmp_path):
    folder, _ = card_checkpoint
    card = write_model_card(folder, tmp_path / "out", repo_id="me/x")
    assert (tmp_path / "out" / "README.md").read_text() == str(card) + "\n"
    assert (tmp_path / "out" / HEATMAP_FILENAME).read_bytes().startswith(b"\x89PNG")
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []
    card = write_model_card(folder, tmp_path / "plain", heatmap_path=None)
    assert not (tmp_path / "plain" / HEATMAP_FILENAME).exists() and "![" not in card.text
    with pytest.raises(TypeError, match=r"write_model_card\(\) got unexpected keyword arguments \['sparsity'\]; "
                                        r"the card's settings are base_model, evaluations, sparsities"):
        write_model_card(folder, tmp_path / "typo", sparsity=0.3)
    assert not (tmp_path / "typo").exists()


def test_every_card_writer_takes_the_one_declared_list_of_card_settings():
    """CardOptions is the one declaration: push_to_hub's card arguments are its names (less the two it sets itself:
    its repository and the heatmap's file), and what save_and_push forwards to the saved card is the rest."""
    import inspect

    from hf_snapvit.cards.render import CARD_OPTION_NAMES
    from hf_snapvit.publishing.hub import CARD_OPTIONS, push_to_hub

    pushed = (set(inspect.signature(push_to_hub).parameters) & set(CARD_OPTION_NAMES)) - {"repo_id"}
    assert pushed == set(CARD_OPTION_NAMES) - {"repo_id", "heatmap_path"}
    assert set(CARD_OPTIONS) == pushed - {"base_model", "evaluations"}


def test_not_elastic_and_bad_sparsities_raise(tmp_path, card_checkpoint):
    folder, _ = card_checkpoint
    with pytest.raises(ModelCardError, match="no config.json"):
        make_model_card(tmp_path)
    with pytest.raises(ModelCardError, match="neither elastic nor sliced"):
        make_model_card(transformers.ViTConfig())
    with pytest.raises(ModelCardError, match=r"\(0, 1\)"):
        make_model_card(folder, sparsities=(0.0, 0.3))
    with pytest.raises(ModelCardError, match="max|out of range"):
        make_model_card(folder, sparsities=(0.99,))


def test_template_ships_inside_the_package():
    assert TEMPLATE_PATH.is_file() and Path(hf_snapvit.__file__).parent in TEMPLATE_PATH.parents


def test_sliced_checkpoint_without_ranking_only_describes_its_size(card_checkpoint, tmp_path):
    folder, _ = card_checkpoint
    small = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    del small.config.elastic_ranking
    small.save_pretrained(tmp_path / "bare")
    card = make_model_card(tmp_path / "bare", heatmap_path=HEATMAP_FILENAME)
    assert len(table(card)) == 1 and "![" not in card.text
    assert "not stored in this checkpoint" in card.text
    with pytest.raises(ModelCardError, match="only serves its saved sparsity"):
        make_model_card(tmp_path / "bare", evaluations=[{"sparsity": 0.5, "metric": "a", "value": 1, "dataset": "d"}])


@requires_shared(SHARED_MODEL)
def test_example_card_describes_the_shared_vit_tiny():
    """The checked-in card (benchmarks/make_example_card.py) against the real model, measured independently."""
    example = Path(__file__).resolve().parents[2] / "model_cards" / "vit-tiny-tinyimagenet-elastic"
    card = ModelCard((example / "README.md").read_text())
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "image-classification"
    assert card.data.base_model == "WinKawaks/vit-tiny-patch16-224"
    assert (example / HEATMAP_FILENAME).read_bytes().startswith(b"\x89PNG")
    model = transformers.AutoModelForImageClassification.from_pretrained(SHARED / "models" / "vit-tiny-tinyimagenet")
    dense_params = backbone_parameters(model)
    rows = table(card)
    dense = rows["0 % (dense)"]
    assert dense[1] == f"{dense_params / 1e6:.2f} M" and dense[3] == "36 / 36" and dense[4] == "9216 / 9216"
    assert float(dense[2]) == pytest.approx(estimate_gflops(model), rel=1e-3)
    for sparsity in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
        params = float(rows[f"{100 * sparsity:.4g} %"][1].removesuffix(" M")) * 1e6
        assert params == pytest.approx((1 - sparsity) * dense_params, rel=0.01)


def test_titles_name_the_folder_or_the_family_and_blocks_count_from_zero(card_checkpoint, tmp_path):
    """Issue 64: no "Elastic vit"; every card and the heatmap number blocks from 0, as the modules do."""
    from hf_snapvit.plots import plot_allocation

    folder, ranking = card_checkpoint
    assert "# Elastic ViT\n" in make_model_card(ranking).text  # a bare ranking: the family, as transformers names it
    assert "# elastic\n" in ModelCard.load(folder / "README.md").text  # save_elastic's card: its folder's name
    assert "# me-repo\n" in make_model_card(folder, repo_id="org/me-repo").text
    small = hf_snapvit.ElasticViTModel.from_pretrained(folder, sparsity=0.3)
    config = small.config.to_dict()
    del config["elastic_ranking"]
    from hf_snapvit.cards.sliced import sliced_card

    card = sliced_card({**config, "auto_map": {"AutoModelForImageClassification": "m.C"}}, "vit-30")
    assert "# vit-30\n" in card.text and "A **" in card.text and "sparse** ViT sliced" in card.text
    assert [row.split("|")[1].strip() for row in card.text.splitlines() if re.match(r"\| \d+ \|", row)] == \
        ["0", "1", "2"]
    figure = plot_allocation(ranking, sparsities=(0.3,))
    assert [t.get_text() for t in figure.axes[1].get_xticklabels()] == ["0", "1", "2"]


def test_a_base_model_given_at_save_time_stays_in_later_cards(card_checkpoint, tmp_path):
    folder, _ = card_checkpoint
    dense = transformers.ViTForImageClassification.from_pretrained(folder)
    hf_snapvit.save_elastic(dense, hf_snapvit.rank(dense, method="magnitude"), tmp_path / "e",
                            base_model="google/vit-base-patch16-224")
    write_model_card(tmp_path / "e", tmp_path / "e")  # a refresh, with no arguments
    card = ModelCard.load(tmp_path / "e" / "README.md")
    assert card.data.base_model == "google/vit-base-patch16-224"
    assert "[`google/vit-base-patch16-224`](https://huggingface.co/google/vit-base-patch16-224)" in card.text
    hf_snapvit.ElasticViTModel.from_pretrained(tmp_path / "e", sparsity=0.3).save_pretrained(tmp_path / "s")
    assert ModelCard.load(tmp_path / "s" / "README.md").data.base_model == "google/vit-base-patch16-224"
