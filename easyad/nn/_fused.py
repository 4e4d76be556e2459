"""Fused operations for the numpy device: one tape entry each instead of a chain of them.

``linear`` (``x @ W.T + b``), ``cross_entropy`` with class indices and ``sigmoid`` are
what a training step spends its entries on. Composed of tensor operations each would be
several nodes, with a transposed copy of W and a one-hot product in the forward pass and
as many vjps in the backward one; fused, the forward pass is what PyTorch does (one GEMM
with the transpose as a BLAS flag, a logsumexp) and the vjp is written out once:

- linear:        dx = g W,  dW = gᵀ x,  db = Σₙ g
- cross_entropy: dlogits = (softmax(logits) - onehot(target)) · g / N  (N only for mean)
- sigmoid:       dx = g s (1 - s)

They record through the tensor layer's node hook (``_tensor.record``: the same one every
tensor operation uses), so they sit on the WengertList like any tensor op and mix with
them. Other devices take the composed path in ``functional``; both are checked against
PyTorch.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.tensor import Tensor
from easyad.tensor._tensor import (common_tape, live_tape, operand, record, record_scalar,
                                   result_dtype)


def applies(*values: Any) -> bool:
    """Whether the fused path takes these operands: at least one Tensor, every Tensor on
    the numpy device, the rest numpy arrays, numbers or None."""
    found = False
    for v in values:
        if isinstance(v, Tensor):
            if v._backend.kind != "numpy":
                return False
            found = True
        elif v is not None and not isinstance(v, (np.ndarray, float, int)):
            return False
    return found


def _backend(values: Any) -> Any:
    return next(v._backend for v in values if isinstance(v, Tensor))


def _as(data: Any, dtype: np.dtype) -> np.ndarray:
    return np.asarray(data, dtype=dtype)


def linear(x: Any, weight: Any, bias: Any = None) -> Tensor:
    be = _backend((x, weight, bias))
    X, W = operand(x, be), operand(weight, be)
    B = operand(bias, be) if bias is not None else None
    if X is None or W is None or (bias is not None and B is None):
        raise TypeError("linear takes tensors or arrays")
    ops = [o for o in (X, W, B) if o is not None]
    if len(W.shape) != 2 or not X.shape or X.shape[-1] != W.shape[1]:
        from easyad.errors import ShapeError
        raise ShapeError(f"linear: input of shape {X.shape} and weight of shape {W.shape} "
                         f"(out, in) do not fit")
    out_shape = X.shape[:-1] + (W.shape[0],)
    if B is not None and B.shape not in ((), (W.shape[0],)):
        from easyad.errors import ShapeError
        raise ShapeError(f"linear: bias of shape {B.shape} for {W.shape[0]} outputs")
    dtype = result_dtype(ops)
    tape = common_tape("linear", ops)
    xd, wd = _as(X.data, dtype), _as(W.data, dtype)
    out = np.matmul(xd, wd.T)                         # the transpose is a BLAS flag
    if B is not None:
        out += _as(B.data, dtype)
    if tape is None or not any(o.needs_adjoint for o in ops):
        return record("linear", be, out, out_shape, dtype, None, (), None)
    needs_x, needs_w = X.needs_adjoint, W.needs_adjoint
    needs_b = B is not None and B.needs_adjoint
    b_shape = B.shape if B is not None else ()
    b_scalar = B is not None and B.dtype is None
    x2 = xd.reshape(-1, W.shape[1])
    keep_x: Any = x2 if needs_w else None
    keep_w: Any = wd if needs_x else None
    x_shape, has_b = X.shape, B is not None
    # the vjp closes over plain values only: an Operand holds the tape, and a tape whose
    # nodes point back at it is a reference cycle, freed only by the garbage collector

    def vjp(g: Any) -> tuple[Any, ...]:
        g2 = g.reshape(-1, out_shape[-1])
        gx = np.matmul(g2, keep_w).reshape(x_shape) if needs_x else None
        gw = np.matmul(g2.T, keep_x) if needs_w else None
        gb: Any = None
        if needs_b:
            gb = g2.sum(axis=0)
            if b_shape == ():                        # one bias for every output
                gb = float(gb.sum()) if b_scalar else np.asarray(gb.sum())
        return (gx, gw, gb) if has_b else (gx, gw)
    inputs = tuple(o.index for o in ops)
    return record("linear", be, out, out_shape, dtype, tape, inputs, vjp)


def cross_entropy(logits: Tensor, target: np.ndarray, reduction: str) -> Any:
    """Mean or sum over rows of ``logsumexp(z) - z[target]``; target: int64 (N,)."""
    z, tape = logits._data, live_tape(logits)
    n = z.shape[0]
    with np.errstate(all="ignore"):
        m = z.max(axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(z - m)
        s = e.sum(axis=1, keepdims=True)
        rows = np.arange(n)
        losses = (np.log(s) + m)[:, 0] - z[rows, target]
    total = float(losses.sum())
    scale = 1.0 / n if reduction == "mean" else 1.0
    if reduction == "mean":
        total = total / n if n else float("nan")

    def vjp(g: float) -> tuple[np.ndarray]:
        p = e / s
        p[rows, target] -= 1.0
        p *= g * scale
        return (p,)
    return record_scalar("cross_entropy", logits._backend, np.float64(total), tape,
                         (logits._index,), vjp)


def sigmoid_values(x: np.ndarray) -> np.ndarray:
    """The logistic function of an array, from exp(-|x|), which never overflows."""
    e = np.exp(-np.abs(x))
    out: np.ndarray = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype,
                                                                              copy=False)
    return out


def sigmoid(x: Tensor) -> Tensor:
    s = sigmoid_values(x._data)

    def vjp(g: Any) -> tuple[np.ndarray]:
        return (g * (s * (1.0 - s)),)
    return record("sigmoid", x._backend, s, x.shape, x.dtype, live_tape(x), (x._index,), vjp)
