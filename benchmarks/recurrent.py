"""An LSTM, eager and replayed: easyad against torch on the CPU with the same number of
threads (and jax.jit when jax is installed), interleaved.

    python benchmarks/recurrent.py [--threads 2] [--rounds 9] [--dtype float32]

The case of issue 28's "an LSTM step": batch 64, input 128, hidden 256, one layer over a
sequence of 32, forward and forward+backward (a loss ``sum(output * g)``: the derivatives
of every parameter and the input), and one LSTMCell step forward+backward. easyad eager:
``nn.LSTM`` on a fresh WengertList per call (forward: constant tensors); easyad replayed:
the loss recorded once with ``ad.record`` (parameters as inputs) and
``value_and_gradient`` called; torch: the module, ``.grad`` cleared; jax: ``lax.scan`` of
the same cell under ``jax.jit(value_and_grad)``. Each round times every (case, library)
pair once, in turn, so a load that comes and goes reaches every library alike; the table
gives the median and quartiles over rounds of wall time in milliseconds, and the ratios
of the medians to torch's (replayed: to jax's). The thread count is set before numpy is
imported (OpenBLAS's ``OPENBLAS_NUM_THREADS``, ``torch.set_num_threads``, XLA's flags).
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":
    _args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _args.add_argument("--threads", type=int, default=2)
    _args.add_argument("--rounds", type=int, default=9)
    _args.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ARGS = _args.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)        # before numpy starts its BLAS
    os.environ["XLA_FLAGS"] = (f"--xla_cpu_multi_thread_eigen={ARGS.threads > 1} "
                               f"intra_op_parallelism_threads={ARGS.threads}")
    if ARGS.dtype == "float64":
        os.environ["JAX_ENABLE_X64"] = "1"

import numpy as np  # noqa: E402

import _interleaved  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)

BATCH, INPUT, HIDDEN, STEPS = 64, 128, 256, 32


def _jax_cases(params: dict[str, np.ndarray], x: np.ndarray, g: np.ndarray,
               cell_x: np.ndarray, cell_g: np.ndarray) -> dict[str, object]:
    """jax.jit of value_and_grad of the same losses, or nothing without jax."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {}

    def step(p, carry, xt):
        h, c = carry
        gates = xt @ p["weight_ih_l0"].T + p["bias_ih_l0"] + h @ p["weight_hh_l0"].T + \
            p["bias_hh_l0"]
        i, f, gg, o = jnp.split(gates, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(gg)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    def loss(p, x):
        zeros = jnp.zeros((x.shape[1], HIDDEN), x.dtype)
        _, hs = jax.lax.scan(lambda carry, xt: step(p, carry, xt), (zeros, zeros), x)
        return jnp.sum(hs * g)

    def cell_loss(p, x):
        zeros = jnp.zeros((x.shape[0], HIDDEN), x.dtype)
        (h, c), _ = step(p, (zeros, zeros), x)
        return jnp.sum(h * cell_g)
    jp = {k: jnp.asarray(v) for k, v in params.items()}
    seq, one = jax.jit(jax.value_and_grad(loss)), jax.jit(jax.value_and_grad(cell_loss))
    jx, jcx = jnp.asarray(x), jnp.asarray(cell_x)
    return {"lstm forward+backward": lambda: jax.block_until_ready(seq(jp, jx)),
            "lstm cell step forward+backward": lambda: jax.block_until_ready(one(jp, jcx))}


def _cases(dtype: str) -> dict[str, dict[str, object]]:
    import torch

    import easyad as ad
    from easyad import nn

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    theirs = torch.nn.LSTM(INPUT, HIDDEN, dtype=getattr(torch, dtype))
    ours = nn.LSTM(INPUT, HIDDEN, dtype=dtype)
    params = {k: v.detach().numpy().copy() for k, v in theirs.state_dict().items()}
    ours.load_state_dict(params)
    x = rng.normal(size=(STEPS, BATCH, INPUT)).astype(dtype)
    g = rng.normal(size=(STEPS, BATCH, HIDDEN)).astype(dtype)
    cell_x, cell_g = x[0], g[0]
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(g)
    tcx, tcg = torch.tensor(cell_x, requires_grad=True), torch.tensor(cell_g)
    cell = nn.LSTMCell(INPUT, HIDDEN, dtype=dtype)
    cell.load_state_dict({k[:-3]: v for k, v in params.items()})     # weight_ih_l0 -> ih
    tcell = torch.nn.LSTMCell(INPUT, HIDDEN, dtype=getattr(torch, dtype))
    tcell.load_state_dict({k[:-3]: torch.tensor(v) for k, v in params.items()})
    cx = ad.Tensor.constant(x)

    def ours_forward() -> None:
        ours(cx)

    def ours_grad() -> None:
        lst = ad.WengertList()
        ad.sum(ours(ad.Tensor.variable(x, lst))[0] * g).derivatives()

    def ours_cell() -> None:
        lst = ad.WengertList()
        ad.sum(cell(ad.Tensor.variable(cell_x, lst))[0] * cell_g).derivatives()

    def loss(p: dict[str, object], x: object) -> object:
        return ad.sum(nn.functional_call(ours, p, x)[0] * g)

    def cell_loss(p: dict[str, object], x: object) -> object:
        return ad.sum(nn.functional_call(cell, p, x)[0] * cell_g)
    cell_params = {k[:-3]: v for k, v in params.items()}
    recorded = ad.record(loss, params, x)
    recorded_cell = ad.record(cell_loss, cell_params, cell_x)

    def torch_forward() -> None:
        with torch.no_grad():
            theirs(tx)

    def torch_grad() -> None:
        tx.grad = None
        theirs.zero_grad(set_to_none=True)
        theirs(tx)[0].backward(tg)

    def torch_cell() -> None:
        tcx.grad = None
        tcell.zero_grad(set_to_none=True)
        tcell(tcx)[0].backward(tcg)

    jax_cases = _jax_cases(params, x, g, cell_x, cell_g)
    cases: dict[str, dict[str, object]] = {
        "lstm forward": {"easyad": ours_forward, "torch": torch_forward},
        "lstm forward+backward": {
            "easyad": ours_grad, "torch": torch_grad,
            "easyad replayed": lambda: recorded.value_and_gradient(params, x)},
        "lstm cell step forward+backward": {
            "easyad": ours_cell, "torch": torch_cell,
            "easyad replayed": lambda: recorded_cell.value_and_gradient(cell_params,
                                                                        cell_x)}}
    for case, fn in jax_cases.items():
        cases[case]["jax.jit"] = fn
    return cases


def main() -> None:
    import torch
    torch.set_num_threads(ARGS.threads)
    cases = _cases(ARGS.dtype)
    times = _interleaved.measure(cases, ARGS.rounds)
    print(f"LSTM batch {BATCH}, input {INPUT}, hidden {HIDDEN}, sequence {STEPS}, "
          f"{ARGS.dtype}, {ARGS.threads} thread(s), {ARGS.rounds} rounds; "
          f"{_interleaved.load()}; torch {torch.__version__}, numpy {np.__version__}\n")
    libs = ["easyad", "torch", "easyad replayed", "jax.jit"]
    print("| case | " + " | ".join(f"{lib} ms (q1, median, q3)" for lib in libs) +
          " | eager / torch | replayed / jax.jit |")
    print("|---|" + "---|" * (len(libs) + 2))
    for case, fns in cases.items():
        cells, med = [], {}
        for lib in libs:
            if lib in fns:
                text, med[lib] = _interleaved.cell(times[(case, lib)])
            else:
                text = "-"
            cells.append(text)
        eager = f"{med['easyad'] / med['torch']:.2f}"
        replay = f"{med['easyad replayed'] / med['jax.jit']:.2f}" if \
            "jax.jit" in med and "easyad replayed" in med else "-"
        print(f"| {case} | " + " | ".join(cells) + f" | {eager} | {replay} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
