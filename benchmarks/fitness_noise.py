"""How many fitness images and which fitness sparsities the SnapViT search needs: the noise and agreement of its
fitness, measured on the shared ViT-Tiny (issue 29).

The search compares candidates by their fitness loss (one minus the mean cosine similarity of the pruned and dense
PCA embeddings over the fitness images, averaged over the fitness sparsities). With too few images that comparison
is noise; with more than it needs, every forward beyond is wasted time. This script scores one xNES population
drawn from the search's starting distribution (the `fast` preset's scores on 128 gradient images) on ``--num-fitness``
other train images, keeping every image's similarity at every sparsity, and reports:

* **split halves**: for each subset size m, the candidates' losses on two disjoint random sets of m images; their
  rank correlation (Spearman), and the regret of picking the best candidate on one set, measured on the other. A
  size whose halves agree as well as larger ones do is enough images;
* **noise against spread**: the standard error of the loss difference between two candidates on the same images,
  against the spread of the losses across the population;
* **sparsity agreement**: the rank correlation of the candidates' losses at each pair of fitness sparsities, and
  between the full loss and the loss without each sparsity (a sparsity that changes nothing costs forwards for
  nothing);
* **cheaper forwards** (``--image-sizes``, ``--token-fractions``: ``SnapViTConfig.fitness_image_size`` and
  ``fitness_token_fraction``): the same candidates scored on the same images with cheaper forwards; their rank
  correlation with the full fitness on the same images, and, split half by half as above, how well choosing on one
  set with the cheaper fitness agrees with and chooses for the full fitness on the other set (the split halves of the
  full fitness are what a second image set gives).

    python benchmarks/fitness_noise.py --num-fitness 1000 --subset-sizes 32 64 128 256 500
    python benchmarks/fitness_noise.py --num-fitness 256 --subset-sizes 128 --sparsities 0.1 0.3 0.5 \
        --image-sizes 128 --token-fractions 0.5 --output benchmarks/results/fitness_cheaper_forwards.json

Writes JSON (``--output``) with the per-candidate losses, the measurements and the settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit as hs
from hf_snapvit.benchmark import hardware_info
from hf_snapvit.data import to_rgb
from hf_snapvit.distributed import resolve_precision
from hf_snapvit.evaluation import load_split
from hf_snapvit.files import write_text_atomic
from hf_snapvit.fitness import EmbeddingFitness
from hf_snapvit.xnes import default_population_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rank_vit_tiny import SHARED  # noqa: E402  (benchmarks/ is not a package)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200"))
    parser.add_argument("--num-fitness", type=int, default=1000, help="fitness images scored (all subsets come from "
                                                                        "these)")
    parser.add_argument("--subset-sizes", type=int, nargs="+", default=[32, 64, 128, 256, 500])
    parser.add_argument("--draws", type=int, default=200, help="random split-half draws per subset size")
    parser.add_argument("--candidates", type=int, default=None, help="population scored (default: the search's)")
    parser.add_argument("--sparsities", type=float, nargs="+", default=list(hs.SnapViTConfig().fitness_sparsities))
    parser.add_argument("--sigma", type=float, default=hs.SnapViTConfig().sigma)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--image-sizes", type=int, nargs="*", default=[], help="cheaper forwards: fitness image sides")
    parser.add_argument("--token-fractions", type=float, nargs="*", default=[],
                        help="cheaper forwards: shares of each image's patch tokens")
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "fitness_noise.json")
    args = parser.parse_args(argv)
    if max(args.subset_sizes) * 2 > args.num_fitness:
        parser.error(f"--subset-sizes up to {max(args.subset_sizes)} need two disjoint halves: --num-fitness of at "
                     f"least {2 * max(args.subset_sizes)} (got {args.num_fitness}).")
    return args


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation of two score vectors (the Pearson correlation of their ranks)."""
    ranks = [np.argsort(np.argsort(x)).astype(np.float64) for x in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])


def split_halves(per_image: np.ndarray, size: int, draws: int, rng: np.random.Generator,
                 chooser: np.ndarray | None = None) -> dict[str, float]:
    """Losses of every candidate on two disjoint random sets of ``size`` images (``per_image``: [candidates,
    images], each image's similarity averaged over the sparsities): their median rank correlation over ``draws``
    draws and its 10th percentile, and the regret of choosing on the first set: the second set's loss of the
    candidate the first picks, above the second set's best (mean over draws; two near-equal best candidates swap
    places between the sets without costing anything, which "the same best" would count as a miss). ``chooser``:
    the first set's losses come from these similarities (a cheaper fitness of the same images) instead."""
    chooser = per_image if chooser is None else chooser
    correlations, regrets = [], []
    for _ in range(draws):
        order = rng.permutation(per_image.shape[1])
        first = 1 - chooser[:, order[:size]].mean(1)
        second = 1 - per_image[:, order[size:2 * size]].mean(1)
        correlations.append(spearman(first, second))
        regrets.append(float(second[np.argmin(first)] - second.min()))
    return {"images": size, "spearman_median": float(np.median(correlations)),
            "spearman_p10": float(np.percentile(correlations, 10)), "regret_mean": float(np.mean(regrets))}


def noise_and_spread(per_image: np.ndarray) -> dict[str, float]:
    """The median standard error of the loss difference between two candidates on the same images, against the
    standard deviation of the losses across candidates (``per_image``: [candidates, images])."""
    losses = 1 - per_image.mean(1)
    errors = [float(np.std(per_image[p] - per_image[q], ddof=1) / np.sqrt(per_image.shape[1]))
              for p, q in combinations(range(len(per_image)), 2)]
    return {"loss_spread": float(np.std(losses, ddof=1)), "paired_difference_se_median": float(np.median(errors)),
            "images": int(per_image.shape[1])}


def sparsity_agreement(similarities: np.ndarray, sparsities: list[float]) -> dict[str, object]:
    """Rank correlations of the candidates' losses between each pair of sparsities, and of the full loss with the
    loss that leaves each sparsity out (``similarities``: [candidates, sparsities, images])."""
    by_sparsity = 1 - similarities.mean(2)  # [candidates, sparsities]
    full = by_sparsity.mean(1)
    pairs = {f"{sparsities[i]:g}-{sparsities[j]:g}": spearman(by_sparsity[:, i], by_sparsity[:, j])
             for i, j in combinations(range(len(sparsities)), 2)}
    without = {f"{s:g}": spearman(full, np.delete(by_sparsity, i, axis=1).mean(1)) for i, s in enumerate(sparsities)}
    return {"between_sparsities": pairs, "full_vs_without": without}


def cheaper_settings(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The fitnesses to score the population with: the full one, then each cheaper forward asked for."""
    return {"full": {}, **{f"image_size={s}": {"image_size": s} for s in args.image_sizes},
            **{f"token_fraction={f:g}": {"token_fraction": f} for f in args.token_fractions}}


def score_population(args: argparse.Namespace) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """``[candidates, sparsities, images]`` similarities of one population drawn around the search's start, for each
    of :func:`cheaper_settings`."""
    transformers.utils.logging.set_verbosity_error()
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()
    processor = AutoImageProcessor.from_pretrained(args.model)
    rows = load_split(args.data, "train", num_samples=129 + args.num_fitness, seed=args.seed)
    images = [to_rgb(image) for image in rows["image"]]
    # The fast preset's scores from the first 129 images (128 for the gradients; the search is skipped), so
    # ranking_from_factors turns candidate factors into rankings exactly as the search does.
    pruner = hs.SnapViTPruner(hs.SnapViTConfig.preset("fast", num_fitness_images=1, max_generations=0,
                                                      seed=args.seed))
    start = time.perf_counter()
    pruner.fit(model, images[:129], processor=processor, show_progress=False)
    timings = {"scores": time.perf_counter() - start}
    pixels = processor(images=images[129:], return_tensors="pt")["pixel_values"]
    mean = pruner.initial_factors_
    rng = np.random.default_rng(args.seed)
    count = args.candidates or default_population_size(len(mean))
    candidates = mean + args.sigma * rng.standard_normal((count, len(mean)))
    similarities = {}
    for name, options in cheaper_settings(args).items():
        start = time.perf_counter()
        fitness = EmbeddingFitness(model, pixels, sparsities=args.sparsities,
                                   pca_components=hs.SnapViTConfig().pca_components,
                                   precision=resolve_precision("auto", torch.device("cpu")), seed=args.seed, **options)
        similarities[name] = np.stack([fitness.image_similarities(pruner.ranking_from_factors(c)).cpu().numpy()
                                       for c in candidates]).astype(np.float64)
        timings["fitness" if name == "full" else f"fitness {name}"] = time.perf_counter() - start
    return similarities, timings


def cheaper_agreement(full: np.ndarray, cheap: np.ndarray, sizes: list[int], draws: int,
                      seed: int) -> dict[str, object]:
    """How a cheaper fitness's choices agree with the full one's (both ``[candidates, sparsities, images]`` of the
    same candidates and images): the rank correlation of their losses on every image, and the split halves of
    :func:`split_halves` with the first set's losses from the cheaper fitness, on the full fitness's draws."""
    per_full, per_cheap = full.mean(1), cheap.mean(1)
    rng = np.random.default_rng(seed + 1)  # the draws of the full fitness's own split halves
    return {"spearman_same_images": spearman(1 - per_full.mean(1), 1 - per_cheap.mean(1)),
            "split_halves": [split_halves(per_full, size, draws, rng, chooser=per_cheap) for size in sizes]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scored, timings = score_population(args)
    similarities = scored.pop("full")
    per_image = similarities.mean(1)  # [candidates, images]: what the loss averages
    rng = np.random.default_rng(args.seed + 1)
    halves = [split_halves(per_image, size, args.draws, rng) for size in args.subset_sizes]
    noise = [noise_and_spread(per_image[:, :size]) for size in [*args.subset_sizes, per_image.shape[1]]]
    agreement = sparsity_agreement(similarities, args.sparsities)
    cheaper = {name: cheaper_agreement(similarities, cheap, args.subset_sizes, args.draws, args.seed)
               for name, cheap in scored.items()}
    command = ["python", "benchmarks/fitness_noise.py", *(argv if argv is not None else sys.argv[1:])]
    report = {"command": " ".join(command), "hardware": hardware_info(),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "timings": timings, "candidate_losses": (1 - per_image.mean(1)).tolist(),
              "split_halves": halves, "noise": noise, "sparsities": agreement, "cheaper_forwards": cheaper}
    write_text_atomic(args.output, json.dumps(report, indent=1) + "\n")
    print(f"{'images':>7} {'spearman median':>16} {'p10':>6} {'regret':>8}  (loss spread "
          f"{noise[-1]['loss_spread']:.4f})")
    for row in halves:
        print(f"{row['images']:>7} {row['spearman_median']:>16.3f} {row['spearman_p10']:>6.3f} "
              f"{row['regret_mean']:>8.5f}")
    for row in noise:
        print(f"{row['images']:>5} images: paired-difference SE {row['paired_difference_se_median']:.5f} against "
              f"loss spread {row['loss_spread']:.5f}")
    print("sparsity pairs:", {k: round(v, 3) for k, v in agreement["between_sparsities"].items()})
    print("full vs without:", {k: round(v, 3) for k, v in agreement["full_vs_without"].items()})
    for name, row in cheaper.items():
        print(f"{name}: spearman with the full fitness on the same images {row['spearman_same_images']:.3f}; "
              "choosing on one half: " + ", ".join(f"{h['images']} images {h['spearman_median']:.3f} / "
                                                   f"regret {h['regret_mean']:.5f}" for h in row["split_halves"]))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
