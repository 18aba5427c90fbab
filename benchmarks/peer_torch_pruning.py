"""Peer side by side: Torch-Pruning prunes the shared ViT-Tiny to hf_snapvit's parameter budgets, no fine-tuning.

Torch-Pruning (``MetaPruner``, global ranking, driven by ``_tp_vit.py``) removes whole heads and FFN neurons, never the
hidden width, until the backbone has the parameters hf_snapvit's ``sparsity`` means; how many of each go is
``--head-rule`` (``proportional``: the same fraction of head and FFN parameters; ``paired``: the SnapViT reference's
head ratio = neuron ratio - 0.15), above hf_snapvit's per-block floors. Its HF ViT example also shrinks head dims and
the hidden width, which hf_snapvit keeps, so it is not compared. Importances as Torch-Pruning ships them: ``l1`` /
``l2`` (data-free), ``taylor`` (cross-entropy on 256 labelled train images outside the bank), ``taylor-pseudo``
(against the dense model's predictions); ``snapvit`` loads hf_snapvit's ``--elastic`` checkpoint at the same sizes.
Every model is scored on the same images (top-1, k-NN top-1 with k = 20, retention) and timed at batch 8 and 64.

    python benchmarks/peer_torch_pruning.py --importances l1 l2 taylor taylor-pseudo snapvit \
        --elastic vit-tiny-elastic-snapvit --num-val 500 --num-bank 1000 --threads 1

Runs with the same evaluation settings merge into one ``--output`` JSON, row by row (a row's latency ratios use the
dense latency of its own run); ``--print-tables`` prints the markdown tables of that JSON.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from huggingface_hub.utils import tqdm

import _tp_vit
from _harness import RESULTS, load_classifier, parser, preprocess, timed, write_json
from hf_snapvit.architectures.budget import ModelShape, backbone_parameters, layer_widths, model_shape
from hf_snapvit.architectures.flops import estimate_gflops
from hf_snapvit.benchmark import compare_latency, hardware_info
from hf_snapvit.elastic.ranking import ElasticRanking, Floors
from hf_snapvit.errors import BudgetError
from hf_snapvit.evaluation import Evaluator, load_split
from hf_snapvit.utils.files import public_name
from hf_snapvit.loading.modeling import ElasticViTModel

HEAD_RULES = ("proportional", "paired")
# The protocol of the stored results: runs merge into them only with the same settings.
SEED, NUM_CALIB, EVAL_BATCH, LATENCY_BATCHES, LATENCY_REPEATS = 0, 256, 100, [8, 64], 3


class ImportanceSpec(NamedTuple):
    """``gradients``: ``None`` (data-free), ``"labels"`` or ``"pseudo"`` (the dense model's own predictions)."""

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


def floors(shape: ModelShape) -> tuple[int, int]:
    """``(heads, neurons)`` every block keeps: hf_snapvit's default floors, so both tools face the same limits."""
    blank = ElasticRanking(head_scores=np.zeros((shape.num_layers, shape.num_heads)),
                           neuron_scores=np.zeros((shape.num_layers, shape.intermediate_size)), shape=shape,
                           **Floors().to_dict())
    return blank.floors()


def plan_removals(shape: ModelShape, sparsity: float, head_rule: str = "proportional") -> tuple[int, int, float]:
    """``(heads to remove, neurons to remove, target backbone parameters)`` for a backbone ``sparsity`` (see
    ``--head-rule``); the plan lands within one neuron of the target (``paired``: within one head, where its head steps
    jump over it)."""
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


def accumulate_gradients(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor | None,
                         batch_size: int = 32, show_progress: bool = False) -> dict[str, torch.Tensor]:
    """Parameter name -> mean cross-entropy gradient over ``pixels`` against ``labels`` (``None``: the model's own
    predictions), to hand to copies of the model (``copy.deepcopy`` does not copy ``.grad``)."""
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
    """A copy of ``model`` pruned by Torch-Pruning to hf_snapvit's ``sparsity`` budget with ``importance`` (a name of
    :func:`importances` or an importance object; gradient-based ones need ``gradients``), and its record: target and
    realised parameters, GFLOPs, per-block widths, pruning seconds."""
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
    record = {**size_record(pruned, sparsity, shape.num_params(), target), "removed_heads": remove_heads,
              "removed_neurons": remove_neurons, "blocks_at_floor": result["floor_blocks"],
              "prune_seconds": result["seconds"]}
    return pruned, record


def latency_record(dense: torch.nn.Module, pruned: torch.nn.Module) -> dict:
    """Median forward ms of the pruned and the dense model, timed interleaved on seeded random images, and their
    ratio, per batch size (string keys, as they read back from JSON)."""
    timed_ms = compare_latency({"dense": dense, "pruned": pruned}, LATENCY_BATCHES, repeats=LATENCY_REPEATS, warmup=1)
    mine = {b: t["median_ms"] for b, t in timed_ms["pruned"].items()}
    reference = {b: t["median_ms"] for b, t in timed_ms["dense"].items()}
    return {"latency_ms": mine, "dense_latency_ms": reference,
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


def parse_args(argv: list[str] | None = None) -> Any:
    options = parser(__doc__)
    options.add_argument("--importances", nargs="+", default=["l1", "l2", "taylor", "taylor-pseudo"],
                         choices=["l1", "l2", "taylor", "taylor-pseudo", "snapvit"],
                         help="Torch-Pruning importances and/or snapvit (needs --elastic)")
    options.add_argument("--elastic", default=None, help="hf_snapvit elastic checkpoint for the 'snapvit' rows")
    options.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    options.add_argument("--head-rule", default="proportional", choices=HEAD_RULES,
                         help="how many heads vs neurons Torch-Pruning removes; non-default rules get their own rows "
                              "(e.g. 'taylor-paired')")
    options.add_argument("--num-val", type=int, default=1000)
    options.add_argument("--num-bank", type=int, default=2000, help="train images in the k-NN memory bank")
    options.add_argument("--threads", type=int, default=0, help="torch threads (0 = all)")
    options.add_argument("--output", type=Path, default=RESULTS / "peer_torch_pruning" / "peer_torch_pruning.json")
    options.add_argument("--print-tables", action="store_true", help="print the markdown tables of --output and exit")
    args = options.parse_args(argv)
    if "snapvit" in args.importances and not args.elastic:
        options.error("'snapvit' rows need --elastic PATH (an hf_snapvit elastic checkpoint of the same model)")
    return args


def _protocol(args: Any) -> dict[str, Any]:
    return {"model": public_name(args.model), "data": public_name(args.data), "num_val": args.num_val,
            "num_bank": args.num_bank, "num_calib": NUM_CALIB, "seed": SEED,
            "knn": "k=20, L2-normalised final-norm CLS features, majority vote, train split as memory bank",
            "top1": "model's own classifier head, validation split",
            "calibration": f"train images {args.num_bank}..{args.num_bank + NUM_CALIB} of the bank's shuffle "
                           f"(seed {SEED + 1}), disjoint from the bank; labels used only by 'taylor'",
            "fine_tuning": "none"}


def earlier_results(args: Any, protocol: dict[str, Any]) -> dict[str, Any]:
    """``--output``'s results when they were made with the same evaluation settings (merged into), else a new one."""
    if args.output.exists():
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


def size_record(pruned: torch.nn.Module, sparsity: float, dense_params: int, target: float) -> dict[str, Any]:
    """What every row records of a model cut to ``sparsity``: realised size, GFLOPs and widths."""
    params = backbone_parameters(pruned)
    heads, neurons = layer_widths(pruned)
    return {"target_sparsity": sparsity, "sparsity": 1.0 - params / dense_params, "target_params": round(target),
            "params": params, "params_with_head": sum(p.numel() for p in pruned.parameters()),
            "gflops": estimate_gflops(pruned), "heads": heads, "neurons": neurons}


def snapvit_record(elastic: str, sparsity: float, dense_params: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """hf_snapvit's elastic checkpoint loaded at ``sparsity``, with the same record fields as a pruned row."""
    pruned, seconds = timed(lambda: ElasticViTModel.from_pretrained(elastic, sparsity=sparsity).eval())
    return pruned, {**size_record(pruned, sparsity, dense_params, (1 - sparsity) * dense_params),
                    "load_seconds": seconds}


def method_setup(name: str, args: Any, model: torch.nn.Module,
                 processor: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """The method's JSON header (description, ranking or head rule) and, for Taylor importances, its gradients."""
    if name == "snapvit":
        config = json.loads((Path(args.elastic) / "config.json").read_text())
        provenance = config.get("elastic_ranking", {}).get("provenance", {})
        return {"rows": [], "description": f"hf_snapvit ElasticViTModel.from_pretrained({args.elastic!r}, sparsity=s)",
                "ranking": {k: provenance.get(k) for k in ("method", "settings", "seed")}}, None
    spec = importances()[name]
    method = {"rows": [], "head_rule": args.head_rule, "description": spec.description}
    if not spec.gradients:
        return method, None

    def gradients() -> dict[str, torch.Tensor]:
        # Rows num_bank.. of the bank's own shuffle: never images of the bank.
        rows = load_split(args.data, "train", num_samples=args.num_bank + NUM_CALIB, seed=SEED + 1)
        rows = rows.select(range(min(args.num_bank, len(rows)), len(rows)))
        labels = torch.tensor(rows["label"]) if spec.gradients == "labels" else None
        return accumulate_gradients(model, preprocess(processor, rows["image"]), labels, show_progress=True)

    found, method["gradient_seconds"] = timed(gradients)
    method["gradient_images"] = NUM_CALIB
    return method, found


def run_method(name: str, args: Any, model: torch.nn.Module, data: dict[str, Any], results: dict[str, Any],
               run: dict[str, Any]) -> None:
    """Every ``--sparsities`` row of one method, merged into ``results`` and written after each row."""
    key = name if name == "snapvit" or args.head_rule == "proportional" else f"{name}-{args.head_rule}"
    method, gradients = method_setup(name, args, model, data["processor"])
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
        found = data["evaluator"].evaluate(pruned)
        record.update(top1=found.top1, knn_top1=found.knn_top1, retention=found.retention,
                      **latency_record(model, pruned), run=run["started"])
        if "gradient_seconds" in method:  # paid once per run, shared by its sparsities
            record["gradient_seconds"] = method["gradient_seconds"]
        method["rows"].append(record)
        results["methods"][key] = {**method, "runs": runs,
                                   "rows": sorted(previous + method["rows"], key=lambda r: r["target_sparsity"])}
        write_json(args.output, results, indent=2)  # after every row: an interrupted run keeps what it finished
        speed = " ".join(f"bs{b} {ratio:.2f}x" for b, ratio in record["latency_ratio"].items())
        print(f"{key:13s} s={record['sparsity']:.3f} params={record['params'] / 1e6:.3f}M "
              f"GFLOPs={record['gflops']:.3f} top-1 {record['top1']:.3f} k-NN {record['knn_top1']:.3f} "
              f"latency {speed}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.print_tables:
        print(format_tables(json.loads(args.output.read_text())))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    import torch_pruning

    model, processor = load_classifier(args.model)
    protocol = _protocol(args)
    results = earlier_results(args, protocol)
    results["protocol"] = protocol
    results["hardware"] = {**hardware_info(), "torch_pruning": getattr(torch_pruning, "__version__", "unknown")}
    run = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
           "argv": [public_name(a) for a in (sys.argv[1:] if argv is None else argv)], "hardware": results["hardware"]}
    val = load_split(args.data, "validation", num_samples=args.num_val, seed=SEED)
    bank = load_split(args.data, "train", num_samples=args.num_bank, seed=SEED + 1)
    val_pixels = preprocess(processor, val["image"])
    evaluator = Evaluator(val_pixels, eval_labels=val["label"], bank_data=preprocess(processor, bank["image"]),
                          bank_labels=bank["label"], dense_model=model, metrics=["top1", "knn", "retention"],
                          batch_size=EVAL_BATCH, show_progress=False)
    dense = evaluator.evaluate(model)
    results["dense"] = {"params": model_shape(model).num_params(),
                        "params_with_head": sum(p.numel() for p in model.parameters()),
                        "gflops": estimate_gflops(model), "top1": dense.top1, "knn_top1": dense.knn_top1}
    print(f"dense: {results['dense']['params'] / 1e6:.3f} M backbone params, {dense.gflops:.3f} GFLOPs, "
          f"top-1 {dense.top1:.3f}, k-NN {dense.knn_top1:.3f}")
    run["zero_sparsity_max_abs_logit_diff"] = diff = zero_sparsity_difference(model, val_pixels, args.head_rule)
    print(f"0 % pruning: max |logit difference| = {diff:.2e}")
    data = {"evaluator": evaluator, "example": {"pixel_values": val_pixels[:1]}, "processor": processor}
    for name in args.importances:
        run_method(name, args, model, data, results, run)
    write_json(args.output, results, indent=2)
    print(format_tables(results))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
