"""What the benchmark scripts share: where the shared ViT-Tiny and Tiny-ImageNet live, random-weight ViTs of the
standard shapes, how a run is recorded (its command, its JSON), how the shared model is loaded, drawn for and scored,
and the stored rankings and zero-training draws of the shared ViT-Tiny.

The draws are those the scripts made before they shared this module (``_zero_training.py``, ``recovery_vit_tiny.py``
and ``correction_vit_tiny.py`` held them), so the stored results' images are the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import transformers

import hf_snapvit
from hf_snapvit.architectures.budget import model_shape
from hf_snapvit.benchmark import device_slug, hardware_info
from hf_snapvit.data.images import to_rgb
from hf_snapvit.data.sampling import key_order
from hf_snapvit.evaluation import Evaluator, load_split
from hf_snapvit.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHARED = ROOT.parent / "shared"
SHARED_MODEL = str(SHARED / "models" / "vit-tiny-tinyimagenet")
SHARED_DATA = str(SHARED / "data" / "tiny-imagenet-200")
RANKING = RESULTS / "defaults_vit_tiny" / "rankings" / "obd-global-sigma0.5-g3.json"

SHAPES = {
    "vit-b16": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "vit-s16": dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536),
    "vit-ti16": dict(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    "vit-l16": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    # The SigLIP so400m tower (PaliGemma, Idefics3, SmolVLM) at 384 pixels, and a ViT-g/14 (DINOv2-g's size).
    "so400m": dict(hidden_size=1152, num_hidden_layers=27, num_attention_heads=16, intermediate_size=4304,
                   image_size=384, patch_size=14),
    "vit-g14": dict(hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, intermediate_size=6144,
                    patch_size=14),
    # For the latency tests: small enough for a CPU, wide enough FFN (256) for the default width multiple of 64.
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=32,
                 patch_size=8),
}


def build(shape: str, seed: int, device: str = "cpu", shapes: dict[str, dict] = SHAPES) -> transformers.ViTModel:
    """A random-weight ViT backbone of ``shape`` (only the widths matter for speed), initialised on ``device``: a
    billion parameters initialise slowly on a CPU."""
    torch.manual_seed(seed)
    with torch.device(device):
        return transformers.ViTModel(transformers.ViTConfig(**shapes[shape]), add_pooling_layer=False).eval()


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def latency_arguments(doc: str, batch_sizes: list[int]) -> argparse.ArgumentParser:
    """The options the GPU latency scripts share; parse with :func:`parse_latency_arguments`."""
    result = parser(doc, shared=False)
    result.add_argument("--shapes", nargs="+", default=["vit-b16"], choices=sorted(SHAPES))
    result.add_argument("--sparsities", type=float, nargs="+", default=[0.5],
                        help="sliced sizes timed next to the dense model (fractions of parameters removed)")
    result.add_argument("--batch-sizes", type=int, nargs="+", default=batch_sizes)
    result.add_argument("--precision", choices=sorted(DTYPES), default=None,
                        help="weights and inputs cast to this (default: bf16 on cuda, fp32 elsewhere)")
    result.add_argument("--width-multiple", type=int, default=64,
                        help="kept FFN widths are multiples of this (64: the fastest on the H100)")
    result.add_argument("--repeats", type=int, default=20,
                        help="timed forwards per model and batch size (median reported)")
    result.add_argument("--warmup", type=int, default=3, help="untimed forwards per model and batch size")
    result.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    result.add_argument("--seed", type=int, default=0)
    result.add_argument("--output", default=None, help="JSON file (default: results/<script>_<device name>.json)")
    return result


def parse_latency_arguments(options: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = options.parse_args(argv)
    args.precision = args.precision or ("bf16" if torch.device(args.device).type == "cuda" else "fp32")
    return args


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``call()`` and its wall seconds."""
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def command(script: str, argv: list[str] | None) -> str:
    """The command line a JSON records, relative to the repository root."""
    return " ".join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)])


def output_path(given: str | Path | None, prefix: str, hardware: dict[str, Any]) -> Path:
    """``given``, else ``results/<prefix>_<device name>.json``."""
    return Path(given) if given else RESULTS / f"{prefix}_{device_slug(hardware)}.json"


def device_report(script: str, argv: list[str] | None, args: argparse.Namespace, prefix: str | None = None,
                  **fields: Any) -> tuple[Path, dict[str, Any]]:
    """Where a device run's JSON goes (``--output``, else ``results/<prefix>_<device name>.json``, the prefix the
    script's name by default) and what it starts with: the command, the machine, every option but ``--output``,
    then ``fields``."""
    hardware = hardware_info(device=args.device)
    return output_path(args.output, prefix or Path(script).stem, hardware), {
        "command": command(script, argv), "hardware": hardware,
        "settings": {k: v for k, v in vars(args).items() if k != "output"}, **fields}


def write_json(path: str | Path, data: Any, indent: int = 1) -> None:
    """Written atomically: a run cut off mid-write keeps the previous file."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=indent, default=str) + "\n")


def parser(doc: str, *, shared: bool = True) -> argparse.ArgumentParser:
    """A script's parser, described by its docstring's first line; ``shared`` adds ``--model`` and ``--data``."""
    result = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if shared:
        result.add_argument("--model", default=SHARED_MODEL)
        result.add_argument("--data", default=SHARED_DATA, help="folder with train.parquet and validation.parquet")
    return result


def load_classifier(path: str, device: str = "cpu") -> tuple[transformers.PreTrainedModel, Any]:
    """The image classifier at ``path`` in eval mode, and its image processor."""
    transformers.utils.logging.set_verbosity_error()
    model = transformers.AutoModelForImageClassification.from_pretrained(path).eval().to(device)
    return model, transformers.AutoImageProcessor.from_pretrained(path)


def preprocess(processor: Any, images: Any) -> torch.Tensor:
    """Pixel values of ``images``, preprocessed once."""
    return processor(images=[to_rgb(image) for image in images], return_tensors="pt")["pixel_values"]


def pixels(processor: Any, rows: Any) -> dict[str, torch.Tensor]:
    """Labelled dataset rows preprocessed once: ``{"pixels", "labels"}``."""
    return {"pixels": preprocess(processor, rows["image"]), "labels": torch.tensor(rows["label"])}


def scores(model: torch.nn.Module, val: dict, bank: dict, k: int = 20) -> dict[str, float]:
    """Top-1 with the model's head and k-NN top-1 (final-norm CLS features, ``bank`` as the memory) on ``val``."""
    evaluator = Evaluator(val["pixels"], eval_labels=val["labels"], bank_data=bank["pixels"],
                          bank_labels=bank["labels"], metrics=["top1", "knn"], k=k, batch_size=100,
                          show_progress=False)
    result, seconds = timed(lambda: evaluator.evaluate(model))
    return {"top1": result.top1, "knn_top1": result.knn_top1, "eval_seconds": seconds}


def disjoint_draw(data: str, seed: int, num_bank: int, num_calibration: int, num_val: int) -> tuple[Any, Any, Any]:
    """``(calibration, val, bank)`` rows: one seeded permutation of the train split gives the k-NN bank first and the
    calibration images after it, so the two never share an image; the validation rows are a seeded draw."""
    train, validation = load_split(data, "train"), load_split(data, "validation")
    order = np.random.default_rng(seed).permutation(len(train))
    calibration = train.select(order[num_bank:num_bank + num_calibration])
    val = validation.select(np.random.default_rng(seed).permutation(len(validation))[:num_val])
    return calibration, val, train.select(order[:num_bank])


def ranking_from_stored(stored: dict[str, Any], model: torch.nn.Module) -> hf_snapvit.ElasticRanking:
    """A ranking ``defaults_vit_tiny.py`` stored for ``model`` (unsorted scores, no shape; ``stored`` is not
    changed); its ``info`` becomes the provenance's ``defaults_sweep``."""
    stored = dict(stored)
    info = stored.pop("info", {})
    return hf_snapvit.ElasticRanking(
        head_scores=np.array(stored.pop("head_scores")), neuron_scores=np.array(stored.pop("neuron_scores")),
        shape=model_shape(model), provenance={"method": "snapvit", "defaults_sweep": info}, **stored)


def stored_ranking(path: Path, base: Any) -> hf_snapvit.ElasticRanking:
    """A ranking file of ``defaults_vit_tiny.py`` or of ``ElasticRanking.to_dict``."""
    stored = json.loads(Path(path).read_text())
    if "shape" in stored:
        return hf_snapvit.ElasticRanking.from_dict(stored)
    ranking = ranking_from_stored(stored, base)
    return dataclasses.replace(ranking, provenance={**ranking.provenance, "stored_ranking": Path(path).name})


# The zero-training benchmarks (prefix_correction_vit_tiny.py, prefix_correction_switch_time.py).
#: Seeds of the train-split draws: the k-NN bank (as every ViT-Tiny table) and the calibration images.
BANK_SEED, CALIBRATION_SEED = 1, 7


def zero_training_arguments(doc: str, output: str, sparsities: list[float], num_calibration: int
                            ) -> argparse.ArgumentParser:
    """The options the zero-training benchmarks share: model, data, ranking, sizes and image counts, output."""
    result = parser(doc)
    result.add_argument("--ranking", type=Path, default=RANKING)
    result.add_argument("--sparsities", type=float, nargs="+", default=sparsities)
    result.add_argument("--num-calibration", type=int, default=num_calibration)
    result.add_argument("--num-val", type=int, default=1000)
    result.add_argument("--num-bank", type=int, default=1000)
    result.add_argument("--output", type=Path, default=RESULTS / output)
    return result


def calibration_rows(data: str, count: int, bank_count: int) -> Any:
    """``count`` train rows drawn with :data:`CALIBRATION_SEED` from those the k-NN bank (the first ``bank_count``
    of the split shuffled with :data:`BANK_SEED`, as ``load_split`` draws it) does not hold: images fitted on must
    not be the bank's, or the bank's features would be the ones fitted. Each row keeps its split index (``row``)."""
    train = load_split(data, "train")
    train = train.add_column("row", list(range(len(train))))
    bank = {int(row) for row in key_order(len(train), BANK_SEED)[:bank_count]}
    rest = train.filter(lambda row: row not in bank, input_columns="row")
    return rest.select(key_order(len(rest), CALIBRATION_SEED)[:count])


def zero_training_setup(args: argparse.Namespace) -> dict:
    """The model, its ranking and the images: validation images and the k-NN bank (seeds 0 and 1, as every ViT-Tiny
    table; none when their count is 0), and calibration images not in the bank (:func:`calibration_rows`)."""
    model, processor = load_classifier(args.model)

    def drawn(split: str, count: int, seed: int) -> dict | None:
        return pixels(processor, load_split(args.data, split, num_samples=count, seed=seed)) if count else None

    rows = calibration_rows(args.data, args.num_calibration, args.num_bank)
    return {"model": model, "ranking": stored_ranking(args.ranking, model),
            "val": drawn("validation", args.num_val, 0), "bank": drawn("train", args.num_bank, BANK_SEED),
            "calibration": preprocess(processor, rows["image"]),
            "calibration_draw": f"{len(rows)} train images (seed {CALIBRATION_SEED}) not in the k-NN bank"}


def run_record(script: str, argv: list[str] | None, args: argparse.Namespace, setup: dict) -> dict:
    """What every zero-training benchmark's JSON starts with: hardware, the command, the ranking and the draws."""
    return {"hardware": hardware_info(), "command": command(script, argv), "ranking": args.ranking.name,
            "num_calibration": args.num_calibration, "calibration": setup["calibration_draw"],
            "num_val": args.num_val, "num_bank": args.num_bank}
