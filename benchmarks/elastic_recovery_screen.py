"""Why elastic recovery trails recovery at one size: a screen of its settings on the shared ViT-Tiny.

Issue 14 asks elastic recovery (one checkpoint, every size) to come within 3 points of recovery at one size, at 30
and 50 % sparsity, with the same number of steps. This script runs the references (``recovery@0.3``,
``recovery@0.5``) and elastic recovery with one setting changed at a time, and records top-1 on the validation
images at 0, 30 and 50 %:

* ``elastic``: the defaults (views at 0 and 0.6 plus one drawn in between);
* ``elastic-balanced``: each sliced view's loss scaled to the same size (3 / its batch mean, left as is below 0.01,
  which only the unsliced view reaches), so that the most damaged view no longer dominates the shared gradient;
* ``elastic-samples2``: two drawn views per step instead of one;
* ``elastic-from0.1``: no unsliced view (range 0.1-0.6);
* ``elastic-0.3to0.5``: only the sizes measured (range 0.3-0.5), an elastic checkpoint for a narrower band;
* ``elastic-lr6e-4``, ``elastic-lr1e-4``: another learning rate;
* ``elastic-no-hidden``: no block-output term (the embedding and logits terms only);
* ``elastic-weighted``: each view's loss weighted by its sparsity over the step's mean sparsity: the unsliced view
  counts nothing, the smallest model most (the opposite direction from ``elastic-balanced``);
* ``elastic-cascade``: in-place distillation down the sandwich: the step's views in size order, each one distilled
  half from the dense teacher and half from the next larger view of the same step (its outputs detached), so that a
  small view learns from a nearer teacher;
* ``elastic-stratified``: the smallest model plus one view drawn in each half of the range (no unsliced view), so
  that every step covers the low and the high half;
* ``elastic-progressive``: progressive shrinking: the range's top grows from 0.2 to its end over the first half of
  the steps (the views are the range's ends plus one drawn between, as in the default);
* ``elastic-switchable``: every LayerNorm and every attention / FFN output bias gets a private copy per anchor
  sparsity 0, 0.1, ..., 0.6 (a view uses its nearest anchor's), as switchable batch norm does for slimmable
  networks. It tests whether the shared weights lack capacity; such a model is not an elastic checkpoint the loader
  reads, so it is evaluated as masked views of the trained model.

    python benchmarks/elastic_recovery_screen.py --steps 60      # 2 CPU cores: ~3 min a reference, ~10 min a variant

Everything else as in ``benchmarks/recovery_vit_tiny.py`` (the default SnapViT ranking, 4000 train images for
recovery, 1000 validation images, batches of 32). Rows are appended to ``--output`` (JSON lines) as they finish.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import hf_snapvit
import hf_snapvit.recovery as recovery
from hf_snapvit.architectures import get_attention, get_layers, get_mlp, get_spec
from hf_snapvit.ranking import ElasticRanking
from hf_snapvit.recovery.forward import Outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recovery_vit_tiny  # noqa: E402  (benchmarks/ is not a package)
from correction_vit_tiny import evaluate  # noqa: E402

RANKING = Path(__file__).parent / "results" / "defaults_vit_tiny" / "rankings" / "obd-global-sigma0.5-g3.json"
REFERENCES = ("recovery@0.3", "recovery@0.5")
ELASTIC = ("elastic", "elastic-balanced", "elastic-samples2", "elastic-from0.1", "elastic-0.3to0.5", "elastic-lr6e-4",
           "elastic-lr1e-4", "elastic-no-hidden", "elastic-switchable", "elastic-weighted", "elastic-cascade",
           "elastic-stratified", "elastic-progressive")
ANCHORS = tuple(round(0.1 * i, 1) for i in range(7))


def settings(name: str, steps: int, batch_size: int) -> hf_snapvit.RecoveryConfig:
    """The RecoveryConfig of a row: the defaults, ``steps`` of ``batch_size``, one change for an elastic variant."""
    # held_out_images=0: every calibration image is trained on, as in the rows stored before the held-out check.
    given: dict[str, Any] = dict(steps=steps, batch_size=batch_size, num_images=None, seed=0, held_out_images=0)
    if name in REFERENCES:
        return hf_snapvit.RecoveryConfig(**given)
    given.update(elastic=True, elastic_range=(0.0, 0.6), elastic_samples=1)
    changes = {"elastic-samples2": dict(elastic_samples=2), "elastic-from0.1": dict(elastic_range=(0.1, 0.6)),
               "elastic-0.3to0.5": dict(elastic_range=(0.3, 0.5)),
               "elastic-lr6e-4": dict(lr=6e-4), "elastic-lr1e-4": dict(lr=1e-4),
               "elastic-no-hidden": dict(hidden_weight=0.0)}
    return hf_snapvit.RecoveryConfig(**{**given, **changes.get(name, {})})


@contextlib.contextmanager
def _patched(**replacements: Any) -> Iterator[None]:
    """Within the block, the recovery module's attributes named in ``replacements`` are replaced; restored after."""
    plain = {name: getattr(recovery, name) for name in replacements}
    for name, value in replacements.items():
        setattr(recovery, name, value)
    try:
        yield
    finally:
        for name, value in plain.items():
            setattr(recovery, name, value)


def balanced_views() -> contextlib.AbstractContextManager:
    """Scale each sliced view's per-image losses so that their batch mean is 3 (about a mid-range view's loss)."""
    plain = recovery.per_image_loss

    def scaled(student, teacher, config):
        loss = plain(student, teacher, config)
        mean = loss.mean().detach()
        return loss * (3.0 / mean) if mean > 1e-2 else loss

    return _patched(per_image_loss=scaled)


def sparsity_weighted_views() -> contextlib.AbstractContextManager:
    """Scale each view's per-image losses by its sparsity over the mean sparsity of the step's views."""
    plain_loss, plain_views = recovery.per_image_loss, recovery._step_views
    weights: list[float] = []

    def views(*args):
        chosen = plain_views(*args)
        mean = sum(s for s, _ in chosen) / len(chosen)
        weights[:] = [s / mean if mean > 0 else 1.0 for s, _ in chosen]
        return chosen

    def weighted(student, teacher, config):
        return plain_loss(student, teacher, config) * weights.pop(0)

    return _patched(per_image_loss=weighted, _step_views=views)


def cascade_views() -> contextlib.AbstractContextManager:
    """Views in size order; each after the first is distilled half from the teacher, half from the view before."""
    plain_loss, plain_views = recovery.per_image_loss, recovery._step_views
    larger: list[Any] = []

    def views(*args):
        larger.clear()
        return sorted(plain_views(*args), key=lambda view: view[0])

    def cascaded(student, teacher, config):
        loss = plain_loss(student, teacher, config)
        if larger:
            loss = 0.5 * loss + 0.5 * plain_loss(student, larger[0], config)
        larger[:] = [Outputs([h.detach() for h in student.hidden], student.embedding.detach(),
                             None if student.logits is None else student.logits.detach())]
        return loss

    return _patched(per_image_loss=cascaded, _step_views=views)


def drawn_views(kind: str) -> contextlib.AbstractContextManager:
    """``stratified``: the range's top plus one view drawn in each half; ``progressive``: a top that grows from 0.2
    to the range's end over the first half of the steps."""

    def views(chosen, config, step):
        (low, ranking), (high, _) = chosen
        rng = np.random.default_rng([config.seed, 3, step])
        if kind == "stratified":
            middle = (low + high) / 2
            drawn = [rng.uniform(low, middle), rng.uniform(middle, high), high]
        else:
            top = min(high, 0.2 + (high - 0.2) * step / max(1, config.steps // 2))
            drawn = [low, top, rng.uniform(low, top)]
        return [(float(s), ranking.keep_counts(float(s))) for s in drawn]

    return _patched(_step_views=views)


def _per_anchor(parameter: nn.Parameter) -> nn.ParameterDict:
    return nn.ParameterDict({f"a{i}": nn.Parameter(parameter.detach().clone()) for i in range(len(ANCHORS))})


class SwitchableParts:
    """Private LayerNorm and output-bias parameters per anchor sparsity, added to a model as extra parameters."""

    def __init__(self, model: nn.Module) -> None:
        # The hooks are closures over this dict, not bound methods: deep-copying the model (recover() trains a copy)
        # copies bound methods together with their object, and the copy would never see the anchor being set.
        self.state: dict[str, str | None] = {"anchor": None}
        state = self.state

        def norm_hook(module, inputs, out):
            a = state["anchor"]
            return out if a is None else F.layer_norm(inputs[0], module.normalized_shape, module.anchor_weight[a],
                                                      module.anchor_bias[a], module.eps)

        def bias_hook(module, inputs, out):
            a = state["anchor"]
            return out if a is None else out - module.bias + module.anchor_bias[a]

        spec = get_spec(model)
        outputs = []
        for layer in get_layers(model, spec):
            mlp, variant = get_mlp(layer, spec)
            outputs += [getattr(get_attention(layer, spec), spec.o_proj), getattr(mlp, variant.out_proj)]
        for norm in (m for m in model.modules() if isinstance(m, nn.LayerNorm)):
            norm.anchor_weight, norm.anchor_bias = _per_anchor(norm.weight), _per_anchor(norm.bias)
            norm.register_forward_hook(norm_hook)
        for linear in outputs:
            linear.anchor_bias = _per_anchor(linear.bias)
            linear.register_forward_hook(bias_hook)

    @contextlib.contextmanager
    def anchor(self, sparsity: float) -> Iterator[None]:
        """Within the block, every view uses the private parameters of the anchor nearest ``sparsity``."""
        self.state["anchor"] = f"a{int(np.argmin([abs(sparsity - x) for x in ANCHORS]))}"
        try:
            yield
        finally:
            self.state["anchor"] = None

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Route each view of elastic recovery through its anchor's parameters."""
        drawn: list[float] = []
        step_views, prefix_view, check = recovery._step_views, recovery.prefix_view, ElasticRanking.check_matches

        def views(*args):
            chosen = step_views(*args)
            drawn[:] = [s for s, _ in chosen]
            return chosen

        @contextlib.contextmanager
        def view(model, spec, heads, neurons):
            with self.anchor(drawn.pop(0)), prefix_view(model, spec, heads, neurons):
                yield

        recovery._step_views, recovery.prefix_view = views, view
        ElasticRanking.check_matches = lambda ranking, shape: None  # the anchor copies change the parameter count
        try:
            yield
        finally:
            recovery._step_views, recovery.prefix_view, ElasticRanking.check_matches = step_views, prefix_view, check


def run_variant(name: str, model_dir: str, calibration: Any, val: dict, bank: dict, steps: int, batch_size: int,
                k: int = 20) -> dict[str, float]:
    """Top-1 of one row at the sparsities it is measured at."""
    load = hf_snapvit.ElasticViTModel.from_pretrained
    config = settings(name, steps, batch_size)
    if name in REFERENCES:
        sparsity = float(name.split("@")[1])
        model = load(model_dir, sparsity=sparsity, recovery_data=calibration, recovery=config)
        return {str(sparsity): evaluate(model, val, bank, k)["top1"]}
    dense = load(model_dir).eval()
    parts = SwitchableParts(dense) if name == "elastic-switchable" else None
    patches = {"elastic-balanced": balanced_views, "elastic-weighted": sparsity_weighted_views,
               "elastic-cascade": cascade_views, "elastic-stratified": lambda: drawn_views("stratified"),
               "elastic-progressive": lambda: drawn_views("progressive")}
    context = parts.training() if parts else patches.get(name, contextlib.nullcontext)()
    with context:
        trained, _ = hf_snapvit.recover(dense, None, calibration, config, show_progress=False)
    ranking = ElasticRanking.from_dict(trained.config.elastic_ranking)
    if parts is None:
        folder = Path(tempfile.mkdtemp(prefix="elastic-screen-")) / "elastic"
        hf_snapvit.save_elastic(trained, ranking, folder)
        return {str(s): evaluate(load(folder, sparsity=s), val, bank, k)["top1"] for s in (0.0, 0.3, 0.5)}
    result = {}
    spec = get_spec(trained)
    for sparsity in (0.0, 0.3, 0.5):
        counts = ranking.keep_counts(sparsity)
        with parts.anchor(sparsity), recovery.prefix_view(trained, spec, counts.heads, counts.neurons):
            result[str(sparsity)] = evaluate(trained, val, bank, k)["top1"]
    return result


def main(argv: list[str] | None = None) -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=REFERENCES + ELASTIC, default=list(REFERENCES + ELASTIC))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-val", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" /
                        "elastic_recovery_screen.jsonl")
    args = parser.parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    bench = recovery_vit_tiny.parse_args(["--preset", "cpu", "--ranking", str(RANKING), "--num-val", str(args.num_val),
                                          "--num-bank", "1000", "--num-calibration", "4000"])
    model_dir, calibration, val, bank = recovery_vit_tiny.prepare(bench)
    for name in args.variants:
        start = time.perf_counter()
        top1 = run_variant(name, model_dir, calibration, val, bank, args.steps, args.batch_size)
        row = {"variant": name, "steps": args.steps, "batch_size": args.batch_size, "num_val": args.num_val,
               "seconds": round(time.perf_counter() - start), "device": "cpu", "torch": torch.__version__,
               "top1": {s: round(v, 4) for s, v in top1.items()}}
        print(row, flush=True)
        with args.output.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
