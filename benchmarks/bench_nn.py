"""One training step of an MLP, easyad.nn against PyTorch on the CPU.

The model is the MNIST-shaped MLP 784-128-10 with tanh, a batch of 64 (fixed random
data), cross-entropy on class indices and plain SGD (lr 0.01). One step is

    easyad:  lst = ad.WengertList(); loss = nn.cross_entropy(model(x, tape=lst), y)
             opt.step(loss.derivatives())
    PyTorch: opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()

The batch is made a tensor once, outside the step, on both sides (``ad.Tensor.constant``,
``torch.tensor``). Both start from the same weights; before any timing one step of each variant
must give
the same loss and the same updated parameters as PyTorch in float64 (to 1e-9). Threads:
PyTorch's intra-op threads and numpy's BLAS threads are pinned to the same number
(``THREADS``, with ``torch.set_num_threads`` and threadpoolctl); the OpenCL variant runs on
PoCL's CPU device, which uses its own thread pool.

Target (issue 5): an easyad step on the numpy device takes at most 1.5x PyTorch's, in
float64 and in float32. The OpenCL figure is reported beside it, without a target.

Run through ``python benchmarks/run.py --only nn`` (``--quick`` for a short run).
"""
from __future__ import annotations

import importlib

import numpy as np

import easyad as ad
from easyad import nn, optim

NAME = "nn"
TITLE = "easyad.nn: one SGD training step of an MLP 784-128-10 (tanh), batch 64, vs PyTorch"
LIBRARIES = ["easyad", "numpy", "torch", "threadpoolctl", "pyopencl",
             "pocl-binary-distribution"]

THREADS = 1          # PyTorch intra-op threads = numpy BLAS threads
TARGET = 1.5         # easyad numpy step / PyTorch step
BATCH, SIZES, LR = 64, (784, 128, 10), 0.01
TOLERANCE = 1e-9


def _optional(name):
    try:
        return importlib.import_module(name)
    except Exception:   # not installed, or broken: the report says so
        return None


def data(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((BATCH, SIZES[0])).astype(dtype)
    y = rng.integers(0, SIZES[-1], BATCH)
    return x, y


def easyad_step(state, dtype, device):
    model = nn.Sequential(nn.Linear(SIZES[0], SIZES[1], dtype=dtype), nn.Tanh(),
                          nn.Linear(SIZES[1], SIZES[2], dtype=dtype)).to(device)
    model.load_state_dict(state)
    opt = optim.SGD(model.parameters(), lr=LR)
    x, y = data(dtype)
    x = ad.Tensor.constant(x, device=device)      # once, as PyTorch's tensor below

    def step():
        lst = ad.WengertList()
        loss = nn.cross_entropy(model(x, tape=lst), y)
        opt.step(loss.derivatives())
        return loss.number
    return step, model


def torch_step(torch, state, dtype):
    tdtype = torch.float64 if dtype == np.float64 else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.Tanh(),
                                torch.nn.Linear(SIZES[1], SIZES[2])).to(tdtype)
    model.load_state_dict({k: torch.tensor(v, dtype=tdtype) for k, v in state.items()})
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = data(dtype)
    tx, ty = torch.tensor(x), torch.tensor(y)

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss.item()
    return step, model


def _state(model):
    return {k: (v.detach().numpy() if hasattr(v, "detach") else v).astype(np.float64)
            for k, v in model.state_dict().items()}


def agree(a, b):
    return all(np.allclose(a[k], b[k], rtol=TOLERANCE, atol=TOLERANCE) for k in a)


def run(ctx):
    torch = _optional("torch")
    threadpoolctl = _optional("threadpoolctl")
    limiter = threadpoolctl.threadpool_limits(THREADS) if threadpoolctl else None
    if torch is not None:
        torch.set_num_threads(THREADS)
    opencl = [d for d in ad.devices() if d.kind == "opencl"][:1]

    ad.random.seed(0)
    init = nn.Sequential(nn.Linear(SIZES[0], SIZES[1]), nn.Tanh(),
                         nn.Linear(SIZES[1], SIZES[2])).state_dict()
    variants, built = {}, {}
    for dtype, bits in ((np.float64, "float64"), (np.float32, "float32")):
        state = {k: v.astype(dtype) for k, v in init.items()}
        if torch is not None:
            built[f"PyTorch CPU, {bits}"] = torch_step(torch, state, dtype)
        built[f"easyad numpy, {bits}"] = easyad_step(state, dtype, "numpy")
        if opencl and bits == "float64":
            built[f"easyad OpenCL ({opencl[0].description}), {bits}"] = \
                easyad_step(state, dtype, opencl[0].name)

    # 1. correctness: one step of each from the same weights, against PyTorch (float64)
    losses, after = {}, {}
    for name, (step, model) in built.items():
        losses[name] = step()
        after[name] = _state(model)
    reference = "PyTorch CPU, float64" if torch is not None else "easyad numpy, float64"
    for name in built:
        if "float64" not in name:
            continue
        ok = abs(losses[name] - losses[reference]) <= TOLERANCE * abs(losses[reference]) \
            and agree(after[name], after[reference])
        if not ok:
            raise SystemExit(f"{name} disagrees with {reference} after one step: not "
                             f"benchmarking")
    ctx.log(f"   one step from the same weights: loss {losses[reference]:.12f}, all float64 "
            f"variants agree with {reference} to {TOLERANCE:g}")
    variants = {name: step for name, (step, _) in built.items()}

    # 2. timing, interleaved
    ctx.log(f"   timing {len(variants)} variants, {ctx.rounds} rounds")
    timings = ctx.measure(variants)
    if limiter is not None:
        limiter.restore_original_limits()

    missed = []
    rows = []
    for name in variants:
        bits = name.rsplit(", ", 1)[1]
        base = f"PyTorch CPU, {bits}"
        ms = timings.median(name) * 1e3
        if torch is None or name == base:
            rows.append((name, f"{ms:.3f}", "1.00x" if name == base else "", "", "baseline"
                         if name == base else "", ""))
            continue
        ratio = timings.ratio(name, base)
        q1, q3 = timings.ratio_quartiles(name, base)
        target, result = "", ""
        if name.startswith("easyad numpy"):
            target = f"<= {TARGET:g}x"
            ok = ratio <= TARGET
            result = "pass" if ok else "**FAIL**"
            if not ok:
                missed.append(f"{name}: {ratio:.2f}x PyTorch (target {TARGET:g}x)")
        rows.append((name, f"{ms:.3f}", f"{ratio:.2f}x", f"{q1:.2f}-{q3:.2f}", target, result))
    if torch is None:
        missed.append("PyTorch is not installed: no ratio")

    blas = "unknown"
    if threadpoolctl is not None:
        info = [f"{p['internal_api']} {p['version']} ({p['num_threads']} threads)"
                for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
        blas = ", ".join(info) or "none found"
    lines = [
        f"MLP {'-'.join(map(str, SIZES))} with tanh, batch {BATCH}, cross-entropy on class "
        f"indices, SGD lr {LR}; one call = one whole training step (forward, backward, "
        f"update). Threads: PyTorch {THREADS} (torch.set_num_threads), numpy BLAS "
        f"{THREADS} (threadpoolctl{'' if threadpoolctl else ': not installed, left as is'}"
        f"); BLAS at import: {blas}. Before timing, one step of every float64 variant "
        f"from the same weights gave PyTorch's loss and parameters to {TOLERANCE:g}.",
        "",
        "| variant | ms per step (median) | ratio vs PyTorch, same dtype (median) "
        "| middle 50% of ratios | target | pass/fail |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    if not opencl:
        lines += ["", "OpenCL: no device (install pyopencl and pocl-binary-distribution)."]
    return "\n".join(lines), missed
