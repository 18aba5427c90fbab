"""The defining invariant: removing units physically equals zeroing their contribution in the dense model."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import hf_snapvit as hs
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.surgery.slicing import slice_model_
from hf_snapvit.architectures import (find_attribute, get_attention, get_layers, get_projection, get_spec, head_dim,
                                      head_tables)
from helpers import masked_copy, output_of

# Fractions of each model's maximum sparsity (tiny models have large embeddings, so maxima differ).
FRACTIONS = [0.25, 0.6, 1.0]


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("fraction", FRACTIONS)
def test_masked_dense_equals_sliced(case, attn, fraction):
    model = case.build()
    model.set_attn_implementation(attn)
    ranking = hs.rank(model, method="random", seed=int(fraction * 10))
    counts = ranking.keep_counts(fraction * ranking.max_sparsity)
    keep = ranking.keep_indices(counts)
    inputs = case.inputs(2)

    expected = output_of(masked_copy(model, keep), inputs)
    sliced = slice_model_(copy.deepcopy(model), keep)
    assert layer_widths(sliced) == (counts.heads, counts.neurons)
    assert sum(counts.heads) < ranking.shape.num_layers * ranking.shape.num_heads or \
        sum(counts.neurons) < ranking.shape.num_layers * ranking.shape.intermediate_size
    torch.testing.assert_close(output_of(sliced, inputs), expected, atol=1e-5, rtol=1e-4)


def test_permutation_preserves_function(case):
    model = case.build()
    ranking = hs.rank(model, method="random", seed=3)
    inputs = case.inputs(2)
    expected = output_of(model, inputs)
    permuted = slice_model_(copy.deepcopy(model), ranking.orders())
    assert any(not np.array_equal(h, np.arange(len(h))) for h, _ in ranking.orders())
    torch.testing.assert_close(output_of(permuted, inputs), expected, atol=1e-5, rtol=1e-4)


def test_sliced_heads_update_module_attributes(case):
    model = case.build()
    spec = get_spec(model)
    slice_model_(model, [([2, 0], list(range(5)))] * len(get_layers(model, spec)))
    for layer in get_layers(model, spec):
        attention = get_attention(layer, spec)
        for paths, value in ((spec.head_count_attrs, 2), (spec.head_size_attrs, 2 * head_dim(attention, spec))):
            assert all(find_attribute(attention, path) in (None, value) for path in paths)
        assert get_projection(attention, spec.q_proj).out_features == 2 * head_dim(attention, spec)
        assert get_projection(attention, spec.o_proj).in_features == 2 * head_dim(attention, spec)
        assert all(getattr(owner, name).shape[-1] == 2 for owner, name in head_tables(layer, spec))


def test_slice_count_mismatch_is_rejected(case):
    model = case.build()
    with pytest.raises(ValueError, match="entries but the model has"):
        slice_model_(model, [([0], [0])])


def test_reslicing_from_a_dense_source_does_not_accumulate(case):
    model = case.build()
    ranking = hs.rank(model, method="random", seed=5)
    inputs = case.inputs(2)
    work = copy.deepcopy(model)
    for fraction in (1.0, 0.3, 0.8):  # shrink, then grow back: every slice starts from the dense source
        keep = ranking.keep_indices(ranking.keep_counts(fraction * ranking.max_sparsity))
        slice_model_(work, keep, source=model)
        expected = output_of(slice_model_(copy.deepcopy(model), keep), inputs)
        torch.testing.assert_close(output_of(work, inputs), expected, atol=1e-6, rtol=1e-5)
