#!/usr/bin/env python3
"""Writes a large, valid .plan file of a given shape and size, for front-end memory and time
measurements (bench/frontend/run.sh, tests/frontend/).

Every shape is the llama3_70b example plan plus filler that `planc check` must lex, parse and
evaluate:
  array    one `let` holding a giant list literal of integers, reals and strings
  members  many `let` declarations, half at the top level and half inside the plan block
  nested   many `let`s whose values nest brackets and operators 40 levels deep
  strings  long comments and long string literals
  mixed    a quarter of each

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


def lines(budget, make):
    """make(0), make(1), ... while they fit in `budget` bytes, joined."""
    parts, written, n = [], 0, 0
    while True:
        text = make(n)
        if written + len(text) > budget:
            break
        parts.append(text)
        written += len(text)
        n += 1
    return "".join(parts)


def array(budget, name="table"):
    def row(n):
        items = []
        for k in range(16):
            i = n * 16 + k
            kind = i % 3
            items.append(str(i * 7919 % 100003) if kind == 0 else
                         f"{i % 1000}.5" if kind == 1 else f'"s{i % 97}"')
        return "  " + ", ".join(items) + ",\n"
    return f"let {name} = [\n" + lines(budget, row) + "  0\n]\n"


def top_lets(budget):
    return lines(budget, lambda n: f"let top_{n} = {n} * 2 + 1\n")


def member_lets(budget):
    return lines(budget, lambda n: f"  let field_{n} = {n % 1000}\n")


def nested(budget):
    def one(n):
        expr = str(n % 10)
        for d in range(20):
            expr = f"({expr} + {d % 7})" if d % 2 == 0 else f"[{expr}]"
        return f"let deep_{n} = {expr}\n"
    return lines(budget, one)


def strings(budget):
    word = "the quick brown fox jumps over the lazy dog "
    return lines(budget, lambda n: "# " + word * 40 + "\n" if n % 2 == 0 else
                 f'let note_{n} = "' + word * 40 + '"\n')


def shape_text(shape, budget):
    """(top-level filler, filler inside the plan block)"""
    if shape == "array":
        return array(budget), ""
    if shape == "members":
        return top_lets(budget // 2), member_lets(budget - budget // 2)
    if shape == "nested":
        return nested(budget), ""
    if shape == "strings":
        return strings(budget), ""
    q = budget // 4
    return (array(q) + top_lets(q // 2) + nested(q) + strings(q)), member_lets(q - q // 2)


SHAPES = ("array", "members", "nested", "strings", "mixed")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in SHAPES:
        sys.exit(__doc__)
    budget = max(0, int(sys.argv[2]) - len(HEAD) - len(PLAN_OPEN) - len(PLAN_CLOSE) - 100)
    top, body = shape_text(sys.argv[1], budget)
    with open(sys.argv[3], "w") as out:
        out.write(HEAD + top + PLAN_OPEN + body + PLAN_CLOSE)


if __name__ == "__main__":
    main()
