"""What a switch costs a switchable model whose checkpoint stores a prefix correction: the factor file's reads, the
reuse of corrected weights whose width did not change, and the one thread its solves run on (issue 64: on 2 loaded
vCPUs a switch took seconds with torch's two threads)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_snapvit import ElasticViTModel
from hf_snapvit.correction.prefix_file import PREFIX_FILE, PrefixFile, pack_lower, unpack_lower
from hf_snapvit.surgery.threads import one_thread
from hf_snapvit.errors import CheckpointError
from hf_snapvit.surgery.slicing import OUTPUT_KINDS

from helpers import CASES, corrected_checkpoint, output_of

FAST = {c.name: c for c in CASES}


def test_every_prefix_of_a_packed_factor_unpacks_to_the_factors_leading_block():
    L = torch.randn(7, 7, dtype=torch.float64).tril()
    packed = pack_lower(L)
    for size in (1, 3, 7):
        assert torch.equal(unpack_lower(packed, size), L[:size, :size])


def corrected_weights(model) -> dict:
    """``(block, kind) -> (width, corrected weight or None)`` of every output projection of a switchable model."""
    blocks = model._switch_state().blocks
    return {(i, kind): (linear.in_features, linear._buffers.get("corrected"))
            for i, block in enumerate(blocks) for kind, linear in zip(OUTPUT_KINDS, (block.o_proj, block.ffn_out))}


def test_a_switch_solves_on_one_thread_and_only_where_a_width_changed(tmp_path, monkeypatch):
    case = FAST["vit"]
    folder, _, _ = corrected_checkpoint(tmp_path, case)
    model = ElasticViTModel.from_pretrained(folder, switchable=True)
    full = {key: width for key, (width, _) in corrected_weights(model).items()}
    solved, threads = [], []
    original = PrefixFile.weight

    def weight(self, block, kind, kept, dense):
        solved.append((block, kind, kept))
        threads.append(torch.get_num_threads())
        return original(self, block, kind, kept, dense)

    monkeypatch.setattr(PrefixFile, "weight", weight)
    before, kept_tensors = torch.get_num_threads(), 0
    torch.set_num_threads(2)
    try:
        previous = corrected_weights(model)
        for sparsity in np.round(np.arange(0.05, min(0.6, model.max_sparsity()), 0.05), 2):
            solved.clear()
            model.set_budget(sparsity=float(sparsity), width_multiple=1)
            assert torch.get_num_threads() == 2  # restored after the switch
            now = corrected_weights(model)
            expected = []
            for key, (width, corrected) in now.items():
                assert (corrected is None) == (width == full[key])
                before_width, before_tensor = previous[key]
                if corrected is not None and before_tensor is not None and before_width == width:
                    assert corrected is before_tensor  # the width stayed: the tensor is kept, not solved again
                    kept_tensors += 1
                elif corrected is not None:
                    expected.append((*key, width))
            assert solved == expected
            previous = now
    finally:
        torch.set_num_threads(before)
    assert threads and set(threads) == {1} and kept_tensors > 0
    sliced = ElasticViTModel.from_pretrained(folder, sparsity=model.elastic_budget.sparsity, width_multiple=1)
    inputs = case.inputs(2, 3)
    torch.testing.assert_close(output_of(model, inputs), output_of(sliced, inputs), rtol=1e-5, atol=1e-5)


def test_one_thread_restores_the_callers_setting_also_after_an_error():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with one_thread():
                assert torch.get_num_threads() == 1
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_factor_file_holding_nan_or_inf_is_refused_naming_the_fix(tmp_path, bad):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    folder, _, _ = corrected_checkpoint(tmp_path, FAST["vit"])
    path = folder / PREFIX_FILE
    with safe_open(str(path), "pt") as handle:  # the metadata (format version, record) travels with the tensors
        metadata = handle.metadata()
    tensors = load_file(path)
    name = f"1.{OUTPUT_KINDS[1]}.projected"
    tensors[name][0, 0] = bad
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(CheckpointError, match=rf"{name} holds NaN or infinite values.*add_prefix_correction"):
        ElasticViTModel.from_pretrained(folder, sparsity=0.4)
    assert ElasticViTModel.from_pretrained(folder, sparsity=0.4, prefix_correction=False) is not None
