"""Issue 16, items 7 and 9: calibration data and settings a careless or hostile caller hands us, and the CLI as a new
user meets it. Every case here gave a raw library error, a crash deep in torch/numpy or a silent wrong result."""

from __future__ import annotations

import io
import json
import logging
import math

import datasets
import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import hf_snapvit as hs
from hf_snapvit.data.sampling import key_order
from hf_snapvit.data.calibration import calibration_batches, draw_calibration, sample_images
from hf_snapvit.cli import main
from hf_snapvit.data.images import MAX_CORRUPT_FRACTION
from hf_snapvit.errors import ConfigError, DataError, EvaluationError
from hf_snapvit.evaluation import load_split
from hf_snapvit.pruning.scoring import ScoreConfig
from hf_snapvit.data.views import MultiCropConfig, check_pixel_values

from helpers import CASES, FEW_CROPS, PROCESSOR, images

CASE = {c.name: c for c in CASES}
TINY = hs.SnapViTConfig(num_gradient_images=4, num_fitness_images=4, scores=FEW_CROPS, max_generations=1,
                        fitness_sparsities=(0.3,), pca_components=4)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _table(num_good: int, corrupt_rows: tuple[int, ...]) -> datasets.Dataset:
    """An in-memory Dataset (decoded lazily) whose rows ``corrupt_rows`` hold bytes that are not an image."""
    good = iter(images(num_good))
    rows = []
    for i in range(num_good + len(corrupt_rows)):
        value = b"not an image" if i in corrupt_rows else _png(next(good))
        rows.append({"image": {"bytes": value, "path": None}, "label": i % 3})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    return datasets.Dataset.from_list(rows, features=features)


def rank(data, model=None, **kwargs):
    return hs.rank(model or CASE["vit"].build(), method="snapvit", data=data, config=TINY, show_progress=False,
                   **kwargs)


# ------------------------------------------------------------------------------------------------ item 7: images
def test_a_corrupt_row_of_a_dataset_is_skipped_named_and_counted(caplog):
    table = _table(20, corrupt_rows=(3,))
    with caplog.at_level(logging.WARNING, logger="hf_snapvit"):
        drawn, labels = sample_images(table, 21, seed=0, label_column="label")
    assert len(drawn) == 20 and all(isinstance(x, Image.Image) for x in drawn)
    assert "row 3" in caplog.text and "1 skipped" in caplog.text
    # the images drawn are the valid rows, each with its own label, in the seeded order
    order = [i for i in key_order(21, 0) if i != 3]
    decoded = table.cast_column("image", datasets.Image(decode=False))
    expected = [Image.open(io.BytesIO(decoded[int(i)]["image"]["bytes"])).convert("RGB") for i in order]
    assert [x.tobytes() for x in drawn] == [x.tobytes() for x in expected]
    assert labels.tolist() == [int(i) % 3 for i in order]


def test_a_corrupt_row_does_not_stop_a_ranking():
    ranking = rank(_table(12, corrupt_rows=(0,)), processor=PROCESSOR)
    assert ranking.provenance["calibration_data"]["num_gradient"] == 4


def test_a_corrupt_row_is_replaced_so_the_draw_keeps_its_size():
    first = int(np.random.default_rng(1).permutation(11)[0])
    table = _table(10, corrupt_rows=(first,))
    drawn, _ = sample_images(table, 5, seed=1)
    assert len(drawn) == 5


def test_too_many_corrupt_rows_fail_naming_them_and_the_bound():
    table = _table(8, corrupt_rows=(1, 4, 6))
    with pytest.raises(DataError, match=r"rows \[1, 4, 6\]") as error:
        sample_images(table, 11, seed=0)
    assert f"{MAX_CORRUPT_FRACTION:.0%}" in str(error.value)


@pytest.mark.parametrize("data, needle", [
    ("train.parquet", "load_image_dataset"),
    ("user/some-dataset", "load_image_dataset"),
    ({"pixel_values": torch.randn(4, 3, 32, 32)}, "data['pixel_values']"),
    ({"image": images(4)}, "datasets.Dataset.from_dict"),
])
def test_a_path_or_a_dict_as_data_says_what_to_pass(data, needle):
    with pytest.raises(DataError, match=type(data).__name__) as error:
        rank(data, processor=PROCESSOR)
    assert needle in str(error.value)


def test_correction_still_takes_a_dict_of_tensors():
    batches, count = calibration_batches({"pixel_values": torch.randn(5, 3, 32, 32)}, num_samples=4, batch_size=2)
    assert count == 4 and [b["pixel_values"].shape[0] for b in batches] == [2, 2]


def test_nan_or_inf_pixels_fail_naming_the_image():
    for bad in (float("nan"), float("inf")):
        pixels = torch.randn(8, 3, 32, 32)
        pixels[5, 1, 2, 3] = bad
        with pytest.raises(DataError, match=r"not finite.*image 5"):
            rank(pixels)
        with pytest.raises(DataError, match="image 5"):
            calibration_batches({"pixel_values": pixels}, num_samples=8)


def test_pixels_that_require_grad_are_detached_with_a_warning():
    pixels = torch.randn(8, 3, 32, 32)
    with pytest.warns(UserWarning, match="requires_grad"):
        ranking = rank(pixels.clone().requires_grad_())
    assert np.array_equal(ranking.head_scores, rank(pixels).head_scores)


def test_uint8_pixels_fail_and_0_255_floats_warn():
    raw = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    with pytest.raises(DataError, match="uint8.*processor"):
        rank(raw)
    with pytest.warns(UserWarning, match="0-255"):
        check_pixel_values(raw.float())
    check_pixel_values(torch.rand(8, 3, 32, 32))  # rescaled [0, 1] pixels pass silently


def test_pixels_smaller_than_one_patch_fail_naming_the_patch_size():
    model = CASE["vit"].build()  # 8-px patches
    with pytest.raises(DataError, match=r"4x4.*8-px patch"):
        draw_calibration(torch.randn(8, 3, 4, 4), 4, 4, model=model)
    with pytest.raises(DataError, match=r"4x4.*8-px patch"):
        calibration_batches(torch.randn(8, 3, 4, 4), num_samples=4, model=model)
    draw_calibration(torch.randn(8, 3, 32, 32), 4, 4, model=model)

    # The public entry points pass the model on, so a ranking or a correction fails the same way.
    for method in ("snapvit", "snip"):
        with pytest.raises(DataError, match=r"4x4.*8-px patch"):
            hs.rank(model, method=method, data=torch.randn(8, 3, 4, 4), preset="fast", show_progress=False)


def test_a_model_built_in_code_without_a_processor_asks_for_one():
    model = CASE["vit"].build()
    assert not model.config._name_or_path
    with pytest.raises(DataError, match=r"processor=AutoImageProcessor\.from_pretrained"):
        rank(images(8), model=model)


# ------------------------------------------------------------------------------------------------ item 7: settings
@pytest.mark.parametrize("overrides, needle", [
    (dict(pca_components=0), "pca_components"),
    (dict(pca_components=2.5), "pca_components"),
    (dict(fitness_sparsities=()), "fitness_sparsities"),
    (dict(fitness_sparsities=(0.3, 1.0)), "fitness_sparsities"),
    (dict(fitness_sparsities=(-0.1,)), "fitness_sparsities"),
    (dict(fitness_sparsities=(math.nan,)), "fitness_sparsities"),
    (dict(fitness_sparsities=0.3), "fitness_sparsities"),
    (dict(fitness_batch_size=0), "fitness_batch_size"),
    (dict(num_gradient_images=0), "num_gradient_images"),
    (dict(num_fitness_images=-3), "num_fitness_images"),
    (dict(num_gradient_images="8"), "num_gradient_images"),
    (dict(max_generations=-1), "max_generations"),
    (dict(max_evaluations=-1), "max_evaluations"),
    (dict(population_size=1), "population_size"),
    (dict(sigma=0.0), "sigma"),
    (dict(sigma=math.inf), "sigma"),
    (dict(init_mean=(1.0,)), "init_mean"),
    (dict(covariance="full"), "covariance"),
    (dict(mode="local"), "mode"),
    (dict(min_head_keep_ratio=1.5), "min_head_keep_ratio"),
    (dict(seed=1.5), "seed"),
    (dict(scores="obd"), "scores"),
])
def test_impossible_snapvit_settings_are_refused_by_the_config(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        hs.SnapViTConfig(**overrides)


@pytest.mark.parametrize("make, needle", [
    (lambda: ScoreConfig(batch_size=0), "batch_size"),
    (lambda: ScoreConfig(definition="hessian"), "definition"),
    (lambda: ScoreConfig(loss="mse"), "loss"),
    (lambda: ScoreConfig(head_rows="qk"), "head_rows"),
    (lambda: ScoreConfig(crops=MultiCropConfig(num_global=0)), "num_global"),
    (lambda: MultiCropConfig(num_local=-1), "num_local"),
    (lambda: MultiCropConfig(global_scale=(0.5, 0.2)), "global_scale"),
    (lambda: MultiCropConfig(local_scale=(0.0, 0.2)), "local_scale"),
    (lambda: MultiCropConfig(local_size=0), "local_size"),
])
def test_impossible_score_and_crop_settings_are_refused(make, needle):
    with pytest.raises(ConfigError, match=needle):
        make()


def test_every_preset_is_still_valid():
    for name in ("default", "fast", "paper"):
        assert hs.SnapViTConfig.preset(name).preset_name() == name


# ------------------------------------------------------------------------------------------------ item 9: the CLI
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    model = CASE["vit-cls"].build()
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def split_files(tmp_path_factory):
    """train.parquet and validation.parquet with different images (so a mix-up shows in the counts)."""
    folder = tmp_path_factory.mktemp("splits")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=5)})
    for split, n, seed in (("train", 12, 1), ("validation", 7, 2)):
        rows = [{"image": {"bytes": _png(im), "path": None}, "label": i % 5} for i, im in enumerate(images(n, seed))]
        datasets.Dataset.from_list(rows, features=features).to_parquet(str(folder / f"{split}.parquet"))
    return folder


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code, err, *needles, absent=()):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and lines and lines[-1].startswith("error: "), err
    for needle in needles:
        assert needle in lines[-1], lines[-1]
    for word in absent:
        assert word not in lines[-1], lines[-1]


def test_eval_at_a_sparsity_of_a_sliced_checkpoint_is_refused(elastic_dir, split_files, tmp_path, capsys):
    code, _, err = cli(capsys, "export", "--model", elastic_dir, "--sparsity", "0.3", "--output", tmp_path / "s30")
    assert code == 0, err
    code, out, err = cli(capsys, "eval", "--model", tmp_path / "s30", "--sparsity", "0.5", "--data",
                         split_files / "validation.parquet", "-q")
    one_line_error(code, err, "sliced", "--sparsity", "dense elastic checkpoint")
    assert out == ""
    # as saved, it reports its own sparsity against the dense model, not 0
    code, out, err = cli(capsys, "eval", "--model", tmp_path / "s30", "--data", split_files / "validation.parquet",
                         "--metrics", "top1", "--json", "-q")
    assert code == 0, err
    assert json.loads(out)["sparsity"] == pytest.approx(0.3, abs=0.05)
    # the library refuses the same call unless it is given the dense model
    with pytest.raises(EvaluationError, match="sliced"):
        hs.evaluate(str(tmp_path / "s30"), load_split(split_files / "validation.parquet", "validation"),
                    sparsity=0.5, show_progress=False)
    result = hs.evaluate(str(tmp_path / "s30"), load_split(split_files / "validation.parquet", "validation"),
                         sparsity=0.5, dense_model=str(elastic_dir), show_progress=False)
    assert result.sparsity == pytest.approx(0.5, abs=0.05) and result.retention is not None


def test_eval_on_a_file_of_another_split_is_refused(elastic_dir, split_files, capsys):
    train = split_files / "train.parquet"
    code, _, err = cli(capsys, "eval", "--model", elastic_dir, "--sparsity", "0.3", "--data", train, "-q")
    one_line_error(code, err, "train.parquet", "'train'", "--split")
    with pytest.raises(EvaluationError, match="split"):
        load_split(train, "validation")
    assert len(load_split(train, "train")) == 12
    # the file of the asked split is read, and the output names what was evaluated
    code, out, err = cli(capsys, "eval", "--model", elastic_dir, "--sparsity", "0.3", "--data",
                         split_files / "validation.parquet", "--metrics", "top1", "-q")
    assert code == 0, err
    assert "validation.parquet" in out and "split 'validation'" in out and "7 evaluated" in out
    code, out, err = cli(capsys, "eval", "--model", elastic_dir, "--data", split_files, "--metrics", "top1",
                         "--json", "-q")
    assert code == 0, err
    result = json.loads(out)
    assert result["num_eval"] == 7 and result["split"] == "validation"


def test_a_bank_metric_without_a_bank_names_the_flag(elastic_dir, split_files, capsys):
    code, _, err = cli(capsys, "eval", "--model", elastic_dir, "--data", split_files / "validation.parquet",
                       "--metrics", "knn", "-q")
    one_line_error(code, err, "--bank-data", absent=("bank_data=",))


# A push without a token names --token: tests/cli/test_cli.py::test_push_without_a_token_fails_before_ranking.


def test_quiet_silences_the_datasets_and_hub_progress_bars(elastic_dir, tmp_path, capsys):
    import huggingface_hub.utils as hub_utils

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=5)})
    rows = [{"image": {"bytes": _png(im), "path": None}, "label": i % 5} for i, im in enumerate(images(6, 9))]
    path = tmp_path / "validation.parquet"  # a new file: datasets prepares it, with a progress bar
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    capsys.readouterr()
    datasets.enable_progress_bars()
    before = (datasets.utils.are_progress_bars_disabled(), hub_utils.are_progress_bars_disabled())
    try:
        code, out, err = cli(capsys, "eval", "--model", elastic_dir, "--sparsity", "0.3", "--data", path,
                             "--metrics", "top1", "-q")
        assert code == 0, err
        assert "Generating" not in err and "%|" not in err, err
        # restored afterwards: -q is for one run, not for the process
        assert (datasets.utils.are_progress_bars_disabled(), hub_utils.are_progress_bars_disabled()) == before
        assert not before[0]
    finally:
        datasets.enable_progress_bars()
