"""Issue 28's layer speeds in one run: conv2d, causal attention and an LSTM, forward and
backward in float32, easyad against torch eager and jax.jit on the CPU.

The three cases (issue 28, item 4):

    conv2d     batch 64, 32 -> 32 channels, 28x28, 3x3, padding 1, bias
    attention  batch 32 x 8 heads, sequence 128, head size 64, causal (no weights)
    lstm       batch 64, input 128, hidden 256, one layer over a sequence of 32

each as the loss ``sum(y * g)`` of the layer's output ``y`` (``g`` a fixed random
cotangent) and its gradient in the input and every parameter. Variants: easyad eager (a
fresh WengertList per call, the input and parameters as variables, ``derivatives()``;
the input and ``g`` made tensors once, as torch's are),
torch eager (leaves made once, ``.grad`` cleared, ``backward``), easyad replayed (the
loss recorded once with ``ad.record``, parameters and input as its arguments;
``value_and_gradient`` per call) and ``jax.jit(jax.value_and_grad(loss))`` of the same
computation when jax is importable (the compile time of its first call is reported, as
is easyad's recording time). Before any timing every variant's value and gradients are
checked against torch's in float32 (to 2e-4 of the largest entry: sums of up to 10^5
float32 products).

Threads: one everywhere (numpy's BLAS by threadpoolctl, ``torch.set_num_threads``,
XLA's flags set before jax is imported), the same for every library. Targets: eager at
most torch's time, replayed at most jax.jit's (ratios <= 1).

Run through ``python benchmarks/run.py --only layers`` (with the peers:
``.venv-bench/bin/python``).
"""
from __future__ import annotations

import importlib
import os
import time

import numpy as np

import easyad as ad
from easyad import nn

NAME = "layers"
TITLE = ("nn layers, float32 forward+backward: conv2d, causal attention, LSTM vs torch "
         "eager and jax.jit")
LIBRARIES = ["easyad", "numpy", "torch", "jax", "jaxlib", "threadpoolctl"]

THREADS = 1
TOLERANCE = 2e-4          # of the largest entry of each array, float32
DTYPE = np.float32
CONV = dict(batch=64, channels=32, size=28)
ATTENTION = dict(batch=32, heads=8, seq=128, d=64)
LSTM = dict(batch=64, input=128, hidden=256, steps=32)


def _optional(name):
    try:
        return importlib.import_module(name)
    except Exception:   # not installed, or broken: the report says so
        return None


# ---- the three cases: arrays, easyad loss, torch loss, jax loss ----

def _conv_case(rng, torch):
    b, c, s = CONV["batch"], CONV["channels"], CONV["size"]
    torch.manual_seed(0)
    theirs = torch.nn.Conv2d(c, c, 3, padding=1)
    ours = nn.Conv2d(c, c, 3, padding=1, dtype=DTYPE)
    params = {k: v.detach().numpy().astype(DTYPE) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(params)
    x = rng.normal(size=(b, c, s, s)).astype(DTYPE)
    g = rng.normal(size=(b, c, s, s)).astype(DTYPE)

    def loss(p, x, g=g):
        return ad.sum(nn.functional_call(ours, p, x) * g)

    def jax_loss(jax, jnp):
        def f(p, x):
            y = jax.lax.conv_general_dilated(x, p["weight"], (1, 1), ((1, 1), (1, 1)),
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return jnp.sum((y + p["bias"][:, None, None]) * g)
        return f
    return dict(params=params, x=x, g=g, loss=loss, torch_module=theirs, jax_loss=jax_loss,
                torch_out=lambda tx: theirs(tx))


def _attention_case(rng, torch):
    b, h, n, d = (ATTENTION[k] for k in ("batch", "heads", "seq", "d"))
    qkv = {k: rng.normal(size=(b, h, n, d)).astype(DTYPE) for k in "qkv"}
    g = rng.normal(size=(b, h, n, d)).astype(DTYPE)
    F = nn.functional

    def loss(p, x, g=g):
        return ad.sum(F.scaled_dot_product_attention(p["q"], p["k"], p["v"],
                                                     is_causal=True) * g)

    def jax_loss(jax, jnp):
        mask = np.tril(np.ones((n, n), dtype=bool))

        def f(p, x):
            scores = jnp.einsum("bhqd,bhkd->bhqk", p["q"], p["k"]) / np.sqrt(d)
            scores = jnp.where(mask, scores, -jnp.inf)
            y = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), p["v"])
            return jnp.sum(y * g)
        return f

    def torch_out(tp):
        return torch.nn.functional.scaled_dot_product_attention(tp["q"], tp["k"], tp["v"],
                                                                is_causal=True)
    # no weights: the "parameters" are q, k and v (the input x is unused)
    return dict(params=qkv, x=None, g=g, loss=loss, torch_module=None, jax_loss=jax_loss,
                torch_out=torch_out)


def _lstm_case(rng, torch):
    b, i, hd, t = (LSTM[k] for k in ("batch", "input", "hidden", "steps"))
    torch.manual_seed(0)
    theirs = torch.nn.LSTM(i, hd)
    ours = nn.LSTM(i, hd, dtype=DTYPE)
    params = {k: v.detach().numpy().astype(DTYPE) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(params)
    x = rng.normal(size=(t, b, i)).astype(DTYPE)
    g = rng.normal(size=(t, b, hd)).astype(DTYPE)

    def loss(p, x, g=g):
        return ad.sum(nn.functional_call(ours, p, x)[0] * g)

    def jax_loss(jax, jnp):
        def step(p, carry, xt):
            h, c = carry
            gates = xt @ p["weight_ih_l0"].T + p["bias_ih_l0"] + h @ p["weight_hh_l0"].T + \
                p["bias_hh_l0"]
            ig, fg, gg, og = jnp.split(gates, 4, axis=-1)
            c = jax.nn.sigmoid(fg) * c + jax.nn.sigmoid(ig) * jnp.tanh(gg)
            h = jax.nn.sigmoid(og) * jnp.tanh(c)
            return (h, c), h

        def f(p, x):
            zeros = jnp.zeros((x.shape[1], hd), x.dtype)
            _, hs = jax.lax.scan(lambda carry, xt: step(p, carry, xt), (zeros, zeros), x)
            return jnp.sum(hs * g)
        return f
    return dict(params=params, x=x, g=g, loss=loss, torch_module=theirs, jax_loss=jax_loss,
                torch_out=lambda tx: theirs(tx)[0])


CASES = {"conv2d": _conv_case, "attention (causal)": _attention_case, "lstm": _lstm_case}
SHAPES = {"conv2d": "batch 64, 32 -> 32 channels, 28x28, 3x3, padding 1",
          "attention (causal)": "batch 32 x 8 heads, sequence 128, d 64",
          "lstm": "batch 64, input 128, hidden 256, sequence 32"}


# ---- the variants of one case ----

def _variants(case, torch, jax):
    params, x, g, loss = case["params"], case["x"], case["g"], case["loss"]
    tg = torch.tensor(g)
    module = case["torch_module"]
    if module is not None:
        tx = torch.tensor(x, requires_grad=True)
        leaves = dict(module.named_parameters())
    else:
        tx = None
        leaves = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}

    def torch_step():
        for t in [*leaves.values(), tx]:
            if t is not None:
                t.grad = None
        y = case["torch_out"](tx if module is not None else leaves)
        value = (y * tg).sum()
        value.backward()
        return value

    def torch_result():
        value = torch_step()
        grads = {k: t.grad.numpy() for k, t in leaves.items()}
        if tx is not None:
            grads["x"] = tx.grad.numpy()
        return value.item(), grads

    # the input and cotangent made tensors once, as torch's tx and tg are: a variable
    # made from a tensor shares its buffer (no copy per call)
    x0 = ad.Tensor.constant(x) if x is not None else None
    g0 = ad.Tensor.constant(g)

    def eager():
        lst = ad.WengertList()
        p = {k: ad.Tensor.variable(v, lst) for k, v in params.items()}
        X = ad.Tensor.variable(x0, lst) if x0 is not None else None
        value = loss(p, X, g0)
        d = value.derivatives()
        return value, d, p, X

    def eager_result():
        value, d, p, X = eager()
        grads = {k: d[t] for k, t in p.items()}
        if X is not None:
            grads["x"] = d[X]
        return float(value.number), grads

    # one structure of arguments: the gradient in the parameters and the input at once
    z = {"p": params} if x is None else {"p": params, "x": x}
    started = time.perf_counter()
    recorded = ad.record(lambda z: loss(z["p"], z.get("x")), z)
    record_s = time.perf_counter() - started

    def replayed():
        return recorded.value_and_gradient(z)

    def replayed_result():
        value, grads = replayed()
        return float(value), {**grads["p"], **({"x": grads["x"]} if x is not None else {})}

    variants = {"torch": (torch_step, torch_result), "easyad": (eager, eager_result),
                "easyad replayed": (replayed, replayed_result)}
    compile_s = None
    if jax is not None:
        jnp = importlib.import_module("jax.numpy")
        argnums = (0, 1) if x is not None else 0
        f = jax.jit(jax.value_and_grad(case["jax_loss"](jax, jnp), argnums=argnums))
        jp = {k: jnp.asarray(v) for k, v in params.items()}
        jx = jnp.asarray(x) if x is not None else jnp.zeros(())
        started = time.perf_counter()
        jax.block_until_ready(f(jp, jx))
        compile_s = time.perf_counter() - started

        def jitted():
            return jax.block_until_ready(f(jp, jx))

        def jax_result():
            value, grads = jitted()
            if x is not None:
                grads = {**grads[0], "x": grads[1]}
            return float(value), {k: np.asarray(v) for k, v in grads.items()}
        variants["jax.jit"] = (jitted, jax_result)
    return variants, record_s, compile_s


def _check(name, label, result, reference):
    value, grads = result
    rvalue, rgrads = reference
    if abs(value - rvalue) > TOLERANCE * max(1.0, abs(rvalue)):
        raise SystemExit(f"{name}, {label}: value {value} where torch gives {rvalue}")
    for k, want in rgrads.items():
        got = np.asarray(grads[k], dtype=np.float64)
        scale = max(1.0, float(np.max(np.abs(want))))
        if got.shape != want.shape or np.max(np.abs(got - want)) > TOLERANCE * scale:
            raise SystemExit(f"{name}, {label}: the gradient in {k} differs from torch's "
                             f"by {np.max(np.abs(got - want)):.3g}: not benchmarking")


def run(ctx):
    threadpoolctl = _optional("threadpoolctl")
    limiter = threadpoolctl.threadpool_limits(THREADS) if threadpoolctl else None
    torch = _optional("torch")
    if torch is None:
        raise SystemExit("layers: torch is needed (the reference and the eager peer)")
    torch.set_num_threads(THREADS)
    if "jax" not in importlib.sys.modules:       # XLA reads its flags at import
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                                           "intra_op_parallelism_threads=1")
    jax = _optional("jax")
    rng = np.random.default_rng(0)
    rows, missed = [], []
    try:
        for name, make in CASES.items():
            case = make(rng, torch)
            variants, record_s, compile_s = _variants(case, torch, jax)
            reference = variants["torch"][1]()
            for label, (_, result) in variants.items():
                if label != "torch":
                    _check(name, label, result(), reference)
            ctx.log(f"   {name}: every variant agrees with torch to {TOLERANCE:g}; timing")
            timings = ctx.measure({label: fn for label, (fn, _) in variants.items()},
                                  seconds=0.3)
            ms = {label: 1e3 * timings.median(label) for label in variants}
            eager = timings.ratio("easyad", "torch")
            replay = timings.ratio("easyad replayed", "jax.jit") if jax else None
            if eager > 1.0:
                missed.append(f"{name} eager: {eager:.2f}x torch (target <= 1)")
            if replay is not None and replay > 1.0:
                missed.append(f"{name} replayed: {replay:.2f}x jax.jit (target <= 1)")
            rows.append("| " + " | ".join([
                name, f"{ms['torch']:.1f}", f"{ms['easyad']:.1f}", f"**{eager:.2f}x**",
                f"{ms['jax.jit']:.1f} ({compile_s:.1f} s)" if jax else "-",
                f"{ms['easyad replayed']:.1f} ({record_s:.1f} s)",
                f"**{replay:.2f}x**" if replay is not None else "-"]) + " |")
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
    if jax is None:
        missed.append("jax is not installed: no replayed ratio")
    lines = [
        "float32, forward and backward (the loss sum(y * g) and its gradient in the input "
        "and every parameter), one thread for every library. Cases: " +
        "; ".join(f"{k}: {v}" for k, v in SHAPES.items()) + ". Before timing, every "
        f"variant's value and gradients agreed with torch's to {TOLERANCE:g} of the "
        "largest entry. Medians over interleaved rounds; in brackets, the first call of "
        "jax.jit (compiling) and easyad's ad.record.",
        "",
        "| case | torch eager ms | easyad eager ms | eager / torch (target <= 1) "
        "| jax.jit ms (compile) | easyad replayed ms (record) "
        "| replayed / jax.jit (target <= 1) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
    ]
    return "\n".join(lines), missed
