"""Eager conv2d and max_pool2d, forward and forward+backward: easyad against torch on the
CPU with the same number of threads, interleaved.

    python benchmarks/conv.py [--threads 2] [--rounds 9] [--dtype float32]

The case of issue 28: batch 64, 32 channels in and out, 28x28, 3x3 kernel, padding 1
(and bias); max_pool2d 2x2 on the same input. Each round times every (case, library) pair
once per call, in turn, so a load that comes and goes reaches both libraries alike; the
table gives per pair the median and quartiles over rounds of wall time in milliseconds,
and the ratio of the medians (easyad / torch). easyad: ``nn.functional`` on a fresh
WengertList per call (forward: constant tensors); torch: leaves made once, ``.grad``
cleared. The thread count is set for both before numpy is imported (OpenBLAS's
``OPENBLAS_NUM_THREADS``, ``torch.set_num_threads``). The load average is printed: on a
machine shared with other jobs the figures move by tens of percent between runs.
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    _args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _args.add_argument("--threads", type=int, default=2)
    _args.add_argument("--rounds", type=int, default=9)
    _args.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ARGS = _args.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)        # before numpy starts its BLAS

import numpy as np  # noqa: E402

import _interleaved  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)


def _cases(dtype: str) -> dict[str, dict[str, object]]:
    import torch
    import torch.nn.functional as TF

    import easyad as ad
    from easyad import nn

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32, 28, 28)).astype(dtype)
    w = (rng.normal(size=(32, 32, 3, 3)) / 17.0).astype(dtype)
    b = rng.normal(size=32).astype(dtype)
    g = rng.normal(size=(64, 32, 28, 28)).astype(dtype)
    gp = rng.normal(size=(64, 32, 14, 14)).astype(dtype)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    tg, tgp = torch.tensor(g), torch.tensor(gp)
    cx, cw, cb = (ad.Tensor.constant(a) for a in (x, w, b))
    F = nn.functional

    def ours_conv() -> None:
        F.conv2d(cx, cw, cb, padding=1)

    def ours_conv_grad() -> None:
        lst = ad.WengertList()
        X, W, B = (ad.Tensor.variable(a, lst) for a in (x, w, b))
        ad.sum(F.conv2d(X, W, B, padding=1) * g).derivatives()

    def ours_pool() -> None:
        F.max_pool2d(cx, 2)

    def ours_pool_grad() -> None:
        lst = ad.WengertList()
        X = ad.Tensor.variable(x, lst)
        ad.sum(F.max_pool2d(X, 2) * gp).derivatives()

    def torch_conv() -> None:
        with torch.no_grad():
            TF.conv2d(tx, tw, tb, padding=1)

    def torch_conv_grad() -> None:
        for t in (tx, tw, tb):
            t.grad = None
        TF.conv2d(tx, tw, tb, padding=1).backward(tg)

    def torch_pool() -> None:
        with torch.no_grad():
            TF.max_pool2d(tx, 2)

    def torch_pool_grad() -> None:
        tx.grad = None
        TF.max_pool2d(tx, 2).backward(tgp)

    return {"conv2d forward": {"easyad": ours_conv, "torch": torch_conv},
            "conv2d forward+backward": {"easyad": ours_conv_grad, "torch": torch_conv_grad},
            "max_pool2d forward": {"easyad": ours_pool, "torch": torch_pool},
            "max_pool2d forward+backward": {"easyad": ours_pool_grad,
                                            "torch": torch_pool_grad}}


def main() -> None:
    import torch
    torch.set_num_threads(ARGS.threads)
    cases = _cases(ARGS.dtype)
    times = _interleaved.measure(cases, ARGS.rounds)
    print(f"batch 64, 32 -> 32 channels, 28x28, 3x3, {ARGS.dtype}, {ARGS.threads} thread(s), "
          f"{ARGS.rounds} rounds; {_interleaved.load()}; torch {torch.__version__}, "
          f"numpy {np.__version__}\n")
    print("\n".join(_interleaved.easyad_vs_torch(cases, times)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
