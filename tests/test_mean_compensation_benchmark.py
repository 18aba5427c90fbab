"""benchmarks/mean_compensation_vit_tiny.py on a tiny random ViT: the compensated slice reproduces the dense model's
mean attention output in the first block (where the inputs are the dense ones), the plain slice does not; nothing
removed means nothing changed; the caller's model is untouched."""

from __future__ import annotations

import torch

import hf_snapvit
from hf_snapvit.benchmark import sliced_copy

from helpers import CASES, load_benchmark

SCRIPT = load_benchmark("mean_compensation_vit_tiny")


def first_attention_output_mean(model, pixels):
    captured = []
    projection = SCRIPT.output_projections(model)[0][0]
    hook = projection.register_forward_hook(lambda module, args, out: captured.append(out.detach().double()))
    with torch.no_grad():
        model(pixel_values=pixels)
    hook.remove()
    return captured[0].reshape(-1, captured[0].shape[-1]).mean(0)


def test_the_compensated_slice_keeps_the_first_blocks_mean_attention_output():
    model = CASES[1].build().eval()  # vit-cls
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ranking = hf_snapvit.rank(model, method="magnitude")
    pixels = torch.randn(6, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    means = SCRIPT.input_means(model, pixels, batch_size=4)
    dense = first_attention_output_mean(model, pixels)
    plain = first_attention_output_mean(sliced_copy(model, ranking, 0.5), pixels)
    fixed = first_attention_output_mean(sliced_copy(SCRIPT.compensated(model, ranking, 0.5, means), ranking, 0.5),
                                        pixels)
    assert (plain - dense).abs().max() > 1e-3  # removing heads moved the mean ...
    assert torch.allclose(fixed, dense, atol=1e-5)  # ... and the compensation puts it back
    untouched = SCRIPT.compensated(model, ranking, 0.0, means)
    assert all(torch.equal(a, b) for a, b in zip(untouched.state_dict().values(), model.state_dict().values()))
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
