"""Where a GPU step's time goes: cProfile of easyad's eager and replayed MLP steps and of
small operations on the first OpenCL GPU (``EASYAD_GPU_BENCH=any``: any OpenCL device),
the top functions by own time. A diagnostic for issue 30, run by ``benchmarks/gpu.sh run``
after the benchmarks; it prints only.

    python benchmarks/gpu_profile.py [H B]
"""
from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import numpy as np

import bench_gpu
import easyad as ad
from easyad import nn


def _report(title, call, repeat):
    call()
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    wall = (time.perf_counter() - start) / repeat
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(repeat):
        call()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(14)
    body = out.getvalue().split("Ordered by")[-1]
    print(f"\n## {title}: {wall * 1e3:.3f} ms per call (unprofiled), {repeat} calls profiled"
          f"\n{body}", flush=True)


def main(hidden=1024, batch=1024):
    device = bench_gpu._device()
    if device is None:
        print("no OpenCL GPU (EASYAD_GPU_BENCH=any for any OpenCL device)")
        return
    queue = device.backend.queue
    mlp = bench_gpu.EagerMLP(device, hidden, batch)
    model, x, y, xt = mlp.model, mlp.x, mlp.y, mlp.xt

    def eager_step():
        return mlp.step().number
    _report(f"eager MLP step H={hidden} B={batch}, loss read", eager_step, 20)

    def forward_only():
        model(xt, tape=None)
        queue.finish()
    _report(f"eager MLP forward H={hidden} B={batch}, no tape", forward_only, 20)

    named = dict(model.named_parameters())
    onehot = np.eye(10, dtype=np.float32)[y]

    def loss_of(params, xs, ys):
        return nn.functional.cross_entropy(nn.functional_call(model, params, xs), ys)
    replayed = ad.record(loss_of, {k: p.data.copy() for k, p in named.items()}, x, onehot,
                         device=device.name)
    onehot_t = ad.Tensor.constant(onehot, device=device.name, dtype=np.float32)
    _report(f"replayed MLP sgd_step H={hidden} B={batch} (batch on the device)",
            lambda: replayed.sgd_step(named, xt, onehot_t, lr=0.01), 20)

    t = ad.Tensor.constant(np.ones(1000, dtype=np.float32), device=device.name,
                           dtype=np.float32)

    def small_ops():
        y = t
        for _ in range(100):
            y = y * 1.0001
        queue.finish()
    _report("100 small ops (x * 1.0001, 1,000 values)", small_ops, 20)


if __name__ == "__main__":
    main(*map(int, sys.argv[1:3]))
