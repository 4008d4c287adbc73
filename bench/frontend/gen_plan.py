#!/usr/bin/env python3
"""Writes a large, valid .plan file of a given shape and size, for front-end memory and time
measurements (bench/frontend/run.sh, tests/frontend).

Every shape is the llama3_70b example plan plus filler that `planc check` must lex, parse and
evaluate:
  array    one `let` holding a giant list literal of integers, reals and strings
  members  many `let` declarations at the top level and inside the plan block
  nested   many `let`s whose values nest brackets and operators about 40 levels deep
  strings  long comments and long string literals

usage: gen_plan.py SHAPE BYTES OUT
"""
import sys

HEAD = """import std.models.llama
import std.clusters
"""

PLAN_OPEN = """plan big {
  model   = llama3_70b
  cluster = dgx_h100 { nodes = 8 }
  framework = megatron_core
  parallel  { tp = 8  pp = 4  vpp = 2  sp = true  dp = auto }
  pipeline  { schedule = interleaved_1f1b }
  optimizer { type = adamw  zero = 1  lr = 1.5e-4 }
  batch     { global = 512  micro = 1 }
  precision = bf16
  recompute = selective
"""
PLAN_CLOSE = "}\n"


def array(budget, out):
    out.write("let table = [\n")
    n, line = 0, []
    written = 0
    while written < budget:
        k = n % 3
        item = str(n * 7919 % 100003) if k == 0 else (
            f"{n % 1000}.5" if k == 1 else f'"s{n % 97}"')
        line.append(item)
        n += 1
        if len(line) == 16:
            text = "  " + ", ".join(line) + ",\n"
            out.write(text)
            written += len(text)
            line = []
    out.write("  0\n]\n")
    out.write(PLAN_OPEN + PLAN_CLOSE)


def members(budget, out):
    half = budget // 2
    written, n = 0, 0
    while written < half:
        text = f"let top_{n} = {n} * 2 + 1\n"
        out.write(text)
        written += len(text)
        n += 1
    out.write(PLAN_OPEN)
    n = 0
    while written < budget:
        text = f"  let field_{n} = {n % 1000}\n"
        out.write(text)
        written += len(text)
        n += 1
    out.write(PLAN_CLOSE)


def nested(budget, out):
    depth = 40
    written, n = 0, 0
    while written < budget:
        expr = str(n % 10)
        for d in range(depth // 2):
            expr = f"({expr} + {d % 7})" if d % 2 == 0 else f"[{expr}]"
        text = f"let deep_{n} = {expr}\n"
        out.write(text)
        written += len(text)
        n += 1
    out.write(PLAN_OPEN + PLAN_CLOSE)


def strings(budget, out):
    written, n = 0, 0
    word = "the quick brown fox jumps over the lazy dog "
    while written < budget:
        if n % 2 == 0:
            text = "# " + word * 40 + "\n"
        else:
            text = f'let note_{n} = "' + word * 40 + '"\n'
        out.write(text)
        written += len(text)
        n += 1
    out.write(PLAN_OPEN + PLAN_CLOSE)


SHAPES = {"array": array, "members": members, "nested": nested, "strings": strings}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(__doc__)
    size = int(sys.argv[2])
    with open(sys.argv[3], "w") as out:
        out.write(HEAD)
        SHAPES[sys.argv[1]](max(0, size - 1200), out)


if __name__ == "__main__":
    main()
