"""Per-sample squared weight gradients from one backward pass, against one backward pass per sample."""

from __future__ import annotations

import torch

from hf_snapvit.pruning.sample_gradients import SquaredSampleGradients


def _loss(first: torch.nn.Linear, second: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample losses summed: ``first`` sees two calls (3 views of 4 tokens, 2 views of 2 tokens per sample, rows
    sample-major as ``flatten(0, 1)`` gives), ``second`` one; no term mixes samples."""
    n = a.shape[0]
    big = first(a.flatten(0, 1)).view(n, -1, 5)
    small = first(b.flatten(0, 1)).view(n, -1, 5)
    hidden = torch.cat([big, small], 1).tanh()
    with torch.no_grad():  # a frozen pass, as the DINO teacher: not recorded
        first(a.flatten(0, 1))
    return (second(hidden) ** 2).mean((1, 2)).sum()


def test_one_backward_pass_gives_every_samples_squared_gradient():
    torch.manual_seed(0)
    first, second, unused = torch.nn.Linear(6, 5), torch.nn.Linear(5, 3), torch.nn.Linear(2, 2)
    a, b = torch.randn(4, 3, 4, 6), torch.randn(4, 2, 2, 6)
    expected = [torch.zeros_like(m.weight, dtype=torch.float64) for m in (first, second)]
    for i in range(4):
        grads = torch.autograd.grad(_loss(first, second, a[i:i + 1], b[i:i + 1]), [first.weight, second.weight])
        for total, g in zip(expected, grads):
            total += g.double() ** 2
    sums = [torch.zeros_like(m.weight, dtype=torch.float64) for m in (first, second, unused)]
    with SquaredSampleGradients([first, second, unused]) as recorder:
        loss = _loss(first, second, a, b)
    recorder.accumulate(loss, 4, sums)
    for got, want in zip(sums, expected):
        assert want.abs().max() > 0
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-12)
    assert torch.equal(sums[2], torch.zeros_like(sums[2]))  # never called: no gradient, and no error
    # The summed gradient squared is not the sum of squares: the samples were really kept apart.
    summed = torch.autograd.grad(_loss(first, second, a, b), first.weight)[0].double() ** 2
    assert not torch.allclose(summed, expected[0], rtol=1e-2)
    assert all(p.grad is None for p in (*first.parameters(), *second.parameters()))
