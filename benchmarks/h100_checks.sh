#!/bin/bash
# The GPU machine's checks in one call, most important first; every step is capped with `timeout` and the results
# are packed into $OUT/results.tar after each step, so a call cut short still returns what finished. Run from the
# repository root. On the GPU machine (../shared/docs/gpu-device.md) bring the wheels in .whl/ and the first rows of
# the shared train parquet as .gpu/train.parquet (parquet_rows.py); STEPS picks and orders the steps, T<n> caps step n
# in seconds. On a CPU, `DEV=cpu B=tiny S=tiny OUT=/tmp/out` runs the same steps on a tiny model (a dry run; for steps
# 19-22 add `BACKEND=aot_eager SCALE_SHAPES="tiny small" SCALE_IMAGES=4 GRID_SPARSITIES="0.1 0.5"`: no inductor C++
# builds, and sizes the tiny model has; for step 23 `RSTEPS=2 NB=40 NV=40 RCAL=64`; for step 24 `RPSTEPS=2`; for
# steps 25-26 `BIG=tiny BIG_IMAGES=4 BIG_CAP=0.4`, and BIG_LOAD_HERE=1 to load step 25's sizes in its own process).
#
# Step 24 (issue 65): recovery on 1 and several processes through accelerate's DDP (benchmarks/recovery_processes.py):
# the weights' difference from one process, and each process's seconds and peak memory. One process per GPU (NCCL),
# so a count above the machine's GPUs is recorded as skipped: on a one-GPU machine only the 1-process run is measured.
# Step 25 (issue 65): a DINOv3 ViT-7B-shaped model ranked (fast preset, bf16), saved elastic and loaded sliced at 0,
# 0.3 and 0.5 on one GPU (benchmarks/big_vit.py), each load in a fresh process; writes its ~13 GB checkpoint in /tmp.
# Step 26: the same model ranked placed by accelerate within $BIG_CAP MiB of the GPU (8192: the blocks that do not fit
# are offloaded to host memory), a model larger than its device. Their GPU figures are still to be measured.
#
# Still to run (issue 56): STEPS="22 18 13" (18: the default preset's 3 -> 20 generations on the shared ViT-Tiny,
# seeds 0-2, model in .acc/vit, train/validation rows in .acc/data), then STEPS="21 3" as the default preset ships,
# and STEPS="23" (elastic against per-size recovery, about 6 minutes alone; .acc/ with 3000 train, 2000 val rows).
# Steps recorded in docs/results.md left with their scripts: 1, 4-7 (bench_gpu_latency.py), 9-12, 14 and 15 are in
# commit 96763dc, step 11 (profile_ranking.py) in 1336aae, steps 2 and 8 (profile_latency.py, eager and --mode compile;
# docs/gpu-profile.md) in 800e787.
set -o pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
DEV=${DEV:-cuda}; B=${B:-vit-b16}; S=${S:-vit-s16}; OUT=${OUT:-/tmp/out}; R=${R:-/tmp/r}
mkdir -p "$OUT" "$R"
if [ "$DEV" = cuda ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv
fi
python3 -c "import torch, transformers, hf_snapvit; print(torch.__version__, transformers.__version__)" || exit 1
save() { tar -cf "$OUT/results.tar" -C "$R" . ; echo "== step $1 rc=$2 at $SECONDS s"; }
# accuracy CAP DIR "BUDGETS" CONFIG...: rank the shared ViT-Tiny with each config for each of $SEEDS, reading each
# ranking after every budget, then evaluate that seed's rankings on the same images (eval's own seed, 0).
accuracy() {
  local cap=$1 dir=$2 budgets=$3; shift 3
  for seed in ${SEEDS:-0 1 2}; do
    timeout "$cap" python3 benchmarks/defaults_vit_tiny.py rank --device "$DEV" --model .acc/vit --data .acc/data \
      --budgets $budgets --seed "$seed" --output-dir "$R/$dir/s$seed" --configs "$@" \
    && timeout "$cap" python3 benchmarks/defaults_vit_tiny.py eval --device "$DEV" --model .acc/vit --data .acc/data \
      --output-dir "$R/$dir/s$seed" --num-val "${NV:-1000}" --num-bank "${NV:-1000}" --sparsities 0.1 0.3 0.5 \
    || return 1
  done
}
# recovery CAP: issue 56's elastic recovery on the shared ViT-Tiny (.acc/vit, .acc/data): the slice unrecovered at
# every size, per-size recovery of $RSTEPS steps at 10/30/50/60 %, then one elastic recovery over 0-60 % at each of
# $RMULT times those steps; one stored ranking (the default SnapViT one), the same images throughout, every call
# capped at CAP and packed as it ends.
recovery() {
  local cap=$1 n=${RSTEPS:-250} m
  rec() {
    timeout "$cap" python3 benchmarks/recovery_vit_tiny.py --preset full --model .acc/vit --data .acc/data \
      --ranking benchmarks/results/defaults_vit_tiny/rankings/obd-global-sigma0.5-g3.json --num-bank "${NB:-1000}" \
      --num-calibration "${RCAL:-2000}" --num-val "${NV:-2000}" --output "$R/recovery_gpu.json" "$@"
    local rc=$?; save 23 $rc; return $rc
  }
  rec --variants none --sparsities 0.1 0.2 0.3 0.4 0.5 0.6 \
    && rec --variants recovery --sparsities 0.1 0.3 0.5 0.6 --steps "$n" || return 1
  for m in ${RMULT:-2 4}; do
    rec --variants elastic --sparsities 0.1 0.2 0.3 0.4 0.5 0.6 --elastic-steps $((m * n)) --tag "${m}x" || return 1
  done
}
DEFAULT=obd:global:3:sigma=0.5:order=output:solution=mean:preset=default  # the default preset, as defaults_vit_tiny names it
SERVING=(python3 benchmarks/serving_paths.py --device "$DEV" --backend "${BACKEND:-inductor}")
for step in ${STEPS:-22 18 13 21 3 23}; do case $step in
3) timeout "${T3:-120}" python3 benchmarks/bench_ranking_time.py --device "$DEV" --shapes "$B" --presets default fast \
     --precisions bf16 --data .gpu/train.parquet --output "$R/ranking_time.json" ;;
13) timeout "${T13:-90}" python3 benchmarks/bench_ranking_time.py --device "$DEV" --shapes "$B" --presets default \
     --precisions bf16 --generations 0 --data .gpu/train.parquet --output "$R/ranking_time_no_search.json" ;;
16) timeout "${T16:-150}" python3 benchmarks/bench_ranking_time.py --device "$DEV" --shapes "$B" --presets default \
     --precisions bf16 --fitness-images 512 512 --gradient-batch-sizes 16 64 --data .gpu/train.parquet \
     --output "$R/ranking_time_512.json" ;;
17) timeout "${T17:-150}" python3 benchmarks/bench_ranking_time.py --device "$DEV" --shapes "$B" --presets default \
     --precisions bf16 --fitness-token-fractions 0.5 --gradient-batch-sizes 16 64 16 64 --data .gpu/train.parquet \
     --output "$R/ranking_time_tokens_steps.json" ;;
18) accuracy "${T18:-240}" default_g20 "3 20" ${G20_CONFIG:-${DEFAULT/:3:/:20:}} ;;
19) timeout "${T19:-170}" "${SERVING[@]}" --shapes "$B" --sparsities 0.5 --batch-sizes 32 256 --paths eager compile \
     compile-unpadded graphs-unpadded graphs compile-eager-attention compile-freezing max-autotune --path-batch-sizes \
     graphs-unpadded=1,32 graphs=1,32 max-autotune=256 --profile --output "$R/serving_paths_suspects.json" ;;
20) timeout "${T20:-170}" "${SERVING[@]}" --shapes "$B" --paths eager compile-unpadded graphs-unpadded \
     --path-batch-sizes compile-unpadded=32,256 graphs-unpadded=1,32 --batch-sizes 1 32 256 --switchable \
     --sparsities ${GRID_SPARSITIES:-0.1 0.3 0.5 0.6} --repeats 10 --output "$R/serving_paths_grid.json" \
   && timeout "${T20:-170}" "${SERVING[@]}" --shapes "$S" --paths eager --batch-sizes 1 32 256 --switchable \
     --sparsities ${GRID_SPARSITIES:-0.1 0.3 0.5 0.6} --repeats 10 --output "$R/serving_paths_grid_small.json" ;;
21) timeout "${T21:-120}" python3 benchmarks/scale.py --device "$DEV" --shapes ${SCALE_SHAPES:-vit-b16 vit-l16 so400m \
     vit-g14} --images "${SCALE_IMAGES:-64}" --output "$R/scale.json" ;;
23) recovery "${T23:-300}" ;;
24) timeout "${T24:-300}" python3 benchmarks/recovery_processes.py --device "$DEV" --shape "${RPSHAPE:-$B}" \
     --processes ${RPROCS:-1 2} --steps "${RPSTEPS:-20}" --batch-size "${RPBATCH:-16}" \
     --work "${RPWORK:-/tmp/recovery_processes}" --output "$R/recovery_processes.json" ;;
25) timeout "${T25:-540}" python3 benchmarks/big_vit.py --device "$DEV" --shape "${BIG:-dinov3-7b}" --preset fast \
     ${BIG_LOAD_HERE:+--load-here} \
     --images "${BIG_IMAGES:-64}" --generations "${BIG_GENERATIONS:-1}" --output "$R/big_vit.json" ;;
26) timeout "${T26:-540}" python3 benchmarks/big_vit.py --device "$DEV" --shape "${BIG:-dinov3-7b}" --preset fast \
     --images "${BIG_IMAGES:-64}" --generations "${BIG_GENERATIONS:-1}" --max-memory-mib "${BIG_CAP:-8192}" \
     --load-sparsities 0.3 --output "$R/big_vit_offloaded.json" ;;
22) timeout "${T22:-170}" "${SERVING[@]}" --shapes "$S" --paths eager compile-unpadded graphs-unpadded \
     --path-batch-sizes compile-unpadded=32,256 graphs-unpadded=1,32 --batch-sizes 1 32 256 \
     --sparsities ${GRID_SPARSITIES:-0.1 0.3 0.5 0.6} --repeats 10 --output "$R/serving_paths_grid_small_compiled.json" ;;
*) echo "unknown step $step"; continue ;;
esac; save "$step" $?; done
ls -la "$R"
