"""A sliced load reads only what it keeps: its peak memory is below a dense load's (fresh processes)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from transformers import ViTConfig, ViTModel

import hf_snapvit as hs
from helpers import run_at_once

CHILD = textwrap.dedent(
    """
    import json, sys, threading, time
    import hf_snapvit, torch, transformers

    def anon():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))

    path, sparsity = sys.argv[1], float(sys.argv[2])
    peak, done = [anon()], [False]
    def poll():
        while not done[0]:
            peak[0] = max(peak[0], anon())
            time.sleep(0.001)
    before = anon()
    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    model = hf_snapvit.ElasticViTModel.from_pretrained(path, sparsity=sparsity)
    done[0] = True
    thread.join()
    peak[0] = max(peak[0], anon())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"peak": peak[0] - before, "after": anon() - before, "param_bytes": params}))
    """
)


def measure(path, *sparsities: float) -> list[dict]:
    """One fresh process per sparsity, run at once (each reads only its own memory)."""
    done = run_at_once([[sys.executable, "-c", CHILD, str(path), str(s)] for s in sparsities])
    return [json.loads(result.stdout.strip().splitlines()[-1]) for result in done]


@pytest.mark.slow
def test_sliced_load_peak_memory_is_below_dense(tmp_path):
    torch.manual_seed(0)
    config = ViTConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048,
                       image_size=64, patch_size=16)
    model = ViTModel(config, add_pooling_layer=False)  # about 25 M parameters, 100 MB in float32
    hs.save_elastic(model, hs.rank(model, method="random"), tmp_path / "e")
    del model
    dense, sliced = measure(tmp_path / "e", 0.0, 0.5)
    # The weights are owned by the model (not views of the file), so their bytes are anonymous memory.
    assert dense["after"] >= 0.9 * dense["param_bytes"]
    assert sliced["param_bytes"] < 0.55 * dense["param_bytes"]
    assert sliced["peak"] < 0.7 * dense["peak"], (sliced, dense)
