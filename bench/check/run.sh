#!/usr/bin/env bash
# planc check as a whole process (hyperfine when installed, else a timed loop), then in-memory
# variant checking. Run from the repository root after building: bench/check/run.sh [build-dir]
set -euo pipefail
build="${1:-build}"
plan=examples/llama3_70b.plan
[ -f "$plan" ] || plan=bench/check/llama3_70b.plan
echo "plan: $plan"
if command -v hyperfine > /dev/null; then
  hyperfine --warmup 5 --runs 100 -N "$build/bin/planc check $plan"
else
  n=100
  start=$(date +%s%N)
  for _ in $(seq $n); do "$build/bin/planc" check "$plan" > /dev/null 2>&1 || true; done
  end=$(date +%s%N)
  echo "planc check: $(( (end - start) / n / 1000 )) us per run (mean of $n)"
fi
"$build/bench/check/bench_check" "$plan" 2
