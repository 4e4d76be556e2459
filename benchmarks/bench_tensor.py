"""Tensors on numpy and on OpenCL (PoCL's CPU device), against plain numpy and torch.

Three workloads, every variant checked against a reference before it is timed:

1. Elementwise chain: ``(exp(-x) * sin(x) + sqrt(x) * 2) / (1 + x * x)`` (9 operations) on
   10**7 float64 values (10**6 with --quick): plain numpy, easyad constant tensors on the
   numpy backend and on OpenCL (each operation one generated kernel; the result stays on
   the device, the queue is finished). Target: OpenCL at most 1.5x numpy's time. Also
   value + gradient of ``sum(chain)`` on a WengertList, with torch for comparison.
2. Matmul 1024 x 1024 float64, forward + backward (C = A @ B, then dA = G B^T and
   dB = A^T G: three matmuls, 6 n^3 flops): numpy's BLAS doing the three matmuls, easyad
   on numpy and on OpenCL, torch. Reported in GFLOP/s. Target: OpenCL at least 25% of
   numpy's BLAS.
3. Replay on OpenCL: value and gradient of the scalar-style Rosenbrock function of n = 100
   variables (a tape of ~800 entries rendered into one kernel) at B = 10**5 points
   (10**4 with --quick), per call including the transfer of X and the results. Reported
   (no target; the lead compares it with the C replay and CasADi).

Run through ``python benchmarks/run.py --only tensor``. Needs pyopencl and
pocl-binary-distribution (the ``opencl`` extra) for the OpenCL rows.
"""
from __future__ import annotations

import importlib

import numpy as np

import easyad as ad

NAME = "tensor"
TITLE = "easyad tensors: elementwise chain, matmul and OpenCL replay, numpy vs OpenCL (PoCL)"
LIBRARIES = ["easyad", "numpy", "pyopencl", "pocl-binary-distribution", "torch"]

CHAIN_TARGET = 1.5      # OpenCL time / numpy time
MATMUL_TARGET = 0.25    # OpenCL GFLOP/s / numpy BLAS GFLOP/s


def _optional(name):
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _opencl_device():
    found = [d for d in ad.devices() if d.kind == "opencl"]
    return found[0] if found else None


def chain(x, f):
    """The elementwise chain, in the namespace ``f`` (easyad or numpy or torch)."""
    return (f.exp(-x) * f.sin(x) + f.sqrt(x) * 2.0) / (1.0 + x * x)


def _fewer_rounds(ctx):
    # these calls take up to a second each: a third of the rounds keeps a full run short
    return type(ctx)(ctx.quick, max(3, ctx.rounds // 3), ctx.seconds, ctx.seed)


def _close(a, b, tol=1e-9):
    return np.allclose(a, b, rtol=tol, atol=tol)


def _row(label, seconds, extra=""):
    return f"| {label} | {seconds * 1e3:.1f} ms | {extra} |"


def bench_chain(ctx, device, torch):
    n = 10**6 if ctx.quick else 10**7
    x = np.random.default_rng(ctx.seed).uniform(0.1, 2.0, n)
    ref = chain(x, np)
    variants = {"numpy": lambda: chain(x, np)}
    tn = ad.Tensor.constant(x, device="numpy")
    variants["easyad numpy backend"] = lambda: chain(tn, ad)
    grad_variants = {}

    def reverse(dev):
        def run():
            lst = ad.WengertList()
            t = ad.Tensor.variable(x, lst, device=dev)
            out = ad.sum(chain(t, ad))
            return out.number, out.derivatives()[t]
        return run
    grad_variants["easyad numpy backend"] = reverse("numpy")
    if device is not None:
        tc = ad.Tensor.constant(x, device=device)
        queue = device.backend.queue

        def on_device():
            out = chain(tc, ad)
            queue.finish()
            return out
        variants["easyad OpenCL"] = on_device
        grad_variants["easyad OpenCL"] = reverse(device)
    if torch is not None:
        def torch_reverse():
            t = torch.tensor(x, requires_grad=True)
            out = chain(t, torch).sum()
            out.backward()
            return out.item(), t.grad.numpy()
        grad_variants["torch"] = torch_reverse
    for name, f in variants.items():
        out = f()
        value = out if isinstance(out, np.ndarray) else out.value
        if not _close(value, ref):
            raise AssertionError(f"chain: {name} disagrees with numpy")
    ref_value, ref_grad = grad_variants["easyad numpy backend"]()
    for name, f in grad_variants.items():
        value, grad = f()
        if not (_close(value, ref_value) and _close(grad, ref_grad)):
            raise AssertionError(f"chain gradient: {name} disagrees")
    sub = _fewer_rounds(ctx)
    timings = sub.measure(variants)
    grad_timings = sub.measure(grad_variants)
    lines = [f"### Elementwise chain, {n:.0e} float64 values", "",
             "`(exp(-x) * sin(x) + sqrt(x) * 2) / (1 + x * x)`, 9 operations, values only "
             "(constant tensors; the OpenCL result stays on the device):", "",
             "| variant | median | vs numpy (quartiles) |", "| --- | --- | --- |"]
    missed = []
    for name in variants:
        r = timings.ratio(name, "numpy")
        q1, q3 = timings.ratio_quartiles(name, "numpy")
        lines.append(_row(name, timings.median(name), f"{r:.2f}x ({q1:.2f}-{q3:.2f})"))
    if device is not None:
        r = timings.ratio("easyad OpenCL", "numpy")
        verdict = "met" if r <= CHAIN_TARGET else "MISSED"
        lines += ["", f"Target: OpenCL at most {CHAIN_TARGET}x numpy: {r:.2f}x, {verdict}."]
        if r > CHAIN_TARGET:
            missed.append(f"elementwise chain: OpenCL {r:.2f}x numpy (target <= {CHAIN_TARGET})")
    base = "easyad numpy backend"
    lines += ["", "Value and gradient of `sum(chain(x))` on a WengertList:", "",
              f"| variant | median | vs {base} |", "| --- | --- | --- |"]
    for name in grad_variants:
        lines.append(_row(name, grad_timings.median(name),
                          f"{grad_timings.ratio(name, base):.2f}x"))
    return lines, missed


def bench_matmul(ctx, device, torch):
    n = 1024
    rng = np.random.default_rng(ctx.seed)
    A, B, G = rng.standard_normal((n, n)), rng.standard_normal((n, n)), np.ones((n, n))
    flops = 3 * 2 * n**3

    def numpy_blas():
        return A @ B, G @ B.T, A.T @ G

    def easyad_run(dev):
        def run():
            lst = ad.WengertList()
            a = ad.Tensor.variable(A, lst, device=dev)
            b = ad.Tensor.variable(B, lst, device=dev)
            c = a @ b
            d = c.derivatives(G)
            return c.value, d[a], d[b]
        return run
    variants = {"numpy BLAS (3 matmuls)": numpy_blas, "easyad numpy backend": easyad_run("numpy")}
    if device is not None:
        variants["easyad OpenCL"] = easyad_run(device)
    if torch is not None:
        def torch_run():
            a = torch.tensor(A, requires_grad=True)
            b = torch.tensor(B, requires_grad=True)
            c = a @ b
            c.backward(torch.tensor(G))
            return c.detach().numpy(), a.grad.numpy(), b.grad.numpy()
        variants["torch"] = torch_run
    ref = numpy_blas()
    for name, f in variants.items():
        if not all(_close(u, v, 1e-8) for u, v in zip(f(), ref)):
            raise AssertionError(f"matmul: {name} disagrees with numpy")
    timings = _fewer_rounds(ctx).measure(variants)
    base = "numpy BLAS (3 matmuls)"
    lines = [f"### Matmul {n} x {n} float64, forward + backward", "",
             "C = A @ B, then dA = G B^T and dB = A^T G (6 n^3 flops; easyad rows include "
             "the transfers to and from the device):", "",
             "| variant | median | GFLOP/s | share of numpy BLAS |", "| --- | --- | --- | --- |"]
    blas = flops / timings.median(base) / 1e9
    for name in variants:
        g = flops / timings.median(name) / 1e9
        lines.append(f"| {name} | {timings.median(name) * 1e3:.0f} ms | {g:.1f} | "
                     f"{1 / timings.ratio(name, base):.0%} |")
    missed = []
    if device is not None:
        share = 1 / timings.ratio("easyad OpenCL", base)
        verdict = "met" if share >= MATMUL_TARGET else "MISSED"
        lines += ["", f"Target: OpenCL at least {MATMUL_TARGET:.0%} of numpy's BLAS "
                      f"({blas:.1f} GFLOP/s): {share:.0%}, {verdict}."]
        if share < MATMUL_TARGET:
            missed.append(f"matmul: OpenCL {share:.0%} of numpy BLAS (target >= 25%)")
    return lines, missed


def rosenbrock(x):
    total = 0.0
    for i in range(len(x) - 1):
        total = total + 100.0 * (x[i + 1] - x[i] * x[i]) ** 2 + (1.0 - x[i]) ** 2
    return total


def bench_replay(ctx, device):
    from easyad.compiler.tape.render_cl import ReplayKernel, replay_gradient_opencl

    n, B = 100, (10**4 if ctx.quick else 10**5)
    X = np.random.default_rng(ctx.seed).uniform(-1.0, 1.5, (B, n))
    lst = ad.WengertList()
    xs = [lst.variable(float(v)) for v in X[0]]
    out = rosenbrock(xs)
    arrays, inputs = lst._arrays(), [r.index for r in xs]
    kernel = ReplayKernel(arrays, inputs, out.index, device)

    def scalar_point(row):
        tape = ad.WengertList()
        vs = [tape.variable(float(v)) for v in row]
        z = rosenbrock(vs)
        d = z.derivatives()
        return z.number, [d[v] for v in vs]
    values, grads, changed = kernel(X)
    for k in range(0, B, max(1, B // 50)):
        v, g = scalar_point(X[k])
        if not (_close(values[k], v, 1e-11) and _close(grads[k], g, 1e-11)) or changed[k]:
            raise AssertionError("OpenCL replay disagrees with the scalar reverse mode")
    variants = {"OpenCL replay, compiled kernel": lambda: kernel(X),
                "OpenCL replay, render + compile (cached) + run":
                    lambda: replay_gradient_opencl(arrays, inputs, out.index, X, device),
                "scalar Records, one point": lambda: scalar_point(X[0])}
    timings = _fewer_rounds(ctx).measure(variants)
    per_point = timings.median("OpenCL replay, compiled kernel") / B
    scalar = timings.median("scalar Records, one point")
    return [f"### Replay on OpenCL: Rosenbrock n = {n}, B = {B} points", "",
            f"A tape of {len(lst)} entries rendered into one straight-line kernel (one "
            "work-item per point); per call, including X to the device and values and "
            "gradients back:", "",
            "| variant | median | per point |", "| --- | --- | --- |",
            f"| OpenCL replay, compiled kernel | "
            f"{timings.median('OpenCL replay, compiled kernel') * 1e3:.1f} ms | "
            f"{per_point * 1e9:.0f} ns |",
            f"| OpenCL replay, render + compile (cached) + run | "
            f"{timings.median('OpenCL replay, render + compile (cached) + run') * 1e3:.1f} ms "
            f"| |",
            f"| scalar Records (record + sweep), one point | {scalar * 1e6:.0f} us | "
            f"{scalar * 1e9:.0f} ns |", "",
            f"OpenCL replay is {scalar / per_point:.0f}x faster per point than recording "
            f"anew with Records."], []


def run(ctx):
    torch = _optional("torch")
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    device = _opencl_device()
    described = device.description if device else "none (install the opencl extra)"
    lines = [f"OpenCL device: {described}",
             ""]
    missed = []
    for part in (bench_chain(ctx, device, torch), bench_matmul(ctx, device, torch)):
        lines += part[0] + [""]
        missed += part[1]
    if device is not None:
        part = bench_replay(ctx, device)
        lines += part[0]
    return "\n".join(lines), missed
