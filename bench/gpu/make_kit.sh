#!/usr/bin/env bash
# Prepares what bench/gpu/device_check.sh needs on a GPU machine that has the CUDA runtime,
# cuBLASLt and NCCL but none of this project's build dependencies: planrun and the two GPU test
# suites (built here with CUDA), the shared libraries they need beyond CUDA's, the equivalence
# programs with the host backend's losses for them, and the benchmark's programs with planc's
# memory prediction.
#
#   bench/gpu/make_kit.sh KIT_DIR        (after scripts/setup; KIT_DIR is created)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kit="${1:?usage: make_kit.sh KIT_DIR}"
build="${BUILD_DIR:-$root/build}"
mkdir -p "$kit/bin" "$kit/lib" "$kit/eq" "$kit/bench"
export PATH=/usr/local/cuda/bin:$PATH
ninja -C "$build" planc planrun cuda_backend_tests comm_cuda_tests >/dev/null
cp "$build/bin/planrun" "$build/runtime/backends/cuda/cuda_backend_tests" \
  "$build/runtime/backends/cuda/comm/comm_cuda_tests" "$kit/bin/"
# The attention kernels' own benchmark, where the build has it.
if ninja -C "$build" -t targets all 2>/dev/null | grep -q '^paraplan_attention_bench:'; then
  ninja -C "$build" paraplan_attention_bench >/dev/null
  find "$build" -name paraplan_attention_bench -type f -perm -u+x -exec cp {} "$kit/bin/" \;
fi
# Libraries other than CUDA's, libc's and libstdc++ (the GPU machine's own is newer).
for b in "$kit"/bin/*; do
  ldd "$b" | awk '$3 ~ /^\// {print $3}'
done | sort -u | { grep -v -E '/(libc|libm|libgcc_s|libpthread|libdl|librt|libstdc\+\+)\.so|/usr/local/cuda' || true; } |
  while read -r lib; do cp -L "$lib" "$kit/lib/"; done

planc="$build/bin/planc" planrun="$build/bin/planrun"
data="$root/data/corpus/classics.txt"
for plan in single gpt_single tp2_pp2_dp2_zero1_sp pp2_vpp2_dp2_zero3 gpt_tp2_pp2_dp2 \
  cp2_tp2_dp2_sp cp2_tp2_dp2_zero1_sp gpt_cp2_tp2_sp mla_tp2_sp moe_ep2_tp2_dp2_sp \
  moe_ep2_pp2_dp2 moe_capacity_etp2_tp2_sp moe_grouped_etp2_tp2_sp; do
  "$planc" compile "$root/tests/equivalence/equivalence.plan" --plan "$plan" -o "$kit/eq/$plan.pplan"
  "$planrun" "$kit/eq/$plan.pplan" --backend=host --steps 3 --data "$data" \
    --metrics "$kit/eq/$plan.host.jsonl" >/dev/null
done
for model in llama_125m llama_350m; do
  for seq in 1024 2048; do
    name="${model//_/-}-seq$seq"
    "$planc" compile "$root/bench/gpu/plans.plan" --plan "${model}_seq$seq" -o "$kit/bench/$name.pplan"
    "$planc" explain "$root/bench/gpu/plans.plan" --plan "${model}_seq$seq" --format=json \
      >"$kit/bench/$name.explain.json"
  done
done
cp "$data" "$kit/classics.txt"
du -sh "$kit"
