#!/usr/bin/env bash
# planc check on a generated 8 MiB plan (every shape of bench/frontend/gen_plan.py) inside an
# address space of 64 bytes per input byte: it must finish with the plan checked. Then the same
# plan in an address space far too small: a clean "out of memory" error (exit 1), no crash.
#
# usage: memory_limit.sh PLANC GEN_PLAN_PY
set -euo pipefail
planc="$1"
gen="$2"
command -v prlimit >/dev/null || { echo "prlimit not found: skipped"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bytes=$((8 * 1048576))
python3 "$gen" mixed "$bytes" "$tmp/big.plan"

limit=$((64 * bytes))
rc=0
prlimit --as="$limit" "$planc" check "$tmp/big.plan" >"$tmp/out" 2>&1 || rc=$?
if ((rc != 0)); then
  echo "FAIL: planc check of an 8 MiB plan within $((limit >> 20)) MiB of address space exited $rc"
  tail -5 "$tmp/out"
  exit 1
fi

rc=0
prlimit --as=$((160 * 1048576)) "$planc" check "$tmp/big.plan" >"$tmp/out" 2>&1 || rc=$?
if ((rc != 1)) || ! grep -q "planc: error: out of memory" "$tmp/out"; then
  echo "FAIL: out of memory should be a clean error (exit 1), got exit $rc:"
  tail -5 "$tmp/out"
  exit 1
fi
echo "ok: 8 MiB plan checked within $((limit >> 20)) MiB; out of memory reported cleanly"
