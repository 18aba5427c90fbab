"""benchmarks/prefix_correction_vit_tiny.py on the shared ViT-Tiny with a few images: the plain rows are the
uncorrected slices, the checked rows are corrected exactly where the stored size check says, switches are timed with
and without the correction, and the JSON holds what the tables are made from."""

from __future__ import annotations

import json

import pytest

from hf_snapvit.correction import prefix_sizes
from hf_snapvit.correction.prefix import applies_at

from helpers import SHARED, SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION, load_benchmark, requires_shared

ACCURACY = load_benchmark("prefix_correction_vit_tiny")


@pytest.mark.slow  # two elastic checkpoints of the shared ViT-Tiny, a size check and a few evaluations
@requires_shared(SHARED_MODEL, SHARED_TRAIN, SHARED_VALIDATION)
def test_the_benchmark_loads_corrected_sizes_exactly_where_the_check_applies_them(tmp_path, monkeypatch):
    output = tmp_path / "result.json"
    # The size check on a 25 % grid (0.25, 0.5, 0.75, the maximum) rather than the default 5 % one: 4 sizes instead of
    # 17, each a dense-model copy and two forwards; the loaded sizes (0.2, 0.5) fall below and on checked ones.
    monkeypatch.setattr(prefix_sizes, "GRID_STEP", 0.25)
    ACCURACY.main(["--num-calibration", "16", "--num-val", "40", "--num-bank", "40", "--sparsities", "0.2", "0.5",
                   "--variants", "plain", "checked", "--output", str(output)])
    result = json.loads(output.read_text())
    rows = {(r["variant"], r["sparsity"]): r for r in result["rows"]}
    assert set(rows) == {(v, s) for v in ("plain", "checked") for s in (0.2, 0.5)}
    assert not any(rows[("plain", s)]["corrected"] for s in (0.2, 0.5))
    record = result["records"]["checked"]
    assert record["method"] == "prefix" and record["num_images"] == 16
    assert [s["requested"] for s in record["sizes"]][:3] == [0.25, 0.5, 0.75] and len(record["sizes"]) == 4
    for sparsity in (0.2, 0.5):
        row, plain = rows[("checked", sparsity)], rows[("plain", sparsity)]
        if not row["corrected"]:  # the plain slice, so the same scores
            assert (row["top1"], row["knn_top1"]) == (plain["top1"], plain["knn_top1"])
    applied = [applies_at(record, s["sparsity"]) for s in record["sizes"]]
    assert applied == [s["kept"] for s in record["sizes"]]  # at a checked size, its recorded verdict
    assert all(s["helped"] for s in record["sizes"] if s["kept"])  # corrected only where its own check passed


@pytest.mark.slow
@requires_shared(SHARED_MODEL, SHARED_TRAIN)
def test_the_switch_timing_compares_plain_and_corrected_switches(tmp_path):
    output = tmp_path / "switch.json"
    ACCURACY.main(["--variants", "every-size", "--num-calibration", "8", "--num-val", "0", "--num-bank", "0",
                   "--sparsities", "0.3", "--switch-repeats", "2", "--output", str(output)])
    result = json.loads(output.read_text())
    switch = result["records"]["every-size"]["switch"]
    assert result["rows"] == [] and [r["sparsity"] for r in switch["rows"]] == [0.3]  # no scores asked
    assert switch["rows"][0]["plain_seconds"] > 0 and switch["rows"][0]["corrected_seconds"] > 0
    assert 0.5 < switch["file_bytes"]["prefix_correction.safetensors"] / switch["file_bytes"]["model.safetensors"] < 2


@requires_shared(SHARED_TRAIN)
def test_calibration_images_are_never_images_of_the_knn_bank():
    from hf_snapvit.evaluation import load_split

    data = str(SHARED.joinpath(*SHARED_TRAIN).parent)
    bank = {image.tobytes() for image in load_split(data, "train", num_samples=300, seed=1)["image"]}
    rows = ACCURACY.calibration_rows(data, 1000, 300)
    assert len(rows) == 1000 and len(set(rows["row"])) == 1000
    assert not bank & {image.tobytes() for image in rows["image"]}
    # An independent draw, as before, shares images with the bank: the check above can fail.
    independent = load_split(data, "train", num_samples=1000, seed=7)["image"]
    assert bank & {image.tobytes() for image in independent}
