"""Recorded tensor programs replayed on OpenCL: fused kernels against one kernel per
operation (issue 16 item 2, "one kernel for OpenCL").

The elementwise chain of ``bench_tensor`` (``(exp(-x) * sin(x) + sqrt(x) * 2) / (1 + x *
x)``, 9 operations) on 10^7 float64 values (10^6 with --quick), ``sum(chain(x))``: its
value, and its value and gradient, each variant checked against numpy before it is timed,
all variants of a part timed interleaved in the same rounds:

- **fused**: ``ad.record(f, x0, tensor=True, device="opencl")`` (``compiler/program/fused_cl.py``:
  the forward chain, the sum and the backward sweep in one kernel);
- **fused on device**: the same program's ``run`` on a device buffer, results left on the
  device (no transfer of x in or of the results out), the queue finished;
- **kernels**: the same recording with ``fuse=False``, one OpenCL kernel per instruction;
- **eager**: OpenCL tensors (``ad.Tensor.variable(x0, lst, device="opencl")``, or a
  constant for the value) and the backward sweep, as ``bench_tensor`` times them;
- **numpy fused**: the recording on the numpy device (``compiler/program/fused_c.py``, one C
  loop, one core).

Every call but "fused on device" takes x from the host and brings the results back.
Target: fused at least 3x faster than eager for value and gradient. The same again for an
arithmetic chain of the same shape (no exp, sin or sqrt; no target): PoCL's float64
transcendental functions are slow one value at a time (the fused kernels call them on
vectors, ``double8`` with AVX-512, where the device has vectors: the report says which;
``EASYAD_OPENCL_VECTOR=0`` times the scalar kernels), so the first chain shows what
fusion saves where they dominate, the second where memory traffic and dispatch do.

Run through ``python benchmarks/run.py --only replaycl``. Needs pyopencl and a usable
OpenCL device (PoCL's CPU device here); without one the report says so.
"""
from __future__ import annotations

import time

import numpy as np

import easyad as ad

NAME = "replaycl"
TITLE = "Recorded tensor programs on OpenCL: fused kernels vs one kernel per operation"
LIBRARIES = ["easyad", "numpy", "pyopencl", "pocl-binary-distribution"]

TARGET = 3.0            # eager time / fused time, value and gradient
TOLERANCE = 1e-9


def _opencl_device():
    try:
        found = [d for d in ad.devices() if d.kind == "opencl"]
    except Exception:   # no pyopencl, no driver: the report says so
        return None
    return found[0] if found else None


def _close(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.allclose(a, b, rtol=TOLERANCE,
                       atol=TOLERANCE * max(1.0, float(np.abs(b).max(initial=0))))


def _cell(timings, name):
    import run
    q1, q3 = run.quartiles(timings.per_call[name])
    return f"{timings.median(name) * 1e3:.1f} ms ({q1 * 1e3:.1f}-{q3 * 1e3:.1f})"


def _ratio(timings, a, b):
    q1, q3 = timings.ratio_quartiles(a, b)
    return f"{timings.ratio(a, b):.2f}x ({q1:.2f}-{q3:.2f})"


def arithmetic(x, f):
    """The chain's shape with arithmetic in place of exp, sin and sqrt: what the fusion
    gains where the device's transcendental functions do not dominate."""
    return ((1.0 - x) * (x * 0.5) + x * 2.0) / (1.0 + x * x)


def _chain_gradient(x):
    """d/dx of bench_tensor.chain, by hand."""
    top = np.exp(-x) * np.sin(x) + 2 * np.sqrt(x)
    dtop = np.exp(-x) * (np.cos(x) - np.sin(x)) + 1 / np.sqrt(x)
    return (dtop * (1 + x * x) - top * 2 * x) / (1 + x * x) ** 2


def _arithmetic_gradient(x):
    top, dtop = 2.5 * x - 0.5 * x * x, 2.5 - x
    return (dtop * (1 + x * x) - top * 2 * x) / (1 + x * x) ** 2


def variants(ctx, chain, chain_gradient, n, seed=0):
    """The value variants and the value-and-gradient variants of ``sum(chain(x))`` at n
    points (each checked against numpy), the seconds to record and build the fused
    program, and its kernels."""
    x0 = np.random.default_rng(seed).uniform(0.1, 2.0, n)

    def f(x):
        return ad.sum(chain(x, ad))
    with ctx.cold_cache():     # a real build (PoCL's kernel cache is off: run.py)
        started = time.perf_counter()
        fused = ad.record(f, x0, tensor=True, device="opencl")
        fused.value_and_gradient(x0)
        fused(x0)
        build_s = time.perf_counter() - started
    kernels = ad.record(f, x0, tensor=True, device="opencl", fuse=False)
    numpy_fused = ad.record(f, x0, tensor=True)
    be = fused._backend
    xb = be.asarray(x0, x0.dtype)
    bound = {what: fused._bound[what] for what in ("value", "gradient")}

    def on_device(what):
        def call():
            out = bound[what].run([xb])
            be.queue.finish()
            return out
        return call

    def eager_value():
        t = ad.Tensor.constant(x0, device="opencl")
        return float(chain(t, ad).sum())

    def eager_gradient():
        lst = ad.WengertList()
        t = ad.Tensor.variable(x0, lst, device="opencl")
        z = chain(t, ad).sum()
        return z.number, z.derivatives()[t]
    value = {"fused": lambda: fused(x0), "fused on device": on_device("value"),
             "kernels": lambda: kernels(x0), "eager": eager_value,
             "numpy fused": lambda: numpy_fused(x0)}
    gradient = {"fused": lambda: fused.value_and_gradient(x0),
                "fused on device": on_device("gradient"),
                "kernels": lambda: kernels.value_and_gradient(x0), "eager": eager_gradient,
                "numpy fused": lambda: numpy_fused.value_and_gradient(x0)}
    ref_value = float(np.sum(chain(x0, np)))
    ref_grad = chain_gradient(x0)
    for name, call in value.items():
        got = call()
        if name == "fused on device":
            got = be.to_numpy(got[0])
        if not _close(got, ref_value):
            raise SystemExit(f"chain value, {name}, disagrees with numpy: not benchmarking")
    for name, call in gradient.items():
        got = call()
        if name == "fused on device":
            got = [be.to_numpy(b) for b in got]
        if not (_close(got[0], ref_value) and _close(got[1], ref_grad)):
            raise SystemExit(f"chain gradient, {name}, disagrees with numpy: not "
                             f"benchmarking")
    widths = {rest[1].width for kind, *rest in getattr(bound["gradient"], "steps", ())
              if kind == "kernel"}
    return value, gradient, build_s, bound["gradient"].source.count("__kernel"), widths


def run(ctx):
    device = _opencl_device()
    if device is None:
        return "No usable OpenCL device (`python -m easyad devices`): nothing measured.", []
    import bench_tensor
    n = 10**6 if ctx.quick else 10**7
    rounds = max(5, ctx.rounds // 3)     # calls of up to seconds each: a third of the rounds
    lines = [f"OpenCL device: {device.description}. {rounds if not ctx.quick else ctx.rounds} "
             "rounds; medians, quartiles in brackets; ratios per round (median, middle 50%).",
             ""]
    missed = []
    for title, chain, chain_gradient, formula in (
            ("chain", bench_tensor.chain, _chain_gradient,
             "(exp(-x) * sin(x) + sqrt(x) * 2) / (1 + x * x)"),
            ("arithmetic chain", arithmetic, _arithmetic_gradient,
             "((1 - x) * (x * 0.5) + x * 2) / (1 + x * x)")):
        value, gradient, build_s, n_kernels, widths = variants(ctx, chain, chain_gradient, n,
                                                               ctx.seed)
        loops = ", ".join(f"double{w} vectors" if w else "scalar loops"
                          for w in sorted(widths, reverse=True)) or "scalar loops"
        lines += [f"### `sum({title}(x))` on {n:.0e} float64 values", "",
                  f"`{formula}`; fused: {n_kernels} kernel(s) for value and gradient, "
                  f"{loops} (record and build {build_s:.2f} s).", "",
                  "| part | fused | fused on device | kernels | eager | numpy fused | "
                  "eager / fused | kernels / fused | fused / numpy fused |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for part, table in (("value", value), ("value and gradient", gradient)):
            timings = ctx.measure(table, rounds=rounds)
            lines.append(f"| {part} | " + " | ".join(_cell(timings, name) for name in table)
                         + f" | {_ratio(timings, 'eager', 'fused')} | "
                         f"{_ratio(timings, 'kernels', 'fused')} | "
                         f"{_ratio(timings, 'fused', 'numpy fused')} |")
            if part == "value and gradient" and title == "chain":
                speedup = timings.ratio("eager", "fused")
                verdict = "met" if speedup >= TARGET else "missed"
                lines += ["", f"Target: fused at least {TARGET:g}x faster than eager (value "
                          f"and gradient): {speedup:.2f}x, {verdict}."]
                if speedup < TARGET:
                    missed.append(f"fused OpenCL replay {speedup:.2f}x eager, target "
                                  f"{TARGET:g}x")
        lines.append("")
    return "\n".join(lines), missed
