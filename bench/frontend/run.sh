#!/usr/bin/env bash
# Front-end memory and time per input byte: generates plans of each shape (gen_plan.py) and runs
# `planc check` on each under /usr/bin/time, printing peak RSS per input byte and seconds.
#
# usage: bench/frontend/run.sh [PLANC] [SIZES_MIB...]     (default: build/bin/planc 4 16)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
planc="${1:-$here/../../build/bin/planc}"
shift || true
sizes=("$@")
((${#sizes[@]})) || sizes=(4 16)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
printf "%-8s %6s %12s %10s %8s %s\n" shape MiB bytes peak_MiB B/B seconds
for shape in array members nested strings mixed; do
  for mib in "${sizes[@]}"; do
    plan="$tmp/$shape.plan"
    python3 "$here/gen_plan.py" "$shape" $((mib * 1048576)) "$plan"
    bytes=$(stat -c %s "$plan")
    rc=0
    /usr/bin/time -f "%M %e" -o "$tmp/time" "$planc" check "$plan" >/dev/null 2>"$tmp/err" || rc=$?
    read -r kib secs <"$tmp/time"
    if ((rc > 1)); then echo "planc exited $rc on $shape $mib MiB:"; tail -3 "$tmp/err"; fi
    awk -v s="$shape" -v m="$mib" -v b="$bytes" -v k="$kib" -v t="$secs" \
      'BEGIN { printf "%-8s %6d %12d %10.1f %8.1f %s\n", s, m, b, k / 1024, k * 1024 / b, t }'
  done
done
