"""conv2d on an OpenCL device by both routes (im2col and the GEMM, ``ops/_conv_gemm_cl.py``;
a kernel per op, ``ops/_conv_cl.py``), forward and forward+backward, with torch beside
them (CUDA where it has a GPU, else the CPU).

    python benchmarks/conv_opencl.py [--device opencl:0] [--rounds 5] [--dtype float32]
                                     [--batch 64] [--groups 1]

The case of issue 28: batch 64, 32 channels in and out, 28x28, 3x3, padding 1, a bias.
Each round times every (case, route) pair once, in turn; the table gives the median and
quartiles of wall time in milliseconds over rounds, the device's queue finished (torch:
``cuda.synchronize``). easyad: ``nn.functional.conv2d`` on device tensors, the backward on
a fresh WengertList; the route forced by ``EASYAD_OPENCL_CONV``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--device", default=None,
                      help="an OpenCL device (default: the first that works)")
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args.add_argument("--batch", type=int, default=64)
    args.add_argument("--groups", type=int, default=1)
    a = args.parse_args()
    import torch
    import torch.nn.functional as TF

    import easyad as ad
    F = ad.nn.functional
    working = [d.name for d in ad.devices() if d.kind == "opencl"]
    if not (a.device or working):
        raise SystemExit("no working OpenCL device: python -m easyad devices says why")
    dev = a.device or working[0]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(a.batch, 32, 28, 28)).astype(a.dtype)
    w = (rng.normal(size=(32, 32 // a.groups, 3, 3)) / 17.0).astype(a.dtype)
    b = rng.normal(size=32).astype(a.dtype)
    g = rng.normal(size=(a.batch, 32, 28, 28)).astype(a.dtype)
    cx, cw, cb, cg = (ad.Tensor.constant(v, device=dev) for v in (x, w, b, g))
    kw = {"padding": 1, "groups": a.groups}

    def forward() -> None:
        y = F.conv2d(cx, cw, cb, **kw)
        y.device.backend.queue.finish()

    def backward() -> None:
        lst = ad.WengertList()
        X, W, B = (ad.Tensor.variable(v, lst, device=dev) for v in (x, w, b))
        ad.sum(F.conv2d(X, W, B, **kw) * cg).derivatives()
        cx.device.backend.queue.finish()      # (one queue: every result is done)

    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    tx, tw, tb = (torch.tensor(v, device=tdev, requires_grad=True) for v in (x, w, b))
    tg = torch.tensor(g, device=tdev)
    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)

    def t_forward() -> None:
        with torch.no_grad():
            TF.conv2d(tx, tw, tb, **kw)
        sync()

    def t_backward() -> None:
        for t in (tx, tw, tb):
            t.grad = None
        TF.conv2d(tx, tw, tb, **kw).backward(tg)
        sync()

    pairs = {(c, r): f for r in ("gemm", "direct")
             for c, f in (("forward", forward), ("forward+backward", backward))}
    pairs.update({("forward", f"torch {tdev}"): t_forward,
                  ("forward+backward", f"torch {tdev}"): t_backward})
    times: dict[tuple[str, str], list[float]] = {}
    for k, fn in pairs.items():           # warm up: kernel builds, plans, allocations
        os.environ["EASYAD_OPENCL_CONV"] = k[1]
        fn()
    for _ in range(a.rounds):
        for k, fn in pairs.items():
            os.environ["EASYAD_OPENCL_CONV"] = k[1]
            start = time.perf_counter()
            fn()
            times.setdefault(k, []).append(1e3 * (time.perf_counter() - start))
    load = os.getloadavg()
    print(f"conv2d batch {a.batch}, 32 -> 32 channels (groups {a.groups}), 28x28, 3x3, "
          f"padding 1, {a.dtype}, device {dev}, {a.rounds} rounds; load average "
          f"{load[0]:.1f}; torch {torch.__version__} on {tdev}\n")
    print("| case | route | ms (q1, median, q3) |")
    print("|---|---|---|")
    for (case, route), ms in times.items():
        q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
        print(f"| {case} | {route} | {q[0]:.2f}, **{q[1]:.2f}**, {q[2]:.2f} |")


if __name__ == "__main__":
    main()
