#!/usr/bin/env bash
# `planc compile` of every plan in bench/compile/ and examples/ as a whole process: wall time and
# peak resident memory from /usr/bin/time, the program file's size, the exit status (1: the plan
# has errors, as several examples are meant to). Prints a Markdown table, with the CPU it ran on.
# Targets: every plan under 5 s and under 50 MB.
#
# Run from the repository root after building planc:
#   bench/compile/run.sh [build-dir] [runs]
# Each plan is compiled `runs` times (default 3); the table gives the lowest wall time and the
# highest peak RSS of the runs.
set -euo pipefail
build="${1:-build}"
runs="${2:-3}"
planc="$build/bin/planc"
[ -x "$planc" ] || { echo "bench/compile/run.sh: no $planc; build it first" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "bench/compile/run.sh: needs /usr/bin/time (GNU time)" >&2; exit 2; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cpu="$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
isa="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx2|sse4_2)$' |
       sort -u | tr '\n' ' ')"
echo "CPU: $cpu, $(nproc) cores; ISA: ${isa:-unknown}; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| plan | status | wall time | peak RSS | program file |"
echo "| --- | --- | --- | --- | --- |"
for plan in bench/compile/*.plan examples/*.plan; do
  best_s="" worst_kb=0 status=0 bytes="-"
  for _ in $(seq "$runs"); do
    rm -f "$tmp/out.pplan"
    status=0
    /usr/bin/time -f "%e %M" -o "$tmp/time" "$planc" compile "$plan" -o "$tmp/out.pplan" \
      > /dev/null 2> "$tmp/err" || status=$?
    read -r s kb < <(tail -n 1 "$tmp/time")
    if [ -z "$best_s" ] || awk -v a="$s" -v b="$best_s" 'BEGIN { exit !(a < b) }'; then best_s="$s"; fi
    if [ "$kb" -gt "$worst_kb" ]; then worst_kb="$kb"; fi
  done
  if [ -f "$tmp/out.pplan" ]; then bytes="$(stat -c %s "$tmp/out.pplan")"; fi
  mb="$(awk -v kb="$worst_kb" 'BEGIN { printf "%.1f MB", kb / 1024 }')"
  echo "| $plan | $status | $best_s s | $mb | $bytes |"
done
