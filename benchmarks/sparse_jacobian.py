"""Sparse Jacobians: easyad's ``F.jacobian(x, sparse=True)`` against CasADi's sparse
``jacobian`` in one interleaved run (issue 27 item 2).

Problems (residuals r(z), square or not):
- ``pde``: a 1-D reaction-diffusion residual, r_i = (u_{i-1} - 2 u_i + u_{i+1}) / h^2
  + u_i^2 (1 - u_i) + exp(-u_i) (tridiagonal: 3 colours whatever n is);
- ``ocp``: a bordered-banded optimal-control residual: states (p, v) per step coupled to
  the next step by an explicit Euler step, a control per step, and 3 global parameters
  that every step reads (dense columns: forward colours = the band's + 3).

Timed, per problem and size, interleaved (every round times every variant in a fresh
random order, garbage collector off; medians and quartiles over rounds):
- easyad: ``F.bind_jacobian(x, values)`` (arrays bound once, one C call of the
  Jacobian's program in the VM) and, with ``--jit`` sizes, after ``F.compile()``;
- CasADi at its fastest public path: ``Function("J", [z], [jacobian(r, z)])`` built
  once, called through ``Function.buffer()`` (its VM), and with ``jit=True`` (gcc, the
  flags ``F.compile()`` gives gcc, from easyad/compiler/tape/library.py) for the sizes
  in ``--jit``.
One-off costs are reported apart: recording, pattern, colouring, building the program
(easyad); building the expression, the Jacobian, the Function, and the JIT compile
(CasADi); building the sparse Jacobian is compared as easyad's pattern + colouring +
program against CasADi's jacobian + Function (each side's expression, or recording,
apart), once, then over ``--build-rounds`` interleaved rounds.
Values are checked against CasADi's before anything is timed.

Run: ``.venv-bench/bin/python benchmarks/sparse_jacobian.py`` (``--sizes 10000 100000
--jit 10000 --rounds 15``). The machine may be shared: say so next to the figures.
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import timeit

import numpy as np

import easyad as ad

ALIVE: list[object] = []


# ---- the problems, for easyad (object arrays of Records) and CasADi (SX) ----

def pde_easyad(n):
    h = 1.0 / (n + 1)

    def r(u):
        left = np.concatenate([[0.0], u[:-1]])
        right = np.concatenate([u[1:], [0.0]])
        return (left - 2 * u + right) / (h * h) + u * u * (1 - u) + ad.exp(-u)
    return r, np.linspace(0.1, 0.9, n)


def pde_casadi(ca, n):
    h = 1.0 / (n + 1)
    u = ca.SX.sym("u", n)
    left = ca.vertcat(0, u[:-1])
    right = ca.vertcat(u[1:], 0)
    return u, (left - 2 * u + right) / (h * h) + u * u * (1 - u) + ca.exp(-u)


def _ocp_steps(n):
    return max(1, (n - 5) // 3)


def ocp_easyad(n):
    N, dt = _ocp_steps(n), 0.01

    def r(z):
        p, v = z[0:2 * (N + 1):2], z[1:2 * (N + 1):2]
        u, theta = z[2 * (N + 1):2 * (N + 1) + N], z[2 * (N + 1) + N:]
        acc = theta[0] * u[:N] - theta[1] * ad.sin(p[:N]) - theta[2] * v[:N] * (1 + v[:N] ** 2)
        rp = p[1:] - p[:N] - dt * v[:N]
        rv = v[1:] - v[:N] - dt * acc
        return np.stack([rp, rv], axis=1).reshape(-1)
    z = np.concatenate([np.linspace(0, 1, 2 * (N + 1)), np.linspace(-1, 1, N),
                        [1.0, 0.5, 0.1]])
    return r, z


def ocp_casadi(ca, n):
    N, dt = _ocp_steps(n), 0.01
    z = ca.SX.sym("z", 2 * (N + 1) + N + 3)
    p, v = z[0:2 * (N + 1):2], z[1:2 * (N + 1):2]
    u, theta = z[2 * (N + 1):2 * (N + 1) + N], z[2 * (N + 1) + N:]
    acc = theta[0] * u - theta[1] * ca.sin(p[:N]) - theta[2] * v[:N] * (1 + v[:N] ** 2)
    rp = p[1:] - p[:N] - dt * v[:N]
    rv = v[1:] - v[:N] - dt * acc
    return z, ca.vec(ca.horzcat(rp, rv).T)


PROBLEMS = {"pde": (pde_easyad, pde_casadi), "ocp": (ocp_easyad, ocp_casadi)}


# ---- building ----

def _jit_options(entries):
    """CasADi's JIT with the flags F.compile() gives gcc for a program of this size."""
    from easyad.compiler.tape import library
    level = ["-O1", "-ftree-loop-vectorize"] if entries >= library._BIG else ["-O3"]
    same = [f for f in library._FLAGS if f not in ("-fPIC", "-shared", "-w", "-std=gnu99")]
    return {"jit": True, "compiler": "shell",
            "jit_options": {"compiler": "gcc", "flags": [*level, *same, library._NATIVE]}}


def build_easyad(problem, n, compiled):
    f, z0 = PROBLEMS[problem][0](n)
    costs = {}
    started = time.perf_counter()
    F = ad.record(f, z0)
    costs["record"] = time.perf_counter() - started
    started = time.perf_counter()
    F.jacobian_pattern()
    costs["pattern"] = time.perf_counter() - started
    started = time.perf_counter()
    colouring = F.jacobian_colouring()
    costs["colouring"] = time.perf_counter() - started
    started = time.perf_counter()
    program = F._jacobian_program()
    costs["program"] = time.perf_counter() - started
    if compiled:
        started = time.perf_counter()
        F.compile()
        F._jacobian_program()
        costs["compile"] = time.perf_counter() - started
    x = z0 + 0.01 * np.cos(np.arange(len(z0)))
    values = np.empty(len(F.jacobian_pattern()[0]))
    call = F.bind_jacobian(x, values)
    ALIVE.append((x, values))
    info = dict(colours=colouring.colours, mode=colouring.mode, lower=colouring.lower_bound,
                entries=len(F), program=len(program) if program is not None else None)
    return F, call, x, values, costs, info


def build_casadi(ca, problem, n, x, jit):
    costs = {}
    started = time.perf_counter()
    z, r = PROBLEMS[problem][1](ca, n)
    costs["expression"] = time.perf_counter() - started
    started = time.perf_counter()
    J = ca.jacobian(r, z)
    costs["jacobian"] = time.perf_counter() - started
    started = time.perf_counter()
    options = _jit_options(J.nnz() * 4) if jit else {}
    G = ca.Function("J", [z], [J], options)
    costs["jit compile" if jit else "function"] = time.perf_counter() - started
    buf, call = G.buffer()
    xs = np.ascontiguousarray(x)
    out = np.zeros(G.nnz_out(0))
    buf.set_arg(0, memoryview(xs))
    buf.set_res(0, memoryview(out))
    ALIVE.append((buf, xs, out))
    rows, cols = G.sparsity_out(0).get_triplet()
    return call, out, (np.asarray(rows), np.asarray(cols), G.size_out(0)), costs


def build_rounds(ca, problem, n, rounds):
    """Building the sparse Jacobian, interleaved (each round both sides in a random order,
    the garbage collector off): easyad's pattern + colouring + program after recording,
    CasADi's jacobian + Function after building the expression. Medians and quartiles
    (seconds) per side."""
    f, z0 = PROBLEMS[problem][0](n)
    times = {"easyad": [], "casadi": []}

    def easyad_side():
        F = ad.record(f, z0)
        started = time.perf_counter()
        F.jacobian_pattern()
        F.jacobian_colouring()
        F._jacobian_program()
        return time.perf_counter() - started

    def casadi_side():
        z, r = PROBLEMS[problem][1](ca, n)
        started = time.perf_counter()
        ca.Function("J", [z], [ca.jacobian(r, z)])
        return time.perf_counter() - started

    sides = {"easyad": easyad_side, "casadi": casadi_side}
    for _ in range(rounds):
        order = list(sides)
        random.shuffle(order)
        for name in order:
            gc.collect()
            gc.disable()
            try:
                times[name].append(sides[name]())
            finally:
                gc.enable()
    return {name: quartiles(ts) for name, ts in times.items()}


def _same(F, values, casadi_out, sparsity, hessian=False):
    import scipy.sparse
    rows, cols = F.hessian_pattern() if hessian else F.jacobian_pattern()
    shape = (F.n_inputs, F.n_inputs) if hessian else (F.n_outputs, F.n_inputs)
    mine = scipy.sparse.csc_matrix((values, (rows, cols)), shape=shape)
    r, c, shape = sparsity
    theirs = scipy.sparse.csc_matrix((casadi_out, (r, c)), shape=shape)
    gap = abs(mine - theirs).max()
    scale = max(1.0, abs(theirs).max())
    if gap > 1e-9 * scale:
        raise SystemExit(f"easyad and CasADi disagree: max gap {gap:g}")
    return mine.nnz, theirs.nnz


# ---- timing ----

def measure(variants, rounds, seconds):
    """Per variant: per-call times of each round (variants in a fresh order per round)."""
    numbers = {}
    for name, call in variants.items():
        call()
        timer = timeit.Timer(call)
        count, elapsed = 1, timer.timeit(1)
        while elapsed < seconds / 4:
            count *= 2
            elapsed = timer.timeit(count)
        numbers[name] = max(1, int(count * seconds / max(elapsed, 1e-9)))
    times = {name: [] for name in variants}
    for _ in range(rounds):
        order = list(variants)
        random.shuffle(order)
        for name in order:
            gc.collect()
            t = timeit.Timer(variants[name]).timeit(numbers[name])
            times[name].append(t / numbers[name])
    return times


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--jit", type=int, nargs="*", default=[10_000],
                        help="sizes at which both sides also compile (gcc)")
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build-rounds", type=int, default=3,
                        help="interleaved rounds of building the sparse Jacobian")
    args = parser.parse_args()
    random.seed(args.seed)
    try:
        import casadi as ca
    except ImportError:
        ca = None
    build_easyad("pde", 10, False)       # imports and caches, before anything is timed
    for problem in args.problems:
        for n in args.sizes:
            jit = n in args.jit
            F, call, x, values, costs, info = build_easyad(problem, n, False)
            variants = {"easyad VM (bind_jacobian)": call}
            if jit:
                G, gcall, gx, gvalues, gcosts, _ = build_easyad(problem, n, True)
                variants["easyad compiled (bind_jacobian)"] = gcall
            print(f"\n## {problem}, n = {F.n_inputs} unknowns, m = {F.n_outputs} residuals")
            print(f"tape {info['entries']:,} entries; Jacobian program "
                  f"{info['program']:,} entries; {info['mode']} colours {info['colours']} "
                  f"(lower bound {info['lower']})")
            print("easyad one-off seconds: " + ", ".join(f"{k} {v:.3f}"
                                                       for k, v in costs.items()))
            if jit:
                print(f"easyad compile seconds: {gcosts['compile']:.1f}")
            call()
            if ca is not None:
                ccall, cout, sparsity, ccosts = build_casadi(ca, problem, n, x, False)
                ccall()
                nnz = _same(F, values, cout, sparsity)
                variants["casadi VM (buffer)"] = ccall
                print(f"nonzeros: easyad {nnz[0]:,}, casadi {nnz[1]:,}")
                print("casadi one-off seconds: " + ", ".join(f"{k} {v:.3f}"
                                                            for k, v in ccosts.items()))
                mine = costs["pattern"] + costs["colouring"] + costs["program"]
                theirs = ccosts["jacobian"] + ccosts["function"]
                print(f"building the sparse Jacobian once (easyad pattern + colouring + "
                      f"program; casadi jacobian + function): easyad {mine:.3f} s, casadi "
                      f"{theirs:.3f} s")
                if args.build_rounds:
                    got = build_rounds(ca, problem, n, args.build_rounds)
                    (e1, em, e3), (c1, cm, c3) = got["easyad"], got["casadi"]
                    print(f"building, median of {args.build_rounds} interleaved rounds "
                          f"(quartiles): easyad {em:.3f} s ({e1:.3f}-{e3:.3f}), casadi "
                          f"{cm:.3f} s ({c1:.3f}-{c3:.3f}), ratio {em / cm:.2f}")
                if jit:
                    jcall, jout, jsparsity, jcosts = build_casadi(ca, problem, n, x, True)
                    jcall()
                    _same(F, values, jout, jsparsity)
                    gcall()
                    _same(G, gvalues, jout, jsparsity)
                    variants["casadi JIT (buffer)"] = jcall
                    print(f"casadi JIT compile seconds: {jcosts['jit compile']:.1f}")
            times = measure(variants, args.rounds, args.seconds)
            print("\n| variant | median us | quartiles us | vs casadi VM | vs casadi JIT |")
            print("|---|---|---|---|---|")
            refs = [times.get("casadi VM (buffer)"), times.get("casadi JIT (buffer)")]
            for name, ts in times.items():
                q1, med, q3 = quartiles(ts)
                cells = []
                for ref in refs:     # per-round ratios (both timed in the same round)
                    if ref is None:
                        cells.append("")
                        continue
                    r1, rm, r3 = quartiles([a / b for a, b in zip(ts, ref)])
                    cells.append(f"{rm:.2f} ({r1:.2f}-{r3:.2f})")
                print(f"| {name} | {med * 1e6:,.1f} | {q1 * 1e6:,.1f}-{q3 * 1e6:,.1f} "
                      f"| {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
