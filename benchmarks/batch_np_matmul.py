"""TensorFunction batches with matmul steps on the numpy device: the step-wise batched
program (each run of C steps one loop over the points, each matmul step one product for
the batch: ``compiler/program/batch_np.py``) against one replay per point (what such a
program did before) and ``torch.func.vmap(grad_and_value)`` on the CPU, the same threads.

    .venv/bin/python benchmarks/batch_np_matmul.py [--points 2000] [--n 64] [--rounds 7]
        [--threads 1]

f(x) = sum(tanh(tanh(x @ W1) @ W2)), x in R^n, W1 and W2 n x n constants: value and
gradient at B points (``F.value_and_gradient(X)``, X of shape (B, n)). ``--threads``
limits numpy's BLAS (threadpoolctl), easyad's batch threads and torch's intra-op threads
alike. "per point" is the fallback path (``batch_np.batched`` made to say no). Each
variant is timed after a warm-up call, the median of ``--rounds`` rounds; the machine may
be shared (say so by the figures). Prints a markdown table.
"""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import threadpoolctl

import _interleaved  # benchmarks/ is on sys.path: the script's folder
import easyad as ad
from easyad import _pool
from easyad.compiler.program import batch_np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="+", default=[2000])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    threadpoolctl.threadpool_limits(args.threads)
    _pool.CORES = args.threads
    rng = np.random.default_rng(0)
    n = args.n
    W1, W2 = rng.normal(size=(n, n)) / np.sqrt(n), rng.normal(size=(n, n)) / np.sqrt(n)

    def f(x: Any) -> Any:
        return ad.sum(ad.tanh(ad.tanh(x @ W1) @ W2))
    F = ad.record(f, np.ones(n), tensor=True)
    try:
        import torch
        import torch.func as tf
        torch.set_num_threads(args.threads)
        T1, T2 = torch.tensor(W1), torch.tensor(W2)
        vg = tf.vmap(tf.grad_and_value(
            lambda x: torch.sum(torch.tanh(torch.tanh(x @ T1) @ T2))))
    except ImportError:
        torch = None
    print(f"| B | batched | one replay per point | torch.func.vmap | per point / batched "
          f"| torch / batched |  (numpy device, n = {n}, {args.threads} thread(s))")
    print("|---|---|---|---|---|---|")
    for count in args.points:
        X = rng.normal(size=(count, n))
        batched = _interleaved.median(lambda X=X: F.value_and_gradient(X), args.rounds)
        got = F.value_and_gradient(X)
        original = batch_np.batched
        batch_np.batched = lambda fused: None
        try:
            want = F.value_and_gradient(X)
            per_point = _interleaved.median(lambda X=X: F.value_and_gradient(X),
                                            max(1, args.rounds // 2))
        finally:
            batch_np.batched = original
        for a, b in zip(got, want):
            assert np.allclose(a, b, rtol=1e-12, atol=1e-12 * np.abs(b).max())
        line = f"| {count} | {batched * 1e3:.2f} ms | {per_point * 1e3:.1f} ms | "
        if torch is not None:
            x = torch.tensor(X)
            grads, values = vg(x)
            assert np.allclose(grads.numpy(), got[1], rtol=1e-10, atol=1e-12)
            ref = _interleaved.median(lambda x=x: vg(x), args.rounds)
            line += f"{ref * 1e3:.2f} ms | {per_point / batched:.1f}x | {ref / batched:.2f}x |"
        else:
            line += f"- | {per_point / batched:.1f}x | - |"
        print(line)


if __name__ == "__main__":
    main()
