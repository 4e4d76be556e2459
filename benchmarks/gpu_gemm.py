"""The OpenCL matmul kernels against each other and against PyTorch on CUDA, at the
products of an MLP step (issue 30): old = the 64x64-tile kernel (render_matmul; a
transposed operand is copied first), new = render_gemm (reads it in place; tile and
K slices from gemm_plan). Interleaved rounds, medians; each product is also checked
against float64 numpy on its first rows. Prints only; under ~40 s on an H100.

    python benchmarks/gpu_gemm.py            # the first OpenCL GPU
    EASYAD_GPU_BENCH=any python benchmarks/gpu_gemm.py   # any OpenCL device, small sizes
"""
from __future__ import annotations

import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402
from easyad.tensor import _kernels_matmul as kernels  # noqa: E402

ROUNDS = 7
SECONDS = 0.01          # per variant per round
# where gemm_plan picks the 128x128 tile, the new kernel is also timed with: new-mid, the
# 64x64 tile; new-bk16, the 128x128 tile with 16-deep slabs (fewer barriers, twice the
# local memory); new-1buf, the 128x128 tile with one slab in local memory (two barriers a
# slab). Which is fastest on the GPU decides GEMM_CONFIGS["float"]["big"].
ALTERNATIVES = {"new-mid": "mid", "new-bk16": "big-bk16", "new-1buf": "big-1buf"}
GPU_SIZES = [(128, 64), (1024, 1024), (4096, 4096)]     # (H, B) of the 784-H-10 MLP
ANY_SIZES = [(128, 64), (256, 256)]


def products(hidden, batch):
    """(label, M, N, K, transpose_a, transpose_b) of one step of 784-H-10 with linear
    layers (x W^T), and the input gradient a deeper net would need."""
    return [
        ("x W1^T (fwd 1)", batch, hidden, 784, False, True),
        ("g1^T x (dW1)", hidden, 784, batch, True, False),
        ("g1 W1 (dx)", batch, 784, hidden, False, False),
        ("h W2^T (fwd 2)", batch, 10, hidden, False, True),
        ("g2^T h (dW2)", 10, hidden, batch, True, False),
        ("g2 W2 (dh)", batch, hidden, 10, False, False),
    ]


def _timer(call, sync):
    """Seconds per call of ``call`` over about SECONDS (calls enqueued back to back)."""
    call()
    sync()
    reps, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(reps):
            call()
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= SECONDS or reps >= 1 << 14:
            return elapsed / reps
        reps = max(reps * 2, int(reps * SECONDS / max(elapsed, 1e-6)))


def _row(be, torch, tdev, variants, units, rng, size, label, M, N, K, ta, tb):
    """Time one product in every variant, interleaved, and print its table row."""
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    a_host = np.ascontiguousarray(A.T) if ta else A
    b_host = np.ascontiguousarray(B.T) if tb else B
    a = be.asarray(a_host[None], np.float32)
    b = be.asarray(b_host[None], np.float32)
    ref = A[:64].astype(np.float64) @ B.astype(np.float64)

    def kernel(mode):
        def call():
            be.gemm = mode
            return be.matmul(a, b, ta, tb)
        return call
    calls = {v: kernel(mode) for v, mode in [("old", "tiled"), ("new", "new"), ("nt", "nt")]
             if v in variants}
    tile = kernels.gemm_plan("float", 1, M, N, K, units)
    if tile[0].startswith("big"):        # the alternatives to the big tile (see ALTERNATIVES)
        for v, config in ALTERNATIVES.items():
            calls[v] = (lambda c: lambda: be._gemm(
                a, b, ta, tb, (1, M, N, K), (False, False), c, 1))(config)
    errs = {}
    for v, call in calls.items():
        got = be.to_numpy(call())[0, :64]
        errs[v] = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    syncs = {v: be.queue.finish for v in calls}
    if tdev:
        at = torch.from_numpy(a_host).to(tdev)
        bt = torch.from_numpy(b_host).to(tdev)
        at, bt = (at.t() if ta else at), (bt.t() if tb else bt)
        calls["torch"] = lambda: torch.matmul(at, bt)
        syncs["torch"] = torch.cuda.synchronize
    times = {v: [] for v in calls}
    for _ in range(ROUNDS):
        order = list(calls)
        random.shuffle(order)
        for v in order:
            times[v].append(_timer(calls[v], syncs[v]))
    med = {v: statistics.median(t) for v, t in times.items()}
    flop = 2.0 * M * N * K
    cells = " | ".join(f"{med[v] * 1e3:.3f} ({flop / med[v] / 1e12:.2f})" if v in med
                       else "-" for v in variants)
    vs_torch = f"{med['new'] / med['torch']:.2f}x" if "torch" in med else "-"
    print(f"| {size} | {label} | {M} x {N} x {K} | {tile[0]}, {tile[1]} | {cells} | "
          f"{med['new'] / med['old']:.2f}x | {vs_torch} | "
          f"{', '.join(f'{e:.1e}' for e in errs.values())} |", flush=True)
    bad = {v: e for v, e in errs.items() if not e < 1e-4}
    if bad:
        print(f"# WRONG RESULT: {label} {M} x {N} x {K}: {bad}", flush=True)
    return med if tile[0].startswith("big") and not bad else None


def main():
    device = bench_gpu._device()
    if device is None:
        print("gpu_gemm: no OpenCL GPU (EASYAD_GPU_BENCH=any runs on any OpenCL device)")
        return
    be = device.backend
    try:
        import torch
        tdev = "cuda" if torch.cuda.is_available() else None
    except ImportError:
        torch, tdev = None, None
    sizes = GPU_SIZES if device.is_gpu else ANY_SIZES
    units = int(device._handle.max_compute_units)
    print(f"# OpenCL matmul on {device.name} ({device.description}), {units} compute units; "
          f"float32; ms per product (median of {ROUNDS} interleaved rounds), TFLOP/s = "
          f"2MNK/time; torch: {torch.cuda.get_device_name() if tdev else 'no CUDA, skipped'}")
    print("# new tile: gemm_plan's choice (config, K slices); err: max |C - ref| / max |ref| "
          "on the first 64 rows against float64 numpy (float32 needs < 1e-4)")
    rng = np.random.default_rng(0)
    # nt: the CPU kernel (CPU devices only)
    variants = (["old", "new", *ALTERNATIVES] + ([] if device.is_gpu else ["nt"])
                + (["torch"] if tdev else []))
    head = ("| H, B | product | M x N x K | new tile | "
            + " | ".join(f"{v} ms (TFLOP/s)" for v in variants)
            + " | new vs old | new vs torch | err (old, new[, nt][, mid, bk16, 1buf]) |")
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    saved = be.gemm
    big = {"big": 0.0, "big-bk16": 0.0, "big-1buf": 0.0}    # summed over the big products
    variant_of = {"big": "new", "big-bk16": "new-bk16", "big-1buf": "new-1buf"}
    try:
        for hidden, batch in sizes:
            for label, M, N, K, ta, tb in products(hidden, batch):
                med = _row(be, torch, tdev, variants, units, rng, f"{hidden}, {batch}",
                           label, M, N, K, ta, tb)
                for config in big if med else ():
                    big[config] += med[variant_of[config]]
    finally:
        be.gemm = saved
    if any(big.values()):
        best = min(big, key=big.get)
        print("# the big products' summed time per 128x128 variant: " + ", ".join(
            f"{c} {t * 1e3:.3f} ms" for c, t in big.items()))
        # read by benchmarks/gpu.sh: the variant the benchmarks then run with
        print(f"GEMM_BIG={best}")
    print("# new vs old / new vs torch: time ratios (< 1: new is faster). old copies a "
          "transposed operand first (that copy is in its time).")


if __name__ == "__main__":
    main()
