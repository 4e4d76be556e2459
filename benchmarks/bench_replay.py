"""Record once, replay many: easyad's Function against recording again and against CasADi.

Scalar-style extended Rosenbrock, written once generically. easyad records it once
(``ad.record``); CasADi builds an SX expression and a ``Function`` of its gradient or
Hessian (its build time is reported; easyad has no step beyond recording).

Targets (issue: derivatives toolbox):
- replay gradient at a new point at least 30x faster than recording it again (n = 1000);
- ``F.gradient(x)`` (n = 1000) no slower than CasADi's gradient Function;
- ``F.hessian(x)`` (n = 50) no slower than CasADi's Hessian Function;
- batched gradients, B = 10^4 rows of n = 100: no slower than CasADi's ``map``, and at
  least 1.6x faster on 2 cores than on 1;
- ``ad.hessian`` (record + Hessian, n = 50) faster than torch.autograd.functional.hessian;
- (tensors issue) ``F.gradient(X, device="opencl")`` at B = 10^5, n = 100 faster than the C
  replay and than CasADi's ``map``.
"""
from __future__ import annotations

import time

import numpy as np

import easyad as ad
import easyad.replay as replay

NAME = "replay"
TITLE = "easyad record once, replay many: Function vs recording again vs CasADi"
LIBRARIES = ["easyad", "numpy", "casadi", "torch"]


def rosenbrock(x):
    s = 0.0
    for i in range(len(x) - 1):
        s = s + 100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2
    return s


def _casadi():
    try:
        import casadi
    except ImportError:
        return None
    return casadi


def _casadi_function(ca, n, what):
    started = time.perf_counter()
    X = ca.SX.sym("x", n)
    fx = rosenbrock([X[i] for i in range(n)])
    if what == "gradient":
        F = ca.Function("g", [X], [ca.gradient(fx, X)])
    else:
        F = ca.Function("h", [X], [ca.hessian(fx, X)[0]])
    return F, time.perf_counter() - started


def run(ctx):
    rng = np.random.default_rng(ctx.seed)
    ca = _casadi()
    rows, missed = [], []

    def verdict(ok, what):
        if not ok:
            missed.append(what)
        return "pass" if ok else "**FAIL**"

    # 1. gradient, n = 1000
    n = 1000
    x = rng.uniform(0.5, 1.5, n)
    F = ad.record(rosenbrock, np.ones(n))
    variants = {"easyad F.gradient(x)": lambda: F.gradient(x),
                "easyad record again (ad.grad)": lambda: ad.grad(rosenbrock)(x)}
    build = None
    if ca is not None:
        G, build = _casadi_function(ca, n, "gradient")
        np.testing.assert_allclose(np.array(G(x)).ravel(), F.gradient(x), rtol=1e-10)
        variants["casadi SX gradient Function"] = lambda: G(x)
    t = ctx.measure(variants)
    speedup = t.ratio("easyad record again (ad.grad)", "easyad F.gradient(x)")
    rows.append(("gradient n=1000: replay vs record again", f"{speedup:.1f}x faster", ">= 30x",
                 verdict(speedup >= 30, "replay >= 30x recording")))
    if ca is not None:
        r = t.ratio("easyad F.gradient(x)", "casadi SX gradient Function")
        rows.append(("gradient n=1000: easyad / casadi time",
                     f"{r:.2f} ({t.median('easyad F.gradient(x)') * 1e6:.0f} us vs "
                     f"{t.median('casadi SX gradient Function') * 1e6:.0f} us; casadi build "
                     f"{build:.2f} s)", "<= 1", verdict(r <= 1, "gradient vs casadi")))

    # 2. Hessian, n = 50
    n = 50
    x = rng.uniform(0.5, 1.5, n)
    F = ad.record(rosenbrock, np.ones(n))
    variants = {"easyad F.hessian(x)": lambda: F.hessian(x),
                "easyad ad.hessian (record + Hessian)": lambda: ad.hessian(rosenbrock)(x)}
    if ca is not None:
        H, build = _casadi_function(ca, n, "hessian")
        np.testing.assert_allclose(np.array(H(x)), F.hessian(x), rtol=1e-10)
        variants["casadi SX hessian Function"] = lambda: H(x)
    try:
        import torch
        import torch.autograd.functional as taf
        xt = torch.tensor(x, dtype=torch.float64)
        variants["torch.autograd.functional.hessian"] = lambda: taf.hessian(rosenbrock, xt)
    except ImportError:
        torch = None
    t = ctx.measure(variants)
    if ca is not None:
        r = t.ratio("easyad F.hessian(x)", "casadi SX hessian Function")
        rows.append(("Hessian n=50: easyad / casadi time",
                     f"{r:.2f} ({t.median('easyad F.hessian(x)') * 1e6:.0f} us vs "
                     f"{t.median('casadi SX hessian Function') * 1e6:.0f} us)", "<= 1",
                     verdict(r <= 1, "hessian vs casadi")))
    if torch is not None:
        r = t.ratio("easyad ad.hessian (record + Hessian)", "torch.autograd.functional.hessian")
        rows.append(("ad.hessian n=50 (record + Hessian) / torch time", f"{r:.3f}", "< 1",
                     verdict(r < 1, "ad.hessian vs torch")))

    # 3. batches: B = 10^4 rows, n = 100
    n, B = 100, 10_000
    X = rng.uniform(0.5, 1.5, (B, n))
    F = ad.record(rosenbrock, np.ones(n))
    saved = replay._PARALLEL_WORK

    def one_thread():
        replay._PARALLEL_WORK = 10**18
        try:
            F.gradient(X)
        finally:
            replay._PARALLEL_WORK = saved

    variants = {"easyad F.gradient(X), all cores": lambda: F.gradient(X),
                "easyad F.gradient(X), 1 thread": one_thread}
    if ca is not None:
        G, _ = _casadi_function(ca, n, "gradient")
        M = G.map(B)
        XT = np.ascontiguousarray(X.T)
        np.testing.assert_allclose(np.array(M(XT)).T[:3], F.gradient(X[:3]), rtol=1e-10)
        variants["casadi Function.map"] = lambda: M(XT)
    # short windows, many rounds: the two sides of the scaling ratio must run at the same
    # machine speed, and a shared machine's speed drifts over seconds
    t = ctx.measure(variants, rounds=150, seconds=0.03)
    scaling = t.ratio("easyad F.gradient(X), 1 thread", "easyad F.gradient(X), all cores")
    rows.append(("batch B=10^4, n=100: 1 thread / all cores (150 rounds of 0.03 s windows)",
                 f"{scaling:.2f}x", ">= 1.6x",
                 verdict(scaling >= 1.6, "batch scaling")))
    if ca is not None:
        r = t.ratio("easyad F.gradient(X), all cores", "casadi Function.map")
        rows.append(("batch B=10^4, n=100: easyad / casadi map time", f"{r:.2f}", "<= 1",
                     verdict(r <= 1, "batch vs casadi map")))

    # 4. replay on OpenCL (issue: tensors): B = 10^5 rows, n = 100, one kernel per batch
    if any(d.kind == "opencl" for d in ad.devices()):
        B = 100_000
        X = rng.uniform(0.5, 1.5, (B, n))
        np.testing.assert_allclose(F.gradient(X[:50], device="opencl"), F.gradient(X[:50]),
                                   rtol=1e-12)
        variants = {"easyad F.gradient(X, device='opencl')":
                    lambda: F.gradient(X, device="opencl"),
                    "easyad F.gradient(X), C replay": lambda: F.gradient(X)}
        if ca is not None:
            M = G.map(B)
            XT = np.ascontiguousarray(X.T)
            variants["casadi Function.map"] = lambda: M(XT)
        t = ctx.measure(variants)
        opencl = "easyad F.gradient(X, device='opencl')"
        r = t.ratio(opencl, "easyad F.gradient(X), C replay")
        rows.append(("OpenCL replay B=10^5, n=100: OpenCL / C replay time",
                     f"{r:.2f} ({t.median(opencl) * 1e3:.0f} ms vs "
                     f"{t.median('easyad F.gradient(X), C replay') * 1e3:.0f} ms)", "< 1",
                     verdict(r < 1, "OpenCL replay vs C replay")))
        if ca is not None:
            r = t.ratio(opencl, "casadi Function.map")
            rows.append(("OpenCL replay B=10^5, n=100: OpenCL / casadi map time", f"{r:.2f}",
                         "< 1", verdict(r < 1, "OpenCL replay vs casadi map")))

    body = ["| measure | figure (medians) | target | pass/fail |", "| --- | --- | --- | --- |"]
    body += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(body) + "\n", missed
