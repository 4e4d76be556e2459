"""Host cost of eager OpenCL tensor operations (issue 30): microseconds per tiny MLP SGD
step (784-H-10, H=16, B=8 by default: device time negligible, so this is the Python and
driver-call cost per step) and per small op (x * 1.0001 on 1,000 floats), with Python
calls, kernel launches and buffer allocations per step counted by cProfile.

    EASYAD_GPU_BENCH=any python benchmarks/eager_host.py [H B] [--profile]
"""
from __future__ import annotations

import cProfile
import pstats
import sys
import time

import numpy as np

import bench_gpu
import easyad as ad
from easyad import nn, optim


def _best_us(call, repeat, rounds=7):
    call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            call()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e6


def _counts(call, repeat):
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(repeat):
        call()
    profile.disable()
    stats = pstats.Stats(profile)
    calls = sum(v[1] for v in stats.stats.values()) / repeat
    launches = sum(v[1] for k, v in stats.stats.items()
                   if "enqueue_nd_range_kernel" in k[2] or k[2].startswith("enqueue_knl")
                   ) / repeat
    arrays = sum(v[1] for k, v in stats.stats.items()
                 if k[0].endswith("pyopencl/array.py") and k[2] == "__init__") / repeat
    return calls, launches, arrays, stats


def main(hidden=16, batch=8, profile=False):
    device = bench_gpu._device()
    if device is None:
        print("no OpenCL device (EASYAD_GPU_BENCH=any)")
        return
    queue = device.backend.queue
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    model = nn.Sequential(nn.Linear(784, hidden, dtype=np.float32), nn.Tanh(),
                          nn.Linear(hidden, 10, dtype=np.float32)).to(device.name)
    opt = optim.SGD(model.parameters(), lr=0.01)
    xt = ad.Tensor.constant(x, device=device.name, dtype=np.float32)

    def step():
        loss = nn.cross_entropy(model(xt, tape=ad.WengertList()), y)
        opt.step(loss.derivatives())
        return loss

    def steps():
        for _ in range(9):
            step()
        step().number     # one read: the queue drains
    t = ad.Tensor.constant(np.ones(1000, dtype=np.float32), device=device.name,
                           dtype=np.float32)

    def small_ops():
        v = t
        for _ in range(100):
            v = v * 1.0001
        queue.finish()
    step_us = _best_us(steps, 5) / 10
    op_us = _best_us(small_ops, 5) / 100
    calls, launches, arrays, stats = _counts(step, 50)
    op_calls = _counts(small_ops, 5)[0] / 100
    print(f"device: {device.name} ({device.description})")
    print(f"eager MLP step 784-{hidden}-10 B={batch}: {step_us:.0f} us per step; per step "
          f"{calls:.0f} Python calls, {launches:.0f} launches, {arrays:.0f} pyopencl "
          f"Array constructions")
    print(f"small op x * 1.0001 (1,000 floats): {op_us:.1f} us per op, {op_calls:.1f} "
          f"Python calls per op")
    if profile:
        stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--profile"]
    main(*map(int, args[:2]), profile="--profile" in sys.argv)
