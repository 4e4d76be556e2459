"""TensorFunction batches with matmul steps on an OpenCL device: one batched program
(each matmul step one product for all the points) against one replay per point (what
such a program did before) and the numpy device's batch.

    .venv/bin/python benchmarks/batch_cl_matmul.py [--device opencl:0] [--points 200 1000]
        [--n 64] [--rounds 5]

f(x) = sum(tanh(x @ W1) @ W2), x in R^n, W1 and W2 n x n constants: value and gradient
at B points (``F.value_and_gradient(X)``, X of shape (B, n)). "per point" is the
fallback path of a program that does not batch (``batch_cl.batched`` made to say no).
Each variant is timed after a warm-up call, the median of ``--rounds`` rounds; the
machine may be shared (say so by the figures). Prints a markdown table.
"""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

import _interleaved  # benchmarks/ is on sys.path: the script's folder
import easyad as ad
from easyad.compiler.program import batch_cl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="opencl:0")
    parser.add_argument("--points", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = args.n
    W1, W2 = rng.normal(size=(n, n)) / np.sqrt(n), rng.normal(size=(n, n)) / np.sqrt(n)

    def f(x: Any) -> Any:
        return ad.sum(ad.tanh(x @ W1) @ W2)
    F = ad.record(f, np.ones(n), tensor=True, device=args.device)
    G = ad.record(f, np.ones(n), tensor=True)
    print(f"| B | batched OpenCL | one replay per point | numpy device | per point / batched "
          f"| numpy / batched |  ({args.device}, n = {n})")
    print("|---|---|---|---|---|---|")
    for count in args.points:
        X = rng.normal(size=(count, n))
        batched = _interleaved.median(lambda X=X: F.value_and_gradient(X), args.rounds)
        want = G.value_and_gradient(X)
        got = F.value_and_gradient(X)
        assert all(np.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in zip(got, want))
        original = batch_cl.batched
        batch_cl.batched = lambda fused: None
        try:
            per_point = _interleaved.median(lambda X=X: F.value_and_gradient(X),
                                max(1, args.rounds // 2))
        finally:
            batch_cl.batched = original
        numpy = _interleaved.median(lambda X=X: G.value_and_gradient(X), args.rounds)
        print(f"| {count} | {batched * 1e3:.2f} ms | {per_point * 1e3:.1f} ms | "
              f"{numpy * 1e3:.2f} ms | {per_point / batched:.1f}x | {numpy / batched:.2f}x |")


if __name__ == "__main__":
    main()
