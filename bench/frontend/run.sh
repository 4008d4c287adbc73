#!/usr/bin/env bash
# Front-end memory and time per input byte: generates plans of each shape (gen_plan.py) and runs
# `planc check` on each under /usr/bin/time, printing peak RSS per input byte and seconds.
#
# usage: bench/frontend/run.sh [PLANC] [SIZES_MIB...]     (default: build/bin/planc 4 16)
# With AS_LIMIT=BYTES each run is confined to that address space (prlimit --as), as the
# acceptance check for 64 MiB plans does: AS_LIMIT=8589934592 bench/frontend/run.sh "" 64
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
planc="${1:-}"
[ -n "$planc" ] || planc="$here/../../build/bin/planc"
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
    limit=()
    [ -z "${AS_LIMIT:-}" ] || limit=(prlimit --as="$AS_LIMIT")
    /usr/bin/time -f "%M %e" -o "$tmp/time" "${limit[@]}" "$planc" check "$plan" >/dev/null \
      2>"$tmp/err" || rc=$?
    read -r kib secs <"$tmp/time"
    # The generated plans check without errors: any exit status but 0 is reported.
    if ((rc != 0)); then echo "planc exited $rc on $shape $mib MiB:"; tail -3 "$tmp/err"; fi
    awk -v s="$shape" -v m="$mib" -v b="$bytes" -v k="$kib" -v t="$secs" \
      'BEGIN { printf "%-8s %6d %12d %10.1f %8.1f %s\n", s, m, b, k / 1024, k * 1024 / b, t }'
  done
done
