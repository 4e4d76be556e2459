"""Issue 16's GPU table: easyad on an OpenCL GPU against PyTorch on CUDA, float32.

Runs only where an OpenCL GPU is found (the NVIDIA driver: see "GPU runs" in
``benchmarks/README.md`` for the command on a lent H100); elsewhere it reports that and
times nothing. ``EASYAD_GPU_BENCH=any`` runs it on any OpenCL device (PoCL's CPU here)
against PyTorch on the CPU, with the two small MLP sizes only: how this module is checked
on machines without a GPU.

- **MLP step**: ``Sequential(Linear(784, H), Tanh(), Linear(H, 10))`` + cross-entropy + SGD,
  H, B = 128, 64 / 1024, 1024 / 4096, 4096. Inputs are made once on the device, labels
  are class indices. Variants: easyad eager (``opt.step(loss.derivatives())``), easyad
  replayed (``ad.record`` of the loss by parameters, ``F.sgd_step(parameters, ...)``:
  the Parameters stay on the device, the batch and one-hot labels are device Tensors used
  as they are), and PyTorch (``zero_grad``, ``backward``,
  ``step``). "step + loss" reads the loss after every step (``loss.number``,
  ``loss.item()``), which waits for the device; "10 steps" reads only the tenth loss,
  so the host can queue ahead (easyad reads a device loss only when asked: the replayed
  step's ``lazy=True`` returns it as a device Tensor). Target
  (issue 16): easyad eager at most 1.5x PyTorch CUDA for H = 1024 and 4096.
- **small op**: 100 multiplications of a 1,000-element tensor by a number, then the
  queue finished: the launch cost per operation.
- **chain**: ``sum((exp(-x) sin(x) + 2 sqrt(x)) / (1 + x x))`` on 10^7 float32 values,
  value and gradient: easyad eager, easyad replayed (one fused kernel), PyTorch eager.
- **small op floor**: the same 100 multiplications as one prebuilt pyopencl kernel launched
  into preallocated buffers: what the driver costs, so easyad's own share is visible.
- **Rosenbrock replay** (issue 15 item 3): a scalar tape (n = 100) replayed for B = 10^6
  points, float64: ``F.gradient(Xd, device=...)`` with X already on the device and G left
  there, against the compiled C replay (``F.compile()``) on all the machine's cores.
  Target: at most 1/10 of the C time.
- **TensorFunction batch**: ``ad.record(f, x0, tensor=True, device=...)`` of a vectorised
  Rosenbrock (n = 100) given B points at once, against the numpy device's one C loop.
- **conv2d, attention, a batch with products**: ``gpu_layers.py`` (its docstring);
  ``EASYAD_GPU_SECTIONS=layers`` runs only these.

Every variant is checked before timing: one step from the same weights gives PyTorch's
loss to 1e-4 (float32), the chain gives numpy's value and gradient to 1e-4.
"""
from __future__ import annotations

import os

import numpy as np

import easyad as ad
from easyad import nn, optim

NAME = "gpu"
TITLE = "GPU: easyad on OpenCL against PyTorch on CUDA (issues 16, 30)"
LIBRARIES = ["easyad", "numpy", "torch", "pyopencl"]

SIZES = [(128, 64), (1024, 1024), (4096, 4096)]      # (H, B)
ANY_DEVICE_SIZES = [(128, 64), (512, 256)]
TARGET = 1.5          # easyad eager / PyTorch CUDA, H >= 1024
LR = 0.01
TOLERANCE = 1e-4      # float32
BURST = 10            # steps per call of the "10 steps" variants
N_CHAIN = 10**7
SMALL_OPS = 100
REPLAY_BATCH = 10**6
TENSOR_BATCH = 200


def _device():
    """The OpenCL GPU (or, with EASYAD_GPU_BENCH=any, any OpenCL device), or None."""
    try:
        found = [d for d in ad.devices() if d.kind == "opencl"]
    except Exception:   # no pyopencl, no driver
        return None
    gpus = [d for d in found if d.is_gpu]
    if gpus:
        return gpus[0]
    if os.environ.get("EASYAD_GPU_BENCH") == "any" and found:
        return found[0]
    return None


def _finish(tensor):
    tensor.device.backend.queue.finish()


class EagerMLP:
    """The eager MLP 784-H-10 of the diagnostics (gpu_profile.py, eager_host.py) on
    ``device``: a batch of B inputs made once there, labels, SGD; ``step()`` returns the
    loss Tensor (unread)."""

    def __init__(self, device, hidden, batch):
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((batch, 784)).astype(np.float32)
        self.y = rng.integers(0, 10, batch)
        self.model = nn.Sequential(nn.Linear(784, hidden, dtype=np.float32), nn.Tanh(),
                                   nn.Linear(hidden, 10, dtype=np.float32)).to(device.name)
        self.opt = optim.SGD(self.model.parameters(), lr=LR)
        self.xt = ad.Tensor.constant(self.x, device=device.name, dtype=np.float32)

    def step(self):
        loss = nn.cross_entropy(self.model(self.xt, tape=ad.WengertList()), self.y)
        self.opt.step(loss.derivatives())
        return loss


def _mlp_variants(torch, tdev, device, hidden, batch):
    ad.random.seed(0)
    init = nn.Sequential(nn.Linear(784, hidden, dtype=np.float32), nn.Tanh(),
                         nn.Linear(hidden, 10, dtype=np.float32)).state_dict()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch)

    def easyad_model():
        model = nn.Sequential(nn.Linear(784, hidden, dtype=np.float32), nn.Tanh(),
                              nn.Linear(hidden, 10, dtype=np.float32)).to(device.name)
        model.load_state_dict(init)
        return model

    eager_model = easyad_model()
    eager_opt = optim.SGD(eager_model.parameters(), lr=LR)
    xt = ad.Tensor.constant(x, device=device.name, dtype=np.float32)

    def eager_step():
        lst = ad.WengertList()
        loss = nn.cross_entropy(eager_model(xt, tape=lst), y)
        eager_opt.step(loss.derivatives())
        return loss

    replay_model = easyad_model()
    named = dict(replay_model.named_parameters())
    onehot = np.eye(10, dtype=np.float32)[y]

    def loss_of(params, xs, ys):
        return nn.functional.cross_entropy(nn.functional_call(replay_model, params, xs), ys)
    replayed = ad.record(loss_of, {k: p.data.copy() for k, p in named.items()}, x, onehot,
                         device=device.name)
    # the batch made once on the device, as PyTorch's (a replay uses device Tensors as is)
    onehot_t = ad.Tensor.constant(onehot, device=device.name, dtype=np.float32)

    tmodel = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.Tanh(),
                                 torch.nn.Linear(hidden, 10)).to(tdev)
    tmodel.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    topt = torch.optim.SGD(tmodel.parameters(), lr=LR)
    tx = torch.tensor(x, device=tdev)
    ty = torch.tensor(y, device=tdev)

    def torch_step():
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
        loss.backward()
        topt.step()
        return loss

    first = {"easyad eager": eager_step().number,
             "easyad replayed": replayed.sgd_step(named, xt, onehot_t, lr=LR),
             "PyTorch": torch_step().item()}
    for name, value in first.items():
        if abs(value - first["PyTorch"]) > TOLERANCE * abs(first["PyTorch"]):
            raise SystemExit(f"MLP H={hidden}: {name}'s first loss {value} is not PyTorch's "
                             f"{first['PyTorch']}: not benchmarking")

    def burst(step, read):
        def call():
            for _ in range(BURST - 1):
                step()
            return read(step())
        return call
    return {
        "easyad eager, step + loss": lambda: eager_step().number,
        "easyad replayed, step + loss": lambda: replayed.sgd_step(named, xt, onehot_t, lr=LR),
        "PyTorch, step + loss": lambda: torch_step().item(),
        f"easyad eager, {BURST} steps": burst(eager_step, lambda loss: loss.number),
        f"easyad replayed, {BURST} steps": burst(
            lambda: replayed.sgd_step(named, xt, onehot_t, lr=LR, lazy=True), float),
        f"PyTorch, {BURST} steps": burst(torch_step, lambda loss: loss.item()),
    }


def _chain(x, m):
    return (m.exp(-x) * m.sin(x) + m.sqrt(x) * 2.0) / (1.0 + x * x)


def _chain_variants(torch, tdev, device, n):
    x0 = np.random.default_rng(1).uniform(0.1, 2.0, n).astype(np.float32)

    def eager():
        lst = ad.WengertList()
        t = ad.Tensor.variable(x0, lst, device=device.name, dtype=np.float32)
        z = ad.sum(_chain(t, ad))
        return z.number, np.asarray(z.derivatives()[t])
    fused = ad.record(lambda x: ad.sum(_chain(x, ad)), x0, tensor=True, device=device.name)

    def torch_chain():
        t = torch.tensor(x0, device=tdev, requires_grad=True)
        z = _chain(t, torch).sum()
        z.backward()
        return z.item(), t.grad.cpu().numpy()
    variants = {"easyad eager": eager, "easyad replayed (fused)":
                lambda: fused.value_and_gradient(x0), "PyTorch": torch_chain}
    x64 = x0.astype(np.float64)
    top = np.exp(-x64) * np.sin(x64) + 2 * np.sqrt(x64)
    dtop = np.exp(-x64) * (np.cos(x64) - np.sin(x64)) + 1 / np.sqrt(x64)
    value, grad = float(np.sum(top / (1 + x64 * x64))), \
        (dtop * (1 + x64 * x64) - top * 2 * x64) / (1 + x64 * x64) ** 2
    for name, call in variants.items():
        v, g = call()
        if not (abs(v - value) <= TOLERANCE * abs(value)
                and np.allclose(g, grad, rtol=TOLERANCE, atol=TOLERANCE)):
            raise SystemExit(f"chain: {name} disagrees with numpy: not benchmarking")
    return variants


def _small_op_variants(torch, tdev, device):
    t = ad.Tensor.constant(np.ones(1000, dtype=np.float32), device=device.name,
                           dtype=np.float32)
    tt = torch.ones(1000, device=tdev)
    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)

    def easyad_ops():
        y = t
        for _ in range(SMALL_OPS):
            y = y * 1.0001
        _finish(y)

    def torch_ops():
        y = tt
        for _ in range(SMALL_OPS):
            y = y * 1.0001
        sync()
    import pyopencl as cl
    queue = device.backend.queue
    kernel = cl.Program(queue.context, """
        __kernel void scale(__global float *y, __global const float *x, float a, int n) {
            int i = get_global_id(0); if (i < n) y[i] = x[i] * a; }""").build().scale
    kernel.set_scalar_arg_dtypes([None, None, np.float32, np.int32])
    bufs = [cl.Buffer(queue.context, cl.mem_flags.READ_WRITE, 4000) for _ in range(2)]

    def floor_ops():
        for i in range(SMALL_OPS):
            kernel(queue, (1024,), (256,), bufs[(i + 1) % 2], bufs[i % 2],
                   np.float32(1.0001), np.int32(1000))
        queue.finish()
    return {"easyad": easyad_ops, "pyopencl kernel (floor)": floor_ops, "PyTorch": torch_ops}


def _rosenbrock(x):
    s = 0.0
    for i in range(len(x) - 1):
        s = s + 100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2
    return s


def _rosenbrock_vector(x):
    return ad.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def _replay_variants(device, batch, n=100):
    """Scalar-tape replay of B Rosenbrock gradients: OpenCL device-resident and with host
    arrays, against the compiled C replay on all cores; all checked against the C one."""
    import pyopencl.array as cl_array
    F = ad.record(_rosenbrock, np.ones(n))
    C = ad.record(_rosenbrock, np.ones(n))
    C.compile()
    X = np.random.default_rng(2).uniform(0.5, 1.5, (batch, n))
    Xd = cl_array.to_device(device.backend.queue, np.ascontiguousarray(X.T)).T
    reference = C.gradient(X[:64])
    np.testing.assert_allclose(F.gradient(X[:64], device=device), reference, rtol=1e-12)
    np.testing.assert_allclose(F.gradient(Xd, device=device).T.get()[:, :64].T, reference,
                               rtol=1e-12)
    return {"OpenCL, device-resident": lambda: F.gradient(Xd, device=device),
            "OpenCL, host arrays": lambda: F.gradient(X, device=device),
            "compiled C, all cores": lambda: C.gradient(X)}


def _tensor_batch_variants(device, batch, n=100):
    x0 = np.ones(n)
    on_device = ad.record(_rosenbrock_vector, x0, tensor=True, device=device.name)
    on_host = ad.record(_rosenbrock_vector, x0, tensor=True)
    X = np.random.default_rng(3).uniform(0.5, 1.5, (batch, n))
    v_ref, g_ref = on_host.value_and_gradient(X)
    v, g = on_device.value_and_gradient(X)
    np.testing.assert_allclose(v, v_ref, rtol=1e-12)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12)
    from easyad.compiler.program import batch_cl
    how = "one launch per kernel" if batch_cl.batched(on_device._bound["gradient"]) \
        else "a replay per point"
    return {f"{device.name}, TensorFunction batch ({how})":
            lambda: on_device.value_and_gradient(X),
            "numpy device, one C loop": lambda: on_host.value_and_gradient(X)}


def _rows(ctx, timings, names, base, per=1.0, unit="ms", scale=1e3):
    import run
    rows = []
    for name in names:
        q1, q3 = run.quartiles(timings.per_call[name])
        cell = f"{timings.median(name) * scale / per:.3f} ({q1 * scale / per:.3f}-" \
               f"{q3 * scale / per:.3f})"
        ratio = ""
        if name != base:
            r1, r3 = timings.ratio_quartiles(name, base)
            ratio = f"{timings.ratio(name, base):.2f}x ({r1:.2f}-{r3:.2f})"
        rows.append(f"| {name} | {cell} {unit} | {ratio} |")
    return rows


def run(ctx):
    device = _device()
    if device is None:
        return ("No OpenCL GPU here (`ad.devices()` lists none), so nothing was timed. "
                "`EASYAD_GPU_BENCH=any` runs the table on any OpenCL device against "
                "PyTorch on the CPU.", [])
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed: no reference, nothing timed.", ["no PyTorch"]
    tdev = "cuda" if device.is_gpu and torch.cuda.is_available() else "cpu"
    sizes = SIZES if device.is_gpu else ANY_DEVICE_SIZES
    n_chain = N_CHAIN if device.is_gpu and not ctx.quick else 10**6
    lines = [f"easyad on {device.name} ({device.description}), PyTorch "
             f"{torch.__version__} on {tdev}"
             + (f" ({torch.cuda.get_device_name()})" if tdev == "cuda" else "")
             + "; float32; medians over interleaved rounds (middle 50% in brackets); the "
             f"float GEMM's 128x128 tile: {os.environ.get('EASYAD_OPENCL_GEMM_BIG') or 'big-1buf'}"
             " (``EASYAD_OPENCL_GEMM_BIG``).", ""]
    missed = []
    if os.environ.get("EASYAD_GPU_SECTIONS") == "layers":   # a second, shorter device run
        sizes = []
    for hidden, batch in sizes:
        ctx.log(f"   MLP H={hidden}, B={batch}")
        variants = _mlp_variants(torch, tdev, device, hidden, batch)
        timings = ctx.measure(variants)
        lines += [f"### MLP 784-{hidden}-10, batch {batch}", "",
                  "ms per step; ratio vs PyTorch in the same column.", "",
                  "| variant | ms per step | ratio vs PyTorch |", "| --- | ---: | ---: |"]
        lines += _rows(ctx, timings, [n for n in variants if n.endswith("loss")],
                       "PyTorch, step + loss")
        burst = [n for n in variants if n.endswith("steps")]
        lines += _rows(ctx, timings, burst, f"PyTorch, {BURST} steps", per=BURST)
        ratio = timings.ratio(f"easyad eager, {BURST} steps", f"PyTorch, {BURST} steps")
        if hidden >= 1024 and tdev == "cuda" and ratio > TARGET:
            missed.append(f"MLP H={hidden}: easyad eager {ratio:.2f}x PyTorch CUDA "
                          f"(target {TARGET:g}x)")
        lines.append("")
    if not sizes:
        lines += _layer_sections(ctx, torch, tdev, device, missed)
        return "\n".join(lines), missed
    ctx.log("   small ops")
    timings = ctx.measure(_small_op_variants(torch, tdev, device))
    lines += ["### small op", "", f"{SMALL_OPS} multiplications of 1,000 values, time per "
              "operation.", "", "| variant | time per op | ratio vs PyTorch |",
              "| --- | ---: | ---: |"]
    lines += _rows(ctx, timings, ["easyad", "pyopencl kernel (floor)", "PyTorch"], "PyTorch",
                   per=SMALL_OPS, unit="us", scale=1e6)
    ctx.log(f"   chain, n={n_chain}")
    variants = _chain_variants(torch, tdev, device, n_chain)
    timings = ctx.measure(variants)
    lines += ["", f"### chain of 9 operations, value and gradient, n = {n_chain:,}", "",
              "Inputs from the host, gradient back to it, every variant.", "",
              "| variant | ms per call | ratio vs PyTorch |", "| --- | ---: | ---: |"]
    lines += _rows(ctx, timings, list(variants), "PyTorch")
    if device.fp64:
        batch = REPLAY_BATCH if device.is_gpu and not ctx.quick else 10**5
        ctx.log(f"   Rosenbrock replay, B={batch}")
        variants = _replay_variants(device, batch)
        timings = ctx.measure(variants, rounds=None if ctx.quick else 8)
        lines += ["", f"### Rosenbrock gradients replayed from a scalar tape, n = 100, B = "
                  f"{batch:,}, float64", "", f"Compiled C on {os.cpu_count()} cores.", "",
                  "| variant | ms per batch | ratio vs compiled C |", "| --- | ---: | ---: |"]
        lines += _rows(ctx, timings, list(variants), "compiled C, all cores")
        ratio = timings.ratio("OpenCL, device-resident", "compiled C, all cores")
        if device.is_gpu and ratio > 0.1:
            missed.append(f"Rosenbrock replay B={batch}: device-resident {ratio:.2f}x the "
                          f"compiled C (target 0.1x)")
        ctx.log("   TensorFunction batch")
        variants = _tensor_batch_variants(device, TENSOR_BATCH)
        timings = ctx.measure(variants, rounds=None if ctx.quick else 8)
        lines += ["", f"### TensorFunction value and gradient at a batch of {TENSOR_BATCH:,} "
                  "points", "", "Vectorised Rosenbrock, n = 100, float64.", "",
                  "| variant | ms per batch | ratio vs numpy device |", "| --- | ---: | ---: |"]
        lines += _rows(ctx, timings, list(variants), "numpy device, one C loop")
    lines += _layer_sections(ctx, torch, tdev, device, missed)
    return "\n".join(lines), missed


def _layer_sections(ctx, torch, tdev, device, missed):
    """conv2d, attention and the batch with products (``gpu_layers.py``): a section that
    fails its check or raises is reported as such, and the others still run."""
    import gpu_layers
    lines = []
    sections = [("conv2d", gpu_layers.conv_variants, "PyTorch"),
                ("attention", gpu_layers.attention_variants, "PyTorch, fused kernel"),
                ("batch", gpu_layers.batch_variants, "easyad, numpy device")]
    for label, make, base in sections:
        ctx.log(f"   {label}")
        try:
            title, variants = make(torch, tdev, device, device.is_gpu and not ctx.quick)
            timings = ctx.measure(variants, rounds=None if ctx.quick else 8)
        except (Exception, SystemExit) as error:     # noqa: BLE001 (reported, not hidden)
            lines += ["", f"### {label}", "", f"Not measured: {type(error).__name__}: {error}"]
            missed.append(f"{label}: not measured ({type(error).__name__})")
            continue
        lines += ["", f"### {title}", "", "| variant | ms per call | ratio |",
                  "| --- | ---: | ---: |"]
        if label == "conv2d":      # forward against forward, backward against backward
            names = list(variants)
            lines += _rows(ctx, timings, names[:3], "PyTorch, forward")
            lines += _rows(ctx, timings, names[3:], "PyTorch, forward + backward")
        else:
            lines += _rows(ctx, timings, list(variants), base)
    return lines
