"""Record once, replay many: easyad's Function against recording again and against CasADi.

Scalar-style extended Rosenbrock, written once generically. easyad records it once
(``ad.record``); CasADi builds an SX expression and a ``Function`` of its gradient or
Hessian. CasADi is timed at its fastest public paths: the ``Function.buffer()`` call
(arguments and results in preallocated arrays: no numpy <-> DM conversion, which costs
10-100 us a call) on its virtual machine, and the same after ``jit=True`` (gcc through the
'shell' compiler, with the flags ``F.compile()`` uses: ``_jit``); its build and compile
times are reported beside the run times. Batches: CasADi's ``map`` runs on as many threads
as easyad's batches (``THREADS``), on its VM and compiled.

Targets:
- replay gradient at a new point at least 30x faster than recording it again (n = 1000);
- issue 15 (replay at compiled speed): every gradient (n = 10, 100, 1000, 10^4), Hessian
  (n = 10, 50) and batch row at most CasADi's VM time; compiled replay at most CasADi's
  JIT time. Each row is timed at the call comparable to CasADi's buffer call, which runs on
  preallocated arrays and returns a Hessian's nonzeros: ``F.bind_gradient(x, g)`` and
  ``F.bind_hessian(x, h)`` (bound once); the allocating calls (``F.gradient(x)``, the
  dense ``F.hessian(x)``) are reported beside them;
- batched gradients, B = 10^4 rows of n = 100: at most CasADi's ``map`` (buffer call),
  and at least 1.6x faster on 2 cores than on 1;
- ``ad.hessian`` (record + Hessian, n = 50) faster than torch.autograd.functional.hessian;
- (tensors issue) ``F.gradient(X, device="opencl")`` at B = 10^5, n = 100 faster than the C
  replay and than CasADi's ``map``;
- issue 15 item 3: OpenCL on a GPU, B = 10^6, device-resident, at most 1/10 of the compiled
  C replay on the CPU's cores (on a CPU OpenCL device the figures are reported only).
"""
from __future__ import annotations

import time

import numpy as np

import easyad as ad
import easyad.recorded.rows as replay_rows
from easyad import _pool

NAME = "replay"
TITLE = "easyad record once, replay many: Function vs recording again vs CasADi (buffer, JIT)"
LIBRARIES = ["easyad", "numpy", "casadi", "torch"]


def _jit(entries):
    """CasADi's JIT options, compiling with the flags ``F.compile()`` gives gcc for a tape of
    this many entries (easyad/compiler/tape/library.py): the same optimisation level (-O1 from its
    ``_BIG`` entries on), -march=native and the same floating-point flags, so the compiled
    rows compare code, not compiler settings."""
    from easyad.compiler.tape import library
    level = ["-O1", "-ftree-loop-vectorize"] if entries >= library._BIG else ["-O3"]
    # casadi's shell compiler adds its own -fPIC -shared; -w and -std only quiet easyad's C
    same = [f for f in library._FLAGS if f not in ("-fPIC", "-shared", "-w", "-std=gnu99")]
    return {"jit": True, "compiler": "shell",
            "jit_options": {"compiler": "gcc", "flags": [*level, *same, library._NATIVE]}}


# the threads easyad's batches run on (easyad/_pool.py): CasADi's map gets as many
THREADS = _pool.CORES
CA_MAP = f"casadi Function.map, {THREADS} threads"
CA_JIT_MAP = f"casadi map + JIT, {THREADS} threads"


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


def _casadi_function(ca, n, what, options=None):
    """CasADi's gradient or Hessian Function of Rosenbrock (n inputs) and its build time
    (with ``options=_jit(...)``: expression, code generation and gcc)."""
    started = time.perf_counter()
    X = ca.SX.sym("x", n)
    fx = rosenbrock([X[i] for i in range(n)])
    out = ca.gradient(fx, X) if what == "gradient" else ca.hessian(fx, X)[0]
    F = ca.Function("g" if what == "gradient" else "h", [X], [out], options or {})
    return F, time.perf_counter() - started


_ALIVE: list[object] = []


def _buffer_call(F, x):
    """CasADi's fastest call: ``F.buffer()`` bound once to ``x`` and a result array, so a
    call runs the function on them (column-major data: an (n, B) argument is the C-order
    (B, n) array). Returns (call, result array)."""
    buf, call = F.buffer()
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.zeros(F.nnz_out(0))
    buf.set_arg(0, memoryview(x))
    buf.set_res(0, memoryview(out))
    _ALIVE.append((buf, x, out))   # call runs on raw pointers into these: keep them
    return call, out


def _dense(F, values):
    """A sparse result of a buffer call as a dense matrix."""
    rows, cols = F.sparsity_out(0).get_triplet()
    shape = (F.size1_out(0), F.size2_out(0))
    dense = np.zeros(shape)
    dense[rows, cols] = values
    return dense


def _compiled(f, n, **options):
    """f recorded at ones(n) and compiled into a fresh cache (a real compile): (Function,
    seconds F.compile(**options) took)."""
    import os
    import tempfile
    import time
    old = os.environ.get("EASYAD_CACHE_DIR")
    os.environ["EASYAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="easyad-bench-")
    try:
        F = ad.record(f, np.ones(n))
        start = time.perf_counter()
        F.compile(**options)
        seconds = time.perf_counter() - start
    finally:
        if old is None:
            os.environ.pop("EASYAD_CACHE_DIR")
        else:
            os.environ["EASYAD_CACHE_DIR"] = old
    if not F.compiled:
        raise RuntimeError("F.compile() found no working C compiler")
    return F, seconds


def run(ctx):
    rng = np.random.default_rng(ctx.seed)
    ca = _casadi()
    rows, missed = [], []

    def verdict(ok, what):
        if not ok:
            missed.append(what)
        return "pass" if ok else "**FAIL**"

    # 1. gradient, n = 1000: replay against recording again
    n = 1000
    x = rng.uniform(0.5, 1.5, n)
    F = ad.record(rosenbrock, np.ones(n))
    t = ctx.measure({"easyad F.gradient(x)": lambda: F.gradient(x),
                     "easyad record again (ad.grad)": lambda: ad.grad(rosenbrock)(x)})
    speedup = t.ratio("easyad record again (ad.grad)", "easyad F.gradient(x)")
    rows.append(("gradient n=1000: replay vs record again", f"{speedup:.1f}x faster", ">= 30x",
                 verdict(speedup >= 30, "replay >= 30x recording")))

    # 2. one point at a time, against CasADi's VM and JIT (buffer calls)
    cases = [("gradient", 10), ("gradient", 100), ("gradient", 1000), ("gradient", 10_000),
             ("hessian", 10), ("hessian", 50)]
    for what, n in cases if ca is not None else []:
        x = rng.uniform(0.5, 1.5, n)
        F = ad.record(rosenbrock, np.ones(n))
        mine = F.gradient if what == "gradient" else F.hessian
        vm, built = _casadi_function(ca, n, what)
        jit, compiled = _casadi_function(ca, n, what, _jit(len(F)))
        vm_call, vm_out = _buffer_call(vm, x)
        jit_call, jit_out = _buffer_call(jit, x)
        vm_call()
        jit_call()
        expected = mine(x)
        for F_ca, out in ((vm, vm_out), (jit, jit_out)):
            got = out if what == "gradient" else _dense(F_ca, out)
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
        plain = f"easyad F.{what}(x)"
        variants = {plain: lambda mine=mine, x=x: mine(x), "casadi VM (buffer)": vm_call,
                    "casadi JIT (buffer)": jit_call}
        # the comparable call (CasADi's buffer call writes into preallocated arrays):
        # the gradient bound once; the Hessian's nonzeros into a preallocated array
        if what == "gradient":
            label = "easyad VM, bound"
            xv, gv = x.copy(), np.empty(n)
            variants[label] = F.bind_gradient(xv, gv)
            variants[label]()
            np.testing.assert_array_equal(gv, expected)
        else:
            label = "easyad VM, bound"
            xv, hv = x.copy(), np.empty(len(F.hessian_pattern()[0]))
            variants[label] = F.bind_hessian(xv, hv)
            variants[label]()
            np.testing.assert_allclose(hv, vm_out, rtol=1e-10, atol=1e-10)   # casadi's order
            hs = np.empty_like(hv)
            variants["easyad VM, sparse out="] = lambda F=F, x=x, hs=hs: F.hessian(
                x, sparse=True, out=hs)
        # F.compile(): C from the tape, gcc, a fresh cache; Hessians: compile(hessian=True)
        C, compile_time = _compiled(rosenbrock, n, hessian=what == "hessian")
        if what == "gradient":
            np.testing.assert_array_equal(C.gradient(x), expected)   # bit for bit
            variants["easyad compiled"] = lambda C=C, x=x: C.gradient(x)
            # the preallocated calls: out= (checks per call), bound once (CasADi's buffer)
            xb, g = x.copy(), np.empty(n)
            bound = C.bind_gradient(xb, g)
            bound()
            np.testing.assert_array_equal(g, expected)
            variants["easyad compiled, out="] = lambda C=C, x=x, g=g: C.gradient(x, out=g)
            variants["easyad compiled, bound"] = bound
        else:
            np.testing.assert_array_equal(C.hessian(x), expected)    # bit for bit
            xc, hc = x.copy(), np.empty_like(hv)
            variants["easyad compiled"] = C.bind_hessian(xc, hc)
            variants["easyad compiled"]()
            np.testing.assert_array_equal(hc, hv)
            variants["easyad compiled, dense"] = lambda C=C, x=x: C.hessian(x)
        t = ctx.measure(variants)
        r_vm, r_jit = t.ratio(label, "casadi VM (buffer)"), t.ratio(label, "casadi JIT (buffer)")
        q = t.ratio_quartiles(label, "casadi VM (buffer)")
        rows.append((f"{what} n={n}: easyad ({label[7:]}) / casadi VM time",
                     f"{r_vm:.2f} (middle 50%: {q[0]:.2f}-{q[1]:.2f}; "
                     f"{t.median(label) * 1e6:.2f} us vs "
                     f"{t.median('casadi VM (buffer)') * 1e6:.2f} us; casadi build "
                     f"{built:.2f} s)", "<= 1", verdict(r_vm <= 1, f"{what} n={n} vs casadi VM")))
        kind = "allocating, dense" if what == "hessian" else "allocating"
        rows.append((f"{what} n={n}: easyad F.{what}(x) ({kind}) / casadi VM time",
                     f"{t.ratio(plain, 'casadi VM (buffer)'):.2f} "
                     f"({t.median(plain) * 1e6:.2f} us)", "(reported)", ""))
        rows.append((f"{what} n={n}: easyad / casadi JIT time",
                     f"{r_jit:.2f} (casadi JIT {t.median('casadi JIT (buffer)') * 1e6:.2f} us; "
                     f"build + gcc {compiled:.2f} s)", "(the VM)", ""))
        r_c = t.ratio("easyad compiled", "casadi JIT (buffer)")
        call = "F.compile()" if what == "gradient" else "F.compile(hessian=True), bound"
        rows.append((f"{what} n={n}: easyad compiled / casadi JIT time",
                     f"{r_c:.2f} ({t.median('easyad compiled') * 1e6:.2f} us; "
                     f"{t.ratio('easyad compiled', 'casadi VM (buffer)'):.2f} casadi VM; "
                     f"{call} {compile_time:.2f} s vs casadi build + gcc "
                     f"{compiled:.2f} s)", "<= 1, compile <= casadi's",
                     verdict(r_c <= 1 and compile_time <= compiled,
                             f"compiled {what} n={n} vs casadi JIT")))
        if what == "hessian":
            rows.append((f"hessian n={n}: easyad VM, F.hessian(x, sparse=True, out=h) / "
                         f"casadi VM time",
                         f"{t.ratio('easyad VM, sparse out=', 'casadi VM (buffer)'):.2f} "
                         f"({t.median('easyad VM, sparse out=') * 1e6:.2f} us)",
                         "(reported)", ""))
        if what == "gradient":
            for name, how in (("easyad compiled, out=", "F.gradient(x, out=g)"),
                              ("easyad compiled, bound", "F.bind_gradient(x, g) once")):
                r_b = t.ratio(name, "casadi JIT (buffer)")
                rows.append((f"{what} n={n}: easyad compiled, {how} / casadi JIT time",
                             f"{r_b:.2f} ({t.median(name) * 1e6:.3f} us; "
                             f"{t.ratio(name, 'casadi VM (buffer)'):.2f} casadi VM)", "<= 1",
                             verdict(r_b <= 1, f"compiled {what} n={n} ({how}) vs casadi JIT")))

    # 3. ad.hessian (record + Hessian) against torch
    n = 50
    x = rng.uniform(0.5, 1.5, n)
    try:
        import torch
        import torch.autograd.functional as taf
        xt = torch.tensor(x, dtype=torch.float64)
        t = ctx.measure({"easyad ad.hessian (record + Hessian)": lambda: ad.hessian(rosenbrock)(x),
                         "torch.autograd.functional.hessian":
                         lambda: taf.hessian(rosenbrock, xt)})
        r = t.ratio("easyad ad.hessian (record + Hessian)", "torch.autograd.functional.hessian")
        rows.append(("ad.hessian n=50 (record + Hessian) / torch time", f"{r:.3f}", "< 1",
                     verdict(r < 1, "ad.hessian vs torch")))
    except ImportError:
        pass

    # 3. batches: B = 10^4 rows, n = 100
    n, B = 100, 10_000
    X = rng.uniform(0.5, 1.5, (B, n))
    F = ad.record(rosenbrock, np.ones(n))
    saved = replay_rows._PARALLEL_WORK

    def one_thread():
        replay_rows._PARALLEL_WORK = 10**18
        try:
            F.gradient(X)
        finally:
            replay_rows._PARALLEL_WORK = saved

    C, _ = _compiled(rosenbrock, n)

    def compiled_one_thread():
        replay_rows._PARALLEL_WORK = 10**18
        try:
            C.gradient(X)
        finally:
            replay_rows._PARALLEL_WORK = saved

    variants = {"easyad F.gradient(X), all cores": lambda: F.gradient(X),
                "easyad F.gradient(X), 1 thread": one_thread,
                "easyad compiled, all cores": lambda: C.gradient(X),
                "easyad compiled, 1 thread": compiled_one_thread}
    if ca is not None:
        G, _ = _casadi_function(ca, n, "gradient")
        map_call, map_out = _buffer_call(G.map(B, "thread", THREADS), X)   # (B, n) = (n, B)
        Gj, compiled = _casadi_function(ca, n, "gradient", _jit(len(F)))
        jit_call, jit_out = _buffer_call(Gj.map(B, "thread", THREADS), X)
        map_call()
        jit_call()
        for out in (map_out, jit_out):
            np.testing.assert_allclose(out.reshape(B, n)[:3], F.gradient(X[:3]), rtol=1e-10)
        variants[CA_MAP] = map_call
        variants[CA_JIT_MAP] = jit_call
    # short windows, many rounds: the two sides of the scaling ratio must run at the same
    # machine speed, and a shared machine's speed drifts over seconds
    t = ctx.measure(variants, rounds=150, seconds=0.03)
    scaling = t.ratio("easyad F.gradient(X), 1 thread", "easyad F.gradient(X), all cores")
    rows.append(("batch B=10^4, n=100: 1 thread / all cores (150 rounds of 0.03 s windows)",
                 f"{scaling:.2f}x", ">= 1.6x",
                 verdict(scaling >= 1.6, "batch scaling")))
    if ca is not None:
        r = t.ratio("easyad F.gradient(X), all cores", CA_MAP)
        rows.append((f"batch B=10^4, n=100: easyad / casadi map time (buffer, {THREADS} "
                     f"threads each)",
                     f"{r:.2f} ({t.median('easyad F.gradient(X), all cores') * 1e3:.2f} ms vs "
                     f"{t.median(CA_MAP) * 1e3:.2f} ms)", "<= 1",
                     verdict(r <= 1, "batch vs casadi map")))
        r = t.ratio("easyad F.gradient(X), all cores", CA_JIT_MAP)
        rows.append((f"batch B=10^4, n=100: easyad / {CA_JIT_MAP}",
                     f"{r:.2f} ({t.median(CA_JIT_MAP) * 1e3:.2f} ms; build "
                     f"+ gcc {compiled:.2f} s)", "(the VM)", ""))
        r = t.ratio("easyad compiled, all cores", CA_JIT_MAP)
        rows.append((f"batch B=10^4, n=100: easyad compiled / {CA_JIT_MAP}",
                     f"{r:.2f} ({t.median('easyad compiled, all cores') * 1e3:.2f} ms; "
                     f"{t.ratio('easyad compiled, all cores', CA_MAP):.2f} "
                     f"casadi map)", "<= 1", verdict(r <= 1, "compiled batch vs casadi JIT map")))
    scaling = t.ratio("easyad compiled, 1 thread", "easyad compiled, all cores")
    rows.append(("batch B=10^4, n=100, compiled: 1 thread / all cores", f"{scaling:.2f}x",
                 ">= 1.8x", verdict(scaling >= 1.8, "compiled batch scaling")))

    # 4. replay on OpenCL (issue 15 item 3): one kernel per batch from the optimised
    # program, points variable-major; host arrays (upload X, bring G back) and
    # device-resident (X uploaded once, G left on the device), against the C replay (VM
    # and compiled) on all the CPU's cores. B = 10^5 and 10^6 rows of n = 100.
    cl_devices = [d for d in ad.devices() if d.kind == "opencl" and d.usable and d.fp64]
    if cl_devices:
        import pyopencl.array as cl_array
        device = min(cl_devices, key=lambda d: not d.is_gpu)
        kind = "GPU" if device.is_gpu else "no GPU: a CPU device"
        queue = device.backend.queue
        for B in (100_000, 1_000_000):
            label = f"B=10^{len(str(B)) - 1}, n=100"
            X = rng.uniform(0.5, 1.5, (B, n))
            Xd = cl_array.to_device(queue, np.ascontiguousarray(X.T)).T   # variable-major
            np.testing.assert_allclose(F.gradient(X[:50], device=device), F.gradient(X[:50]),
                                       rtol=1e-12)
            np.testing.assert_allclose(F.gradient(Xd, device=device).T.get()[:, :50].T,
                                       C.gradient(X[:50]), rtol=1e-12)
            host = f"OpenCL {label}, host arrays"
            resident = f"OpenCL {label}, device-resident"
            vm, comp = f"C replay (VM) {label}, all cores", f"compiled C {label}, all cores"
            variants = {host: lambda X=X: F.gradient(X, device=device),
                        resident: lambda Xd=Xd: F.gradient(Xd, device=device),  # syncs
                        comp: lambda X=X: C.gradient(X)}
            if B == 100_000:
                variants[vm] = lambda X=X: F.gradient(X)
                if ca is not None:
                    variants[CA_MAP] = _buffer_call(G.map(B, "thread", THREADS), X)[0]
            t = ctx.measure(variants, rounds=3 if B > 100_000 else None)
            ms = {k: t.median(k) * 1e3 for k in variants}
            where = f"{device.name}, {kind}"
            rows.append((f"OpenCL replay {label}: host arrays / compiled C (all cores) time",
                         f"{t.ratio(host, comp):.2f} ({ms[host]:.0f} ms vs {ms[comp]:.0f} ms; "
                         f"{where})", "(reported)", ""))
            r = t.ratio(resident, comp)
            rows.append((f"OpenCL replay {label}: device-resident / compiled C time",
                         f"{r:.2f} ({ms[resident]:.0f} ms vs {ms[comp]:.0f} ms; {where})",
                         "<= 0.1 on a GPU",
                         verdict(r <= 0.1, f"OpenCL {label} vs compiled C") if device.is_gpu
                         else "n/a (no GPU)"))
            if vm in ms:
                rows.append((f"OpenCL replay {label}: host arrays / C replay (VM) time",
                             f"{t.ratio(host, vm):.2f} ({ms[vm]:.0f} ms VM)", "< 1",
                             verdict(t.ratio(host, vm) < 1, "OpenCL replay vs C replay")))
            if CA_MAP in ms:
                r = t.ratio(host, CA_MAP)
                rows.append((f"OpenCL replay {label}: host arrays / casadi map time "
                             f"({THREADS} threads)",
                             f"{r:.2f}", "< 1", verdict(r < 1, "OpenCL replay vs casadi map")))
            del X, Xd

    body = ["| measure | figure (medians) | target | pass/fail |", "| --- | --- | --- | --- |"]
    body += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(body) + "\n", missed
