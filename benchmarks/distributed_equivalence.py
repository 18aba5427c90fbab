"""SnapViT on the shared ViT-Tiny, streamed from parquet; run under `accelerate launch` or alone, writes the ranking."""
# Run from the repository root:
#   OMP_NUM_THREADS=1 accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
#       --dynamo_backend no <this file> two
#   OMP_NUM_THREADS=1 python <this file> one
import json, sys
from pathlib import Path
import datasets, numpy as np
from transformers import AutoImageProcessor, AutoModelForImageClassification
import hf_snapvit as hs
from hf_snapvit import distributed

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
out = sys.argv[1]
base = SHARED / "models" / "vit-tiny-tinyimagenet"
model = AutoModelForImageClassification.from_pretrained(base).eval()
processor = AutoImageProcessor.from_pretrained(base)
stream = datasets.load_dataset("parquet", data_files=str(SHARED / "data" / "tiny-imagenet-200" / "train.parquet"),
                               split="train", streaming=True)
config = hs.SnapViTConfig.preset("fast", num_gradient_images=24, num_fitness_images=24, max_generations=1)
ranking = hs.rank(model, "snapvit", stream, config=config, processor=processor, show_progress=False)
timings = ranking.provenance["timings"]
state = distributed.process_state()
grid = np.round(np.arange(0.05, 0.601, 0.05), 2)
keep = [ranking.keep_counts(min(s, ranking.max_sparsity)) for s in grid]
np.savez(f"{out}.rank{state.process_index}.npz", heads=ranking.head_scores, neurons=ranking.neuron_scores,
         keep_heads=np.array([k.heads for k in keep]), keep_neurons=np.array([k.neurons for k in keep]))
print(json.dumps({"rank": state.process_index, "processes": state.num_processes,
                  "wall_s": round(timings["wall_seconds"], 1),
                  "timings": {k: round(v, 1) for k, v in timings["phases"].items()},
                  "best_loss": ranking.provenance["search"]["best_loss"]}), flush=True)

# Compare (after both runs):
#   python - <<'PY'
#   import numpy as np
#   a = np.load("one.rank0.npz")
#   for r in (0, 1):
#       b = np.load(f"two.rank{r}.npz")
#       rel = max(np.max(np.abs(a[k] - b[k]) / np.abs(a[k])) for k in ("heads", "neurons"))
#       print(r, f"max rel diff {rel:.2e}", np.array_equal(a["keep_heads"], b["keep_heads"])
#             and np.array_equal(a["keep_neurons"], b["keep_neurons"]))
#   PY
