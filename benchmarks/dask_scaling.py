"""Batch gradients on dask (issue 29 item 6): Rosenbrock's gradient at B rows of n inputs,
computed by F.gradient on a numpy batch in one process (easyad's own row threads), on dask's
threaded scheduler, and on a LocalCluster of 1 and 2 worker processes (one thread each),
the rows made on the workers and the results kept there (persist), so that what is timed
is the computation and its scheduling, not moving 8*B*n bytes to and from the client.
Then the overhead per task: many tiny chunks, the time per task.

    python benchmarks/dask_scaling.py [--n 100] [--batch 1000000] [--chunk 50000]
        [--threads T] [--write benchmarks/results/dask.md]

``--threads T`` gives every process (the one-process batch and each worker) T threads
(``EASYAD_NUM_THREADS``): on a machine of at least 2T cores, 2 workers then have cores
the first does not use, and the table shows scaling. Without it, every process uses
every core (a worker per machine is then the right layout).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np


def rosen(x):
    return sum(100.0 * (x[i + 1] - x[i] ** 2) ** 2 + (1.0 - x[i]) ** 2
               for i in range(len(x) - 1))


def fresh(client, make):
    """Compute make() on the cluster, the results kept there. The Function is scattered
    again first (a few kB, the workers keep the loaded one): new keys, so that this repeat
    computes rather than finding the last one's results."""
    from distributed import wait

    from easyad import distributed
    distributed._SCATTERED.clear()
    wait(client.persist(make()))


def best(run, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--write", default=None)
    a = parser.parse_args()
    env = {} if a.threads is None else {"EASYAD_NUM_THREADS": str(a.threads)}
    os.environ.update(env)         # this process's batch too (read at import of easyad)
    import warnings

    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import easyad as ad
    from easyad import _pool

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        F = ad.record(rosen, np.zeros(a.n)).compile()
    rows = []
    X = da.random.default_rng(0).random((a.batch, a.n), chunks=(a.chunk, a.n))
    XN = X.compute()
    t_numpy = best(lambda: F.gradient(XN), a.repeats)   # noqa: F821 (ruff misreads the del)
    rows.append(("numpy batch, one process (easyad's row threads)", t_numpy, "-"))
    t_threads = best(lambda: F.gradient(X).persist(scheduler="threads"), a.repeats)
    rows.append(("dask threaded scheduler", t_threads, len(X.chunks[0])))
    del XN
    for workers in (1, 2):
        cluster = LocalCluster(n_workers=workers, processes=True, threads_per_worker=1,
                               dashboard_address=None, silence_logs=50, env=env)
        with Client(cluster) as client:
            Xc = client.persist(X)
            wait(Xc)
            wait(client.persist(F.gradient(Xc[: a.chunk])))     # loads and compiles once
            t = best(lambda: fresh(client, lambda: F.gradient(Xc)), a.repeats)  # noqa: B023
            rows.append((f"LocalCluster, {workers} worker process{'es' * (workers > 1)}",
                         t, len(Xc.chunks[0])))
            if workers == 2:   # overhead per task: 400 chunks of 10 rows
                tiny = client.persist(da.random.default_rng(1).random((4000, a.n),
                                                                      chunks=(10, a.n)))
                wait(tiny)
                t_tiny = best(lambda: fresh(client, lambda: F.gradient(tiny)), a.repeats)  # noqa: B023
        cluster.close()
    one = rows[2][1]
    lines = [f"Rosenbrock n = {a.n}, B = {a.batch:,} rows, chunks of {a.chunk:,} rows; "
             f"best of {a.repeats}; {os.cpu_count()} cores; "
             f"{_pool.CORES} threads per process; compiled: {F.compiled}.", "",
             "| how | seconds | tasks | rows/s |", "|---|---|---|---|"]
    for name, t, tasks in rows:
        lines.append(f"| {name} | {t:.3f} | {tasks} | {a.batch / t:,.0f} |")
    lines += ["", f"2 workers vs 1: speed-up {one / rows[3][1]:.2f}x.",
              f"Overhead per task (400 chunks of 10 rows on 2 workers): "
              f"{t_tiny / 400 * 1e3:.2f} ms."]
    text = "\n".join(lines)
    print(text)
    if a.write:
        with open(a.write, "w") as out:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            out.write(f"# Batch gradients on dask: Rosenbrock n = {a.n}, B = {a.batch:,}\n\n"
                      f"- date: {stamp}\n- machine: {os.cpu_count()} CPUs\n"
                      f"- command: `python benchmarks/dask_scaling.py --n {a.n} "
                      f"--batch {a.batch} --chunk {a.chunk}"
                      + (f" --threads {a.threads}" if a.threads else "")
                      + f" --write {a.write}`\n\n{text}\n")


if __name__ == "__main__":
    main()
