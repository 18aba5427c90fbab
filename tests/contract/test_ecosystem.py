"""A sliced model in the serving tools: pipelines, ``torch.compile``, ``torch.export``, ONNX Runtime, bf16/fp16.

A sliced model is a stock transformers model with narrower projections, so every tool must give the outputs of the
sliced model itself. Each test builds a tiny elastic checkpoint of one architecture of ``tests/helpers.py``, loads it
at 30 % sparsity, and compares the tool's outputs with the sliced model's own. The snippets of
``docs/deployment.md`` are these tests' calls.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import pipeline

from hf_snapvit.architectures.budget import layer_widths
from helpers import CASES, PROCESSOR, images, output_of, sliced_model

CASE = {c.name: c for c in CASES}
SPARSITY = 0.3


def sliced(tiny_elastic, name: str, **kwargs) -> torch.nn.Module:
    """The tiny ``name`` model loaded from its elastic checkpoint at 30 % sparsity."""
    return sliced_model(tiny_elastic(name), CASE[name], sparsity=SPARSITY, **kwargs)


def pixels(batch: int, seed: int = 0) -> torch.Tensor:
    return CASE["vit"].inputs(batch, seed)["pixel_values"]


# ------------------------------------------------------------------------------------------------ pipelines
@pytest.mark.parametrize("name", ["vit-cls", "dinov2-cls", "deit-cls-teacher"])
def test_image_classification_pipeline_gives_the_models_probabilities(tiny_elastic, name):
    model = sliced(tiny_elastic, name)
    classify = pipeline("image-classification", model=model, image_processor=PROCESSOR)
    batch = images(3, seed=1)
    results = classify(batch, top_k=5)
    with torch.no_grad():
        probabilities = model(**PROCESSOR(batch, return_tensors="pt")).logits.softmax(-1)
    for result, expected in zip(results, probabilities):
        order = expected.argsort(descending=True).tolist()
        assert [r["label"] for r in result] == [model.config.id2label[i] for i in order]
        np.testing.assert_allclose([r["score"] for r in result], expected[order].numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["vit", "dinov2", "clip-vision"])
def test_image_feature_extraction_pipeline_gives_the_models_hidden_states(tiny_elastic, name):
    model = sliced(tiny_elastic, name)
    extract = pipeline("image-feature-extraction", model=model, image_processor=PROCESSOR)
    batch = images(2, seed=2)
    features = extract(batch, return_tensors=True)
    expected = output_of(model, dict(PROCESSOR(batch, return_tensors="pt")))
    assert len(features) == len(batch)
    for got, want in zip(features, expected):
        torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ compilers
@pytest.mark.slow
@pytest.mark.parametrize("name", ["dinov2"])  # SigLIP's and CLIP's compiled forwards: test_attention.py
def test_torch_compile_fullgraph_gives_the_same_outputs(tiny_elastic, name):
    model = sliced(tiny_elastic, name)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    for batch in (2, 3):
        inputs = {"pixel_values": pixels(batch, seed=batch)}
        with torch.no_grad():
            out = compiled(**inputs)
        got = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        torch.testing.assert_close(got, output_of(model, inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit-cls", "dinov2", "clip-vision"])
def test_torch_export_with_a_dynamic_batch_gives_the_same_outputs(tiny_elastic, name):
    model = sliced(tiny_elastic, name)
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, args=(), kwargs={"pixel_values": pixels(2)},
                                  dynamic_shapes={"pixel_values": {0: batch}})
    exported = program.module()
    for size in (1, 3):
        inputs = {"pixel_values": pixels(size, seed=size)}
        out = exported(**inputs)
        got = out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state
        torch.testing.assert_close(got, output_of(model, inputs), rtol=1e-5, atol=1e-5)


def export_onnx(model: torch.nn.Module, path, exporter: str) -> None:
    """The two calls of docs/deployment.md: ``dynamo`` (torch.export based, the default) and ``torchscript``."""
    example = torch.randn(2, 3, 32, 32)
    if exporter == "dynamo":
        torch.onnx.export(model, (), path, kwargs={"pixel_values": example}, input_names=["pixel_values"],
                          dynamic_shapes={"pixel_values": {0: "batch"}}, dynamo=True)
    else:
        with pytest.warns(DeprecationWarning, match="TorchScript"):  # torch >= 2.9 says it is legacy
            torch.onnx.export(model, (example,), path, input_names=["pixel_values"],
                              dynamic_axes={"pixel_values": {0: "batch"}}, dynamo=False)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")  # the tracer's notes on shape checks it freezes
# torch.onnx's own deprecation notes, nothing of ours to fix.
@pytest.mark.filterwarnings("ignore:.*LeafSpec.* is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:The feature will be removed:DeprecationWarning")
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("name", ["vit-cls", "dinov2", "clip-vision"])
def test_onnx_runtime_runs_the_exported_model_at_two_batch_sizes(tiny_elastic, tmp_path, name, exporter):
    import onnxruntime

    model = sliced(tiny_elastic, name)
    export_onnx(model, tmp_path / "model.onnx", exporter)
    session = onnxruntime.InferenceSession(tmp_path / "model.onnx", providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["pixel_values"]
    for size in (1, 3):
        inputs = {"pixel_values": pixels(size, seed=size)}
        first = session.run(None, {"pixel_values": inputs["pixel_values"].numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(first), output_of(model, inputs), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ half precision
@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 0.02), (torch.float16, 0.004)])
@pytest.mark.parametrize("name", ["vit-cls", "dinov2"])
def test_half_precision_loading_is_close_to_float32(tiny_elastic, name, dtype, tolerance):
    full = sliced(tiny_elastic, name)
    half = sliced(tiny_elastic, name, dtype=dtype)
    assert {p.dtype for p in half.parameters()} == {dtype}
    assert layer_widths(half) == layer_widths(full)
    assert half.config.elastic_layout == full.config.elastic_layout
    inputs = {"pixel_values": pixels(2)}
    got = output_of(half, {"pixel_values": inputs["pixel_values"].to(dtype)}).float()
    want = output_of(full, inputs)
    # Relative to the outputs' scale: bf16 keeps 8 significant bits, fp16 11.
    error = (got - want).abs().max() / want.abs().max()
    assert error < tolerance, f"{dtype}: max error {error:.2e} of the output scale"


# ------------------------------------------------------------------------------------------------ stock loading
def test_stock_auto_classes_refuse_a_sliced_checkpoint_with_a_size_mismatch(tiny_elastic, tmp_path):
    # docs/deployment.md, "What stock tools can and cannot do": transformers builds the dense widths of config.json,
    # so a sliced checkpoint needs ElasticViTModel (or the checkpoint's remote code, when it carries it).
    from transformers import AutoModelForImageClassification

    sliced(tiny_elastic, "vit-cls").save_pretrained(tmp_path / "sliced")
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        AutoModelForImageClassification.from_pretrained(tmp_path / "sliced")
