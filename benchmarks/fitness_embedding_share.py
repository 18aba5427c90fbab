"""Share of the SnapViT fitness forward time spent in the patch embedding (what a block-0 input cache would save)."""
# Run: python <this file> (defaults: ../shared's ViT-Tiny next to the repository, 128 validation images).
import argparse, time
from pathlib import Path
import datasets, torch
from transformers import AutoImageProcessor, AutoModelForImageClassification
import hf_snapvit as hs
from hf_snapvit.architectures import get_backbone
from hf_snapvit.fitness import EmbeddingFitness

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
parser = argparse.ArgumentParser()
parser.add_argument("--model", default=str(SHARED / "models" / "vit-tiny-tinyimagenet"))
parser.add_argument("--data", default=str(SHARED / "data" / "tiny-imagenet-200" / "validation.parquet"))
parser.add_argument("--num-images", type=int, default=128)
parser.add_argument("--candidates", type=int, default=4)
args = parser.parse_args()

model = AutoModelForImageClassification.from_pretrained(args.model).eval()
processor = AutoImageProcessor.from_pretrained(args.model)
table = datasets.load_dataset("parquet", data_files=args.data, split="train").select(range(args.num_images))
pixels = processor(images=[im.convert("RGB") for im in table["image"]], return_tensors="pt")["pixel_values"]
fit = EmbeddingFitness(model, pixels, sparsities=(0.1, 0.3, 0.5, 0.6), pca_components=192)
spent = {"embeddings": 0.0}
def pre(module, args): spent["t"] = time.perf_counter()
def post(module, args, out): spent["embeddings"] += time.perf_counter() - spent["t"]
for m in (get_backbone(fit.model), get_backbone(fit.work)):
    m.embeddings.register_forward_pre_hook(pre); m.embeddings.register_forward_hook(post)
rankings = [hs.rank(model, method="random", seed=s) for s in range(args.candidates)]
fit.forward_seconds = 0.0
start = time.perf_counter()
losses = [fit.loss(r) for r in rankings]
total = time.perf_counter() - start
print(f"torch threads {torch.get_num_threads()}, {args.num_images} images, {args.candidates} candidates x 4 sparsities")
print(f"evaluation wall {total:.2f} s, forward {fit.forward_seconds:.2f} s, patch embedding {spent['embeddings']:.3f} s "
      f"= {100 * spent['embeddings'] / fit.forward_seconds:.1f} % of forward time")
