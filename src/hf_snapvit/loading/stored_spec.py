"""What the loader checks of a spec config.json stores (``elastic_spec``, a model no registry knows), beyond its
fields (:func:`~hf_snapvit.architectures.stored.check_stored_spec`): that it describes the model its ranking was made
for, and that a model cut by it still runs, before any weight is read."""

from __future__ import annotations

import copy
from typing import Any

from transformers import PreTrainedModel

from ..architectures import get_layers, get_spec
from ..architectures.budget import ModelShape, layer_widths
from ..architectures.inputs import pixel_shape
from ..architectures.registry import SPEC_KEY
from ..architectures.stored import FIX
from ..architectures.tracing import trace_block
from ..elastic.ranking import ElasticRanking
from ..errors import UnsupportedArchitectureError
from ..surgery.slicing import prefixes, slice_model_


def check_stored_spec_loads(model: PreTrainedModel, ranking: ElasticRanking | None, shape: ModelShape) -> None:
    """Refuse the spec ``model``'s config stores (if it stores one) where it gives another ``shape`` than its
    ``ranking`` was made for, keeps every head (``prune_heads`` false) where the ranking removes some, or gives a
    model that cannot run once cut (:func:`_check_cuts`). ``model``: the loader's dense meta-device skeleton."""
    if getattr(model.config, SPEC_KEY, None) is None:
        return
    spec = get_spec(model)
    if ranking is not None and (error := spec_disagreement(ranking.shape, shape)):
        raise error
    floor = ranking.floors()[0] if ranking is not None else shape.num_heads
    if not spec.prune_heads and floor < shape.num_heads:
        raise UnsupportedArchitectureError(
            f"config.json[{SPEC_KEY!r}] has prune_heads=False (this model's attention cannot run with fewer heads: "
            f"every block keeps all {shape.num_heads}), but its elastic_ranking removes heads (it keeps {floor} at "
            f"least). One of them was edited or comes from another checkpoint. {FIX}")
    _check_cuts(model)


def _check_cuts(model: PreTrainedModel) -> None:
    """A spec that leaves out something slicing must change (a head attribute the forward reshapes to) breaks the
    forward only once units go: a meta-device copy of the skeleton cut to half its heads and neurons must run the
    forward the dense skeleton runs."""
    spec = get_spec(model)

    clip = pixel_shape(model.config, 1)  # a tower that takes a clip's frames in its batch gets them so

    def fails(whole: PreTrainedModel) -> str:
        try:
            trace_block(whole.get_submodule(spec.encoder), get_layers(whole, spec)[0],  # a task model's encoder
                        shape=clip[1:] if spec.frames_in_batch else clip)
        except UnsupportedArchitectureError as error:
            return f"{type(error.__cause__).__name__}: {error.__cause__}"
        return ""

    if next(model.parameters()).device.type != "meta" or fails(model):
        return  # a real model (a copy would cost its memory), or a forward the meta device cannot run
    heads, neurons = layer_widths(model)
    keep = prefixes([max(1, h // 2) if spec.prune_heads else h for h in heads], [max(1, n // 2) for n in neurons])
    if failure := fails(slice_model_(copy.deepcopy(model), keep)):
        raise UnsupportedArchitectureError(
            f"config.json[{SPEC_KEY!r}] of {str(model.config._name_or_path)!r} does not cut this "
            f"{type(model).__name__}: with half its heads and FFN neurons it cannot run ({failure[:160]}). A field "
            "naming what changes with them (head_count_attrs, head_size_attrs, head_width, q_proj, k_proj, v_proj, "
            f"o_proj, mlp_in, mlp_out) leaves something out. {FIX}")


# Which stored fields decide each ModelShape entry a ranking records.
_DECIDED_BY = {"num_layers": "layers", "num_heads": "head_count_attrs/head_width", "head_dim": "head_width",
               "frames": "frames_in_batch", "hidden_size": "o_proj", "intermediate_size": "mlp_out",
               "params_per_head": "q_proj/k_proj/v_proj/head_rows",
               "params_per_neuron": "mlp_in/mlp_out", "fixed_params": "excluded_from_budget",
               "num_tokens": "extra_tokens/num_patches", "num_patches": "num_patches", "ffn_matrices": "mlp_in",
               "head_flops": "backbone"}


def spec_disagreement(ranked: Any, found: Any) -> UnsupportedArchitectureError | None:
    """The error for a stored spec that gives another :class:`~hf_snapvit.architectures.budget.ModelShape`
    (``found``) than the one its checkpoint's ranking records (``ranked``) in an entry the spec decides, else
    ``None``."""
    differ = [name for name in _DECIDED_BY if getattr(ranked, name) != getattr(found, name)]
    if not differ:
        return None
    text = "; ".join(f"{name}={getattr(found, name)} by its {_DECIDED_BY[name]}, the ranking's "
                     f"{getattr(ranked, name)}" for name in differ[:3])
    return UnsupportedArchitectureError(
        f"config.json's {SPEC_KEY!r} and 'elastic_ranking' describe different models: {text}. One of them was "
        f"edited or comes from another checkpoint. {FIX}")
