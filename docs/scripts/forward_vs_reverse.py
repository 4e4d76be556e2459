"""Measure the cost of a full Jacobian in forward and in reverse mode; plot the crossover.

One generic function f: R^n -> R^m (written once against the Numeric protocol), its
Jacobian computed two ways:

- forward mode: n passes of f on Traces, pass j seeding input j (column j of J);
- reverse mode: f recorded once on a WengertList, then m backward sweeps (row i of J).

Each pass or sweep costs about as much as f itself (its length L grows with n + m), so
theory predicts forward ~ n L, reverse ~ L + m L: forward wins when n < m, reverse when
n > m, and t_forward / t_reverse grows like n / m. The script measures it (best of several
timings, both Jacobians checked against each other) and writes
docs/images/forward_vs_reverse.png. Runtime: well under a minute.

    .venv/bin/python docs/scripts/forward_vs_reverse.py [--output PATH]
"""
from __future__ import annotations

import argparse
import pathlib
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import easyad as ad  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE.parent / "images" / "forward_vs_reverse.png"
SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
FIXED = 16  # the other dimension in the two sweeps of one dimension


def f(x, m):
    """R^n -> R^m, generic: a shared part over all inputs, then m outputs that reuse it."""
    n = len(x)
    s = 0.0
    for i in range(n):
        s = s + ad.sin(x[i]) * x[(i + 1) % n]
    h = ad.tanh(s)
    return [ad.exp(h * (j + 1) / m) * x[j % n] for j in range(m)]


def jacobian_forward(x0, m):
    n = len(x0)
    J = np.empty((m, n))
    for j in range(n):  # one pass per input
        x = [ad.Trace(v, 1.0 if k == j else 0.0) for k, v in enumerate(x0)]
        J[:, j] = [y.derivative for y in f(x, m)]
    return J


def jacobian_reverse(x0, m):
    lst = ad.WengertList()
    x = [lst.variable(v) for v in x0]
    ys = f(x, m)  # one recording
    J = np.empty((m, len(x0)))
    for i, y in enumerate(ys):  # one backward sweep per output
        d = y.derivatives()
        J[i] = [d[v] for v in x]
    return J


def best_time(fn, budget=0.02, repeats=5):
    """Best per-call seconds over `repeats` timings of about `budget` seconds each."""
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget / 4 or calls == 0:
        fn()
        calls += 1
    per = max(1, int(calls * 4 * budget / max(budget, time.perf_counter() - start) / 4))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per):
            fn()
        best = min(best, (time.perf_counter() - t0) / per)
    return best


def measure(n, m, rng):
    x0 = list(rng.uniform(-1.0, 1.0, n))
    Jf, Jr = jacobian_forward(x0, m), jacobian_reverse(x0, m)
    np.testing.assert_allclose(Jf, Jr, rtol=1e-12, atol=1e-12)
    return (best_time(lambda: jacobian_forward(x0, m)),
            best_time(lambda: jacobian_reverse(x0, m)))


def tape_length(n, m):
    """L: the operations of one evaluation of f (entries of its recording)."""
    lst = ad.WengertList()
    f([lst.variable(0.5) for _ in range(n)], m)
    return len(lst)


def fit(rows):
    """Least-squares constants (relative error) of the cost model from the measured
    (n, m, L, t_fwd, t_rev): forward = a n L (n passes over L operations), reverse =
    b L + m (s + c L + r n) (one recording, then m sweeps over L entries, each with a fixed
    cost s and n reads d[x_j] of a row of J), and L = l0 + l1 n + l2 m."""
    n, m, L, tf, tr = (np.array(col, dtype=float) for col in zip(*rows))
    a = np.sum(n * L / tf) / np.sum((n * L / tf) ** 2)  # min sum (a n L / tf - 1)^2
    A = np.column_stack([L / tr, m / tr, m * L / tr, m * n / tr])
    (b, s, c, r), *_ = np.linalg.lstsq(A, np.ones_like(tr), rcond=None)
    length, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(n), n, m]), L, rcond=None)
    return a, b, s, c, r, length


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=pathlib.Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    started = time.perf_counter()
    rows = [(n, m, tape_length(n, m), *measure(n, m, rng)) for n in SIZES for m in SIZES]
    at = {(n, m): (L, tf, tr) for n, m, L, tf, tr in rows}
    a, b, s, c, r, (l0, l1, l2) = fit(rows)

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    grid = np.geomspace(SIZES[0], SIZES[-1], 100)
    for ax, axis in ((axes[0], "n"), (axes[1], "m")):
        keys = [(s, FIXED) if axis == "n" else (FIXED, s) for s in SIZES]
        ax.loglog(SIZES, [1e3 * at[k][1] for k in keys], "o", color="C0",
                  label="forward, measured: n Trace passes")
        ax.loglog(SIZES, [1e3 * at[k][2] for k in keys], "s", color="C1",
                  label="reverse, measured: 1 recording + m sweeps")
        nn = grid if axis == "n" else np.full_like(grid, FIXED)
        mm = grid if axis == "m" else np.full_like(grid, FIXED)
        L = l0 + l1 * nn + l2 * mm
        ax.loglog(grid, 1e3 * a * nn * L, "-", color="C0", lw=1, label="model: a n L")
        ax.loglog(grid, 1e3 * (b * L + mm * (s + c * L + r * nn)), "-", color="C1", lw=1,
                  label="model: b L + m (s + c L + r n)")
        other = "m" if axis == "n" else "n"
        ax.set_xlabel(f"{axis} ({'inputs' if axis == 'n' else 'outputs'}), {other} = {FIXED}")
        ax.set_ylabel("ms per full Jacobian")
        ax.set_title(f"cost against {axis}, {other} = {FIXED}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)

    ax = axes[2]
    for won, marker, color, label in ((True, "o", "C0", "forward faster (measured)"),
                                      (False, "s", "C1", "reverse faster (measured)")):
        pts = [(m, n) for n, m, _, tf, tr in rows if (tf < tr) == won]
        if pts:
            ax.loglog(*zip(*pts), marker, color=color, label=label, ms=7)
    M, N = np.meshgrid(grid, grid)
    L = l0 + l1 * N + l2 * M
    ratio = a * N * L / (b * L + M * (s + c * L + r * N))  # t_forward / t_reverse, predicted
    ax.contour(M, N, ratio, levels=[1.0], colors="black", linewidths=1.2)
    ax.plot([], [], "-", color="black", lw=1.2, label="theory: t_forward = t_reverse")
    ax.loglog(grid, grid, ":", color="grey", lw=1, label="n = m (equal unit costs)")
    ax.set_xlim(SIZES[0] / 1.3, SIZES[-1] * 1.3)
    ax.set_ylim(SIZES[0] / 1.3, SIZES[-1] * 1.3)
    ax.set_xlabel("m (outputs)")
    ax.set_ylabel("n (inputs)")
    ax.set_title("which mode wins, and the predicted crossover")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", framealpha=0.95)

    fig.suptitle("easyad: full Jacobian of one generic f: R^n -> R^m in forward and reverse "
                 "mode (measured; L = operations of f)", fontsize=12)
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=100)
    print(f"wrote {args.output} in {time.perf_counter() - started:.0f} s; model constants: "
          f"a = {1e9 * a:.1f} ns (an operation of a Trace pass), b = {1e9 * b:.1f} ns "
          f"(an operation recorded), c = {1e9 * c:.1f} ns (an entry of a sweep), "
          f"s = {1e9 * s:.0f} ns (a sweep's fixed cost), r = {1e9 * r:.1f} ns (a read); "
          f"L = {l0:.1f} + {l1:.2f} n + "
          f"{l2:.2f} m")
    for n, m, L, tf, tr in rows:
        print(f"n={n:4d} m={m:4d} L={L:5d} forward {1e3 * tf:9.3f} ms "
              f"reverse {1e3 * tr:9.3f} ms ratio {tf / tr:8.3f}")


if __name__ == "__main__":
    main()
