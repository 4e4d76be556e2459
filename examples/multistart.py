"""A parallel sweep on dask.distributed: multi-start optimisation, many
``scipy.optimize.minimize`` runs (trust-region Newton) from random starts, each given
easyad's gradient and Hessian from one recording of the objective. The recording is
scattered once to the workers (it pickles as its tape, checked on arrival); each task
runs a block of starts. The minima found must be those of the same runs in one process,
bit for bit. docs/distributed.md.

    python examples/multistart.py [--starts 1000] [--per-task 50] [--workers 2]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import easyad as ad


def objective(x):
    # a Rosenbrock valley with ripples: many local minima
    return sum(100.0 * (x[i + 1] - x[i] ** 2) ** 2 + (1.0 - x[i]) ** 2
               + 2.0 * ad.sin(3.0 * x[i]) ** 2 for i in range(len(x) - 1))


def run_starts(F, starts: np.ndarray) -> np.ndarray:
    """(value, x...) of the minimum reached from each start."""
    from scipy.optimize import minimize
    out = np.empty((len(starts), 1 + starts.shape[1]))
    for k, x0 in enumerate(starts):
        r = minimize(F, x0, jac=F.gradient, hess=F.hessian, method="trust-exact")
        out[k, 0], out[k, 1:] = r.fun, r.x
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=1000)
    parser.add_argument("--per-task", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--n", type=int, default=4)
    a = parser.parse_args(argv)
    from distributed import Client, LocalCluster

    F = ad.record(objective, np.zeros(a.n))
    starts = np.random.default_rng(0).uniform(-2.0, 2.0, size=(a.starts, a.n))
    blocks = [starts[k:k + a.per_task] for k in range(0, a.starts, a.per_task)]
    cluster = LocalCluster(n_workers=a.workers, processes=True, threads_per_worker=1,
                           dashboard_address=None, silence_logs=50)
    with Client(cluster) as client:
        shared = client.scatter(F, broadcast=True)           # once to each worker
        t = time.perf_counter()
        found = np.concatenate(client.gather(
            [client.submit(run_starts, shared, b, pure=False) for b in blocks]))
        took = time.perf_counter() - t
    cluster.close()
    best = found[np.argmin(found[:, 0])]
    print(f"{a.starts} starts on {a.workers} workers: {took:.2f} s; best minimum "
          f"{best[0]:.6g} at {np.round(best[1:], 6)}")
    check = blocks[:2]                                       # the same runs, here
    here = np.concatenate([run_starts(F, b) for b in check])
    assert np.array_equal(here, found[:len(here)]), "a worker's run differs"


if __name__ == "__main__":
    main()
