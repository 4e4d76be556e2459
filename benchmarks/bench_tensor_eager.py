"""Eager tensors: easyad's per-operation cost against torch eager and jax.jit (issue 16).

Four workloads on the numpy device, every variant checked against a reference before it is
timed, all variants of a workload timed interleaved in the same rounds (medians and the
middle 50% of the per-round ratios):

1. Per-op dispatch on small arrays (8 float64 values): a program of ``OPS`` tensor
   operations, recorded on a fresh WengertList, then its backward sweep; reported per
   operation (forward only, and forward + its share of the sweep), against torch eager
   with ``requires_grad`` (forward, and forward + ``backward()``). Where an OpenCL device
   works, its rows too (labelled with the device: PoCL is OpenCL on the CPU, so those
   rows measure the host cost of launching kernels, not a GPU).
2. Vectorized Rosenbrock gradient (whole-array code ``sum(100 (x[1:] - x[:-1]^2)^2 +
   (1 - x[:-1])^2)``) at n = 10, 100, 1000, 10^6: ``ad.grad(f)(x0)`` (which passes f a
   Tensor), a Tensor variable + ``derivatives()``, torch eager (the input made once,
   ``backward()``), ``jax.jit(jax.grad(f))`` (compile time reported beside), and the
   hand-written numpy gradient as the unit.
3. MLP 784-128-10 (tanh) SGD training step, batch 64, float32 and float64: easyad.nn vs
   PyTorch (as ``bench_nn``) and a jitted jax step (parameters in, updated parameters out).
4. Elementwise chain of 9 operations (``bench_tensor.chain``) on 10^7 values (10^6 with
   --quick): the value (constant tensors) and value + gradient of ``sum(chain)``, against
   numpy, torch eager and jax.jit.
5. The core's strong-zero ufuncs mul0 and div0 (in every elementwise vjp) against numpy's
   multiply and divide on 10^6 values (``EASYAD_EAGER_PARTS=ufuncs``).

Threads: torch 1 intra-op thread, numpy's BLAS 1 (threadpoolctl), XLA's CPU backend single
threaded (``XLA_FLAGS`` set before jax is imported), so every library gets one core.

Run through ``python benchmarks/run.py --only eager`` (``--quick`` for a short run). jax is
optional (``pip install jax``); without it the jax columns say "not installed".
"""
from __future__ import annotations

import importlib
import os
import sys
import time

import numpy as np

import easyad as ad
from easyad import nn

NAME = "eager"
TITLE = ("easyad eager tensors: per-op dispatch, Rosenbrock gradient, MLP step, elementwise "
         "chain, vs torch eager and jax.jit")
LIBRARIES = ["easyad", "numpy", "torch", "jax", "jaxlib", "threadpoolctl"]

THREADS = 1
SMALL = 8                       # elements of the per-op arrays
ROSEN_SIZES = (10, 100, 1000, 10**6)
TOLERANCE = 1e-9


def _optional(name):
    try:
        return importlib.import_module(name)
    except Exception:   # not installed, or broken: the report says so
        return None


def _jax():
    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false "
                                       "intra_op_parallelism_threads=1").strip()
    jax = _optional("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", True)
    return jax


def _close(a, b, tol=TOLERANCE):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max(initial=0))))


def _check(name, got, ref, tol=TOLERANCE):
    if not _close(got, ref, tol):
        raise SystemExit(f"{name} disagrees with the reference: not benchmarking")


def _ms(timings, name, spec):
    """The median of ``name`` in milliseconds (``spec``: its format), "n/a" if not run."""
    if name not in timings.per_call:
        return "n/a"
    return f"{timings.median(name) * 1e3:{spec}} ms"


def _ratio(timings, a, b):
    if a not in timings.per_call or b not in timings.per_call:
        return "n/a"
    q1, q3 = timings.ratio_quartiles(a, b)
    return f"{timings.ratio(a, b):.2f}x ({q1:.2f}-{q3:.2f})"


# ---- 1. per-op dispatch ----

def small_program(x, y, f):
    """Elementwise operations, then a sum: the per-op workload (f: easyad or torch)."""
    a = x * y
    b = a + x
    c = f.sin(b)
    d = c * c
    e = d - y
    g = f.exp(e)
    h = g / (x + 1.0)
    k = h * 0.5
    m = f.tanh(k)
    n = m + a
    p = n * n
    q = f.sqrt(p + 1.0)
    r = q - x
    s = f.log(r + 2.0)
    return (s * y).sum()




def _opencl_device():
    """The OpenCL device tensors would use, or None where none works."""
    return next((d for d in ad.devices() if d.kind == "opencl" and d.usable), None)


def bench_dispatch(ctx, torch):
    rng = np.random.default_rng(1)
    x0, y0 = rng.uniform(0.1, 1.0, SMALL), rng.uniform(0.1, 1.0, SMALL)
    variants, checks = {}, {}

    def easyad_forward(device=None):
        lst = ad.WengertList()
        x = ad.Tensor.variable(x0, lst, device=device)
        y = ad.Tensor.variable(y0, lst, device=device)
        return small_program(x, y, ad)

    def easyad_both(device=None):
        lst = ad.WengertList()
        x = ad.Tensor.variable(x0, lst, device=device)
        y = ad.Tensor.variable(y0, lst, device=device)
        d = small_program(x, y, ad).derivatives()
        return d[x]
    lst = ad.WengertList()
    x, y = ad.Tensor.variable(x0, lst), ad.Tensor.variable(y0, lst)
    before = len(lst)
    small_program(x, y, ad)
    recorded = len(lst) - before
    variants["easyad forward"] = easyad_forward
    variants["easyad forward + backward"] = easyad_both
    checks["easyad forward + backward"] = easyad_both()
    opencl = _opencl_device()
    if opencl is not None:
        where = f"easyad on {opencl.name} ({opencl.description})"
        variants[f"{where} forward"] = lambda: easyad_forward(opencl)
        variants[f"{where} forward + backward"] = lambda: easyad_both(opencl)
        checks[f"{where} forward + backward"] = easyad_both(opencl)
    if torch is not None:
        tx = torch.tensor(x0, requires_grad=True)
        ty = torch.tensor(y0, requires_grad=True)

        def torch_forward():
            return small_program(tx, ty, torch)

        def torch_both():
            tx.grad = ty.grad = None
            small_program(tx, ty, torch).backward()
            return tx.grad
        variants["torch forward"] = torch_forward
        variants["torch forward + backward"] = torch_both
        checks["torch forward + backward"] = torch_both().numpy().copy()
    ref = next(iter(checks.values()))
    for name, got in checks.items():
        _check(name, got, ref)
    timings = ctx.measure(variants)
    lines = [f"### Per-op dispatch ({SMALL} float64 values, {recorded} recorded operations "
             f"per call, divided out)", "",
             "| variant | us per op (median) | vs torch, same part |", "| --- | ---: | ---: |"]
    for name in variants:
        base = "torch forward + backward" if name.endswith("backward") else "torch forward"
        lines.append(f"| {name} | {timings.median(name) / recorded * 1e6:.2f} | "
                     f"{_ratio(timings, name, base) if name != base else '1.00x'} |")
    return lines, timings, recorded


STRUCTURAL = {            # name: (easyad on x (4, 3) and b (3,), torch on the same)
    "sum": (lambda x, b: x.sum(), lambda x, b: x.sum()),
    "sum(axis=0)": (lambda x, b: x.sum(axis=0), lambda x, b: x.sum(0)),
    "max(axis=1)": (lambda x, b: x.max(axis=1), lambda x, b: x.amax(1)),
    "x[1:]": (lambda x, b: x[1:], lambda x, b: x[1:]),
    "x @ b": (lambda x, b: x @ b, lambda x, b: x @ b),
    "reshape(12)": (lambda x, b: x.reshape(12), lambda x, b: x.reshape(12)),
    ".T": (lambda x, b: x.T, lambda x, b: x.T),
}


REPEATS = 50     # operations per timed call (the list is cleared between calls)


def bench_structural(ctx, torch):
    """Per-op forward cost of the structural operations on a recorded (4, 3) tensor: each
    timed call makes REPEATS of one operation on fresh inputs (easyad: a cleared list and
    two new variables, amortised over the calls; torch: inputs that require grad)."""
    rng = np.random.default_rng(2)
    x0, b0 = rng.uniform(0.1, 1.0, (4, 3)), rng.uniform(0.1, 1.0, 3)
    lst = ad.WengertList()
    variants = {}

    def ours_repeated(f):
        lst.clear()
        x, b = ad.Tensor.variable(x0, lst), ad.Tensor.variable(b0, lst)
        for _ in range(REPEATS):
            f(x, b)

    for name, (ours, theirs) in STRUCTURAL.items():
        variants[f"easyad {name}"] = lambda f=ours: ours_repeated(f)
        if torch is None:
            continue
        tx, tb = torch.tensor(x0, requires_grad=True), torch.tensor(b0, requires_grad=True)

        def theirs_repeated(f=theirs, tx=tx, tb=tb):
            for _ in range(REPEATS):
                f(tx, tb)
        variants[f"torch {name}"] = theirs_repeated
        x, b = ad.Tensor.variable(x0, lst), ad.Tensor.variable(b0, lst)
        got = ours(x, b)
        got = got.number if isinstance(got, ad.Record) else got.value
        _check(f"easyad {name}", np.asarray(got), theirs(tx, tb).detach().numpy())
    timings = ctx.measure(variants)
    lst.clear()
    lines = ["### Per-op dispatch, structural operations (forward, a recorded (4, 3) "
             "float64 tensor)", "", "| operation | easyad | torch | easyad / torch |",
             "| --- | ---: | ---: | ---: |"]
    for name in STRUCTURAL:
        ours, theirs = f"easyad {name}", f"torch {name}"
        torch_us = (f"{timings.median(theirs) / REPEATS * 1e6:.2f} us"
                    if theirs in timings.per_call else "n/a")
        lines.append(f"| `{name}` | {timings.median(ours) / REPEATS * 1e6:.2f} us | "
                     f"{torch_us} | {_ratio(timings, ours, theirs)} |")
    return lines


# ---- 2. vectorized Rosenbrock ----

def rosen(x, f=None):
    """Vectorized Rosenbrock, whole-array code (any array library with slicing and sum)."""
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


def rosen_grad_numpy(x):
    """The hand-written gradient: the unit of the table."""
    g = np.zeros_like(x)
    d = x[1:] - x[:-1] ** 2
    g[:-1] = -400.0 * x[:-1] * d - 2.0 * (1.0 - x[:-1])
    g[1:] += 200.0 * d
    return g


def bench_rosen(ctx, torch, jax):
    lines = ["### Vectorized Rosenbrock gradient (float64)", "",
             "time per gradient; ratios are medians of per-round ratios (middle 50%)", "",
             "| n | numpy by hand | ad.grad | Tensor + derivatives | torch eager | jax.jit "
             "| jax compile | ad.grad / torch | Tensor / torch | ad.grad / Tensor | "
             "ad.grad / jax.jit |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    sizes = ROSEN_SIZES if not ctx.quick else ROSEN_SIZES
    for n in sizes:
        x0 = np.random.default_rng(n).uniform(-1.0, 1.5, n)
        ref = rosen_grad_numpy(x0)
        variants = {"numpy": lambda x0=x0: rosen_grad_numpy(x0)}
        grad = ad.grad(rosen)
        variants["ad.grad"] = lambda x0=x0, grad=grad: grad(x0)

        def tensor(x0=x0):
            lst = ad.WengertList()
            x = ad.Tensor.variable(x0, lst)
            return rosen(x).derivatives()[x]
        variants["Tensor"] = tensor
        if torch is not None:
            tx = torch.tensor(x0, requires_grad=True)

            def torch_grad(tx=tx):
                tx.grad = None
                rosen(tx).backward()
                return tx.grad
            variants["torch"] = torch_grad
        compile_s = None
        if jax is not None:
            jx = jax.numpy.asarray(x0)
            started = time.perf_counter()
            compiled = jax.jit(jax.grad(rosen)).lower(jx).compile()
            compile_s = time.perf_counter() - started
            variants["jax"] = lambda jx=jx, c=compiled: c(jx).block_until_ready()
        for name, v in variants.items():
            got = v()
            _check(f"Rosenbrock n={n} {name}", np.asarray(got.detach() if hasattr(
                got, "detach") else got), ref)
        big = n >= 10**5
        timings = ctx.measure(variants, rounds=max(5, ctx.rounds // 3) if big else None)

        def ms(name, timings=timings):
            return _ms(timings, name, ".4g")
        lines.append(
            f"| {n} | {ms('numpy')} | {ms('ad.grad')} | {ms('Tensor')} | {ms('torch')} | "
            f"{ms('jax')} | {f'{compile_s:.3f} s' if compile_s is not None else 'n/a'} | "
            f"{_ratio(timings, 'ad.grad', 'torch')} | {_ratio(timings, 'Tensor', 'torch')} | "
            f"{_ratio(timings, 'ad.grad', 'Tensor')} | {_ratio(timings, 'ad.grad', 'jax')} |")
        ctx.log(f"   rosenbrock n={n} done")
    return lines


# ---- 3. MLP step ----

def jax_step(jax, state, dtype, lr, batch):
    jnp = jax.numpy
    params = tuple(jnp.asarray(state[k].astype(dtype)) for k in
                   ("0.weight", "0.bias", "2.weight", "2.bias"))
    x, y = batch
    jxs, jys = jnp.asarray(x), jnp.asarray(y)

    def loss(p, x, y):
        w1, b1, w2, b2 = p
        z = jnp.tanh(x @ w1.T + b1) @ w2.T + b2
        lse = jax.nn.logsumexp(z, axis=1)
        return jnp.mean(lse - jnp.take_along_axis(z, y[:, None], axis=1)[:, 0])

    def update(p, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        return tuple(a - lr * b for a, b in zip(p, g)), value
    started = time.perf_counter()
    compiled = jax.jit(update).lower(params, jxs, jys).compile()
    compile_s = time.perf_counter() - started
    box = [params]

    def step():
        box[0], value = compiled(box[0], jxs, jys)
        return float(value)
    return step, compile_s


def bench_mlp(ctx, torch, jax):
    import bench_nn
    ad.random.seed(0)
    init = nn.Sequential(nn.Linear(*bench_nn.SIZES[:2]), nn.Tanh(),
                         nn.Linear(*bench_nn.SIZES[1:])).state_dict()
    lines = [f"### MLP {'-'.join(map(str, bench_nn.SIZES))} (tanh) SGD step, batch "
             f"{bench_nn.BATCH}", "",
             "| dtype | easyad | torch | jax.jit | jax compile | easyad / torch | "
             "easyad / jax.jit |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for dtype, bits in ((np.float64, "float64"), (np.float32, "float32")):
        state = {k: v.astype(dtype) for k, v in init.items()}
        variants, first = {}, {}
        step, _ = bench_nn.easyad_step(state, dtype, "numpy")
        variants["easyad"] = step
        if torch is not None:
            variants["torch"] = bench_nn.torch_step(torch, state, dtype)[0]
        compile_s = None
        if jax is not None:
            variants["jax"], compile_s = jax_step(jax, state, dtype, bench_nn.LR,
                                                  bench_nn.data(dtype))
        for name, v in variants.items():
            first[name] = v()
        tol = 1e-9 if bits == "float64" else 1e-4
        for name in first:
            _check(f"MLP {bits} {name}", first[name], first["easyad"], tol)
        timings = ctx.measure(variants)

        def ms(name, timings=timings):
            return _ms(timings, name, ".3f")
        lines.append(f"| {bits} | {ms('easyad')} | {ms('torch')} | {ms('jax')} | "
                     f"{f'{compile_s:.3f} s' if compile_s is not None else 'n/a'} | "
                     f"{_ratio(timings, 'easyad', 'torch')} | "
                     f"{_ratio(timings, 'easyad', 'jax')} |")
    return lines


# ---- 4. elementwise chain ----

def bench_chain(ctx, torch, jax):
    import bench_tensor
    chain = bench_tensor.chain
    n = 10**6 if ctx.quick else 10**7
    x0 = np.random.default_rng(ctx.seed).uniform(0.1, 2.0, n)
    value = {"numpy": lambda: chain(x0, np)}
    tc = ad.Tensor.constant(x0)
    value["easyad"] = lambda: chain(tc, ad)
    grad = {}

    def easyad_grad():
        lst = ad.WengertList()
        t = ad.Tensor.variable(x0, lst)
        return chain(t, ad).sum().derivatives()[t]
    grad["easyad"] = easyad_grad
    if torch is not None:
        tx = torch.tensor(x0)
        value["torch"] = lambda: chain(tx, torch)
        tg = torch.tensor(x0, requires_grad=True)

        def torch_grad():
            tg.grad = None
            chain(tg, torch).sum().backward()
            return tg.grad
        grad["torch"] = torch_grad
    compile_s = {}
    if jax is not None:
        jx = jax.numpy.asarray(x0)
        for kind, table, fn in (("value", value, lambda x: chain(x, jax.numpy)),
                                ("gradient", grad,
                                 jax.grad(lambda x: chain(x, jax.numpy).sum()))):
            started = time.perf_counter()
            c = jax.jit(fn).lower(jx).compile()
            compile_s[kind] = time.perf_counter() - started
            table["jax"] = lambda c=c: c(jx).block_until_ready()
    # the chain recorded once (ad.record) and replayed fused: benchmarks/bench_tensor_replay
    # times it against the others; this column keeps the eager table's comparison
    with ctx.cold_cache():         # a real gcc run of both programs, not disk-cache hits
        started = time.perf_counter()
        fused_value = ad.record(lambda x: chain(x, ad), x0, tensor=True)
        fused_grad = ad.record(lambda x: chain(x, ad).sum(), x0, tensor=True)
        fused_value(x0)
        fused_grad.gradient(x0)
        fused_s = time.perf_counter() - started
    value["fused"] = lambda: fused_value(x0)
    grad["fused"] = lambda: fused_grad.gradient(x0)
    ref_value = chain(x0, np)
    for name, v in value.items():
        got = v()
        _check(f"chain value {name}", got.value if isinstance(got, ad.Tensor) else
               np.asarray(got), ref_value)
    ref_grad = np.asarray(grad["easyad"]())
    for name, v in grad.items():
        got = v()
        _check(f"chain gradient {name}", np.asarray(got), ref_grad)
    rounds = max(5, ctx.rounds // 3)
    lines = [f"### Elementwise chain of 9 operations on {n:.0e} float64 values", "",
             "easyad fused: the chain recorded once by `ad.record` and replayed as one C "
             "loop (record + render + gcc: "
             f"{f'{fused_s:.2f} s' if fused_s is not None else 'n/a'}).", "",
             "| part | numpy | easyad | easyad fused | torch eager | jax.jit | jax compile | "
             "easyad / torch | easyad / jax.jit | easyad / fused | fused / torch | "
             "fused / jax.jit |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: |"]
    for kind, table in (("value", value), ("gradient", grad)):
        timings = ctx.measure(table, rounds=rounds)

        def ms(name, timings=timings):
            return _ms(timings, name, ".1f")
        lines.append(f"| {kind} | {ms('numpy')} | {ms('easyad')} | {ms('fused')} | "
                     f"{ms('torch')} | {ms('jax')} | "
                     f"{f'{compile_s[kind]:.3f} s' if kind in compile_s else 'n/a'} | "
                     f"{_ratio(timings, 'easyad', 'torch')} | "
                     f"{_ratio(timings, 'easyad', 'jax')} | "
                     f"{_ratio(timings, 'easyad', 'fused')} | "
                     f"{_ratio(timings, 'fused', 'torch')} | "
                     f"{_ratio(timings, 'fused', 'jax')} |")
    return lines


# ---- 5. the strong-zero ufuncs ----

def bench_ufuncs(ctx):
    """The core's mul0/div0 ufuncs (every elementwise vjp's ``mul0(g, partial)``) against
    numpy's multiply and divide, on 10^6 values, fresh outputs and ``out=``."""
    from easyad import _core
    mul0, div0 = _core._mul0_ufunc, _core._div0_ufunc
    rng = np.random.default_rng(ctx.seed)
    lines = ["### Strong-zero ufuncs (mul0, div0) against numpy's multiply and divide, "
             "10^6 values", "",
             "| dtype | operands | mul0 | np.multiply | mul0 / multiply | div0 | np.divide | "
             "div0 / divide |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for dtype in (np.float64, np.float32):
        a = rng.standard_normal(10**6).astype(dtype)
        b = rng.standard_normal(10**6).astype(dtype)
        a[::7] = 0.0
        out = np.empty_like(a)
        for label, args, kwargs in (("two arrays", (a, b), {}),
                                    ("two arrays, out=", (a, b), {"out": out}),
                                    ("array, scalar, out=", (a, dtype(3.0)), {"out": out})):
            with np.errstate(all="ignore"):
                _check(f"mul0 {label}", mul0(*args), np.where(
                    (args[0] == 0) | (args[1] == 0), 0.0, np.multiply(*args)), 0.0)
                variants = {name: (lambda f=f, args=args, kwargs=kwargs: f(*args, **kwargs))
                            for name, f in (("mul0", mul0), ("multiply", np.multiply),
                                            ("div0", div0), ("divide", np.divide))}
                timings = ctx.measure(variants)

            def ms(name, timings=timings):
                return _ms(timings, name, ".3f")
            lines.append(f"| {np.dtype(dtype).name} | {label} | {ms('mul0')} | "
                         f"{ms('multiply')} | {_ratio(timings, 'mul0', 'multiply')} | "
                         f"{ms('div0')} | {ms('divide')} | {_ratio(timings, 'div0', 'divide')} |")
    return lines


def blas_note(threadpoolctl):
    """What numpy's BLAS is and which kernels it chose: matmul-bound rows (the MLP step)
    depend on it, and OpenBLAS picks its kernels by CPU model, not by the instructions the
    CPU has (a CPU newer than OpenBLAS may get older kernels)."""
    if threadpoolctl is None:
        return ""
    found = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
    if not found:
        return ""
    info = found[0]
    try:
        with open("/proc/cpuinfo") as f:
            avx512 = " avx512f" in f.read()
    except OSError:
        avx512 = False
    from easyad.tensor import _blas
    own = _blas.own_kernels(64, 784, 128)
    return (f" numpy's BLAS: {info.get('internal_api')} {info.get('version')}, kernels for "
            f"{info.get('architecture', 'an unreported architecture')}"
            + (" (this CPU has AVX-512)" if avx512 else "") + "; easyad's matrix products "
            + ("run on its own AVX-512 kernels (easyad/_gemm.h, `EASYAD_MATMUL=auto`)."
               if own else "run on numpy's BLAS."))


def run(ctx):
    torch = _optional("torch")
    jax = _jax()
    threadpoolctl = _optional("threadpoolctl")
    limiter = threadpoolctl.threadpool_limits(THREADS) if threadpoolctl else None
    if torch is not None:
        torch.set_num_threads(THREADS)
    only = set(filter(None, os.environ.get("EASYAD_EAGER_PARTS", "").split(",")))
    lines = ["All on one core each (torch 1 thread, BLAS 1 thread, XLA single-threaded). "
             "Ratios: median of the per-round ratios, middle 50% in brackets; < 1 means "
             "easyad is faster." + ("" if torch else " torch: not installed.")
             + ("" if jax else " jax: not installed.") + blas_note(threadpoolctl), ""]
    try:
        if not only or "dispatch" in only:
            part, _, _ = bench_dispatch(ctx, torch)
            lines += part + [""] + bench_structural(ctx, torch) + [""]
        if not only or "rosen" in only:
            lines += bench_rosen(ctx, torch, jax) + [""]
        if not only or "mlp" in only:
            lines += bench_mlp(ctx, torch, jax) + [""]
        if not only or "chain" in only:
            lines += bench_chain(ctx, torch, jax) + [""]
        if not only or "ufuncs" in only:
            lines += bench_ufuncs(ctx) + [""]
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
    return "\n".join(lines), []
