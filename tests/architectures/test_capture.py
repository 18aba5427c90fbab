"""architectures/capture.py: capture_block_outputs keeps what the blocks and the backbone return, as the model's own
output_hidden_states reports it (blocks that return a tensor or a tuple), and leaves no hook behind."""

from __future__ import annotations

import pytest
import torch

from hf_snapvit.architectures import get_backbone, get_layers
from hf_snapvit.architectures.capture import capture_block_outputs
from hf_snapvit.errors import ConfigError
from helpers import CASES

BY_NAME = {case.name: case for case in CASES}


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("name", ["vit", "data2vec-vision"])  # ViT's blocks return a tensor, Data2Vec's a tuple
def test_what_it_keeps_equals_the_hidden_states_the_model_reports(name):
    case = BY_NAME[name]
    model = case.build()
    inputs = case.inputs(2)
    layers = get_layers(model)
    returned = []
    probe = layers[0].register_forward_hook(lambda module, args, output: returned.append(type(output)))
    with capture_block_outputs(model, backbone=True) as every, capture_block_outputs(
            model, blocks="last", on_block=lambda hidden: hidden.float().mean(1)) as last:
        out = model(**inputs, output_hidden_states=True)
    probe.remove()
    assert returned == [tuple if name == "data2vec-vision" else torch.Tensor]
    reported = out.hidden_states[1:]  # [0] is the embeddings' output
    assert len(every.blocks) == len(layers) == len(reported) and all(len(kept) == 1 for kept in every.blocks)
    for kept, hidden in zip(every.calls, reported):
        assert torch.equal(kept, hidden) and kept.dtype == hidden.dtype
        assert kept.requires_grad  # kept as computed, not detached: a loss on it trains the model
    assert [kept[0] for kept in every.blocks] == every.calls
    assert every.backbone == [out]  # a bare backbone: the backbone is the model
    assert len(last.blocks) == 1 and torch.equal(last.calls[0], reported[-1].float().mean(1))
    every.clear()
    assert every.calls == every.backbone == every.blocks[0] == []


def test_hooks_are_removed_even_when_the_forward_fails_and_a_none_keeps_nothing():
    case = BY_NAME["vit-cls"]
    model = case.build()
    before = _hooks(model)
    seen = []

    def nothing(out, kwargs):
        seen.append(kwargs)
        return None

    def failing(hidden):
        raise RuntimeError("in the forward")

    with torch.no_grad(), capture_block_outputs(model, blocks=None, on_backbone=nothing) as captured:
        assert _hooks(model) == before + 1 and len(get_backbone(model)._forward_hooks) == 1
        model(**case.inputs(1))
    assert _hooks(model) == before
    assert captured.backbone == [] and captured.blocks == []
    assert len(seen) == 1 and "interpolate_pos_encoding" in seen[0]  # its keyword arguments (a tower's grid_thw)
    with pytest.raises(RuntimeError, match="in the forward"), torch.no_grad():
        with capture_block_outputs(model, backbone=True, on_block=failing):
            assert _hooks(model) == before + len(get_layers(model)) + 1
            model(**case.inputs(1))
    assert _hooks(model) == before
    with pytest.raises(ConfigError, match=r"blocks='first'.*'all'.*'last'.*None"):
        with capture_block_outputs(model, blocks="first"):
            pass
    assert _hooks(model) == before
