"""The gradient through a Newton solver: implicit (ad.custom_root) against unrolled, with
JAX's two ways (jax.lax.custom_root, and grad through the loop) in the same run.

    .venv-bench/bin/python benchmarks/implicit.py [--n 64 256] [--rounds 15] [--steps 10]

The problem: the steady state u of a 1-d reaction-diffusion equation, -u'' + k u^3 = s
(n unknowns, finite differences, Dirichlet ends), solved by Newton's method from u = 0
(``--steps`` iterations: converged to rounding at these sizes); the gradient of
``sum(grid * u^2)`` in the source s (n parameters). Variants:

- easyad implicit, dense / CG: ``ad.custom_root`` with the Newton solver on plain numpy
  (never differentiated); the derivative is one transposed solve, dense (``ad.jacobian``
  of the residual) or CG on jvps of it (matrix-free);
- easyad unrolled: ``ad.grad`` through the Newton iterations (``ad.linalg.solve``);
- jax custom_root / jax unrolled: the same two under ``jax.jit(jax.grad(...))``, compiled
  once before timing (JAX's fastest public path; float64 enabled).

Rounds interleave the variants (each timed over enough calls for ~0.2 s); the table shows
the median time per gradient and its quartiles over rounds, and, for easyad, the peak of
Python/numpy allocations during one gradient (tracemalloc: numpy reports its buffers to it)
and the tape's entries. JAX's memory is not measured (XLA's buffers are outside
tracemalloc). Prints a markdown table; the machine may be shared (say so by the figures).
"""
from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

import easyad as ad


def problem(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    h = 1.0 / (n + 1)
    lap = (2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)) / h**2
    grid = np.linspace(h, 1 - h, n)
    s = 400.0 * np.sin(np.pi * grid) + 50.0 * grid
    return lap, grid, s, 3.0


def easyad_variants(n: int, steps: int) -> dict[str, Callable[[], Any]]:
    lap, grid, s0, k = problem(n)

    def residual(u: Any, s: Any) -> Any:
        return lap @ u + k * u**3 - s

    def newton(r: Callable[[Any], Any], u: Any) -> Any:
        # the solver on plain numbers, the Jacobian by hand: what a user's solver would be
        for _ in range(steps):
            u = u - np.linalg.solve(lap + np.diag(3 * k * u**2), r(u))
        return u

    def implicit(method: str) -> Callable[[Any], Any]:
        def loss(s: Any) -> Any:
            u = ad.custom_root(residual, np.zeros(n), solve=newton, tangent_solve=method,
                               args=(s,))
            return ad.sum(grid * u * u)
        return loss

    def unrolled(s: Any) -> Any:
        u = 0.0 * s
        for _ in range(steps):
            u = u - ad.linalg.solve(lap + ad.diag(3 * k * u**2), residual(u, s))
        return ad.sum(grid * u * u)

    dense, cg, plain = ad.grad(implicit("dense")), ad.grad(implicit("cg")), ad.grad(unrolled)
    reference = plain(s0)
    for g in (dense, cg):
        assert np.allclose(g(s0), reference, rtol=1e-7, atol=1e-12), "the gradients differ"
    return {"easyad implicit (dense)": lambda: dense(s0),
            "easyad implicit (CG, matrix-free)": lambda: cg(s0),
            "easyad unrolled": lambda: plain(s0)}


def jax_variants(n: int, steps: int) -> dict[str, Callable[[], Any]]:
    try:
        import jax
    except ImportError:
        return {}
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    lap_np, grid_np, s_np, k = problem(n)
    lap, grid, s0 = jnp.asarray(lap_np), jnp.asarray(grid_np), jnp.asarray(s_np)

    def residual(u: Any, s: Any) -> Any:
        return lap @ u + k * u**3 - s

    def newton(r: Callable[[Any], Any], u: Any) -> Any:
        def body(_: Any, u: Any) -> Any:
            return u - jnp.linalg.solve(lap + jnp.diag(3 * k * u**2), r(u))
        return jax.lax.fori_loop(0, steps, body, u)

    def implicit(s: Any) -> Any:
        u = jax.lax.custom_root(lambda u: residual(u, s), jnp.zeros(n), newton,
                                lambda g, y: jnp.linalg.solve(jax.jacobian(g)(y), y))
        return jnp.sum(grid * u * u)

    def unrolled(s: Any) -> Any:
        u = newton(lambda u: residual(u, s), jnp.zeros(n))
        return jnp.sum(grid * u * u)

    out = {}
    for name, f in (("jax custom_root (jit)", implicit), ("jax unrolled (jit)", unrolled)):
        g = jax.jit(jax.grad(f))
        g(s0).block_until_ready()                       # compiled before timing
        out[name] = (lambda g=g: g(s0).block_until_ready())
    return out


def _per_call(f: Callable[[], Any], budget: float = 0.2) -> float:
    calls, start = 0, time.perf_counter()
    while True:
        f()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget:
            return elapsed / calls


def _peak(f: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _tape_entries(n: int, steps: int) -> dict[str, int]:
    """The entries each easyad variant records (the unrolled tape holds every step)."""
    lap, grid, s0, k = problem(n)
    counts = {}
    for name, method in (("easyad implicit (dense)", "dense"),
                         ("easyad implicit (CG, matrix-free)", "cg"), ("easyad unrolled", None)):
        lst = ad.WengertList()
        s = ad.Tensor.variable(s0, lst)
        if method is None:
            u = 0.0 * s
            for _ in range(steps):
                u = u - ad.linalg.solve(lap + ad.diag(3 * k * u**2), lap @ u + k * u**3 - s)
        else:
            u = ad.custom_root(lambda u, s: lap @ u + k * u**3 - s, np.zeros(n), args=(s,),
                               tangent_solve=method)
        ad.sum(grid * u * u)
        counts[name] = len(lst)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    for n in args.n:
        variants = {**easyad_variants(n, args.steps), **jax_variants(n, args.steps)}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, f in variants.items():
                times[name].append(_per_call(f))
        entries = _tape_entries(n, args.steps)
        base = statistics.median(times["easyad unrolled"])
        print(f"\n## n = {n}, {args.steps} Newton steps, {args.rounds} rounds\n")
        print("| variant | ms per gradient: median (quartiles) | vs easyad unrolled "
              "| peak memory | tape entries |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            med = statistics.median(ts)
            memory = f"{_peak(variants[name]) / 2**20:.2f} MiB" if name.startswith("easyad") \
                else "n/a"
            print(f"| {name} | {med * 1e3:.3f} ({q[0] * 1e3:.3f}-{q[2] * 1e3:.3f}) "
                  f"| {med / base:.2f}x | {memory} | {entries.get(name, '')} |")


if __name__ == "__main__":
    main()
