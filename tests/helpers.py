"""Shared test helpers: tiny random models of every supported architecture built in code (no downloads), random
images, the masked-dense reference, the ../shared paths, and the benchmark scripts as modules."""

from __future__ import annotations

import copy
import importlib.util
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets
import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from transformers import ViTImageProcessor

import hf_snapvit
from hf_snapvit.architectures import get_attention, get_layers, get_mlp, get_projection, get_spec, head_dim
from hf_snapvit.correction import CorrectionConfig
from hf_snapvit.data.views import MultiCropConfig
from hf_snapvit.pruning.scoring import ScoreConfig

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, folder: Path = BENCHMARKS) -> types.ModuleType:
    """``benchmarks/<name>.py`` (or ``folder``'s) as a module (benchmarks/ is not a package). It is registered in
    ``sys.modules`` (dataclasses look their module up while the file executes) and its folder is put on the path
    (scripts import their siblings)."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

def run_at_once(commands: list[list[str]], envs: list[dict] | None = None, timeout: float = 300,
                **kwargs) -> list[subprocess.CompletedProcess]:
    """Run the ``commands`` as processes at the same time (each with its ``envs`` entry) and wait for all; a test of
    several fresh processes then waits for the slowest rather than for their sum. Asserts every one exits with 0."""
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=None if envs is None else envs[i], **kwargs)
                 for i, command in enumerate(commands)]
    try:
        done = [subprocess.CompletedProcess(p.args, None, *p.communicate(timeout=timeout)) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, result in zip(processes, done):
        result.returncode = process.returncode
    assert all(r.returncode == 0 for r in done), [r.stderr[-2000:] for r in done if r.returncode]
    return done


def spearman(a, b) -> float:
    """Spearman's rank correlation of two equal-length sequences: Pearson's correlation of their ranks, tied values
    sharing their average rank (as scipy.stats.spearmanr does, without needing scipy)."""
    ranks = []
    for values in (a, b):
        x = torch.as_tensor(np.asarray(values, dtype=np.float64).ravel())
        order = torch.argsort(x, stable=True)
        rank = torch.empty_like(x)
        rank[order] = torch.arange(x.numel(), dtype=x.dtype)
        # Ties: every member of a group of equal values gets the group's mean rank.
        _, group, counts = torch.unique(x, return_inverse=True, return_counts=True)
        sums = torch.zeros(counts.numel(), dtype=x.dtype).index_add_(0, group, rank)
        ranks.append((sums / counts)[group])
    ra, rb = (r - r.mean() for r in ranks)
    return float((ra @ rb) / (ra.norm() * rb.norm()))


COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)


@dataclass
class Case:
    name: str
    build: Callable[[], transformers.PreTrainedModel]
    inputs: Callable[[int], dict]

    def __repr__(self) -> str:
        return self.name


def _pixels(batch: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=generator)}


def _siglip2_inputs(batch: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "pixel_values": torch.randn(batch, 16, 3 * 8 * 8, generator=generator),
        "pixel_attention_mask": torch.ones(batch, 16, dtype=torch.long),
        "spatial_shapes": torch.tensor([[4, 4]] * batch),
    }


def _mae_inputs(batch: int, seed: int = 0) -> dict:
    """Pixels with ViTMAE's ``noise`` fixed (the identity order): its embeddings otherwise shuffle (and mask) patches
    at random on every forward, so two forwards of one model would differ."""
    return {**_pixels(batch, seed), "noise": torch.arange(16.0).expand(batch, -1)}


def _case(name, cls, config, inputs=_pixels) -> Case:
    def build():
        torch.manual_seed(0)
        model = cls(config)
        # Random init leaves biases at 0 and some norms at 1; perturb so every parameter matters in comparisons.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        return model.eval()

    return Case(name, build, inputs)


def _cases() -> list[Case]:
    T = transformers
    vit = dict(COMMON, intermediate_size=37)
    siglip2 = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, patch_size=8,
                   num_patches=16)
    text = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
    cases = [
        _case("vit", T.ViTModel, T.ViTConfig(**vit)),
        _case("vit-cls", T.ViTForImageClassification, T.ViTConfig(**vit, num_labels=5)),
        _case("deit", T.DeiTModel, T.DeiTConfig(**vit)),
        _case("deit-cls-teacher", T.DeiTForImageClassificationWithTeacher, T.DeiTConfig(**vit, num_labels=5)),
        _case("dinov2", T.Dinov2Model, T.Dinov2Config(**COMMON, mlp_ratio=3)),
        _case("dinov2-swiglu", T.Dinov2Model, T.Dinov2Config(**COMMON, mlp_ratio=3, use_swiglu_ffn=True)),
        _case("dinov2-cls", T.Dinov2ForImageClassification, T.Dinov2Config(**COMMON, mlp_ratio=3, num_labels=5)),
        _case("dinov2-registers", T.Dinov2WithRegistersModel,
              T.Dinov2WithRegistersConfig(**COMMON, mlp_ratio=3, num_register_tokens=2)),
        _case("siglip-vision", T.SiglipVisionModel, T.SiglipVisionConfig(**vit)),
        _case("siglip-cls", T.SiglipForImageClassification,
              T.SiglipConfig(vision_config=vit, text_config=text, num_labels=5)),
        _case("siglip2-vision", T.Siglip2VisionModel, T.Siglip2VisionConfig(**siglip2), _siglip2_inputs),
        _case("siglip2-cls", T.Siglip2ForImageClassification,
              T.Siglip2Config(vision_config=siglip2, text_config=text, num_labels=5), _siglip2_inputs),
        _case("clip-vision", T.CLIPVisionModel, T.CLIPVisionConfig(**vit)),
        _case("clip-cls", T.CLIPForImageClassification,
              T.CLIPConfig(vision_config=vit, text_config=text, num_labels=5)),
        # mask_ratio 0, as hf_snapvit runs ViTMAE (its inference_config): tests compare hf_snapvit's computations
        # with plain forwards, which would otherwise see 4 of 16 patches. architectures/test_families.py covers
        # the default 0.75.
        _case("vit-mae", T.ViTMAEModel, T.ViTMAEConfig(**vit, mask_ratio=0.0), _mae_inputs),
        _case("vit-msn", T.ViTMSNModel, T.ViTMSNConfig(**vit)),
        # Per-block relative position bias tables: sliced with the heads.
        _case("beit", T.BeitModel, T.BeitConfig(**vit, use_relative_position_bias=True)),
        _case("beit-cls", T.BeitForImageClassification,
              T.BeitConfig(**vit, use_relative_position_bias=True, num_labels=5)),
        _case("data2vec-vision", T.Data2VecVisionModel, T.Data2VecVisionConfig(**vit, use_relative_position_bias=True)),
    ]
    if hasattr(T, "DINOv3ViTModel"):
        cases += [
            _case("dinov3", T.DINOv3ViTModel, T.DINOv3ViTConfig(**vit, num_register_tokens=1)),
            _case("dinov3-gated", T.DINOv3ViTModel, T.DINOv3ViTConfig(**vit, use_gated_mlp=True)),
        ]
    return cases


CASES = _cases()


def output_of(model: transformers.PreTrainedModel, inputs: dict) -> torch.Tensor:
    """The tensor a user of this model reads: logits for classifiers, the last hidden state otherwise."""
    with torch.no_grad():
        out = model(**inputs)
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def sliced_model(folder, case: Case, **kwargs) -> transformers.PreTrainedModel:
    """``ElasticViTModel.from_pretrained(folder, **kwargs)``, checked to be narrower than the dense ``case`` model
    (comparisons against a model that was not sliced would prove nothing)."""
    from hf_snapvit import ElasticViTModel
    from hf_snapvit.architectures.budget import layer_widths

    model = ElasticViTModel.from_pretrained(folder, **kwargs)
    heads, neurons = layer_widths(model)
    dense_heads, dense_neurons = layer_widths(case.build())
    assert sum(heads) < sum(dense_heads) and sum(neurons) < sum(dense_neurons), (heads, neurons)
    return model


SHARED_MODEL = ("models", "vit-tiny-tinyimagenet")
SHARED_TRAIN = ("data", "tiny-imagenet-200", "train.parquet")
SHARED_VALIDATION = ("data", "tiny-imagenet-200", "validation.parquet")


def hub_cache_copy(folder: Path, cache: Path, repo: str, commit: str = "0" * 40) -> tuple[Path, str]:
    """``folder`` laid out as huggingface_hub caches a downloaded ``repo`` under ``cache`` (its snapshot and the
    ``main`` ref): what a load with ``cache_dir=cache, local_files_only=True`` reads. Returns the repo's cache folder
    and the commit."""
    root = Path(cache) / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    return root, commit


def requires_shared(*paths: tuple[str, ...]):
    """Skip unless every named file or folder of ../shared exists (each path given as a tuple of parts)."""
    missing = [SHARED.joinpath(*parts) for parts in paths if not SHARED.joinpath(*parts).exists()]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(map(str, missing))} (the shared folder "
                                                    "beside the repository)")


CLASS_NAMES = [f"class {c}" for c in range(40)]


def coloured(label: int, i: int) -> Image.Image:
    """A 16x16 image whose colour says its class (and a little noise, its index)."""
    rng = np.random.default_rng(i)
    base = np.array([(37 * label) % 256, (91 * label) % 256, (53 * label) % 256], dtype=np.int16)
    return Image.fromarray(np.clip(base + rng.integers(-6, 7, (16, 16, 3)), 0, 255).astype(np.uint8))


def sorted_table(classes: int, per_class: int, *, class_label: bool = True) -> datasets.Dataset:
    """Rows sorted by class (at most 40), as image folders and the shared train parquet store them."""
    labels = [c for c in range(classes) for _ in range(per_class)]
    feature = datasets.ClassLabel(names=CLASS_NAMES[:classes]) if class_label else datasets.Value("int64")
    rows = {"image": [coloured(c, i) for i, c in enumerate(labels)], "label": labels}
    return datasets.Dataset.from_dict(rows, features=datasets.Features({"image": datasets.Image(), "label": feature}))


def sliced(model: transformers.PreTrainedModel, heads: int = 2, neurons: int = 10) -> transformers.PreTrainedModel:
    """A copy of the 2-block ``model`` keeping its first ``heads`` heads and ``neurons`` FFN neurons in each block."""
    from hf_snapvit.surgery.slicing import slice_model_

    return slice_model_(copy.deepcopy(model), [(np.arange(heads), np.arange(neurons))] * 2)


def images(n: int, seed: int = 0) -> list[Image.Image]:
    """n random RGB images of 48 x 40 pixels."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)) for _ in range(n)]


PROCESSOR = ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)


def recovery_benchmark_inputs(folder: Path, num_calibration: int) -> tuple[Path, datasets.Dataset, dict, dict]:
    """What the recovery benchmarks take, at toy scale: a tiny ViT saved as an elastic checkpoint under ``folder``,
    unlabelled calibration images, and validation and k-NN bank pixels with 5 classes."""
    elastic = Path(folder) / "elastic"
    model = CASES[1].build()  # vit-cls
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="magnitude"), elastic, image_processor=PROCESSOR)
    calibration = datasets.Dataset.from_dict({"image": images(num_calibration)}).cast_column("image", datasets.Image())
    pixels = PROCESSOR(images=images(10, seed=1), return_tensors="pt")["pixel_values"]
    val = {"pixels": pixels[:6], "labels": torch.arange(6) % 5}
    bank = {"pixels": pixels[4:], "labels": torch.arange(6) % 5}
    return elastic, calibration, val, bank


# Two global and two local crops: the scoring path of the default, at a fraction of its cost.
FEW_CROPS = ScoreConfig(crops=MultiCropConfig(num_global=2, num_local=2))


def masked_copy(model, keep):
    """Dense model whose dropped heads (o_proj columns) and neurons (FFN output columns) are zeroed."""
    masked = copy.deepcopy(model)
    spec = get_spec(masked)
    with torch.no_grad():
        for layer, (heads, neurons) in zip(get_layers(masked, spec), keep):
            attention = get_attention(layer, spec)
            hd = head_dim(attention, spec)
            o_proj = get_projection(attention, spec.o_proj)
            dropped = np.setdiff1d(np.arange(o_proj.in_features // hd), heads)
            for h in dropped:
                o_proj.weight[:, h * hd:(h + 1) * hd] = 0
            mlp, variant = get_mlp(layer, spec)
            out_proj = get_projection(mlp, variant.out_proj)
            out_proj.weight[:, np.setdiff1d(np.arange(out_proj.in_features), neurons)] = 0
    return masked


def tiny_vit_classifier(num_hidden_layers: int = 2) -> transformers.ViTForImageClassification:
    """A seeded ViT classifier (2 blocks by default) whose FFN width (37) no multiple divides, its weights moved off
    the init."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                                    intermediate_size=37, image_size=32, patch_size=8, num_labels=5)
    model = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def save_tiny_vit_folder(folder: Path) -> Path:
    """:func:`tiny_vit_classifier` saved with a 32-px image processor: a dense model folder as the CLI takes it."""
    tiny_vit_classifier().save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


def write_image_parquet(path: Path, count: int = 24, classes: int = 5, corrupt: tuple[int, ...] = ()) -> Path:
    """``count`` seeded random 40-px PNG images with labels ``i % classes``, as one parquet file; the rows ``corrupt``
    hold bytes that are not an image instead."""
    import io

    rng = np.random.default_rng(0)
    rows = []
    for i in range(count):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(buffer, format="PNG")
        rows.append({"image": {"bytes": b"not an image" if i in corrupt else buffer.getvalue(), "path": None},
                     "label": i % classes})
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=classes)})
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


# Tiny SnapViT searches: one generation (what a test of the inputs needs) and two (what a test of the search needs).
TINY_SNAPVIT = dict(num_gradient_images=3, num_fitness_images=6, max_generations=1, max_evaluations=None,
                    fitness_sparsities=(0.1, 0.3), pca_components=8,
                    scores=ScoreConfig(crops=MultiCropConfig(num_global=2, num_local=2)))
TINY_SEARCH = dict(num_gradient_images=3, num_fitness_images=6, max_generations=2, max_evaluations=None,
                   fitness_sparsities=(0.1, 0.3), pca_components=8,
                   scores=ScoreConfig(crops=MultiCropConfig(num_local=2)))


def fit(model, data=None, **overrides):
    pruner = hf_snapvit.SnapViTPruner(hf_snapvit.SnapViTConfig(**{**TINY_SEARCH, **overrides}))
    return pruner, pruner.fit(model, images(12) if data is None else data, processor=PROCESSOR, show_progress=False)


def forward_precision(ranking) -> str:
    """The autocast precision the search ran in ("auto" is bf16 on a CPU with bf16 matrix units)."""
    return {"fp32": "no", "bf16": "bf16"}[ranking.provenance["precision"]]


def interrupted_in_generation(n: int):
    """``EmbeddingFitness.batch_loss`` that raises KeyboardInterrupt in the ``n``-th generation's evaluation."""
    from hf_snapvit.pruning.methods.snapvit.fitness import EmbeddingFitness

    evaluate, calls = EmbeddingFitness.batch_loss, [0]

    def interrupted(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise KeyboardInterrupt
        return evaluate(self, *args, **kwargs)

    return interrupted


def data_of(case, n, seed=0):
    """``(inputs, data)``: ``n`` seeded inputs of ``case`` and the calibration data they make (the pixels
    alone where they are the only input)."""
    inputs = case.inputs(n, seed) if seed else case.inputs(n)
    return inputs, (inputs if len(inputs) > 1 else inputs["pixel_values"])


def corrected_checkpoint(tmp_path, case, n=10, guard=False):
    """An elastic checkpoint of ``case`` (random ranking) with its prefix correction, and the calibration data;
    without the guard, the correction applies at every size and is fitted on every image."""
    folder = tmp_path / case.name
    model = case.build().eval()
    hf_snapvit.save_elastic(model, hf_snapvit.rank(model, method="random", seed=1), folder)
    _, data = data_of(case, n)
    record = hf_snapvit.add_prefix_correction(folder, data, show_progress=False,
                                              config=CorrectionConfig(num_samples=None, batch_size=4, guard=guard))
    return folder, data, record


def free_port() -> int:
    """A TCP port free on this machine now, for a launch's rendezvous."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
