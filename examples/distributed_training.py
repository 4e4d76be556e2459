"""Data-parallel training on dask.distributed: a small MLP's squared-error loss recorded
once (``ad.record`` of tensor code, at one shard's shapes), its gradient computed on the
dataset's shards by 2 worker processes of a ``LocalCluster`` (the recording sent to each
worker once, as its program), summed by a tree of sums, and the SGD step taken on the
client. The same training in one process (the loss recorded on the whole dataset) must
end with the same parameters to 1e-10. Then the trained model's input gradients for
every example, a ``TensorFunction`` of one example over the rows as a dask array (one
task per chunk), equal to the numpy batch's bit for bit. docs/distributed.md.

    python examples/distributed_training.py [--steps 30] [--shards 8] [--workers 2]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import easyad as ad


def loss(p, x, y):
    h = ad.tanh(x @ p["w1"] + p["b1"])
    return ad.sum((h @ p["w2"] + p["b2"] - y) ** 2)


def prediction(x, p):
    """The model's output for one example x (4,)."""
    return ad.sum(ad.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"])


def init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"w1": rng.normal(size=(4, 16)) / 2, "b1": np.zeros(16),
            "w2": rng.normal(size=(16, 1)) / 4, "b2": np.zeros(1)}


def sgd(p, g, lr):
    return {k: p[k] - lr * g[k] for k in p}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="rows per shard")
    parser.add_argument("--workers", type=int, default=2)
    a = parser.parse_args(argv)
    import dask.array as da
    from distributed import Client, LocalCluster

    from easyad.distributed import shard_value_and_gradient

    rng = np.random.default_rng(0)
    n = a.shards * a.rows
    x = rng.normal(size=(n, 4))
    y = np.sin(x[:, :1] + x[:, 1:2]) * x[:, 2:3] + 0.1 * rng.normal(size=(n, 1))
    p0, lr = init(rng), 2e-4     # a sum over all rows: a small step
    on_shard = ad.record(loss, p0, x[:a.rows], y[:a.rows])
    X = da.from_array(x, chunks=(a.rows, 4))
    Y = da.from_array(y, chunks=(a.rows, 1))

    cluster = LocalCluster(n_workers=a.workers, processes=True, threads_per_worker=1,
                           dashboard_address=None, silence_logs=50)
    with Client(cluster):
        p = p0
        start = time.perf_counter()
        for step in range(a.steps):
            value, g = shard_value_and_gradient(on_shard, p, X, Y).compute()
            p = sgd(p, g, lr)
            if step % 10 == 0 or step == a.steps - 1:
                print(f"step {step:3d}  loss {value:.6f}")
        took = time.perf_counter() - start
        # the trained model's sensitivity to each example's inputs, d prediction / d x,
        # for every row on the workers: a TensorFunction of one example, X's chunks its
        # batches (one task each), the parameters shipped once as a shared argument
        at = ad.record(prediction, x[0], p)
        S = at.gradient(X, p)                          # lazy (n, 4)
        sensitivities = S.compute()
    cluster.close()
    assert np.array_equal(sensitivities, at.gradient(x, p))      # the numpy batch's
    print(f"input sensitivities of {n} examples on the workers ({S.numblocks[0]} tasks), "
          f"mean |d prediction / d x| {np.abs(sensitivities).mean(axis=0).round(3)}")

    whole = ad.record(loss, p0, x, y)           # one process, the whole dataset
    q = p0
    for _ in range(a.steps):
        q = sgd(q, whole.gradient(q, x, y), lr)
    worst = max(float(np.max(np.abs(p[k] - q[k]))) for k in p)
    print(f"{a.steps} steps on {a.workers} workers, {a.shards} shards: {took:.2f} s; "
          f"largest difference from one process {worst:.1e}")
    assert worst < 1e-10, worst


if __name__ == "__main__":
    main()
