"""docs/supported-models.md is what utils/supported_models.py writes from the registry and a discovery run: every
row's proof was run here, today, on the family's tiny model."""

from __future__ import annotations

from helpers import BENCHMARKS, load_benchmark


def test_the_supported_models_page_is_the_one_the_registry_and_discovery_produce():
    script = load_benchmark("supported_models", BENCHMARKS.parent / "utils")
    assert script.main(["--check"]) == 0, "rerun: python utils/supported_models.py"
    page = script.PAGE.read_text()
    assert "| ijepa | `IJepaModel` | discovered |" in page and "| vit | `ViTModel` | registered |" in page
    assert "| sam_vision_model | `SamVisionModel` | discovered | heads of `vision_encoder.layers.*.attn` (one fused " \
           "`qkv`)" in page
    assert "| blip_2_vision_model | `Blip2VisionModel` | registered | every head kept" in page
    assert "| qwen2_vl_vision | `Qwen2VisionTransformerPretrainedModel` | discovered |" in page
