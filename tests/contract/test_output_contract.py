"""The sliced model's contract, tested as a contract: for every family hf_snapvit serves (tests/support/families.py:
the registered backbones and their task variants, the task models, the families found by discovery, timm's ViTs, a user's
own model), every field of every output equals the masked dense model's (the dense model with the dropped heads'
output-projection columns and the dropped neurons' FFN-output columns zeroed, :func:`helpers.masked_copy`), for each
way a sliced model is loaded: sliced at a sparsity, switchable after switches up and down (and its ``to_sliced()``),
the sliced checkpoint saved and loaded again, and that checkpoint loaded by transformers alone
(``trust_remote_code``); sparsity 0 equals the untouched model. docs/supported-models.md says what is checked for
each family, from the same probe.

The forwards (:data:`output_fields.KINDS`): the default outputs, ``output_hidden_states=True``,
``output_attentions=True`` under eager attention (a sliced block's attention weights hold its kept heads, in rank
order: compared with the masked model's at those heads), ``return_dict=False`` tuples, another resolution
(``interpolate_pos_encoding=True`` where the forward takes it) and ``bool_masked_pos``, on each family's own inputs
(video clips, Qwen2-VL grids, SigLIP2 patch sequences). A forward is skipped for a family only where stock
transformers cannot run it for the dense model (:func:`output_fields.stock_gaps`, the reason in the skip).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import hf_snapvit as hs
from hf_snapvit.architectures import discovery, get_attention, get_layers, get_spec
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.errors import UnsupportedArchitectureError
from hf_snapvit.surgery import proof

from support.families import FAMILIES, Family
from helpers import masked_copy
from support.output_fields import (EAGER, KINDS, at_heads, eager, field_mismatches, forward_kwargs, output_fields,
                           recorded_sources, remote_code_gap, run, stock_gaps)

# The loads: sparsity 0 (= the untouched model), sliced at a sparsity, switchable, its to_sliced() copy, the sliced
# checkpoint saved and loaded again, and that checkpoint loaded by transformers alone with trust_remote_code.
PATHS = ("sparsity 0", "sliced", "switchable", "to_sliced", "re-saved", "remote code")
# Switches of the switchable model, checked after each: down from full size, up to it, down to the smaller size, up
# to the larger, down again, up to full size: each size is reached from a larger and from a smaller one. Each forward
# kind starts at another place in the cycle (from the size the kind before left), so the orders differ.
SWITCHES = ("high", 0.0, "low", "high", "low", 0.0)
# Loads that give the 'sliced' path's model again (by another route): their every output field is compared for the
# default outputs and the hidden states; the other forwards exercise the same model's code, checked on 'sliced'.
SAME_MODEL = ("to_sliced", "re-saved")


@dataclass
class Saved:
    """One family ranked and saved elastic, its sliced checkpoint saved again, the masked references, and the models
    of each load path (loaded once)."""

    family: Family
    model: transformers.PreTrainedModel
    inputs: dict
    gaps: dict[str, str]  # forward kind -> why stock cannot run it for the dense model
    folder: Path
    resaved: Path
    sparsities: dict[str, float]  # "high", "low": the sizes the contract is checked at
    ranking: Any
    stored: Any
    loaded: dict[tuple[str, bool], Any] = field(default_factory=dict)
    expected: dict[tuple[float, str], dict[str, Any]] = field(default_factory=dict)
    references: dict[tuple[float, bool], Any] = field(default_factory=dict)

    def reference(self, sparsity: float, kind: str) -> dict[str, Any]:
        """The output fields of forward ``kind`` of the masked dense model at ``sparsity`` (the untouched model at
        0); what a pruned block's attention returned is taken at its kept heads, in rank order (a sliced block holds
        those, in that order)."""
        if (sparsity, kind) not in self.expected:
            keep = self.ranking.keep_indices(self.stored.keep_counts(sparsity))
            masked = self.masked(sparsity, keep, kind in EAGER)
            spec = get_spec(self.model)
            dense = layer_widths(self.model)[0]
            with recorded_sources([get_attention(layer, spec) for layer in get_layers(masked, spec)]) as sources:
                fields = output_fields(run(masked, forward_kwargs(kind, masked, self.inputs, self.gaps)))
                for name, value in fields.items():
                    source = sources.get(id(value)) if isinstance(value, torch.Tensor) else None
                    if source is not None and source[1] is value:
                        picked = at_heads(value, torch.as_tensor(keep[source[0]][0]), dense[source[0]])
                        fields[name] = value if picked is None else picked
            self.expected[sparsity, kind] = fields
        return self.expected[sparsity, kind]

    def masked(self, sparsity: float, keep: list, attention: bool) -> transformers.PreTrainedModel:
        """The masked dense model at ``sparsity`` (the untouched one at 0), built with eager attention if
        ``attention``; made once."""
        if (sparsity, attention) not in self.references:
            masked = masked_copy(self.model, keep) if sparsity else self.model
            self.references[sparsity, attention] = eager(masked) if attention else masked
        return self.references[sparsity, attention]

    def load(self, path: str, eager: bool) -> transformers.PreTrainedModel:
        """The model of load ``path`` (with ``attn_implementation="eager"`` if ``eager``), loaded once."""
        if (path, eager) not in self.loaded:
            options = {"attn_implementation": "eager"} if eager else {}
            high = self.sparsities["high"]
            if path in ("sparsity 0", "sliced"):
                model = hs.ElasticViTModel.from_pretrained(self.folder, sparsity=high if path == "sliced" else 0.0,
                                                           **options)
            elif path == "switchable":
                model = hs.ElasticViTModel.from_pretrained(self.folder, switchable=True, **options)
            elif path == "to_sliced":  # the switchable model's copy at its size, reached from a smaller one
                switchable = self.load("switchable", eager)
                switchable.set_budget(sparsity=self.sparsities["low"])
                switchable.set_budget(sparsity=high)
                model = switchable.to_sliced()
            elif path == "re-saved":
                model = hs.ElasticViTModel.from_pretrained(self.resaved, **options)
            else:
                config = json.loads((self.resaved / "config.json").read_text())
                gap = remote_code_gap(self.model)
                assert ("auto_map" in config) is (gap is None), (gap, config.get("auto_map"))
                if gap is not None:
                    pytest.skip(gap)
                auto = getattr(transformers, next(iter(config["auto_map"])))
                model = auto.from_pretrained(self.resaved, trust_remote_code=True, **options).eval()
            self.loaded[path, eager] = model
        return self.loaded[path, eager]


_SAVED: dict[str, Saved | str] = {}


@pytest.fixture
def saved(family, tmp_path_factory) -> Saved:
    """The family's :class:`Saved`, made when its first test runs; a family the proof refuses is skipped (its row on
    the supported-models page says refused, and why). Only the latest family's models are kept: the tests run family
    by family, and 63 families' loaded models would hold over a gigabyte."""
    if family.name not in _SAVED:
        for name in [name for name, kept in _SAVED.items() if not isinstance(kept, str)]:
            del _SAVED[name]
        _SAVED[family.name] = _save(family, tmp_path_factory.mktemp("contract"))
    if isinstance(_SAVED[family.name], str):
        pytest.skip(_SAVED[family.name])
    return _SAVED[family.name]


def _save(family: Family, folder: Path) -> Saved | str:
    model = family.build()
    with pytest.MonkeyPatch.context() as patch:  # discovered afresh, as in a user's first process
        patch.setattr(discovery, "_DISCOVERED", {})
        patch.setattr(proof, "_PROVEN", set())
        try:
            ranking = hs.rank(model, method="magnitude", show_progress=False)
            stored = hs.save_elastic(model, ranking, folder / "elastic", model_card=False)
        except UnsupportedArchitectureError as error:
            return f"{family.name} is refused: {str(error)[:200]}"
        high = round(min(0.3, 0.8 * stored.max_sparsity_for(None)), 3)
        inputs = family.inputs(model)
        saved = Saved(family, model, inputs, stock_gaps(model, inputs), folder / "elastic", folder / "resaved",
                      {"high": high, "low": round(high / 2, 3)}, ranking, stored)
        counts, dense = stored.keep_counts(high), layer_widths(model)
        assert sum(counts.heads) + sum(counts.neurons) < sum(dense[0]) + sum(dense[1]), (counts, dense)
        for sparsity in (0.0, *saved.sparsities.values()):  # the references, while the discovered spec is known
            for kind in KINDS:
                if kind not in saved.gaps:
                    saved.reference(sparsity, kind)
        hs.ElasticViTModel.from_pretrained(saved.folder, sparsity=high).save_pretrained(saved.resaved)
    return saved


def _check(saved: Saved, model, sparsity: float, kind: str, path: str, where: str) -> None:
    counts = saved.stored.keep_counts(sparsity)
    budget = model.elastic_budget if path == "switchable" else None
    widths = (list(budget.heads), list(budget.neurons)) if budget is not None else layer_widths(model)
    assert widths == (list(counts.heads), list(counts.neurons)), f"{where}: widths {widths}, expected {counts}"
    actual = output_fields(run(model, forward_kwargs(kind, model, saved.inputs, saved.gaps)))
    problems = field_mismatches(actual, saved.reference(sparsity, kind), names=(path, "masked"))
    assert not problems, f"{where}, {kind}: " + "; ".join(problems)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES, ids=repr)
def test_every_output_field_equals_the_masked_model(saved, family, path, kind):
    if kind in saved.gaps:
        pytest.skip(saved.gaps[kind])
    if path in SAME_MODEL and kind not in ("outputs", "hidden states"):
        pytest.skip(f"{path}: the sliced model again; its other forwards are checked on the 'sliced' path")
    model = saved.load(path, eager=kind in EAGER)
    if path != "switchable":
        sparsity = 0.0 if path == "sparsity 0" else saved.sparsities["high"]
        _check(saved, model, sparsity, kind, path, f"{family.name} {path}")
        return
    start = KINDS.index(kind)
    for step, size in enumerate(SWITCHES[start:] + SWITCHES[:start]):
        sparsity = saved.sparsities.get(size, size)
        model.set_budget(sparsity=sparsity)
        _check(saved, model, sparsity, kind, path, f"{family.name} switchable, switch {step + 1} to {sparsity}")


def test_every_registered_model_type_is_in_the_contract():
    """By construction: a model type registered without a tiny model among the contract's families fails here."""
    missing = sorted(set(hs.supported_model_types()) - {family.model_type for family in FAMILIES})
    assert not missing, f"registered without a family in tests/support/families.py: {missing}"
