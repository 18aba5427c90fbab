"""``hf-snapvit eval``: top-1, k-NN, linear probe and representation retention of a checkpoint."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .formatting import gflops, millions
from .models import add_model_argument, model_config
from .options import data_option, fraction, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``eval``."""
    from ..evaluation import METRICS

    add_model_argument(parser, "CHECKPOINT",
                       "an elastic checkpoint (loaded at --sparsity), a sliced one, or any supported model")
    parser.add_argument("--sparsity", type=fraction, default=None, metavar="S",
                        help="budget for an elastic checkpoint (a sliced one is evaluated as saved)")
    parser.add_argument("--dense-model", default=None, metavar="CHECKPOINT",
                        help="the dense model for the retention metric (default: --model when loaded at --sparsity)")
    parser.add_argument("--data", required=True, metavar="ID_OR_PATH",
                        help="labelled evaluation images: a parquet file, a folder of {split}.parquet, a dataset id")
    parser.add_argument("--split", default="validation",
                        help="evaluation split; a single file must not be named for another side of train/held-out "
                             "(default: %(default)s)")
    parser.add_argument("--num-samples", type=positive_int, default=None, metavar="N",
                        help="evaluate on a seeded subset of this size (default: the whole split)")
    parser.add_argument("--bank-data", default=None, metavar="ID_OR_PATH",
                        help="labelled train images for k-NN and the linear probe (default: none)")
    parser.add_argument("--bank-split", default="train", help="split of --bank-data (default: %(default)s)")
    parser.add_argument("--num-bank", type=positive_int, default=None, metavar="N", help="bank subset size")
    parser.add_argument("--metrics", nargs="+", choices=METRICS, default=None,
                        help="default: every metric the data and model allow")
    parser.add_argument("--k", type=positive_int, default=20, help="neighbours of the k-NN (default: %(default)s)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="images per forward pass")
    parser.add_argument("--seed", type=int, default=0, help="seed of the subsets (default: 0)")
    parser.add_argument("--output", default=None, metavar="FILE.json", help="also write the result here")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate ``--model`` on ``--data`` (and the ``--bank-data`` bank) with :func:`hf_snapvit.evaluate`."""
    from ..evaluation import evaluate, load_split

    model_config(args.model, "CHECKPOINT", elastic=bool(args.sparsity))
    if args.dense_model is not None:
        model_config(args.dense_model, "--dense-model", elastic=False)
    _check_metric_inputs(args)
    with data_option("--data"):  # load_split checks the source first (data.folders.check_image_source)
        eval_data = load_split(args.data, args.split, num_samples=args.num_samples, seed=args.seed)
    bank = None
    if args.bank_data is not None:
        with data_option("--bank-data"):
            bank = load_split(args.bank_data, args.bank_split, num_samples=args.num_bank, seed=args.seed)
    result = evaluate(args.model, eval_data, sparsity=args.sparsity, bank_data=bank, dense_model=args.dense_model,
                      metrics=args.metrics, k=args.k, batch_size=args.batch_size, show_progress=not args.quiet,
                      output=args.output)
    data = {"data": str(args.data), "split": args.split}
    if args.bank_data is not None:
        data.update(bank_data=str(args.bank_data), bank_split=args.bank_split)
    return {**result.to_dict(), **data}


def _check_metric_inputs(args: argparse.Namespace) -> None:
    """Metrics asked for whose inputs are missing fail before any loading, naming the options to add."""
    wanted = set(args.metrics or ())
    bank_metrics = sorted({"knn", "linear"} & wanted)
    if bank_metrics and args.bank_data is None:
        raise ConfigError(f"--metrics {' '.join(bank_metrics)} need labelled train images (the k-NN bank and the "
                          "probe's training set): pass --bank-data, e.g. the train split's parquet file.")
    if "retention" in wanted and args.dense_model is None and not args.sparsity:
        raise ConfigError("--metrics retention compares with the dense model: give an elastic checkpoint with "
                          "--sparsity, or the dense model with --dense-model.")


def render(r: dict[str, Any]) -> str:
    """The result of :func:`run` as text."""
    metrics = [(name, r.get(key)) for name, key in (("top-1", "top1"), (f"k-NN (k={r.get('k')})", "knn_top1"),
                                                    ("linear probe", "linear_top1"), ("retention", "retention"))]
    bank = (f", {r['num_bank']} in the bank ({r.get('bank_data')}, split {r.get('bank_split')!r})"
            if r.get("num_bank") else "")
    lines = [(f"model:     {r.get('name')} ({millions(r.get('num_params') or 0)} backbone params, "
              f"{gflops(r.get('gflops') or 0)} GFLOPs, sparsity {r.get('sparsity') or 0:.4f})"),
             f"images:    {r.get('num_eval')} evaluated ({r.get('data')}, split {r.get('split')!r}){bank}"]
    lines += [f"{name + ':':<10} {value:.4f}" for name, value in metrics if value is not None]
    return "\n".join(lines)
