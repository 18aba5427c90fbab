"""Evaluation protocols against independent references: k-NN, linear probe, retention, top-1, evaluate metrics."""

from __future__ import annotations

import inspect
import json

import datasets
import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTImageProcessor

import hf_snapvit as hs
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.architectures.embedding import image_embedding
from hf_snapvit.errors import DataError, EvaluationError
from hf_snapvit.evaluation import (
    EvaluationResult,
    Evaluator,
    ImageSet,
    LinearProbeConfig,
    evaluate,
    extract_features,
    knn_accuracy,
    knn_predict,
    representation_retention,
    top1_accuracy,
    train_linear_probe,
)
from helpers import CASES

CASE = {c.name: c for c in CASES}


def knn_reference(bank, bank_labels, queries, k):
    """Brute force, written independently: Euclidean distances of normalised float64 features, a stable sort (ties to
    the earlier bank entry), then the most frequent label (ties to the smallest, as np.argmax picks the first)."""
    bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    out = []
    for q in queries:
        distance = np.sqrt(((bank - q) ** 2).sum(1))
        nearest = np.argsort(distance, kind="stable")[:k]
        out.append(np.argmax(np.bincount(bank_labels[nearest], minlength=bank_labels.max() + 1)))
    return np.array(out)


@pytest.mark.parametrize("k", [1, 5, 20])
def test_knn_matches_brute_force(k):
    rng = np.random.default_rng(k)
    bank = rng.normal(size=(300, 16)).astype(np.float32)
    labels = rng.integers(0, 7, 300)
    queries = rng.normal(size=(90, 16)).astype(np.float32)
    predicted = knn_predict(bank, labels, queries, k, chunk_size=32).numpy()  # several chunks
    np.testing.assert_array_equal(predicted, knn_reference(bank.astype(np.float64), labels, queries, k))
    query_labels = rng.integers(0, 7, 90)
    assert knn_accuracy(bank, labels, queries, query_labels, k) == pytest.approx(
        float((predicted == query_labels).mean()))


def test_knn_ties_are_deterministic():
    # Four identical bank vectors with labels 3, 1, 2, 0: with k = 2 the two earliest entries (labels 3 and 1) are
    # the neighbours, and their 1-1 vote goes to the smaller label.
    bank = np.array([[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 3, dtype=np.float32)
    labels = np.array([3, 1, 2, 0, 5, 5, 5])
    queries = np.array([[2.0, 0.0]], dtype=np.float32)
    assert knn_predict(bank, labels, queries, 2).tolist() == [1]
    assert knn_reference(bank.astype(np.float64), labels, queries, 2).tolist() == [1]
    assert knn_predict(bank, labels, queries, 4).tolist() == [0]  # all four tied 1-1-1-1: smallest label
    with pytest.raises(EvaluationError, match=r"k=8 must be an integer in \[1, 7\]"):
        knn_predict(bank, labels, queries, 8)


def blobs(n, generator, separation=6.0, dim=8, classes=3):
    labels = torch.randint(0, classes, (n,), generator=generator)
    return torch.eye(classes, dim)[labels] * separation + torch.randn(n, dim, generator=generator), labels


def test_linear_probe_learns_a_separable_problem():
    generator = torch.Generator().manual_seed(0)
    train, train_labels = blobs(600, generator)
    test, test_labels = blobs(300, generator)
    probe = train_linear_probe(train, train_labels, config=LinearProbeConfig(epochs=20))
    assert probe.num_val == 120 and probe.num_train == 480  # 20 % of the train features held out
    assert probe.accuracy(test, test_labels) > 0.97
    best = max(range(len(probe.history)), key=lambda i: (probe.history[i]["val_accuracy"], -i))
    assert probe.best_epoch == best + 1
    lrs = [h["lr"] for h in probe.history]
    assert lrs[0] == pytest.approx(1e-3) and all(a > b for a, b in zip(lrs, lrs[1:]))  # cosine decay


def test_linear_probe_selects_on_validation_and_keeps_a_copy():
    # Test data never enters train_linear_probe: it takes no test argument at all.
    assert not [p for p in inspect.signature(train_linear_probe).parameters if "test" in p]
    generator = torch.Generator().manual_seed(1)
    train, train_labels = blobs(600, generator, separation=1.0)
    val, val_labels = blobs(200, generator, separation=1.0)
    test, test_labels = blobs(300, generator, separation=1.0)
    # Validation labels are shifted, so the better the probe learns the train rule, the worse it does on "val": the
    # best validation epoch is an early one, and the final weights are worse on validation.
    shifted = (val_labels + 1) % 3
    probe = train_linear_probe(train, train_labels, val_features=val, val_labels=shifted,
                               config=LinearProbeConfig(epochs=20))
    history = [h["val_accuracy"] for h in probe.history]
    assert probe.best_epoch == int(np.argmax(history)) + 1
    assert history[probe.best_epoch - 1] > history[-1]
    # The returned weights are that epoch's (a copy), not the last epoch's (the reference's bug).
    assert probe.accuracy(val, shifted) == pytest.approx(history[probe.best_epoch - 1])
    # Selecting on test would have picked a later, better epoch; this probe is the early, worse one.
    honest = train_linear_probe(train, train_labels, val_features=val, val_labels=val_labels,
                                config=LinearProbeConfig(epochs=20))
    assert probe.accuracy(test, test_labels) < honest.accuracy(test, test_labels)


def test_retention_and_top1_functions():
    a = torch.randn(10, 4)
    assert representation_retention(a, 3 * a) == pytest.approx(1.0)
    assert representation_retention(a, -a) == pytest.approx(-1.0)
    noisy = a + torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
    cosines = [float(x @ y / (x.norm() * y.norm())) for x, y in zip(noisy, a)]
    assert representation_retention(noisy, a) == pytest.approx(sum(cosines) / 10) and sum(cosines) / 10 < 1.0
    logits = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert top1_accuracy(logits, [1, 0, 0]) == pytest.approx(2 / 3)
    with pytest.raises(EvaluationError, match="one per image"):
        top1_accuracy(logits, [1, 0])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_one_pass_features_equal_image_embedding(case):
    model = case.build()
    inputs = case.inputs(5)
    features = extract_features(model, inputs, batch_size=2, show_progress=False)
    with torch.no_grad():
        expected = image_embedding(model, inputs)
    torch.testing.assert_close(features.embeddings, expected)
    if features.logits is not None:
        with torch.no_grad():
            torch.testing.assert_close(features.logits, model(**inputs).logits)
    assert (features.logits is not None) == ("ForImageClassification" in type(model).__name__)


def test_pil_dataset_and_tensor_sources_agree():
    model = CASE["vit-cls"].build()
    processor = ViTImageProcessor(size={"height": 32, "width": 32})
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)) for _ in range(7)]
    labels = [0, 1, 2, 3, 4, 0, 1]
    dataset = datasets.Dataset.from_dict({"image": images, "label": labels}).cast_column("image", datasets.Image())
    pixels = processor(images=images, return_tensors="pt")["pixel_values"]
    from_list = extract_features(model, ImageSet.from_data(images, labels), processor=processor, batch_size=3,
                                 show_progress=False)
    from_dataset = extract_features(model, dataset, processor=processor, batch_size=3, show_progress=False)
    from_tensor = extract_features(model, ImageSet.from_data(pixels, labels), batch_size=3, show_progress=False)
    torch.testing.assert_close(from_list.embeddings, from_tensor.embeddings)
    torch.testing.assert_close(from_dataset.embeddings, from_tensor.embeddings)
    assert from_dataset.labels.tolist() == labels == from_list.labels.tolist()
    with pytest.raises(DataError, match="processor"):
        extract_features(model, images, show_progress=False)  # PIL images, no processor, no checkpoint path


def test_evaluator_dense_retention_is_one_and_pruned_less(tmp_path):
    model = CASE["vit-cls"].build()
    generator = torch.Generator().manual_seed(0)
    eval_pixels, eval_labels = torch.randn(24, 3, 32, 32, generator=generator), torch.arange(24) % 5
    bank_pixels, bank_labels = torch.randn(40, 3, 32, 32, generator=generator), torch.arange(40) % 5
    evaluator = Evaluator(eval_pixels, eval_labels=eval_labels, bank_data=bank_pixels, bank_labels=bank_labels,
                          dense_model=model, k=5, probe=LinearProbeConfig(epochs=3), show_progress=False)
    dense = evaluator.evaluate(model, name="dense")
    assert dense.retention == pytest.approx(1.0, abs=1e-6) and dense.sparsity == 0.0
    with torch.no_grad():
        logits = model(pixel_values=eval_pixels).logits
    assert dense.top1 == pytest.approx(top1_accuracy(logits, eval_labels))
    dense_eval, dense_bank = evaluator.features(model)
    assert evaluator.features(model)[0] is dense_eval  # cached, not recomputed
    assert dense.knn_top1 == pytest.approx(knn_accuracy(dense_bank.embeddings, bank_labels, dense_eval.embeddings,
                                                        eval_labels, 5))
    ranking = hs.rank(model, method="magnitude")
    pruned = slice_model_(CASE["vit-cls"].build(), ranking.keep_indices(ranking.keep_counts(0.4)))
    result = evaluator.evaluate(pruned, name="pruned")
    assert result.retention < 1.0 - 1e-4
    assert result.sparsity == pytest.approx(ranking.keep_counts(0.4).sparsity)
    assert result.gflops < dense.gflops and result.linear_probe["best_epoch"] in (1, 2, 3)
    path = tmp_path / "result.json"
    result.to_json(path)
    assert EvaluationResult.from_dict(json.loads(path.read_text())) == result


def test_evaluate_loads_an_elastic_checkpoint_by_path(tmp_path):
    model = CASE["vit-cls"].build()
    hs.save_elastic(model, hs.rank(model, method="random"), tmp_path / "elastic")
    pixels, labels = torch.randn(12, 3, 32, 32), torch.arange(12) % 5
    result = evaluate(str(tmp_path / "elastic"), pixels, eval_labels=labels, sparsity=0.3, show_progress=False,
                      output=tmp_path / "r.json")
    assert result.retention < 1.0 and result.sparsity == pytest.approx(0.3, abs=0.05)
    assert result.knn_top1 is None and result.top1 is not None  # no bank given: no k-NN
    assert json.loads((tmp_path / "r.json").read_text())["name"].endswith("@0.3")


def test_bad_inputs_name_the_problem():
    model = CASE["vit"].build()
    with pytest.raises(EvaluationError, match="need labelled train images"):
        Evaluator(torch.randn(4, 3, 32, 32), eval_labels=[0, 1, 0, 1], metrics=["knn"])
    with pytest.raises(EvaluationError, match="Unknown metrics"):
        Evaluator(torch.randn(4, 3, 32, 32), metrics=["f1"])
    with pytest.raises(EvaluationError, match="no classifier"):
        Evaluator(torch.randn(4, 3, 32, 32), eval_labels=[0, 1, 0, 1], metrics=["top1"]).evaluate(model)
    with pytest.raises(EvaluationError, match="1-D sequence of 4 labels"):
        ImageSet.from_data(torch.randn(4, 3, 32, 32), [0, 1])
    with pytest.raises(EvaluationError, match="val_fraction"):
        LinearProbeConfig(val_fraction=1.0)


def test_evaluate_metrics_load_offline_and_agree(monkeypatch):
    import evaluate as hf_evaluate

    from hf_snapvit.evaluation.evaluate_metrics import METRIC_NAMES, load_metric

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_evaluate.config, "HF_EVALUATE_OFFLINE", True)
    rng = np.random.default_rng(0)
    bank, bank_labels = rng.normal(size=(60, 6)).astype(np.float32), rng.integers(0, 4, 60)
    queries, labels = rng.normal(size=(25, 6)).astype(np.float32), rng.integers(0, 4, 25)
    metrics = {name: load_metric(name) for name in METRIC_NAMES}
    assert metrics["knn_accuracy"].compute(predictions=queries, references=labels, bank_features=bank,
                                           bank_labels=bank_labels, k=7) == {
        "knn_accuracy": pytest.approx(knn_accuracy(bank, bank_labels, queries, labels, 7))}
    other = queries + rng.normal(size=queries.shape).astype(np.float32)
    assert metrics["representation_retention"].compute(predictions=other, references=queries)[
        "representation_retention"] == pytest.approx(representation_retention(other, queries), abs=1e-6)
    predictions = rng.integers(0, 4, 25)
    assert metrics["top1_accuracy"].compute(predictions=predictions, references=labels)["top1_accuracy"] == \
        pytest.approx(float((predictions == labels).mean()))
    probe = train_linear_probe(bank, bank_labels, num_classes=4, config=LinearProbeConfig(epochs=4))
    out = metrics["linear_probe_accuracy"].compute(predictions=queries, references=labels, train_features=bank,
                                                   train_labels=bank_labels, num_classes=4, epochs=4)
    assert out["best_epoch"] == probe.best_epoch
    assert out["linear_probe_accuracy"] == pytest.approx(probe.accuracy(queries, labels))
