"""Prune the shared ViT-Tiny once, save one elastic checkpoint, load it at three sizes, inspect it, optionally push it.

Steps: stream calibration images from the Tiny-ImageNet train parquet (``hf_snapvit.data.images.load_image_dataset``),
rank every head and FFN neuron (``hf_snapvit.rank``, SnapViT ``fast`` preset by default), write the elastic
checkpoint (``hf_snapvit.save_elastic``) and, for the methods that read images, the weight correction of every size
(``hf_snapvit.add_prefix_correction``), load it at each ``--sparsities`` value
(``ElasticViTModel.from_pretrained``) and report parameters, GFLOPs and top-1 on the first validation images, print
the per-block keep counts and draw the allocation heatmap, and upload with ``--push-to-hub``.

    python examples/prune_and_push.py                                   # SnapViT, fast preset
    python examples/prune_and_push.py --method magnitude                # data-free, seconds
    accelerate launch --config_file examples/accelerate_config.yaml examples/prune_and_push.py
    python examples/prune_and_push.py --push-to-hub me/vit-tiny-elastic  # after `hf auth login`
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import transformers
from datasets import load_dataset
from transformers import AutoImageProcessor, AutoModelForImageClassification

import hf_snapvit
from hf_snapvit.architectures.budget import layer_widths
from hf_snapvit.data.images import load_image_dataset
from hf_snapvit.utils.distributed import process_state
from hf_snapvit.pruning.methods import ranking_method
from hf_snapvit.pruning.methods.config import PRESETS

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
    parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200" / "train.parquet"),
                        help="calibration images (a Hub dataset id, a parquet file or folder, an image folder)")
    parser.add_argument("--eval-data", default=str(SHARED / "data" / "tiny-imagenet-200" / "validation.parquet"))
    parser.add_argument("--output", default="vit-tiny-elastic", help="folder for the elastic checkpoint")
    parser.add_argument("--method", default="snapvit", choices=hf_snapvit.available_methods())
    parser.add_argument("--preset", default="fast", choices=PRESETS,
                        help="SnapViT preset (default: %(default)s, for a CPU; default and paper take longer)")
    parser.add_argument("--num-samples", type=int, default=None, help="calibration images (default: the preset's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sparsities", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--num-eval", type=int, default=200, help="validation images for top-1 (0: skip)")
    parser.add_argument("--plot", default=None, help="allocation heatmap PNG (default: OUTPUT-allocation.png)")
    parser.add_argument("--prefix-correction", action=argparse.BooleanOptionalAction, default=True,
                        help="store the weight correction of every size, fitted on the calibration images, when the "
                             "method reads them (default: on)")
    parser.add_argument("--push-to-hub", default=None, metavar="REPO_ID")
    parser.add_argument("--private", action="store_true")
    return parser.parse_args()


@torch.no_grad()
def top1(model: torch.nn.Module, pixel_values: torch.Tensor, labels: torch.Tensor, batch_size: int = 50) -> float:
    correct = 0
    for start in range(0, len(labels), batch_size):
        logits = model(pixel_values=pixel_values[start:start + batch_size]).logits
        correct += (logits.argmax(-1) == labels[start:start + batch_size]).sum().item()
    return correct / len(labels)


def main() -> None:
    args = parse_args()
    transformers.utils.logging.set_verbosity_error()
    state = process_state()  # one process, or N under `accelerate launch`
    show = state.is_main_process

    processor = AutoImageProcessor.from_pretrained(args.model)
    model = AutoModelForImageClassification.from_pretrained(args.model).eval()

    # 1. Rank. Every process runs this (the work is split between them); the calibration stream is seeded, so all
    #    of them read the same images.
    data = None
    method = ranking_method(args.method)  # whether it reads images (and labels), and its settings
    if method.needs_data:
        needed = method.config_cls.preset(args.preset).images_needed
        data = load_image_dataset(args.data, num_samples=args.num_samples or needed, seed=args.seed,
                                  label_column="label" if method.needs_labels else None, show_progress=show)
    start = time.perf_counter()
    ranking = hf_snapvit.rank(model, method=args.method, data=data, preset=args.preset, processor=processor,
                              seed=args.seed, show_progress=show)
    seconds = time.perf_counter() - start
    if not state.is_main_process:  # one process writes, loads and reports
        return

    # 2. Save one elastic checkpoint: the dense weights in rank order plus the ranking in config.json.
    output = Path(args.output)
    stored = hf_snapvit.save_elastic(model, ranking, output, image_processor=processor)
    print(f"ranked with {args.method} in {seconds:.1f} s on {state.num_processes} process(es); "
          f"elastic checkpoint: {output}")
    if data is not None and args.prefix_correction:  # as `hf-snapvit prune` does: no training, every size
        record = hf_snapvit.add_prefix_correction(output, data, processor, refresh_card=True,
                                                  show_progress=show)
        kept = [f"{s['requested']:g}" for s in record["sizes"] if s["kept"]]
        print(f"prefix correction stored; held-out images say it helps at sparsities: {', '.join(kept) or 'none'}")

    # 3. Load it at three sizes; each load reads only the weights that size keeps.
    pixel_values = labels = None
    if args.num_eval > 0:
        stream = load_dataset("parquet", data_files={"validation": args.eval_data}, split="validation",
                              streaming=True)
        examples = list(stream.take(args.num_eval))
        pixel_values = processor(images=[e["image"].convert("RGB") for e in examples],
                                 return_tensors="pt")["pixel_values"]
        labels = torch.tensor([e["label"] for e in examples])
    for sparsity in args.sparsities:
        small = hf_snapvit.ElasticViTModel.from_pretrained(output, sparsity=sparsity)
        heads, neurons = layer_widths(small)
        line = (f"sparsity {sparsity:.2f}: {hf_snapvit.backbone_parameters(small) / 1e6:.2f} M backbone params, "
                f"{hf_snapvit.estimate_gflops(small):.3f} GFLOPs, heads per block {heads}")
        if labels is not None:
            line += f", top-1 {top1(small, pixel_values, labels):.1%} on {len(labels)} validation images"
        print(line)

    # 4. Inspect: what every size keeps, from the ranking alone (no weights loaded), and the allocation heatmap.
    print(f"\nranking: {stored.provenance.get('method')}, mode {stored.mode}, max sparsity {stored.max_sparsity:.3f}")
    for sparsity in args.sparsities:
        counts = stored.keep_counts(sparsity)
        print(f"  {sparsity:.2f}: {counts.num_params / 1e6:.2f} M params, {counts.gflops:.3f} GFLOPs, "
              f"neurons per block {counts.neurons}")
    from hf_snapvit.plots import plot_allocation

    plot = Path(args.plot) if args.plot else output.with_name(f"{output.name}-allocation.png")
    plot_allocation(stored, plot, sparsities=args.sparsities)
    print(f"allocation heatmap: {plot}")

    # 5. Publish (weights, config with the ranking, preprocessor config and a generated model card, one commit).
    if args.push_to_hub:
        from hf_snapvit.publishing.hub import push_to_hub

        commit = push_to_hub(args.push_to_hub, output, private=args.private or None)
        print(f"pushed: {commit.commit_url}")


if __name__ == "__main__":
    main()
