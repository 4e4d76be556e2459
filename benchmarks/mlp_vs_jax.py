"""The replayed MLP training step against jax.jit, written as a user of each library would.

    python benchmarks/mlp_vs_jax.py                      # both dtypes, every library on 1 thread
    python benchmarks/mlp_vs_jax.py --dtype float32 --batch 256 --rounds 40
    python benchmarks/mlp_vs_jax.py --blas-threads 2 --xla-threads 2
    python benchmarks/mlp_vs_jax.py --variants           # other ways of timing each step
    python benchmarks/mlp_vs_jax.py --matmul             # the step's bare products, each side
    python benchmarks/mlp_vs_jax.py --before             # + the step with numpy's cross-entropy
    python benchmarks/mlp_vs_jax.py --before-fold        # + the step as before h-mlp32

The model is the MNIST-shaped MLP 784-128-10 with tanh, softmax cross-entropy on class
indices, plain SGD. easyad's side uses only the public API the README shows: an
``nn.Sequential`` model, the loss written with ``nn.functional_call``, recorded once by
``ad.record`` and stepped with ``F.sgd_step(named, x, y, lr=...)`` (the Parameters
themselves, updated in place, the loss returned as a float). jax's side is the usual
``jax.jit`` of ``value_and_grad`` and the update, parameters in and new parameters out,
timed to ``block_until_ready``; its compile time is reported. Both start from the same
weights and must give the same loss and the same updated parameters before anything is
timed. Inputs are made once, outside the step.

Threads are fixed before any library is imported, because each reads them once at import:
``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (numpy's BLAS, which
the replayed step's matrix products call), and ``XLA_FLAGS`` (one thread:
``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1``). easyad itself
starts threads only for batches of points (``easyad/_pool.py``), which this step does not
use. ``--pin CPU`` puts the process, and so every thread, on one core: "one thread" is not
"one core" for jax, whose step runs on XLA's thread while the calling thread waits.
``--blas-threads`` / ``--xla-threads`` change one side at a time (``--xla-threads``
other than 1 leaves XLA on its own default threads). ``--batch``, ``--init normal``,
``--labels onehot`` and ``--with-torch`` change the other factors the benchmarks README's
section "Why the MLP step against jax.jit differs" compares, ``--variants`` what is timed.

Timing as ``benchmarks/run.py`` does, but standalone: every variant timed in each round for
a fixed number of calls (about ``--seconds``), rounds in a freshly shuffled order, the
garbage collector off while timing; medians and quartiles of the per-call times, and of the
per-round ratios against jax's step. Each window is timed on the wall clock and in CPU time
(the process's), and its voluntary context switches are counted: on a shared, loaded
machine the wall clock favours a step that sleeps while its work runs on another thread
(jax's) over one that never waits (easyad's), so compare CPU times there.
"""
from __future__ import annotations

from typing import Any

import argparse
import os
import sys

# ---- threads: must be set before numpy, easyad or jax is imported ----


def _threads_from_argv(argv: list[str]) -> tuple[int, int]:
    blas = xla = 1
    for i, arg in enumerate(argv):
        for name in ("--blas-threads", "--xla-threads"):
            value = arg.split("=", 1)[1] if arg.startswith(name + "=") else (
                argv[i + 1] if arg == name and i + 1 < len(argv) else None)
            if value is not None:
                if name == "--blas-threads":
                    blas = int(value)
                else:
                    xla = int(value)
    return blas, xla


BLAS_THREADS, XLA_THREADS = _threads_from_argv(sys.argv[1:])
# --pin CPU: this process and every thread it starts on one core (as ``taskset -c CPU``)
PINNED = next((int(a.split("=", 1)[1]) if "=" in a else int(sys.argv[i + 2])
               for i, a in enumerate(sys.argv[1:]) if a.split("=", 1)[0] == "--pin"), None)
if PINNED is not None:
    os.sched_setaffinity(0, {PINNED})
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = str(BLAS_THREADS)
if XLA_THREADS == 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                               "=false intra_op_parallelism_threads=1").strip()

if "--with-torch" in sys.argv[1:]:     # as a harness timing every library in one process
    import torch
    torch.set_num_threads(BLAS_THREADS)

import gc            # noqa: E402  (after the thread settings above)
import random        # noqa: E402
import resource      # noqa: E402
import statistics    # noqa: E402
import time          # noqa: E402

import numpy as np   # noqa: E402

import easyad as ad  # noqa: E402
from easyad import nn  # noqa: E402

SIZES, LR = (784, 128, 10), 0.01
KEYS = ("0.weight", "0.bias", "2.weight", "2.bias")


def _jax():
    import jax
    jax.config.update("jax_enable_x64", True)     # float64 needs it; float32 arrays stay so
    return jax


# ---- the two steps ----

def make_data(batch: int, dtype: type, labels: str = "index") -> tuple[np.ndarray, np.ndarray]:
    """A fixed batch; labels as class indices, or one-hot rows of x's dtype (what a
    training loop with a new batch each step passes a recording: integer arguments are
    part of it, see docs/record-replay.md)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((batch, SIZES[0])).astype(dtype)
    y = rng.integers(0, SIZES[-1], batch)
    return x, (y if labels == "index" else np.eye(SIZES[-1], dtype=dtype)[y])


def make_model(dtype: type, init: str) -> nn.Sequential:
    """easyad's model; ``init``: ``torch`` (nn.Linear's own, PyTorch's uniform) or
    ``normal`` (N(0, 0.01^2) weights, zero biases, as hand-written jax examples often do)."""
    ad.random.seed(0)
    model = nn.Sequential(nn.Linear(SIZES[0], SIZES[1], dtype=dtype), nn.Tanh(),
                          nn.Linear(SIZES[1], SIZES[2], dtype=dtype))
    if init == "normal":
        rng = np.random.default_rng(1)
        model.load_state_dict({k: (0.01 * rng.standard_normal(v.shape) if k.endswith("weight")
                                   else np.zeros(v.shape)).astype(dtype)
                               for k, v in model.state_dict().items()})
    return model


def easyad_steps(model: nn.Sequential, x: np.ndarray, y: np.ndarray) -> tuple[dict, float]:
    """The replayed steps (each a zero-argument callable returning the loss) and the time
    of ``ad.record`` plus the first sgd_step (its C compiled, or loaded from easyad's disk
    cache on later runs)."""
    named = dict(model.named_parameters())
    arrays = {k: p.data for k, p in named.items()}

    def loss(params, x, y):
        return nn.functional.cross_entropy(nn.functional_call(model, params, x), y)
    started = time.perf_counter()
    F = ad.record(loss, arrays, x, y)
    F.sgd_step({k: a.copy() for k, a in arrays.items()}, x, y, lr=LR)   # its C, on copies
    record_s = time.perf_counter() - started
    steps = {
        # the documented loop: the Parameters themselves, loss as a float
        "easyad": lambda: F.sgd_step(named, x, y, lr=LR),
        # the project's benchmark: a fresh dict of the Parameters' arrays each call
        "easyad arrays": lambda: F.sgd_step({k: p.data for k, p in named.items()}, x, y,
                                            lr=LR),
        # the loss left as a 0-d Tensor (no float made)
        "easyad lazy": lambda: F.sgd_step(named, x, y, lr=LR, lazy=True),
    }
    return steps, record_s


def numpy_cross_entropy_step(init: str, x: np.ndarray, y: np.ndarray, dtype: type) -> Any:
    """easyad's step on its own model with the cross-entropy left to numpy steps between
    the generated C, as before ``softmax_c`` (its ``lower`` made to lower nothing while
    the program is bound), for a before/after in one run (``--before``)."""
    from easyad.compiler.program import softmax_c
    model = make_model(dtype, init)
    real = softmax_c.lower
    softmax_c.lower = lambda plan, first: ({}, [])
    try:
        steps, _ = easyad_steps(model, x, y)
    finally:
        softmax_c.lower = real
    return steps["easyad"]


def unfolded_step(init: str, x: np.ndarray, y: np.ndarray, dtype: type) -> Any:
    """easyad's step on its own model as before h-mlp32, for a before/after in one run
    (``--before-fold``): the update a C loop (``blas_steps.fold_updates`` made to fold
    nothing), every loop 256 bits wide (no ``EASYAD_WIDE``) and every call through
    sgd_step's general path (its prepared call never made). Private names: a diagnostic."""
    from easyad.compiler.program import blas_steps, fused_c
    model = make_model(dtype, init)
    real_fold, real_wide = blas_steps.fold_updates, fused_c._WIDE

    def fold_nothing(plan: Any) -> dict:
        real_fold(plan)
        plan.folded = []
        return {}
    blas_steps.fold_updates, fused_c._WIDE = fold_nothing, ()
    try:
        steps, _ = easyad_steps(model, x, y)
    finally:
        blas_steps.fold_updates, fused_c._WIDE = real_fold, real_wide
    function = steps["easyad"].__closure__
    for cell in function or ():
        if type(cell.cell_contents).__name__ == "TensorFunction":
            cell.cell_contents._sgd_misses = 1 << 30      # never prepared
            cell.cell_contents._sgd_ready = None
    return steps["easyad"]


def jax_steps(jax, state: dict, x: np.ndarray, y: np.ndarray) -> tuple[dict, float, dict]:
    """jax's jitted steps, the first call's time of the main one (trace and compile), and
    each step's parameters (a one-item list, replaced by each call)."""
    jnp = jax.numpy
    params0 = tuple(jnp.asarray(state[k]) for k in KEYS)
    jx, jy = jnp.asarray(x), jnp.asarray(y)

    def loss(p, x, y):
        w1, b1, w2, b2 = p
        z = jnp.tanh(x @ w1.T + b1) @ w2.T + b2
        if y.ndim == 2:         # one-hot
            return jnp.mean(-jnp.sum(jax.nn.log_softmax(z, axis=1) * y, axis=1))
        return jnp.mean(jax.nn.logsumexp(z, axis=1)
                        - jnp.take_along_axis(z, y[:, None], axis=1)[:, 0])

    def update(p, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        return tuple(a - LR * b for a, b in zip(p, g)), value
    step = jax.jit(update)
    started = time.perf_counter()
    jax.block_until_ready(step(params0, jx, jy))      # trace + compile (+ one step)
    compile_s = time.perf_counter() - started
    compiled = jax.jit(update).lower(params0, jx, jy).compile()
    donating = jax.jit(update, donate_argnums=0)
    boxes = {name: [tuple(jnp.array(p) for p in params0)]
             for name in ("jax.jit", "jax float", "jax compiled", "jax compiled, float",
                          "jax donate")}

    def run(name, function, read):
        box = boxes[name]

        def call():
            box[0], value = function(box[0], jx, jy)
            return read(value, box[0])
        return call

    def ready(value, params):
        jax.block_until_ready((value, params))
        return value

    def as_float(value, params):        # waits for the step, as the loss is its output
        return float(value)
    steps = {"jax.jit": run("jax.jit", step, ready),
             "jax float": run("jax float", step, as_float),
             # a Compiled object (.lower().compile()) called: its own Python call path
             "jax compiled": run("jax compiled", compiled, ready),
             # the project's benchmark (bench_tensor_eager.jax_step): both of the above
             "jax compiled, float": run("jax compiled, float", compiled, as_float),
             # parameters' buffers reused for the new ones
             "jax donate": run("jax donate", donating, ready)}
    return steps, compile_s, boxes


# ---- timing ----

def _window(function, calls: int) -> tuple[float, float, int]:
    """Wall and CPU seconds (this process, all its threads) of ``calls`` calls, and the
    voluntary context switches they made (a thread waiting for another: jax's step hands
    its work to XLA's thread and sleeps until it is done); the garbage collector off, as
    timeit has it."""
    gc.collect()
    gc.disable()
    try:
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            function()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches
    finally:
        gc.enable()


def _calls_for(function, seconds: float) -> int:
    calls = 1
    while True:
        elapsed = _window(function, calls)[0]
        if elapsed >= seconds / 4 or calls >= 1 << 20:
            return max(1, round(calls * seconds / max(elapsed, 1e-9)))
        calls *= 4


def measure(variants: dict, rounds: int, seconds: float, seed: int = 0) -> dict:
    """Per-call seconds of every variant in every round (rounds line up by index), on
    the clock ``wall`` and on ``cpu``: CPU time is what a variant cost while it ran, so
    it survives other work on a shared machine taking the core away (every library here
    runs its step on one thread; a library whose idle threads spin would pay for it)."""
    for function in variants.values():
        for _ in range(5):
            function()
    calls = {name: _calls_for(f, seconds) for name, f in variants.items()}
    per_call: dict[str, dict[str, list[float]]] = {
        clock: {name: [] for name in variants} for clock in ("wall", "cpu", "switches")}
    shuffler = random.Random(seed)
    for _ in range(rounds):
        order = list(variants)
        shuffler.shuffle(order)
        for name in order:
            wall, cpu, switches = _window(variants[name], calls[name])
            per_call["wall"][name].append(wall / calls[name])
            per_call["cpu"][name].append(cpu / calls[name])
            per_call["switches"][name].append(switches / calls[name])
    return per_call


def spread(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q2, q1, q3


def report(per_call: dict, reference: str) -> list[str]:
    lines = [f"| variant | wall us, median (quartiles) | / {reference} | "
             f"CPU us, median (quartiles) | / {reference} | switches / call |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in per_call["wall"]:
        cells = []
        for clock in ("wall", "cpu"):
            times, ref = per_call[clock][name], per_call[clock][reference]
            med, q1, q3 = spread([t * 1e6 for t in times])
            ratio = spread([a / b for a, b in zip(times, ref)])
            cells.append(f"{med:.1f} ({q1:.1f}-{q3:.1f}) | "
                         f"{ratio[0]:.2f}x ({ratio[1]:.2f}-{ratio[2]:.2f})")
        switches = statistics.median(per_call["switches"][name])
        lines.append(f"| {name} | {' | '.join(cells)} | {switches:.1f} |")
    return lines


# ---- the two checks: the steps agree, and the bare products ----

def check_agree(easyad_step, model, jax_step, boxes, name, tol: float) -> None:
    """One step of each from the same weights: same loss, same new parameters."""
    loss_e = easyad_step()
    loss_j = float(jax_step())
    new_e = [np.asarray(model.state_dict()[k], dtype=np.float64) for k in KEYS]
    new_j = [np.asarray(p, dtype=np.float64) for p in boxes[name][0]]
    if not (np.isclose(loss_e, loss_j, rtol=tol) and all(
            np.allclose(a, b, rtol=tol, atol=tol) for a, b in zip(new_e, new_j))):
        raise SystemExit(f"the steps disagree: loss {loss_e!r} (easyad) vs {loss_j!r} (jax)")


def matmul_variants(jax, batch: int, dtype: type) -> dict:
    """The step's five products, each as the replayed step can compute it (numpy's BLAS,
    or easyad's own kernels: ``easyad/tensor/_blas.py`` picks per call) and as one jitted
    jax call. (The only private names this harness touches: a diagnostic, not the step.)"""
    from easyad.tensor import _blas
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    n, h, o = batch, SIZES[1], SIZES[2]
    shapes = {"x @ w1.T (n,784)(784,128)": ((n, SIZES[0]), (SIZES[0], h)),
              "gz1.T @ x (128,n)(n,784)": ((h, n), (n, SIZES[0])),
              "a @ w2.T (n,128)(128,10)": ((n, h), (h, o)),
              "gz2 @ w2 (n,10)(10,128)": ((n, o), (o, h)),
              "gz2.T @ a (10,n)(n,128)": ((o, n), (n, h))}
    variants = {}
    for label, (sa, sb) in shapes.items():
        a, b = rng.standard_normal(sa).astype(dtype), rng.standard_normal(sb).astype(dtype)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        product = jax.jit(jnp.matmul).lower(ja, jb).compile()
        variants[f"numpy {label}"] = lambda a=a, b=b: np.matmul(a, b)
        if _blas._core.GEMM_SUPPORTED:    # easyad's own AVX-512 kernels (EASYAD_MATMUL)
            variants[f"easyad {label}"] = lambda a=a, b=b: _blas._core._gemm(a, b)
        variants[f"jax {label}"] = lambda p=product, a=ja, b=jb: p(a, b).block_until_ready()
    return variants


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dtype", default="float32,float64")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=0.1,
                        help="time per variant per round")
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--xla-threads", type=int, default=1,
                        help="1: XLA single-threaded; otherwise XLA's own default")
    parser.add_argument("--pin", type=int, metavar="CPU",
                        help="run on this one core, threads included (jax's XLA thread too)")
    parser.add_argument("--with-torch", action="store_true",
                        help="import torch first (its own OpenMP and BLAS in the process)")
    parser.add_argument("--labels", choices=("index", "onehot"), default="index")
    parser.add_argument("--init", choices=("torch", "normal"), default="torch")
    parser.add_argument("--variants", action="store_true",
                        help="also time the other ways of timing a step (see the docstring)")
    parser.add_argument("--matmul", action="store_true",
                        help="time the step's bare products instead of the step")
    parser.add_argument("--before", action="store_true",
                        help="also time the step as before compiler/program/softmax_c.py "
                             "(the cross-entropy and its gradient by numpy between the C)")
    parser.add_argument("--before-fold", action="store_true",
                        help="also time the step as before h-mlp32 (the update a C loop, "
                             "256-bit loops, sgd_step's general path)")
    args = parser.parse_args(argv)
    jax = _jax()
    print(f"cores {sorted(os.sched_getaffinity(0))}, batch {args.batch}, BLAS threads "
          f"{BLAS_THREADS} (OPENBLAS/OMP/MKL_NUM_THREADS), "
          f"XLA {'1 thread' if XLA_THREADS == 1 else 'its default threads'}, init "
          f"{args.init}, labels {args.labels}; {args.rounds} rounds of ~{args.seconds} s "
          f"per variant; "
          f"numpy {np.__version__}, jax {jax.__version__}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for name in args.dtype.split(","):
        dtype = np.dtype(name).type
        if args.matmul:
            per_call = measure(matmul_variants(jax, args.batch, dtype), args.rounds,
                               args.seconds)
            print(f"\n{name}: bare products\n")
            print("| product | wall us | CPU us |\n| --- | ---: | ---: |")
            print("\n".join(f"| {k} | {spread([t * 1e6 for t in v])[0]:.2f} | "
                            f"{spread([t * 1e6 for t in per_call['cpu'][k]])[0]:.2f} |"
                            for k, v in per_call["wall"].items()))
            continue
        x, y = make_data(args.batch, dtype, args.labels)
        model = make_model(dtype, args.init)
        state = {k: np.array(v) for k, v in model.state_dict().items()}
        e_steps, record_s = easyad_steps(model, x, y)
        j_steps, compile_s, boxes = jax_steps(jax, state, x, y)
        check_agree(e_steps["easyad"], model, j_steps["jax.jit"], boxes, "jax.jit",
                    1e-9 if dtype is np.float64 else 1e-4)
        keep = ("easyad", "jax.jit") if not args.variants else tuple(e_steps) + tuple(j_steps)
        variants = {k: v for k, v in {**e_steps, **j_steps}.items() if k in keep}
        if args.before:
            variants["easyad, CE by numpy"] = numpy_cross_entropy_step(args.init, x, y,
                                                                       dtype)
        if args.before_fold:
            variants["easyad, before fold"] = unfolded_step(args.init, x, y, dtype)
        per_call = measure(variants, args.rounds, args.seconds)
        print(f"\n{name}: record + first call {record_s:.3f} s, jax compile {compile_s:.3f} s\n")
        print("\n".join(report(per_call, "jax.jit")))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
