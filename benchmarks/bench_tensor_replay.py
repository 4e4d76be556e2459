"""Tensor programs recorded once and replayed (issue 16 item 2): ``ad.record`` of tensor
code against eager easyad, torch eager and jax.jit.

Three workloads on the numpy device, every variant checked against a reference before it
is timed, the variants of a workload timed interleaved (medians, and the middle 50% of
the per-round ratios):

1. Vectorized Rosenbrock gradient at n = 10, 100, 1000, 10^6: ``F.gradient(x)`` of
   ``F = ad.record(rosen, x0, tensor=True)`` (fused generated C), eager ``ad.grad``,
   torch eager, ``jax.jit(jax.grad(f))``; record + gcc time beside jax's compile time
   (every record + gcc time is a cold compile: a fresh, empty EASYAD_CACHE_DIR each,
   ``ctx.cold_cache()``; a warm one only loads the cached library).
2. MLP 784-128-10 (tanh) SGD training step, batch 64, float64 and float32: the loss
   recorded once by the parameters (``ad.nn.functional_call``), each step
   ``F.sgd_step(params, x, y, lr=...)`` (the update inside the replayed program, as jax's
   jitted step has it), against the eager easyad step, torch eager and a jitted jax step.
3. Elementwise chain of 9 operations on 10^7 values (10^6 with --quick), value and
   gradient of its sum: replayed (one fused loop) against eager easyad, torch and jax.jit.
4. Batches: Rosenbrock's value and gradient at B points at once, ``F.value_and_gradient(X)``
   with X of shape (B, n) (one C loop over the points), against ``jax.jit(jax.vmap(
   jax.value_and_grad(f)))`` and ``torch.func.vmap`` of ``torch.func.grad_and_value``.

One core each, as ``bench_tensor_eager``. Run: ``python benchmarks/run.py --only
tensor_replay`` (``--quick`` for a short run).
"""
from __future__ import annotations

import os
import time

import numpy as np

import easyad as ad
from easyad import nn

NAME = "tensor_replay"
TITLE = ("easyad tensor programs recorded once and replayed (fused C): Rosenbrock, MLP step, "
         "elementwise chain, vs eager, torch eager and jax.jit")
LIBRARIES = ["easyad", "numpy", "torch", "jax", "jaxlib", "threadpoolctl"]


def _eager():
    import bench_tensor_eager
    return bench_tensor_eager


def bench_rosen(ctx, torch, jax):
    E = _eager()
    lines = ["### Vectorized Rosenbrock gradient (float64), replayed", "",
             "| n | replayed | eager ad.grad | torch eager | jax.jit | record + gcc (cold) | "
             "jax compile | replayed / torch | replayed / jax.jit | eager / replayed |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n in E.ROSEN_SIZES:
        x0 = np.random.default_rng(n).uniform(-1.0, 1.5, n)
        ref = E.rosen_grad_numpy(x0)
        with ctx.cold_cache():                # a real gcc run, not a disk-cache hit
            started = time.perf_counter()
            F = ad.record(E.rosen, x0, tensor=True)
            F.gradient(x0)                   # binds: renders and compiles the C
            record_s = time.perf_counter() - started
        variants = {"replayed": lambda x0=x0, F=F: F.gradient(x0)}
        grad = ad.grad(E.rosen)
        variants["eager"] = lambda x0=x0, grad=grad: grad(x0)
        if torch is not None:
            tx = torch.tensor(x0, requires_grad=True)

            def torch_grad(tx=tx):
                tx.grad = None
                E.rosen(tx).backward()
                return tx.grad
            variants["torch"] = torch_grad
        compile_s = None
        if jax is not None:
            jx = jax.numpy.asarray(x0)
            started = time.perf_counter()
            compiled = jax.jit(jax.grad(E.rosen)).lower(jx).compile()
            compile_s = time.perf_counter() - started
            variants["jax"] = lambda jx=jx, c=compiled: c(jx).block_until_ready()
        for name, v in variants.items():
            got = v()
            E._check(f"Rosenbrock n={n} {name}", np.asarray(got.detach() if hasattr(
                got, "detach") else got), ref)
        big = n >= 10**5
        timings = ctx.measure(variants, rounds=max(5, ctx.rounds // 3) if big else None)

        def ms(name, timings=timings):
            return E._ms(timings, name, ".4g")
        lines.append(
            f"| {n} | {ms('replayed')} | {ms('eager')} | {ms('torch')} | {ms('jax')} | "
            f"{record_s:.3f} s | {f'{compile_s:.3f} s' if compile_s is not None else 'n/a'} "
            f"| {E._ratio(timings, 'replayed', 'torch')} | "
            f"{E._ratio(timings, 'replayed', 'jax')} | {E._ratio(timings, 'eager', 'replayed')} |")
        ctx.log(f"   rosenbrock n={n} done")
    return lines


def replayed_step(state, dtype):
    """An SGD step of the MLP with its loss recorded once: parameters updated in place
    by the replayed program (``sgd_step``)."""
    import bench_nn
    model = nn.Sequential(nn.Linear(bench_nn.SIZES[0], bench_nn.SIZES[1], dtype=dtype),
                          nn.Tanh(), nn.Linear(bench_nn.SIZES[1], bench_nn.SIZES[2],
                                               dtype=dtype))
    model.load_state_dict(state)
    named = dict(model.named_parameters())
    x, y = bench_nn.data(dtype)

    def loss(p, x, y):
        return nn.functional.cross_entropy(nn.functional_call(model, p, x), y)
    started = time.perf_counter()
    F = ad.record(loss, {k: p.data for k, p in named.items()}, x, y)
    F.sgd_step({k: p.data.copy() for k, p in named.items()}, x, y, lr=bench_nn.LR)  # binds
    record_s = time.perf_counter() - started

    def step():
        return F.sgd_step({k: p.data for k, p in named.items()}, x, y, lr=bench_nn.LR)
    return step, record_s


def bench_mlp(ctx, torch, jax):
    import bench_nn
    E = _eager()
    ad.random.seed(0)
    init = nn.Sequential(nn.Linear(*bench_nn.SIZES[:2]), nn.Tanh(),
                         nn.Linear(*bench_nn.SIZES[1:])).state_dict()
    lines = [f"### MLP {'-'.join(map(str, bench_nn.SIZES))} (tanh) SGD step, batch "
             f"{bench_nn.BATCH}, replayed", "",
             "| dtype | replayed | eager | torch | jax.jit | record + gcc (cold) | jax compile | "
             "replayed / torch | replayed / jax.jit | eager / replayed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for dtype, bits in ((np.float64, "float64"), (np.float32, "float32")):
        state = {k: v.astype(dtype) for k, v in init.items()}
        variants, first = {}, {}
        with ctx.cold_cache():                # a real gcc run, not a disk-cache hit
            variants["replayed"], record_s = replayed_step(state, dtype)
        variants["eager"] = bench_nn.easyad_step(state, dtype, "numpy")[0]
        if torch is not None:
            variants["torch"] = bench_nn.torch_step(torch, state, dtype)[0]
        compile_s = None
        if jax is not None:
            variants["jax"], compile_s = E.jax_step(jax, state, dtype, bench_nn.LR,
                                                    bench_nn.data(dtype))
        for name, v in variants.items():
            first[name] = v()
        tol = 1e-9 if bits == "float64" else 1e-4
        for name in first:
            E._check(f"MLP {bits} {name}", first[name], first["eager"], tol)
        timings = ctx.measure(variants)

        def ms(name, timings=timings):
            return E._ms(timings, name, ".3f")
        lines.append(f"| {bits} | {ms('replayed')} | {ms('eager')} | {ms('torch')} | "
                     f"{ms('jax')} | {record_s:.3f} s | "
                     f"{f'{compile_s:.3f} s' if compile_s is not None else 'n/a'} | "
                     f"{E._ratio(timings, 'replayed', 'torch')} | "
                     f"{E._ratio(timings, 'replayed', 'jax')} | "
                     f"{E._ratio(timings, 'eager', 'replayed')} |")
    return lines


def bench_chain(ctx, torch, jax):
    import bench_tensor
    E = _eager()
    chain = bench_tensor.chain
    n = 10**6 if ctx.quick else 10**7
    x0 = np.random.default_rng(ctx.seed).uniform(0.1, 2.0, n)
    with ctx.cold_cache():                    # a real gcc run, not a disk-cache hit
        started = time.perf_counter()
        V = ad.record(lambda x: chain(x, ad), x0, tensor=True)
        V(x0)
        G = ad.record(lambda x: ad.sum(chain(x, ad)), x0, tensor=True)
        G.gradient(x0)
        record_s = time.perf_counter() - started
    tc = ad.Tensor.constant(x0)
    value = {"replayed": lambda: V(x0), "eager": lambda: chain(tc, ad)}

    def eager_grad():
        lst = ad.WengertList()
        t = ad.Tensor.variable(x0, lst)
        return chain(t, ad).sum().derivatives()[t]
    grad = {"replayed": lambda: G.gradient(x0), "eager": eager_grad}
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
    ref_value = chain(x0, np)
    for name, v in value.items():
        got = v()
        E._check(f"chain value {name}", got.value if isinstance(got, ad.Tensor) else
                 np.asarray(got), ref_value)
    ref_grad = np.asarray(grad["eager"]())
    for name, v in grad.items():
        E._check(f"chain gradient {name}", np.asarray(v()), ref_grad)
    rounds = max(5, ctx.rounds // 3)
    lines = [f"### Elementwise chain of 9 operations on {n:.0e} float64 values, replayed",
             "", f"record + gcc (value and gradient programs, cold): {record_s:.2f} s", "",
             "| part | replayed | eager | torch eager | jax.jit | jax compile | "
             "eager / replayed | replayed / torch | replayed / jax.jit |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kind, table in (("value", value), ("gradient", grad)):
        timings = ctx.measure(table, rounds=rounds)

        def ms(name, timings=timings):
            return E._ms(timings, name, ".1f")
        lines.append(f"| {kind} | {ms('replayed')} | {ms('eager')} | {ms('torch')} | "
                     f"{ms('jax')} | "
                     f"{f'{compile_s[kind]:.3f} s' if kind in compile_s else 'n/a'} | "
                     f"{E._ratio(timings, 'eager', 'replayed')} | "
                     f"{E._ratio(timings, 'replayed', 'torch')} | "
                     f"{E._ratio(timings, 'replayed', 'jax')} |")
    return lines


BATCHES = [(10, 1000), (100, 1000), (1000, 100)]      # (n, B)


def bench_batch(ctx, torch, jax):
    E = _eager()
    lines = ["### Batches: Rosenbrock value and gradient at B points, replayed", "",
             "| n | B | replayed batch | one call per point | torch.func vmap | "
             "jax.jit(vmap) | jax compile | batch / jax | per point / batch |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, count in BATCHES:
        X = np.random.default_rng(n).uniform(-1.0, 1.5, (count, n))
        ref = np.stack([E.rosen_grad_numpy(x) for x in X])
        F = ad.record(E.rosen, X[0], tensor=True)
        F.value_and_gradient(X)
        variants = {"batch": lambda X=X, F=F: F.value_and_gradient(X)[1],
                    "loop": lambda X=X, F=F: [F.value_and_gradient(x)[1] for x in X]}
        if torch is not None:
            tX = torch.tensor(X)
            tg = torch.func.vmap(torch.func.grad_and_value(E.rosen))
            variants["torch"] = lambda tX=tX, tg=tg: tg(tX)[0]
        compile_s = None
        if jax is not None:
            jX = jax.numpy.asarray(X)
            started = time.perf_counter()
            compiled = jax.jit(jax.vmap(jax.value_and_grad(E.rosen))).lower(jX).compile()
            compile_s = time.perf_counter() - started
            variants["jax"] = lambda jX=jX, c=compiled: c(jX)[1].block_until_ready()
        for name, v in variants.items():
            got = v()
            E._check(f"batch n={n} {name}", np.asarray(got.detach() if hasattr(
                got, "detach") else got), ref)
        timings = ctx.measure(variants)

        def ms(name, timings=timings):
            return E._ms(timings, name, ".4g")
        lines.append(
            f"| {n} | {count} | {ms('batch')} | {ms('loop')} | {ms('torch')} | {ms('jax')} "
            f"| {f'{compile_s:.3f} s' if compile_s is not None else 'n/a'} "
            f"| {E._ratio(timings, 'batch', 'jax')} | {E._ratio(timings, 'loop', 'batch')} |")
        ctx.log(f"   batch n={n} done")
    return lines


def run(ctx):
    E = _eager()
    torch = E._optional("torch")
    jax = E._jax()
    threadpoolctl = E._optional("threadpoolctl")
    limiter = threadpoolctl.threadpool_limits(E.THREADS) if threadpoolctl else None
    if torch is not None:
        torch.set_num_threads(E.THREADS)
    only = set(filter(None, os.environ.get("EASYAD_REPLAY_PARTS", "").split(",")))
    lines = ["All on one core each (torch 1 thread, BLAS 1 thread, XLA single-threaded). "
             "Ratios: median of the per-round ratios, middle 50% in brackets; < 1 means "
             "the first named is faster." + ("" if torch else " torch: not installed.")
             + ("" if jax else " jax: not installed.") + E.blas_note(threadpoolctl), ""]
    try:
        if not only or "rosen" in only:
            lines += bench_rosen(ctx, torch, jax) + [""]
        if not only or "mlp" in only:
            lines += bench_mlp(ctx, torch, jax) + [""]
        if not only or "chain" in only:
            lines += bench_chain(ctx, torch, jax) + [""]
        if not only or "batch" in only:
            lines += bench_batch(ctx, torch, jax) + [""]
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
    return "\n".join(lines), []
