"""Sparse Hessians of a Function: star colouring against a partition of columns, and
against CasADi's sparse ``hessian``, in one interleaved run (issue 27 item 2).

Problems (scalar objectives, from the residuals of benchmarks/sparse_jacobian.py):
- ``pde``: half the sum of squares of the reaction-diffusion residual (a pentadiagonal
  Hessian: a partition of its columns needs 5 colours, a star colouring fewer);
- ``ocp``: the same of the bordered-banded optimal-control residual, plus a ridge term
  (3 global parameters couple with every step: an arrowhead border).

Per problem and size: the colours of both colourings (the forward-over-reverse sweeps
per Hessian), and, timed interleaved (medians and quartiles over rounds, each round in a
fresh random order): ``F.hessian(x, sparse=True)`` with the star colouring (easyad's
default where it needs fewer colours) and with the column partition (the colouring
forced, for comparison, where colours x tape entries <= 5e6), by the route ``hessian``
takes after its first call (printed: the Hessian's second-order program, built in C,
with its number of entries), and CasADi's ``Function("H", [z], [hessian(f, z)[0]])``
called through ``Function.buffer()``. Values (the first call's sweeps and the program)
are checked against CasADi's first. Building is timed in CPU time over
``--build-rounds`` interleaved rounds: easyad's pattern + colourings + program after
recording, against CasADi's expression + hessian + Function.

Run: ``.venv-bench/bin/python benchmarks/sparse_hessian.py`` (``--sizes 1000 10000
--rounds 15``). The machine may be shared: say so next to the figures.
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np
import sparse_jacobian as problems  # noqa: E402  (benchmarks/ is on sys.path)

import easyad as ad


def objective_easyad(problem, n):
    r, z0 = problems.PROBLEMS[problem][0](n)
    return (lambda z: 0.5 * np.sum(r(z) ** 2) + 0.5e-3 * np.sum(z * z)), z0


def objective_casadi(ca, problem, n):
    z, r = problems.PROBLEMS[problem][1](ca, n)
    return z, 0.5 * ca.sumsqr(r) + 0.5e-3 * ca.sumsqr(z)


def build_easyad(problem, n, star):
    f, z0 = objective_easyad(problem, n)
    F = ad.record(f, z0)
    started = time.process_time()      # CPU time: the machine may be shared
    rows, cols, colour = F._pattern()
    columns, stars = F.hessian_colouring()
    if not star and stars < columns:
        # the partition of columns forced (private caches: for this comparison only)
        from easyad import _sparsity
        F._pattern_cache = (rows, cols, _sparsity.colour_columns(F.n_inputs, rows, cols))
    F._hessian_plan()
    coloured = time.process_time() - started
    second = F._second()      # the Hessian's program (what every call after the first runs)
    built = time.process_time() - started
    x = z0 + 0.01 * np.cos(np.arange(len(z0)))
    used = int(F._pattern()[2].max()) + 1
    entries = len(second[3][0]) if second is not None else None
    return F, x, dict(columns=columns, star=stars, used=used, build=built,
                      colouring=coloured, entries=entries)


def build_casadi(ca, problem, n, x):
    started = time.process_time()
    z, f = objective_casadi(ca, problem, n)
    H, _ = ca.hessian(f, z)
    G = ca.Function("H", [z], [H])
    built = time.process_time() - started
    buf, call = G.buffer()
    xs = np.ascontiguousarray(x)
    out = np.zeros(G.nnz_out(0))
    buf.set_arg(0, memoryview(xs))
    buf.set_res(0, memoryview(out))
    problems.ALIVE.append((buf, xs, out))
    rows, cols = G.sparsity_out(0).get_triplet()
    return call, out, (np.asarray(rows), np.asarray(cols), G.size_out(0)), built


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--problems", nargs="+", default=list(problems.PROBLEMS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build-rounds", type=int, default=3,
                        help="interleaved rounds of building, both sides (CPU time)")
    args = parser.parse_args()
    random.seed(args.seed)
    try:
        import casadi as ca
    except ImportError:
        ca = None
    for problem in args.problems:
        for n in args.sizes:
            F, x, info = build_easyad(problem, n, True)
            star_values = F.hessian(x, sparse=True)       # the first call: the sweeps
            program_values = F.hessian(x, sparse=True)    # then the program, if any
            print(f"\n## {problem}, n = {F.n_inputs}: Hessian {len(F.hessian_pattern()[0]):,} "
                  f"nonzeros; colours: partition of columns {info['columns']}, star "
                  f"{info['star']}; tape {len(F):,} entries")
            route = f"second-order program ({info['entries']:,} entries)" \
                if info["entries"] is not None else "sweeps"
            print(f"easyad pattern + colourings {info['colouring']:.3f} s, with the program "
                  f"{info['build']:.3f} s (CPU); route after the first call: {route}; "
                  f"program vs sweeps max gap {np.abs(program_values - star_values).max():.1e}")
            variants = {f"easyad star ({info['used']} colours)":
                        lambda F=F, x=x: F.hessian(x, sparse=True)}
            if info["columns"] * len(F) <= 5e6:     # else n sweeps or a huge program
                G, _, ginfo = build_easyad(problem, n, False)
                column_values = G.hessian(x, sparse=True)
                gap = np.abs(star_values - column_values).max()
                print(f"star vs partition of columns: max gap {gap:.1e}")
                variants[f"easyad columns ({ginfo['used']} colours)"] = \
                    lambda G=G, x=x: G.hessian(x, sparse=True)
            else:
                print(f"partition of columns not timed: {info['columns']} sweeps of "
                      f"{len(F):,} entries (the dense route)")
            if ca is not None:
                ccall, cout, sparsity, built = build_casadi(ca, problem, n, x)
                ccall()
                problems._same(F, star_values, cout, sparsity, hessian=True)
                problems._same(F, program_values, cout, sparsity, hessian=True)
                print(f"casadi expression + hessian + function {built:.3f} s")
                variants["casadi VM (buffer)"] = ccall
            if ca is not None and args.build_rounds:
                ours, theirs = [], []
                for _ in range(args.build_rounds):
                    ours.append(build_easyad(problem, n, True)[2]["build"])
                    theirs.append(build_casadi(ca, problem, n, x)[3])
                ratio = problems.quartiles([a / b for a, b in zip(ours, theirs)])
                print(f"building, CPU s, median of {args.build_rounds} interleaved rounds: "
                      f"easyad (pattern + colourings + program) "
                      f"{problems.quartiles(ours)[1]:.3f}, CasADi (expression + hessian + "
                      f"Function) {problems.quartiles(theirs)[1]:.3f}, ratio "
                      f"{ratio[1]:.2f} ({ratio[0]:.2f}-{ratio[2]:.2f})")
            times = problems.measure(variants, args.rounds, args.seconds)
            print("\n| variant | median us | quartiles us | vs casadi VM |")
            print("|---|---|---|---|")
            ref = times.get("casadi VM (buffer)")
            for name, ts in times.items():
                q1, med, q3 = problems.quartiles(ts)
                cell = ""
                if ref is not None:
                    r1, rm, r3 = problems.quartiles([a / b for a, b in zip(ts, ref)])
                    cell = f"{rm:.2f} ({r1:.2f}-{r3:.2f})"
                print(f"| {name} | {med * 1e6:,.1f} | {q1 * 1e6:,.1f}-{q3 * 1e6:,.1f} "
                      f"| {cell} |")


if __name__ == "__main__":
    main()
