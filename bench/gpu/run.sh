#!/usr/bin/env bash
# One GPU (H100 or H200): planrun's CUDA backend against PyTorch eager and torch.compile on
# Llama-style ~125M and ~350M models at seq 1024 and 2048, same batch, same GPU, one run.
# Results: JSON lines in $OUT_DIR (default bench/gpu/results), summarised on stdout.
#
#   bench/gpu/run.sh [H100|H200]
#
# Needs: a build of planc and planrun with CUDA (scripts/setup on a machine with the CUDA
# toolkit), python3 with torch >= 2.5 and a GPU. planrun's side runs the programs in PLAN_DIR
# (`<model>-seq<seq>.pplan`); a missing one is compiled from bench/gpu/plans.plan first.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gpu="${1:-H100}"
out="${OUT_DIR:-$here/results}"
plans="${PLAN_DIR:-$here/programs}"
planrun="${PLANRUN:-$root/build/bin/planrun}"
planc="${PLANC:-$root/build/bin/planc}"
data="${DATA:-$root/data/corpus/classics.txt}"
steps="${STEPS:-20}"
mkdir -p "$out" "$plans"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

echo "== PyTorch eager and torch.compile"
python3 "$here/torch_baseline.py" --gpu "$gpu" --steps "$steps" | tee "$out/pytorch.jsonl"

echo "== planrun --backend=cuda"
: > "$out/planrun.jsonl"
for model in llama-125m llama-350m; do
  for seq in 1024 2048; do
    prog="$plans/$model-seq$seq.pplan"
    if [ ! -f "$prog" ]; then
      "$planc" compile "$here/plans.plan" --plan "${model//-/_}_seq$seq" -o "$prog"
    fi
    "$planrun" "$prog" --backend=cuda --steps "$steps" --data "$data" \
      --metrics "$out/planrun-$model-seq$seq.jsonl" | tail -3
    # The compiler's memory prediction for the same program, for the peak-memory column.
    "$planc" dump "$prog" --format=json > "$out/planc-$model-seq$seq.json" || true
  done
done
echo "results in $out"
