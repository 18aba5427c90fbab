"""What the benchmark scripts share: where the shared ViT-Tiny and Tiny-ImageNet live, random-weight ViTs of the
standard shapes, how a run is recorded (its command, its JSON), how the shared model is loaded, drawn for and scored,
and the stored rankings of the shared ViT-Tiny.

The draws are those the scripts made before they shared this module (``recovery_vit_tiny.py`` and
``correction_vit_tiny.py`` held them), so the stored results' images are the same.
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
from hf_snapvit.evaluation import Evaluator, load_split
from hf_snapvit.utils.files import write_text_atomic

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
    result.add_argument("--output", default=None,
                        help="JSON file (default: results/<script>/<script>_<device name>.json)")
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


def output_path(given: str | Path | None, prefix: str, hardware: dict[str, Any], folder: str) -> Path:
    """``given``, else ``results/<folder>/<prefix>_<device name>.json`` (one folder per script)."""
    return Path(given) if given else RESULTS / folder / f"{prefix}_{device_slug(hardware)}.json"


def device_report(script: str, argv: list[str] | None, args: argparse.Namespace, prefix: str | None = None,
                  **fields: Any) -> tuple[Path, dict[str, Any]]:
    """Where a device run's JSON goes (``--output``, else ``results/<script>/<prefix>_<device name>.json``, the prefix
    the script's name by default) and what it starts with: the command, the machine, every option but ``--output``,
    then ``fields``."""
    hardware = hardware_info(device=args.device)
    return output_path(args.output, prefix or Path(script).stem, hardware, Path(script).stem), {
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
