#!/usr/bin/env bash
# One call on a GPU machine: the GPU test suites, planrun --backend=cuda on the equivalence plans
# against the host backend's losses, the benchmark (planrun, PyTorch eager, torch.compile), a
# per-kernel profile of one planrun step and a memory check of the kernels. Each stage has its
# own time limit and the script stops starting stages at DEADLINE seconds, so one slow or hung
# stage costs only its own time.
#
#   bench/gpu/device_check.sh KIT_DIR OUT_DIR      (KIT_DIR from bench/gpu/make_kit.sh)
#
# Needs: an NVIDIA GPU, the CUDA 13 runtime, cuBLASLt and NCCL (system or Python wheels), python3
# with torch for the PyTorch stages; optionally ncu and compute-sanitizer.
set -uo pipefail
kit="$(cd "${1:?usage: device_check.sh KIT_DIR OUT_DIR}" && pwd)"
out="${2:?usage: device_check.sh KIT_DIR OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deadline="${DEADLINE:-480}"
steps="${STEPS:-20}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

# stage NAME LIMIT_SECONDS COMMAND...: runs unless the deadline is near; logs to $out/NAME.log.
stage() {
  local name="$1" limit="$2"
  [[ -n "${ONLY:-}" && ! "$name" =~ $ONLY ]] && return 0
  shift 2
  local left=$((deadline - SECONDS))
  if ((left < 15)); then
    say "[$name] skipped: ${left}s left of the ${deadline}s budget"
    return 0
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS rc
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  say "[$name] rc=$rc in $((SECONDS - t0))s$( ((rc == 124)) && echo " (timed out at ${limit}s)")"
  tail -n "${TAIL:-4}" "$out/$name.log" | sed 's/^/    /' | tee -a "$summary"
  return 0
}

# Shared libraries: CUDA's from the toolkit or the Python wheels, the rest from the kit.
libdirs="$kit/lib"
for want in libcudart.so.13 libcublasLt.so.13 libnccl.so.2; do
  found="$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib/x86_64-linux-gnu /opt /usr/local/lib \
    -name "$want" 2>/dev/null | head -1)"
  [ -n "$found" ] && libdirs="$libdirs:$(dirname "$found")"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

say "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader)"
say "   nvcc: $(nvcc --version 2>/dev/null | tail -1); python3: $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
say "   CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
say "   LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
ldd "$kit/bin/planrun" | grep -E 'not found|nccl|cublas|cudart' | tee -a "$summary"

# 1. The GPU suites (they skip without a GPU; here they run).
stage cuda_backend_tests 120 "$kit/bin/cuda_backend_tests" --no-version=true
stage comm_cuda_tests 90 "$kit/bin/comm_cuda_tests" --no-version=true

# 2. planrun --backend=cuda on the equivalence plans: every step's loss within 2e-3 of the host's.
for prog in "$kit"/eq/*.pplan; do
  plan="$(basename "$prog" .pplan)"
  stage "eq_$plan" 60 "$kit/bin/planrun" "$prog" --backend=cuda --steps 3 --data "$kit/classics.txt" \
    --metrics "$out/eq_$plan.cuda.jsonl" --timeout 50
  [[ -n "${ONLY:-}" && ! "eq_$plan" =~ $ONLY ]] && continue
  python3 - "$kit/eq/$plan.host.jsonl" "$out/eq_$plan.cuda.jsonl" "$plan" <<'PY' | tee -a "$summary"
import json, sys
def losses(p):
    try:
        return [json.loads(l)["loss"] for l in open(p) if l.strip()]
    except OSError:
        return []
host, cuda = losses(sys.argv[1]), losses(sys.argv[2])
if len(cuda) != len(host) or not host:
    print(f"    EQ {sys.argv[3]}: FAIL ({len(cuda)} cuda losses, {len(host)} host)")
else:
    worst = max(abs(c - h) / abs(h) for c, h in zip(cuda, host))
    ok = worst <= 2e-3 and cuda[-1] < cuda[0]
    print(f"    EQ {sys.argv[3]}: {'ok' if ok else 'FAIL'} worst relative {worst:.2e} losses {cuda[0]:.4f} -> {cuda[-1]:.4f}")
PY
done

# 3. The benchmark: planrun first, then PyTorch eager on the same four configurations.
for prog in "$kit"/bench/*.pplan; do
  name="$(basename "$prog" .pplan)"
  stage "bench_planrun_$name" 90 "$kit/bin/planrun" "$prog" --backend=cuda --steps $((steps + 5)) \
    --data "$kit/classics.txt" --metrics "$out/bench_planrun_$name.jsonl" --timeout 80
done
if [ -n "${AB_ENV:-}" ]; then  # the same benchmark with one setting changed, e.g. AB_ENV=NAME=1
  for prog in "$kit"/bench/*.pplan; do
    name="$(basename "$prog" .pplan)"
    stage "bench_planrun_ab_$name" 90 env "$AB_ENV" "$kit/bin/planrun" "$prog" --backend=cuda \
      --steps $((steps + 5)) --data "$kit/classics.txt" --metrics "$out/bench_planrun_ab_$name.jsonl" \
      --timeout 80
  done
fi
if [ -x "$kit/bin/paraplan_attention_bench" ]; then
  TAIL=20 stage attention_bench 90 "$kit/bin/paraplan_attention_bench"
fi
TAIL=8 stage bench_pytorch_eager 120 python3 "$here/torch_baseline.py" --gpu H200 --steps "$steps" \
  --systems eager

# 4. Where planrun's step goes: every kernel of one step (ncu, one metric: the kernel's duration).
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
if [ -n "$ncu_bin" ]; then
  stage ncu_llama125m 120 "$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file "$out/ncu_llama125m.csv" "$kit/bin/planrun" "$kit/bench/llama-125m-seq1024.pplan" \
    --backend=cuda --steps 1 --data "$kit/classics.txt"
fi

# 5. Out-of-bounds and misaligned global accesses in the kernels (the CPU emulation cannot see them).
san_bin="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)"
if [ -n "$san_bin" ]; then
  stage memcheck_backend 120 "$san_bin" --tool memcheck --error-exitcode 9 \
    "$kit/bin/cuda_backend_tests" --no-version=true
  stage racecheck_backend 60 "$san_bin" --tool racecheck --error-exitcode 9 \
    "$kit/bin/cuda_backend_tests" --no-version=true
  stage memcheck_moe 60 "$san_bin" --tool memcheck --error-exitcode 9 "$kit/bin/planrun" \
    "$kit/eq/moe_capacity_etp2_tp2_sp.pplan" --backend=cuda --steps 1 --data "$kit/classics.txt"
fi

# 6. torch.compile last: its compilation is the slowest stage.
TAIL=8 stage bench_pytorch_compile 200 python3 "$here/torch_baseline.py" --gpu H200 --steps "$steps" \
  --systems compile --model llama-350m --seq 2048 --model llama-125m --seq 1024

say "== done in ${SECONDS}s"
python3 - "$out" <<'PY' | tee -a "$summary"
import glob, json, os, sys
out = sys.argv[1]
for p in sorted(glob.glob(os.path.join(out, "bench_planrun_*.jsonl"))):
    rows = [json.loads(l) for l in open(p) if l.strip()]
    timed = rows[5:] or rows
    if not timed:
        continue
    t = sorted(r["step_seconds"] for r in timed)[len(timed) // 2]
    tok = sorted(r["tokens_per_second"] for r in timed)[len(timed) // 2]
    peak = max(r.get("peak_bytes", 0) for r in rows)
    print(f"planrun {os.path.basename(p)[14:-6]}: median step {t*1e3:.1f} ms, {tok:,.0f} tok/s, "
          f"peak {peak/2**30:.2f} GiB, loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}")
PY
