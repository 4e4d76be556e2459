"""Memory against time of a 10^5-step ODE gradient: plain taping vs binomial checkpointing.

    .venv-bench/bin/python benchmarks/checkpointing.py [--steps 100000] [--rounds 3]
                                                         [--snapshots 1000,316,100,30,10]

The problem: RK4 (step 1e-4) of the Lotka-Volterra system u' = a u - b u v,
v' = -c v + d u v from (1.0, 0.5) with (a, b, c, d) = (1.1, 0.4, 0.4, 0.1); the loss
u(T)^2 + sin(v(T)); its gradient with respect to the initial state and the four
parameters (6 numbers).

Variants (each one run in a child process of its own, the variants in turn each round,
so that the machine's load hits them alike):

- easyad ``plain``: ``ad.scan(..., checkpoints=None)``, every step on the WengertList;
- easyad ``c=K``: ``ad.scan(..., checkpoints=K)``, Griewank's binomial schedule;
- jax ``scan``: ``jax.jit(jax.value_and_grad(...))`` of ``lax.scan`` (XLA keeps each
  step's residuals), then ``scan+checkpoint`` (``jax.checkpoint`` on the step: only the
  carries are kept) and ``nested sqrt`` (a scan of sqrt(n) checkpointed scans of
  sqrt(n) steps: O(sqrt n) carries, JAX's usual recipe; jax has no revolve).

Time: wall time of one value-and-gradient call (for jax the compiled function's second
call: compile time is reported apart). Memory: the child's peak resident set size
(``ru_maxrss``) minus its resident size just before the call, after imports and (jax)
compilation (for jax before the first call, which the peak then includes); plus, for
easyad, the outer WengertList's bytes, and for jax XLA's ``temp_size_in_bytes`` of the
compiled function. The gradients must agree with plain
taping (easyad: 1e-12 relative; jax: 1e-9, other operation order). Medians and
quartiles over rounds; the machine is shared with other work (say so with the figures).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

POINT = (1.0, 0.5, 1.1, 0.4, 0.4, 0.1)
H = 1e-4


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rk4(sin: Any):
    def rhs(u: Any, v: Any, p: Any) -> tuple[Any, Any]:
        a, b, c, d = p
        return a * u - b * u * v, -c * v + d * u * v

    def step(carry: Any, _: Any = None) -> tuple[Any, Any]:
        (u, v), p = carry
        k1 = rhs(u, v, p)
        k2 = rhs(u + 0.5 * H * k1[0], v + 0.5 * H * k1[1], p)
        k3 = rhs(u + 0.5 * H * k2[0], v + 0.5 * H * k2[1], p)
        k4 = rhs(u + H * k3[0], v + H * k3[1], p)
        return ((u + H / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0]),
                 v + H / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])), p), None
    return step


def child_easyad(steps: int, snapshots: int | None) -> dict[str, Any]:
    import easyad as ad
    step = _rk4(ad.sin)
    base = _rss()
    t0 = time.perf_counter()
    lst = ad.WengertList()
    xs = [lst.variable(v) for v in POINT]
    ((u, v), _), _ = ad.scan(step, ((xs[0], xs[1]), tuple(xs[2:])), length=steps,
                             checkpoints=snapshots)
    loss = u * u + ad.sin(v)
    tape_bytes = lst.nbytes
    d = loss.derivatives()
    grad = [d[x] for x in xs]
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak": _peak() - base, "tape": tape_bytes,
            "value": loss.number, "grad": grad}


def child_jax(steps: int, how: str) -> dict[str, Any]:
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    step = _rk4(jnp.sin)

    def run(p: Any) -> Any:
        carry = ((p[0], p[1]), (p[2], p[3], p[4], p[5]))
        if how == "scan":
            carry, _ = jax.lax.scan(step, carry, None, length=steps)
        elif how == "scan+checkpoint":
            carry, _ = jax.lax.scan(jax.checkpoint(step), carry, None, length=steps)
        else:                                   # nested sqrt
            inner = max(1, math.isqrt(steps))
            outer, rest = divmod(steps, inner)

            @jax.checkpoint
            def block(c: Any, _: Any) -> tuple[Any, Any]:
                return jax.lax.scan(step, c, None, length=inner)[0], None
            carry, _ = jax.lax.scan(block, carry, None, length=outer)
            if rest:
                carry, _ = jax.lax.scan(step, carry, None, length=rest)
        (u, v), _ = carry
        return u * u + jnp.sin(v)
    f = jax.jit(jax.value_and_grad(run))
    x = jnp.array(POINT)
    t0 = time.perf_counter()
    compiled = f.lower(x).compile()
    compile_s = time.perf_counter() - t0
    temp = compiled.memory_analysis().temp_size_in_bytes
    base = _rss()
    jax.block_until_ready(f(x))
    t0 = time.perf_counter()
    value, grad = jax.block_until_ready(f(x))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak": _peak() - base, "tape": temp, "compile": compile_s,
            "value": float(value), "grad": [float(g) for g in grad]}


def _spawn(variant: str, steps: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", variant, "--steps",
                          str(steps)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{variant}: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--snapshots", default="1000,316,100,30,10")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        kind, _, how = args.child.partition(":")
        if kind == "easyad":
            r = child_easyad(args.steps, None if how == "plain" else int(how))
        else:
            r = child_jax(args.steps, how)
        print(json.dumps(r))
        return
    variants = ["easyad:plain"] + [f"easyad:{k}" for k in args.snapshots.split(",")]
    if not args.no_jax:
        variants += ["jax:scan", "jax:scan+checkpoint", "jax:nested sqrt"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            runs[v].append(_spawn(v, args.steps))
    reference = runs["easyad:plain"][0]["grad"]
    print(f"RK4 Lotka-Volterra, {args.steps} steps, gradient of 6 inputs; {args.rounds} "
          f"interleaved rounds, one child process per run (shared, loaded machine)\n")
    print("| variant | time s (q1 / median / q3) | peak RSS increase MB (median) | "
          "tape / XLA temp MB | max rel. gradient difference vs easyad plain |")
    print("|---|---|---|---|---|")
    for v in variants:
        rs = runs[v]
        q1, med, q3 = _quartiles([r["seconds"] for r in rs])
        peak = statistics.median(r["peak"] for r in rs) / 2 ** 20
        tape = statistics.median(r["tape"] for r in rs) / 2 ** 20
        diff = max(abs(a - b) / max(1.0, abs(b)) for r in rs
                   for a, b in zip(r["grad"], reference))
        limit = 1e-12 if v.startswith("easyad") else 1e-9
        mark = "" if diff <= limit else " (DISAGREES)"
        extra = f" (compile {statistics.median(r['compile'] for r in rs):.2f} s)" \
            if "compile" in rs[0] else ""
        print(f"| {v} | {q1:.2f} / {med:.2f} / {q3:.2f}{extra} | {peak:.1f} | {tape:.2f} | "
              f"{diff:.1e}{mark} |")


if __name__ == "__main__":
    main()
