"""Eager structural operations on small tensors, this checkout against another one,
interleaved (the op table's moves must not slow them).

    python benchmarks/structural_eager.py /path/to/other/checkout [rounds]

Each round runs a child per checkout (PYTHONPATH set to it); a child times every case on
a fresh WengertList per repeat (the tape stays short) in CPU time, and the table shows,
per case, the minimum over rounds and repeats in microseconds. The fast cases (t.sum(),
a @ t, t[1:3], t.reshape) run the compiled core's paths; the others the op table's.
"""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import time

CASES = ["t.sum()", "t.sum(axis=0)", "t.max(axis=1)", "a @ t", "t[1:3]", "t.reshape(4, 16)",
         "t.transpose()", "ad.where(c, t, 0.0)", "ad.where(c, t, a)", "t.sum(axis=(0, 1))",
         "t.max(axis=(0,))", "t[[0, 2]]", "a3.transpose(2, 0, 1)", "a3 @ a3"]


def child() -> None:
    import numpy as np

    import easyad as ad

    def make(expr: str):
        lst = ad.WengertList()
        rng = np.random.default_rng(0)
        names = {"ad": ad, "t": ad.Tensor.variable(rng.normal(size=(8, 8)), lst),
                 "a": ad.Tensor.variable(rng.normal(size=(8, 8)), lst),
                 "a3": ad.Tensor.variable(rng.normal(size=(4, 8, 8)), lst),
                 "c": ad.Tensor.constant(rng.normal(size=(8, 8))) > 0}
        return eval("lambda: " + expr, names)

    out = {}
    for expr in CASES:
        best = float("inf")
        for _ in range(15):
            f = make(expr)
            start = time.process_time()
            for _ in range(300):
                f()
            best = min(best, (time.process_time() - start) / 300 * 1e6)
        out[expr] = best
    print(repr(out))


def main() -> None:
    here = str(pathlib.Path(__file__).resolve().parent.parent)
    other = str(pathlib.Path(sys.argv[1]).resolve())
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    found: dict[str, dict[str, float]] = {here: {}, other: {}}
    for _ in range(rounds):
        for tree in (other, here):
            env = dict(os.environ, PYTHONPATH=tree)
            text = subprocess.run([sys.executable, __file__, "--child"], env=env, cwd=tree,
                                  check=True, capture_output=True, text=True).stdout
            for k, v in ast.literal_eval(text.strip().splitlines()[-1]).items():
                found[tree][k] = min(v, found[tree].get(k, float("inf")))
    print(f"{'case':24s} {'other us':>9s} {'this us':>9s} {'ratio':>6s}")
    for k in CASES:
        print(f"{k:24s} {found[other][k]:9.2f} {found[here][k]:9.2f} "
              f"{found[here][k] / found[other][k]:6.2f}")


if __name__ == "__main__":
    child() if sys.argv[1:] == ["--child"] else main()
