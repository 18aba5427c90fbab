"""Peer side by side: Torch-Pruning prunes the shared ViT-Tiny to hf_snapvit's parameter budgets, no fine-tuning.

Torch-Pruning (``torch-pruning`` on PyPI, ``MetaPruner`` with global ranking) removes whole attention heads and FFN
neurons, never the hidden width, until the backbone has the parameters that hf_snapvit's ``sparsity`` means: the
fraction of backbone parameters removed, embeddings included, classifier excluded
(``hf_snapvit.architectures.budget.backbone_parameters``; ``ElasticRanking.keep_counts(sparsity).num_params``). How many heads
versus neurons go is a rule (``--head-rule``), because Torch-Pruning ranks the two kinds separately:
``proportional`` removes the same fraction of head and of FFN parameters (one ratio for both kinds),
``paired`` uses the SnapViT reference's head ratio = neuron ratio - 0.15. Every block keeps hf_snapvit's floors
(20 % of heads, 5 % of neurons, at least one of each). Torch-Pruning's own HF ViT example instead shrinks head
dimensions and the hidden width as well; that changes the structure hf_snapvit keeps fixed, so it is not compared.

Importances (Torch-Pruning's classes, as they ship: group importance normalised by its mean):

* ``l1`` / ``l2``: ``GroupMagnitudeImportance(p=1 / 2)``, data-free;
* ``taylor``: ``GroupTaylorImportance``, gradients of cross-entropy on ``--num-calib`` labelled train images;
* ``taylor-pseudo``: the same with the dense model's own predictions as targets (label-free, uses the classifier);
* ``snapvit``: not Torch-Pruning; hf_snapvit's elastic checkpoint (``--elastic``) loaded at the same sparsities,
  evaluated by the same code for a same-table comparison.

Evaluation through :mod:`hf_snapvit.evaluation`, on the images ``load_split`` draws for the same
``--num-val``/``--num-bank``/``--seed`` (as ``_zero_training.pixels_and_labels`` draws them): top-1 of the
model's head on the validation split; k-NN top-1 with k = 20 over L2-normalised final-norm CLS features, majority
vote, train images as the memory bank; representation retention (cosine similarity to the dense model's
embeddings). Speed: median CPU forward latency at batch 8 and 64 of each pruned model and of the dense model,
measured in the same run (reported as ratios), and the pruning wall time.

    python benchmarks/peer_torch_pruning.py --importances l1 l2 taylor taylor-pseudo \
        --num-val 500 --num-bank 1000 --sparsities 0.1 0.2 0.3 0.4 0.5 0.6

Results of several invocations with the same evaluation settings merge into one ``--output`` JSON, row by row
(a row's latency ratios use the dense latency of its own run), so a long comparison can be split into short runs;
``--print-tables`` prints the markdown tables of that JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from huggingface_hub.utils import tqdm

import hf_snapvit
from hf_snapvit.benchmark import hardware_info, measure_latency
from hf_snapvit.architectures.budget import ModelShape, backbone_parameters, estimate_gflops, layer_widths, model_shape
from hf_snapvit.data.images import to_rgb
from hf_snapvit.errors import BudgetError
from hf_snapvit.evaluation import (
    extract_features,
    knn_accuracy,
    load_split,
    representation_retention,
    top1_accuracy,
)
from hf_snapvit.files import public_name, write_text_atomic
from hf_snapvit.elastic.ranking import ElasticRanking, Floors

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tp_vit  # noqa: E402  (sibling helper; benchmarks/ is not a package)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
HEAD_RULES = ("proportional", "paired")


@dataclass(frozen=True)
class ImportanceSpec:
    """A Torch-Pruning importance and what it needs.

    Args:
        build: Makes a fresh importance object.
        gradients: ``None`` (data-free), ``"labels"`` (cross-entropy on labelled images) or ``"pseudo"``
            (cross-entropy on the dense model's own predictions).
        description: How the scores are computed, for the JSON.
    """

    build: Callable[[], Any]
    gradients: str | None
    description: str


def importances() -> dict[str, ImportanceSpec]:
    """The Torch-Pruning importances this benchmark runs, by name."""
    import torch_pruning as tp

    return {
        "l1": ImportanceSpec(lambda: tp.importance.GroupMagnitudeImportance(p=1), None,
                             "GroupMagnitudeImportance(p=1): group L1 norm of the weights, data-free"),
        "l2": ImportanceSpec(lambda: tp.importance.GroupMagnitudeImportance(p=2), None,
                             "GroupMagnitudeImportance(p=2): group L2 norm of the weights (Torch-Pruning's default), "
                             "data-free"),
        "taylor": ImportanceSpec(tp.importance.GroupTaylorImportance, "labels",
                                 "GroupTaylorImportance: |w·dL/dw| with L = cross-entropy on labelled train images"),
        "taylor-pseudo": ImportanceSpec(tp.importance.GroupTaylorImportance, "pseudo",
                                        "GroupTaylorImportance with L = cross-entropy against the dense model's own "
                                        "predictions (label-free; uses the classifier head)"),
    }


# ------------------------------------------------------------------------------------------------- budgets
def floors(shape: ModelShape) -> tuple[int, int]:
    """``(heads, neurons)`` every block keeps: hf_snapvit's default floors, so both tools face the same limits."""
    blank = ElasticRanking(head_scores=np.zeros((shape.num_layers, shape.num_heads)),
                           neuron_scores=np.zeros((shape.num_layers, shape.intermediate_size)), shape=shape,
                           **Floors().to_dict())
    return blank.floors()


def plan_removals(shape: ModelShape, sparsity: float, head_rule: str = "proportional") -> tuple[int, int, float]:
    """How many heads and FFN neurons to remove for a backbone ``sparsity``.

    Args:
        shape: The dense model's :class:`~ModelShape` (unit parameter costs).
        sparsity: Fraction of backbone parameters to remove, hf_snapvit's definition.
        head_rule: ``"proportional"`` (same fraction of head and of FFN parameters) or ``"paired"`` (head ratio =
            neuron ratio - 0.15, the SnapViT reference).

    Returns:
        ``(heads to remove, neurons to remove, target backbone parameters)``; the plan lands within one neuron of the
        target (``paired``: within one head, where its head steps jump over the target).
    """
    if head_rule not in HEAD_RULES:
        raise BudgetError(f"head_rule={head_rule!r} is not one of {HEAD_RULES}.")
    min_heads, min_neurons = floors(shape)
    total_heads, total_neurons = shape.num_layers * shape.num_heads, shape.num_layers * shape.intermediate_size
    max_heads = shape.num_layers * (shape.num_heads - min_heads)
    max_neurons = shape.num_layers * (shape.intermediate_size - min_neurons)
    ph, pn = shape.params_per_head, shape.params_per_neuron
    dense = shape.num_params()
    largest = (max_heads * ph + max_neurons * pn) / dense
    if not isinstance(sparsity, (int, float)) or not 0.0 <= sparsity <= largest:
        raise BudgetError(
            f"sparsity={sparsity!r} is out of range: with per-block floors of {min_heads} heads and {min_neurons} "
            f"neurons this model allows 0 <= sparsity <= {largest:.4f}."
        )
    target = (1.0 - sparsity) * dense
    remove = dense - target
    if head_rule == "proportional":
        prunable = total_heads * ph + total_neurons * pn
        heads = min(round(remove / prunable * total_heads), max_heads, math.floor(remove / ph))
        # Neurons fill the rest; where the neuron floors bind, heads take over.
        while True:
            neurons = round((remove - heads * ph) / pn)
            if neurons <= max_neurons or heads >= max_heads:
                return heads, max(0, min(neurons, max_neurons)), target
            heads += 1

    def removed(n: int) -> tuple[int, int]:
        h = min(max_heads, math.floor(total_heads * max(0.0, n / total_neurons - Floors().paired_head_offset) + 1e-9))
        return h, h * ph + n * pn

    best = min(range(max_neurons + 1), key=lambda n: abs(removed(n)[1] - remove))
    return removed(best)[0], best, target


# ------------------------------------------------------------------------------------------------- pruning
def accumulate_gradients(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor | None,
                         batch_size: int = 32, show_progress: bool = False) -> dict[str, torch.Tensor]:
    """Mean cross-entropy gradient of every parameter over ``pixels``.

    Args:
        model: A ``*ForImageClassification`` model; its weights are not changed.
        pixels: ``[N, C, H, W]`` pixel values.
        labels: Class labels, or ``None`` to use the model's own predictions (label-free).
        batch_size: Images per backward pass.
        show_progress: Show a progress bar.

    Returns:
        Parameter name -> gradient, to hand to copies of the model (``copy.deepcopy`` does not copy ``.grad``).
    """
    model.zero_grad(set_to_none=True)
    for start in tqdm(range(0, len(pixels), batch_size), desc="gradients", disable=not show_progress):
        logits = model(pixel_values=pixels[start:start + batch_size]).logits
        target = logits.argmax(1).detach() if labels is None else labels[start:start + batch_size]
        (F.cross_entropy(logits, target, reduction="sum") / len(pixels)).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def prune_to_sparsity(
    model: torch.nn.Module,
    sparsity: float,
    importance: str | Any,
    example_inputs: dict[str, torch.Tensor],
    *,
    gradients: dict[str, torch.Tensor] | None = None,
    head_rule: str = "proportional",
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A copy of ``model`` pruned by Torch-Pruning to hf_snapvit's ``sparsity`` budget.

    Args:
        model: The dense HF ViT (not modified).
        sparsity: Fraction of backbone parameters to remove.
        importance: A name from :func:`importances` or a Torch-Pruning importance object.
        example_inputs: Keyword inputs for Torch-Pruning's graph tracing.
        gradients: Parameter name -> gradient, for gradient-based importances (:func:`accumulate_gradients`).
        head_rule: See :func:`plan_removals`.

    Returns:
        The pruned copy and a record: target and realised parameters, GFLOPs, per-block widths, pruning seconds.
    """
    shape = model_shape(model)
    remove_heads, remove_neurons, target = plan_removals(shape, sparsity, head_rule)
    if isinstance(importance, str):
        table = importances()
        if importance not in table:
            raise BudgetError(f"importance={importance!r} is not one of {sorted(table)}.")
        if table[importance].gradients and gradients is None:
            raise BudgetError(f"importance={importance!r} needs gradients: pass accumulate_gradients(...) output.")
        importance = table[importance].build()
    pruned = copy.deepcopy(model)
    if gradients is not None:
        for name, p in pruned.named_parameters():
            if name in gradients:
                p.grad = gradients[name].clone()
    min_heads, min_neurons = floors(shape)
    result = _tp_vit.prune_vit_(pruned, importance, example_inputs, remove_heads=remove_heads,
                                remove_neurons=remove_neurons, min_heads=min_heads, min_neurons=min_neurons)
    pruned.zero_grad(set_to_none=True)
    params = backbone_parameters(pruned)
    record = {
        "target_sparsity": sparsity,
        "sparsity": 1.0 - params / shape.num_params(),
        "target_params": round(target),
        "params": params,
        "params_with_head": sum(p.numel() for p in pruned.parameters()),
        "gflops": estimate_gflops(pruned),
        "removed_heads": remove_heads,
        "removed_neurons": remove_neurons,
        "heads": result.heads,
        "neurons": result.neurons,
        "blocks_at_floor": result.floor_blocks,
        "prune_seconds": result.seconds,
    }
    return pruned, record


# ------------------------------------------------------------------------------------------------- evaluation
def draw(data_dir: str, split: str, start: int, n: int, seed: int) -> tuple[list, torch.Tensor]:
    """Images ``start:start+n`` of ``split`` shuffled with ``seed`` (``start=0``: the draw of
    ``_zero_training.pixels_and_labels``)."""
    ds = load_split(data_dir, split, num_samples=start + n, seed=seed)
    ds = ds.select(range(min(start, len(ds)), len(ds)))
    return [to_rgb(im) for im in ds["image"]], torch.tensor(ds["label"])


def evaluate(model: torch.nn.Module, val: tuple[torch.Tensor, torch.Tensor], bank: tuple[torch.Tensor, torch.Tensor],
             batch: int, dense_embeddings: torch.Tensor | None = None) -> tuple[dict[str, float], torch.Tensor]:
    """Top-1 of the model's head, k-NN top-1 (k = 20) and, given the dense embeddings, representation retention.

    Uses :mod:`hf_snapvit.evaluation`, the harness every hf_snapvit number goes through: one forward pass per batch
    gives the final-norm CLS embedding and the logits; k-NN over L2-normalised embeddings, majority vote.

    Returns:
        The metrics and the validation embeddings.
    """
    val_features = extract_features(model, val[0], batch_size=batch, show_progress=False)
    bank_features = extract_features(model, bank[0], batch_size=batch, logits=False, show_progress=False)
    metrics = {"top1": top1_accuracy(val_features.logits, val[1]),
               "knn_top1": knn_accuracy(bank_features.embeddings, bank[1], val_features.embeddings, val[1], k=20)}
    if dense_embeddings is not None:
        metrics["retention"] = representation_retention(val_features.embeddings, dense_embeddings)
    return metrics, val_features.embeddings


def latency_record(dense: torch.nn.Module, pruned: torch.nn.Module, batches: list[int], repeats: int) -> dict:
    """Median forward ms of the pruned and the dense model, timed interleaved
    (:func:`hf_snapvit.benchmark.measure_latency`, seeded random images), and their ratio, per batch size."""
    if not batches:
        return {"latency_ms": {}, "dense_latency_ms": {}, "latency_ratio": {}}
    timed = measure_latency({"dense": dense, "pruned": pruned}, batches, repeats=repeats, warmup=1)
    mine = {b: t["median_ms"] for b, t in timed["pruned"].items()}  # string keys, as they read back from JSON
    reference = {b: t["median_ms"] for b, t in timed["dense"].items()}
    return {"latency_ms": mine, "dense_latency_ms": reference,  # the dense model measured alongside, same run
            "latency_ratio": {b: mine[b] / reference[b] for b in mine}}


def format_tables(results: dict[str, Any]) -> str:
    """Markdown tables of a results JSON: accuracy per sparsity, then speed and pruning time per sparsity."""
    methods = results["methods"]
    sparsities = sorted({r["target_sparsity"] for m in methods.values() for r in m["rows"]})
    header = " / ".join(f"{100 * s:.0f}" for s in sparsities)
    dense = results["dense"]
    label = {name: "hf_snapvit SnapViT" if name == "snapvit" else f"Torch-Pruning {name}" for name in methods}

    def series(rows: dict[float, dict], key: Callable[[dict], float | None], fmt: str) -> str:
        values = [key(rows[s]) if s in rows else None for s in sparsities]
        return " / ".join("-" if v is None else fmt.format(v) for v in values)

    lines = [f"| method | top-1 @ {header} % | k-NN @ {header} % | retention @ {header} % |", "|---|---|---|---|",
             f"| dense | {100 * dense['top1']:.1f} | {100 * dense['knn_top1']:.1f} | 1.00 |"]
    for name, method in methods.items():
        rows = {r["target_sparsity"]: r for r in method["rows"]}
        lines.append(f"| {label[name]} | {series(rows, lambda r: 100 * r['top1'], '{:.1f}')} | "
                     f"{series(rows, lambda r: 100 * r['knn_top1'], '{:.1f}')} | "
                     f"{series(rows, lambda r: r.get('retention'), '{:.2f}')} |")
    batches = sorted({b for m in methods.values() for r in m["rows"] for b in r["latency_ratio"]}, key=int)
    lines += ["", f"| method | GFLOPs @ {header} % | "
              + " | ".join(f"latency ratio bs {b}" for b in batches) + " | pruning s (+ gradients) |",
              "|---|---|" + "---|" * len(batches) + "---|",
              f"| dense | {dense['gflops']:.2f} | " + " | ".join("1.00" for _ in batches) + " | |"]
    for name, method in methods.items():
        rows = {r["target_sparsity"]: r for r in method["rows"]}
        prune = [r.get("prune_seconds", r.get("load_seconds", 0.0)) for r in method["rows"]]
        grad = max((r.get("gradient_seconds", 0.0) for r in method["rows"]), default=0.0)
        lines.append(f"| {label[name]} | {series(rows, lambda r: r['gflops'], '{:.2f}')} | "
                     + " | ".join(series(rows, lambda r, b=b: r["latency_ratio"].get(b), "{:.2f}") for b in batches)
                     + f" | {statistics.median(prune):.1f}" + (f" (+ {grad:.0f})" if grad else "") + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--importances", nargs="+", default=["l1", "l2", "taylor", "taylor-pseudo"],
                        help="Torch-Pruning importances (l1 l2 taylor taylor-pseudo) and/or snapvit (needs --elastic)")
    parser.add_argument("--elastic", default=None, help="hf_snapvit elastic checkpoint for the 'snapvit' rows")
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    parser.add_argument("--head-rule", default="proportional", choices=HEAD_RULES,
                        help="how many heads vs neurons Torch-Pruning removes; non-default rules get their own rows "
                             "(e.g. 'taylor-paired')")
    parser.add_argument("--num-val", type=int, default=1000)
    parser.add_argument("--num-bank", type=int, default=2000, help="train images in the k-NN memory bank")
    parser.add_argument("--num-calib", type=int, default=256,
                        help="train images (disjoint from the bank) for the Taylor gradients")
    parser.add_argument("--latency-batches", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--latency-repeats", type=int, default=3)
    parser.add_argument("--eval-batch", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = all)")
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).parent / "results" / "peer_torch_pruning.json")
    parser.add_argument("--no-merge", action="store_true", help="overwrite --output instead of merging into it")
    parser.add_argument("--print-tables", action="store_true", help="print the markdown tables of --output and exit")
    args = parser.parse_args(argv)
    known = set(importances()) | {"snapvit"}
    unknown = [name for name in args.importances if name not in known]
    if unknown:
        parser.error(f"unknown importances {unknown}; choose from {sorted(known)}")
    if "snapvit" in args.importances and not args.elastic:
        parser.error("'snapvit' rows need --elastic PATH (an hf_snapvit elastic checkpoint of the same model)")
    return args


def _protocol(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": public_name(args.model), "data": public_name(args.data), "num_val": args.num_val,
            "num_bank": args.num_bank,
            "num_calib": args.num_calib, "seed": args.seed,
            "knn": "k=20, L2-normalised final-norm CLS features, majority vote, train split as memory bank",
            "top1": "model's own classifier head, validation split",
            "calibration": f"train images {args.num_bank}..{args.num_bank + args.num_calib} of the bank's shuffle "
                           f"(seed {args.seed + 1}), disjoint from the bank; labels used only by 'taylor'",
            "fine_tuning": "none"}


def hardware() -> dict[str, Any]:
    """:func:`hf_snapvit.benchmark.hardware_info` plus the Torch-Pruning version."""
    import torch_pruning

    return {**hardware_info(), "torch_pruning": getattr(torch_pruning, "__version__", "unknown")}


def write_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str))


def earlier_results(args: argparse.Namespace, protocol: dict[str, Any]) -> dict[str, Any]:
    """``--output``'s results when they were made with the same evaluation settings (merged into), else a new one."""
    if args.output.exists() and not args.no_merge:
        previous = json.loads(args.output.read_text())
        recorded = dict(previous.get("protocol") or {})
        # Results recorded before paths were reduced to folder names hold the full paths: the same settings.
        recorded.update({k: public_name(recorded[k]) for k in ("model", "data") if recorded.get(k)})
        if recorded == protocol:
            return {**previous, "protocol": protocol}
        print(f"{args.output} has other evaluation settings; overwriting it")
    return {"protocol": protocol, "methods": {}}


def zero_sparsity_difference(model: torch.nn.Module, pixels: torch.Tensor, head_rule: str) -> float:
    """Max |logit difference| of a 0 % Torch-Pruning pass: traced and re-assembled, the model must not change."""
    zero, _ = prune_to_sparsity(model, 0.0, "l2", {"pixel_values": pixels[:1]}, head_rule=head_rule)
    with torch.inference_mode():
        return (zero(pixel_values=pixels[:8]).logits - model(pixel_values=pixels[:8]).logits).abs().max().item()


def snapvit_record(elastic: str, sparsity: float, dense_params: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """hf_snapvit's elastic checkpoint loaded at ``sparsity``, with the same record fields as a pruned row."""
    start = time.perf_counter()
    pruned = hf_snapvit.ElasticViTModel.from_pretrained(elastic, sparsity=sparsity).eval()
    heads, neurons = layer_widths(pruned)
    params = backbone_parameters(pruned)
    return pruned, {"target_sparsity": sparsity, "sparsity": 1.0 - params / dense_params,
                    "target_params": round((1 - sparsity) * dense_params), "params": params,
                    "params_with_head": sum(p.numel() for p in pruned.parameters()),
                    "gflops": estimate_gflops(pruned), "heads": heads, "neurons": neurons,
                    "load_seconds": time.perf_counter() - start}


def method_setup(name: str, args: argparse.Namespace, model: torch.nn.Module,
                 to_pixels: Callable) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """The method's JSON header (description, ranking or head rule) and, for Taylor importances, its gradients."""
    method: dict[str, Any] = {"rows": []}
    if name == "snapvit":
        method["description"] = f"hf_snapvit ElasticViTModel.from_pretrained({args.elastic!r}, sparsity=s)"
        config = json.loads((Path(args.elastic) / "config.json").read_text())
        method["ranking"] = {k: config.get("elastic_ranking", {}).get("provenance", {}).get(k)
                             for k in ("method", "settings", "seed")}
        return method, None
    method["head_rule"] = args.head_rule
    spec = importances()[name]
    method["description"] = spec.description
    if not spec.gradients:
        return method, None
    start = time.perf_counter()
    calib_images, calib_labels = draw(args.data, "train", args.num_bank, args.num_calib, args.seed + 1)
    gradients = accumulate_gradients(model, to_pixels(calib_images),
                                     calib_labels if spec.gradients == "labels" else None, show_progress=True)
    method["gradient_images"] = args.num_calib
    method["gradient_seconds"] = time.perf_counter() - start
    return method, gradients


def run_method(name: str, args: argparse.Namespace, model: torch.nn.Module, data: dict[str, Any],
               results: dict[str, Any], run: dict[str, Any]) -> None:
    """Every ``--sparsities`` row of one method, merged into ``results`` and written after each row."""
    key = name if name == "snapvit" or args.head_rule == "proportional" else f"{name}-{args.head_rule}"
    method, gradients = method_setup(name, args, model, data["to_pixels"])
    # Rows of earlier runs at other sparsities stay; this run's rows replace any at the same sparsity.
    earlier = results["methods"].get(key, {})
    previous = [r for r in earlier.get("rows", []) if r["target_sparsity"] not in args.sparsities]
    runs = [r for r in earlier.get("runs", []) if r["started"] in {row["run"] for row in previous}] + [run]
    for sparsity in tqdm(args.sparsities, desc=name):
        if name == "snapvit":
            pruned, record = snapvit_record(args.elastic, sparsity, results["dense"]["params"])
        else:
            pruned, record = prune_to_sparsity(model, sparsity, name, data["example"], gradients=gradients,
                                               head_rule=args.head_rule)
        record.update(evaluate(pruned, data["val"], data["bank"], args.eval_batch, data["dense_embeddings"])[0])
        record.update(latency_record(model, pruned, args.latency_batches, args.latency_repeats))
        record["run"] = run["started"]
        if "gradient_seconds" in method:  # paid once per run, shared by its sparsities
            record["gradient_seconds"] = method["gradient_seconds"]
        method["rows"].append(record)
        results["methods"][key] = {**method, "runs": runs,
                                   "rows": sorted(previous + method["rows"], key=lambda r: r["target_sparsity"])}
        write_json(args.output, results)  # after every row: an interrupted run keeps what it finished
        speed = " ".join(f"bs{b} {ratio:.2f}x" for b, ratio in record["latency_ratio"].items())
        print(f"{key:13s} s={record['sparsity']:.3f} params={record['params'] / 1e6:.3f}M "
              f"GFLOPs={record['gflops']:.3f} top-1 {record['top1']:.3f} k-NN {record['knn_top1']:.3f} "
              f"latency {speed}", flush=True)
        del pruned


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.print_tables:
        print(format_tables(json.loads(args.output.read_text())))
        return
    transformers.utils.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    processor = AutoImageProcessor.from_pretrained(args.model)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    protocol = _protocol(args)
    results = earlier_results(args, protocol)
    results["protocol"], results["hardware"] = protocol, hardware()
    run = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "argv": [public_name(a) for a in (sys.argv[1:] if argv is None else argv)],
           "hardware": results["hardware"]}

    val_images, val_labels = draw(args.data, "validation", 0, args.num_val, args.seed)
    bank_images, bank_labels = draw(args.data, "train", 0, args.num_bank, args.seed + 1)
    to_pixels = lambda images: processor(images=images, return_tensors="pt")["pixel_values"]  # noqa: E731
    val, bank = (to_pixels(val_images), val_labels), (to_pixels(bank_images), bank_labels)

    shape = model_shape(model)
    dense = {"params": shape.num_params(), "params_with_head": sum(p.numel() for p in model.parameters()),
             "gflops": estimate_gflops(model)}
    metrics, dense_embeddings = evaluate(model, val, bank, args.eval_batch)
    dense.update(metrics)
    results["dense"] = dense
    print(f"dense: {dense['params'] / 1e6:.3f} M backbone params, {dense['gflops']:.3f} GFLOPs, "
          f"top-1 {dense['top1']:.3f}, k-NN {dense['knn_top1']:.3f}")
    run["zero_sparsity_max_abs_logit_diff"] = diff = zero_sparsity_difference(model, val[0], args.head_rule)
    print(f"0 % pruning: max |logit difference| = {diff:.2e}")

    data = {"val": val, "bank": bank, "example": {"pixel_values": val[0][:1]}, "to_pixels": to_pixels,
            "dense_embeddings": dense_embeddings}
    for name in args.importances:
        run_method(name, args, model, data, results, run)
    write_json(args.output, results)
    print(format_tables(results))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
