"""ad.vmap against torch.func.vmap (eager) and jax.jit(jax.vmap(...)) (compiled), one
interleaved run (issue 27 item 1).

    .venv-bench/bin/python benchmarks/vmap.py                 # both problems
    .venv-bench/bin/python benchmarks/vmap.py --rounds 15 --batch 64
    .venv-bench/bin/python benchmarks/vmap.py --only jacobians --pin 1   # one CPU

Problems, float64, every library on one thread (set before any import):

- **per-example gradients** of an MLP 784-128-10, tanh, softmax cross-entropy on one-hot
  labels, at batch 64: easyad ``ad.vmap(ad.grad(loss), in_axes=(None, 0, 0))``; torch
  ``torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))``; jax
  ``jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))``; easyad replayed: the
  recording of ``sum(ad.vmap(loss)(stacked parameters, x, y))`` and ``F.gradient`` (the
  parameters broadcast into the stacked buffers in every call: a training step would);
- **batched Jacobians** of ``f(x) = tanh(A x + c) * x[0]`` (16 -> 16) at batch 64: easyad
  ``ad.vmap(ad.jacobian(f))`` (also with mode 'forward' and 'reverse'); torch
  ``vmap(jacrev(f))`` and ``vmap(jacfwd(f))``; jax
  ``jit(vmap(jacrev(f)))`` and ``jit(vmap(jacfwd(f)))``; easyad replayed: the recording
  of ``ad.vmap(ad.jacobian(f))`` itself (reverse and forward mode: the transform's sweeps
  are program kernels, one fused program for all examples), and for comparison the old
  route, one VJP replay of the recorded ``ad.vmap(f)`` per output element.

Inputs are made once, outside the timed calls; every variant's result is checked against
easyad's eager one first. Each round times every variant (in a freshly shuffled order) for
about ``--seconds``; the table gives per-call medians and quartiles over the rounds, and
each variant's median ratio to easyad eager. jax's compile time (first call) is reported
apart. The machine is shared: read the figures with the load average printed beside them.
"""
from __future__ import annotations

import os

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                           "=false intra_op_parallelism_threads=1").strip()

import argparse  # noqa: E402
import gc  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import easyad as ad  # noqa: E402


def _peers() -> tuple[Any, Any]:
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    try:
        import jax
        jax.config.update("jax_enable_x64", True)
    except ImportError:
        jax = None
    return torch, jax


def _leaves(x: Any) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)):
        return [a for item in x for a in _leaves(item)]
    return [np.asarray(x.detach() if hasattr(x, "detach") else x)]


def per_example_gradients(batch: int, torch: Any, jax: Any) -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(0)
    params = [(rng.normal(size=(784, 128)) * 0.05, np.zeros(128)),
              (rng.normal(size=(128, 10)) * 0.1, np.zeros(10))]
    x = rng.normal(size=(batch, 784))
    y = np.eye(10)[rng.integers(0, 10, batch)]

    def loss(p: Any, x: Any, y: Any) -> Any:
        (w1, b1), (w2, b2) = p
        z = ad.tanh(x @ w1 + b1) @ w2 + b2
        return ad.logsumexp(z) - ad.sum(z * y)

    eager = ad.vmap(ad.grad(loss), in_axes=(None, 0, 0))
    stacked = [tuple(np.empty((batch,) + a.shape) for a in layer) for layer in params]
    for layer, into in zip(params, stacked):
        for a, b in zip(layer, into):
            b[...] = a
    F = ad.record(lambda q, x, y: ad.sum(ad.vmap(loss)(q, x, y)), stacked, x, y)

    def replayed() -> Any:
        for layer, into in zip(params, stacked):      # the parameters, per example
            for a, b in zip(layer, into):
                np.copyto(b, a)
        return F.gradient(stacked, x, y)

    variants: dict[str, Callable[[], Any]] = {"easyad eager (ad.vmap(ad.grad))": lambda:
                                              eager(params, x, y),
                                              "easyad replayed (ad.record, F.gradient)":
                                              replayed}
    if torch is not None:
        tp = [tuple(torch.tensor(a) for a in layer) for layer in params]
        tx, ty = torch.tensor(x), torch.tensor(y)

        def tloss(p: Any, x: Any, y: Any) -> Any:
            (w1, b1), (w2, b2) = p
            z = torch.tanh(x @ w1 + b1) @ w2 + b2
            return z.logsumexp(0) - (z * y).sum()
        tf = torch.func.vmap(torch.func.grad(tloss), in_dims=(None, 0, 0))
        variants["torch.func.vmap(grad)"] = lambda: tf(tp, tx, ty)
    if jax is not None:
        import jax.numpy as jnp
        jp = [tuple(jnp.asarray(a) for a in layer) for layer in params]
        jx, jy = jnp.asarray(x), jnp.asarray(y)

        def jloss(p: Any, x: Any, y: Any) -> Any:
            (w1, b1), (w2, b2) = p
            z = jnp.tanh(x @ w1 + b1) @ w2 + b2
            return jax.nn.logsumexp(z) - jnp.sum(z * y)
        jf = jax.jit(jax.vmap(jax.grad(jloss), in_axes=(None, 0, 0)))
        variants["jax.jit(vmap(grad))"] = lambda: jax.block_until_ready(jf(jp, jx, jy))
    return variants


def batched_jacobians(batch: int, torch: Any, jax: Any) -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(1)
    n = 16
    A, c = rng.normal(size=(n, n)) / 4.0, rng.normal(size=n)
    x = rng.normal(size=(batch, n))

    def f(v: Any) -> Any:
        return ad.tanh(A @ v + c) * v[0]

    eager = ad.vmap(ad.jacobian(f))
    F = ad.record(ad.vmap(f), x, tensor=True)
    units = [np.broadcast_to(np.eye(n)[j], (batch, n)).copy() for j in range(n)]

    def rows() -> Any:
        return np.stack([F.vjp(x, u) for u in units], axis=1)

    variants: dict[str, Callable[[], Any]] = {"easyad eager (ad.vmap(ad.jacobian))":
                                              lambda: eager(x)}
    for mode in ("forward", "reverse"):      # (the default, "auto", takes forward here)
        g = ad.vmap(ad.jacobian(f, mode=mode))
        variants[f"easyad eager (ad.vmap(ad.jacobian(f, {mode!r})))"] = \
            lambda g=g: g(x)
    for mode in ("reverse", "forward"):
        # recorded on the first call, so its time (recording and C compile) is reported
        variants[f"easyad replayed (ad.record(ad.vmap(ad.jacobian(f, {mode!r}))))"] = \
            _recorded(ad.vmap(ad.jacobian(f, mode=mode)), x)
    variants["easyad replayed (ad.record(ad.vmap(f)), F.vjp rows)"] = rows
    if torch is not None:
        tA, tc, tx = torch.tensor(A), torch.tensor(c), torch.tensor(x)

        def tf(v: Any) -> Any:
            return torch.tanh(tA @ v + tc) * v[0]
        rev = torch.func.vmap(torch.func.jacrev(tf))
        fwd = torch.func.vmap(torch.func.jacfwd(tf))
        variants["torch.func.vmap(jacrev)"] = lambda: rev(tx)
        variants["torch.func.vmap(jacfwd)"] = lambda: fwd(tx)
    if jax is not None:
        import jax.numpy as jnp
        jA, jc, jx = jnp.asarray(A), jnp.asarray(c), jnp.asarray(x)

        def jf(v: Any) -> Any:
            return jnp.tanh(jA @ v + jc) * v[0]
        jrev = jax.jit(jax.vmap(jax.jacrev(jf)))
        jfwd = jax.jit(jax.vmap(jax.jacfwd(jf)))
        variants["jax.jit(vmap(jacrev))"] = lambda: jax.block_until_ready(jrev(jx))
        variants["jax.jit(vmap(jacfwd))"] = lambda: jax.block_until_ready(jfwd(jx))
    return variants


def _recorded(g: Callable[..., Any], x: np.ndarray) -> Callable[[], Any]:
    """A replay of ``ad.record(g, x, tensor=True)``, recorded at its first call."""
    made: list[Any] = []

    def call() -> Any:
        if not made:
            made.append(ad.record(g, x, tensor=True))
        return made[0](x)
    return call


_clock = time.perf_counter


def run(title: str, variants: dict[str, Callable[[], Any]], rounds: int,
        seconds: float) -> None:
    reference = _leaves(next(iter(variants.values()))())
    compile_times = {}
    for name, call in variants.items():
        start = time.perf_counter()
        got = _leaves(call())
        compile_times[name] = time.perf_counter() - start
        for a, b in zip(reference, got):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9, err_msg=name)
    calls = {name: max(1, int(seconds / max(1e-6, _once(call))))
             for name, call in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            call, k = variants[name], calls[name]
            gc.disable()
            start = _clock()
            for _ in range(k):
                call()
            times[name].append((_clock() - start) / k)
            gc.enable()
    base = np.array(times[next(iter(variants))])
    clock = "CPU time of the process" if _clock is time.process_time else "wall time"
    print(f"\n### {title} (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores; {clock})\n")
    print("| variant | median us | quartiles us | ratio to easyad eager (median) |")
    print("| --- | ---: | ---: | ---: |")
    for name, ts in times.items():
        a = np.array(ts) * 1e6
        q1, q2, q3 = np.percentile(a, [25, 50, 75])
        ratio = float(np.median(np.array(ts) / base))
        print(f"| {name} | {_sig(q2)} | {_sig(q1)}-{_sig(q3)} | {ratio:.2f} |")
    for name, t in compile_times.items():
        if name.startswith("jax"):
            print(f"\n{name}: first call (trace and compile) {t * 1e3:.0f} ms")
        elif name.startswith("easyad replayed (ad.record(ad.vmap(ad.jacobian"):
            print(f"\n{name}: first call (record and compile) {t * 1e3:.0f} ms")


def _sig(us: float) -> str:
    """``us`` to 3 significant digits (0.0481 ms is 48.1 us; 2 decimals of ms hid it)."""
    if us <= 0:
        return "0"
    rounded = float(f"{us:.3g}")
    return f"{rounded:.{max(0, 2 - math.floor(math.log10(rounded)))}f}"


def _once(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", choices=("gradients", "jacobians"))
    parser.add_argument("--pin", type=int, metavar="CPU",
                        help="run on this CPU only (as taskset -c CPU); default: unpinned")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: the process's CPU time (every thread's), which a loaded "
                        "machine inflates less than wall time")
    args = parser.parse_args()
    global _clock
    _clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.pin is not None:        # before the peers start any thread
        os.sched_setaffinity(0, {args.pin})
    torch, jax = _peers()
    if args.only != "jacobians":
        run(f"per-example gradients, MLP 784-128-10, batch {args.batch}",
            per_example_gradients(args.batch, torch, jax), args.rounds, args.seconds)
    if args.only != "gradients":
        run(f"batched Jacobians 16 -> 16, batch {args.batch}",
            batched_jacobians(args.batch, torch, jax), args.rounds, args.seconds)


if __name__ == "__main__":
    main()
