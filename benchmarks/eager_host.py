"""Host cost of eager OpenCL tensor operations (issue 30): microseconds per tiny MLP SGD
step (784-H-10, H=16, B=8 by default: device time negligible, so this is the Python and
driver-call cost per step) and per small op (x * 1.0001 on 1,000 floats), as wall time
and as CPU time of the calling thread (what the host spends, without a CPU device's
worker threads: steadier on a loaded machine), with Python calls (cProfile), kernel
launches and pyopencl Array constructions per step counted.

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


def _best_us(call, repeat, rounds=7):
    """(best wall, best calling-thread CPU) microseconds per call over ``rounds``."""
    call()
    wall = cpu = float("inf")
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(repeat):
            call()
        cpu = min(cpu, (time.thread_time() - start_cpu) / repeat)
        wall = min(wall, (time.perf_counter() - start) / repeat)
    return wall * 1e6, cpu * 1e6


def _launches(call):
    """Kernel launches and pyopencl Array constructions in one ``call()``."""
    import pyopencl as cl
    import pyopencl.array as cl_array
    from easyad.tensor import _opencl
    counts = [0, 0]
    kernel_call, enqueue, init = cl.Kernel.__call__, _opencl._enqueue, cl_array.Array.__init__

    def counted_kernel(self, *args, **kwargs):
        counts[0] += 1
        return kernel_call(self, *args, **kwargs)

    def counted_enqueue(*args, **kwargs):
        counts[0] += 1
        return enqueue(*args, **kwargs)

    def counted_init(self, *args, **kwargs):
        counts[1] += 1
        return init(self, *args, **kwargs)
    cl.Kernel.__call__, _opencl._enqueue, cl_array.Array.__init__ = \
        counted_kernel, counted_enqueue, counted_init
    try:
        call()
    finally:
        cl.Kernel.__call__, _opencl._enqueue, cl_array.Array.__init__ = \
            kernel_call, enqueue, init
    return counts


def _counts(call, repeat):
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(repeat):
        call()
    profile.disable()
    stats = pstats.Stats(profile)
    return sum(v[1] for v in stats.stats.values()) / repeat, stats


def main(hidden=16, batch=8, profile=False):
    device = bench_gpu._device()
    if device is None:
        print("no OpenCL device (EASYAD_GPU_BENCH=any)")
        return
    queue = device.backend.queue
    mlp = bench_gpu.EagerMLP(device, hidden, batch)
    x, y, step = mlp.x, mlp.y, mlp.step

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
    step_wall, step_cpu = (v / 10 for v in _best_us(steps, 5))
    op_wall, op_cpu = (v / 100 for v in _best_us(small_ops, 5))
    calls, stats = _counts(step, 50)
    op_calls = _counts(small_ops, 5)[0] / 100
    launches, arrays = _launches(step)
    print(f"device: {device.name} ({device.description})")
    print(f"eager MLP step 784-{hidden}-10 B={batch}: {step_wall:.0f} us wall, "
          f"{step_cpu:.0f} us host CPU per step; per step {calls:.0f} Python calls, "
          f"{launches} launches, {arrays} pyopencl Array constructions")
    print(f"small op x * 1.0001 (1,000 floats): {op_wall:.1f} us wall, {op_cpu:.1f} us host "
          f"CPU per op, {op_calls:.1f} Python calls per op")
    torch_us = _torch_step_us(x, y, hidden)
    if torch_us is not None:
        print(f"PyTorch {torch_us[0]}: {torch_us[1]:.0f} us wall per step (10 steps, one "
              f"read); easyad eager / PyTorch = {step_wall / torch_us[1]:.2f}x")
    if profile:
        stats.sort_stats("tottime").print_stats(25)


def _torch_step_us(x, y, hidden):
    """(device, us per step) of the same step in PyTorch, on CUDA where there is one."""
    try:
        import torch
    except ImportError:
        return None
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.Tanh(),
                                torch.nn.Linear(hidden, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tx, ty = torch.tensor(x, device=dev), torch.tensor(y, device=dev)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss

    def steps():
        for _ in range(9):
            step()
        step().item()
    return dev, _best_us(steps, 5)[0] / 10


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--profile"]
    main(*map(int, args[:2]), profile="--profile" in sys.argv)
