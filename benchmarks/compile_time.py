"""Compile time of ``F.compile()`` (Rosenbrock's gradient, n = 10, 100, 1000) against
CasADi's JIT build (expression, code generation and gcc, with the flags easyad uses), for
one or more easyad checkouts, interleaved: each round starts one fresh process per checkout
(in an order that alternates round by round), and each process times both sides at every n
(three times each at n <= 100), easyad and CasADi in alternating order, with
``bench_replay``'s own helpers (``_compiled``: a fresh cache, so gcc really runs;
``_casadi_function`` with ``_jit``). A fresh process per round counts what a first compile
in a process pays (the compiler's ``--version``, CasADi's plugin), as ``run.py --only
replay`` does. Prints medians and quartiles of the
wall time and of the CPU time (the process's and its children's: gcc's), which a loaded
machine disturbs less; writes nothing.

    python benchmarks/compile_time.py [--rounds 9] [CHECKOUT ...]

Each CHECKOUT is a folder holding a built ``easyad`` and its ``benchmarks`` (default: this
one); run it with a Python that has casadi (``.venv-bench``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SIZES = (10, 100, 1000)

# one process's measurements: both sides at every n, as JSON on its last line
# (and the CPU seconds of the process and its children, gcc's included, around each: on a
# loaded machine wall time is mostly waiting for a core)
_CHILD = """
import json, resource, sys, time, numpy as np
sys.path.insert(0, {benchmarks!r})
import bench_replay as b
ca = b._casadi()
flip = {flip}
times = {{}}
def cpu():
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
for n in {sizes!r}:
    entries = len(b.ad.record(b.rosenbrock, np.ones(n)))
    for repeat in range(3 if n <= 100 else 1):
        sides = ["easyad", "casadi"][::-1 if flip else 1]
        flip = not flip
        for side in sides:
            start = cpu()
            if side == "easyad":
                seconds = b._compiled(b.rosenbrock, n)[1]
            else:
                seconds = b._casadi_function(ca, n, "gradient", b._jit(entries))[1]
            times.setdefault(f"{{side}} {{n}}", []).append(seconds)
            times.setdefault(f"{{side}} {{n}} cpu", []).append(cpu() - start)
print(json.dumps(times))
"""


def _one_process(checkout: str, flip: bool) -> dict[str, list[float]]:
    code = _CHILD.format(benchmarks=os.path.join(checkout, "benchmarks"), flip=flip,
                         sizes=SIZES)
    env = dict(os.environ, PYTHONPATH=checkout)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def main() -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", default=[here])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {c: {} for c in args.checkouts}
    for r in range(args.rounds):
        order = args.checkouts if r % 2 == 0 else args.checkouts[::-1]
        for checkout in order:
            measured = _one_process(checkout, flip=r % 2 == 1)
            print(checkout, json.dumps(measured), file=sys.stderr)     # the raw numbers
            for key, seconds in measured.items():
                samples[checkout].setdefault(key, []).extend(seconds)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"compile time, seconds: median [q1, q3] over {args.rounds} interleaved rounds "
          f"(3 compiles per side and process at n <= 100, the first one included)")
    for checkout in args.checkouts:
        print(f"\n{checkout}")
        for n in SIZES:
            mine, theirs = samples[checkout][f"easyad {n}"], samples[checkout][f"casadi {n}"]
            (a1, a, a3), (c1, c, c3) = _quartiles(mine), _quartiles(theirs)
            ratios = [m / t for m, t in zip(mine, theirs)]    # the same process's
            print(f"  n={n:5d}: F.compile() {a:.3f} [{a1:.3f}, {a3:.3f}]   casadi JIT "
                  f"{c:.3f} [{c1:.3f}, {c3:.3f}]   ratio per process, median "
                  f"{statistics.median(ratios):.2f}")
            mine, theirs = (samples[checkout][f"{side} {n} cpu"] for side in ("easyad", "casadi"))
            (a1, a, a3), (c1, c, c3) = _quartiles(mine), _quartiles(theirs)
            print(f"          CPU seconds  {a:.3f} [{a1:.3f}, {a3:.3f}]              "
                  f"{c:.3f} [{c1:.3f}, {c3:.3f}]   ratio per process, median "
                  f"{statistics.median([m / t for m, t in zip(mine, theirs)]):.2f}")


if __name__ == "__main__":
    main()
