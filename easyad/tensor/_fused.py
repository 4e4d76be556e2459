"""Fused operations: one tape entry each instead of a chain of them, on every backend.

``linear`` (``x @ W.T + b``), ``cross_entropy`` with class indices and ``sigmoid`` are
what a training step spends its entries on (``easyad.nn`` calls them). Composed of tensor
operations each would be several nodes, with a transposed copy of W and a one-hot product
in the forward pass and as many vjps in the backward one; fused, the forward pass is what
PyTorch does (one GEMM with the transpose as a flag, a logsumexp) and the vjp is written
out once:

- linear:        dx = g W,  dW = gᵀ x,  db = Σₙ g
- cross_entropy: dlogits = (softmax(logits) - onehot(target)) · g / N  (N only for mean)
- sigmoid:       dx = g s (1 - s)

They run through the Backend Protocol (``_backend.py``): ``linear`` and ``cross_entropy``
through its fused kernels (numpy's own, written with numpy; OpenCL and meta compose them
of their primitives, ``_composed.py``), ``sigmoid`` as one ``map``. Each vjp is a step
(``_steps.Step``): ``LinearStep``, ``CrossEntropyStep``, ``SigmoidStep``.
``add_channel_bias`` (nn's convolutions) adds a bias into the convolution's own fresh
output on the host (``ChannelBiasStep``: dy = g, db = Σ g over all but the channels).
"""
from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.errors import ShapeError
from easyad.tensor import _graph, _interpreters
from easyad.tensor._base import (BOOL, TensorBase, common_tape, live_tape, operand, record,
                                 record_scalar, result_dtype, wrap)
from easyad.tensor._steps import Step

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

# the logistic function, from exp(-|x|) on each side of 0, so neither branch overflows
_SIGMOID = "choose(x >= 0.0, 1.0 / (1.0 + exp(-x)), exp(x) / (1.0 + exp(x)))"


class LinearStep(Step):
    """linear's vjp: dx = g W, dW = gᵀ x, db = Σₙ g, for the operands that ``needs`` one
    (x, W, bias). ``nok``: (n, o, k), x as (n, k) and W (o, k); ``keep_x``/``keep_w``: x
    as (n, k) and W, each kept only where the other needs its adjoint; ``x_part``,
    ``w_part``: their (data, shape, entry), for the graph's handles; ``b_shape``: () for
    one bias for every output (a float adjoint for a ``b_scalar``); ``has_b``: whether
    there is a bias at all."""

    __slots__ = ("cls", "be", "dtype", "nok", "needs", "keep_x", "keep_w", "x_part", "w_part",
                 "b_shape", "b_scalar", "has_b")

    def __init__(self, cls: type, be: Backend, dtype: Any, nok: tuple[int, int, int],
                 needs: tuple[bool, bool, bool], keep_x: Any, keep_w: Any,
                 x_part: tuple[Any, ...], w_part: tuple[Any, ...], b_shape: tuple[int, ...],
                 b_scalar: bool, has_b: bool) -> None:
        self.cls, self.be, self.dtype, self.nok, self.needs = cls, be, dtype, nok, needs
        self.keep_x, self.keep_w, self.x_part, self.w_part = keep_x, keep_w, x_part, w_part
        self.b_shape, self.b_scalar, self.has_b = b_shape, b_scalar, has_b

    def __call__(self, g: Any) -> tuple[Any, ...]:
        be, (n, o, _) = self.be, self.nok
        gx, gw, gb = be.linear_vjp(be.reshape(g, (n, o)), self.keep_x, self.keep_w,
                                   self.needs)
        if gx is not None:
            gx = be.reshape(gx, self.x_part[1])
        if gb is not None and self.b_shape == ():         # one bias for every output
            gb = be.reduce("sum", gb, (0,))
            if self.b_scalar:
                gb = float(np.asarray(be.to_numpy(gb)).reshape(()))
        return (gx, gw, gb) if self.has_b else (gx, gw)

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        cls, be, dtype, needs, (n, o, k) = self.cls, self.be, self.dtype, self.needs, self.nok
        xh, wh = (_graph.handle(cls, be, d, s, dtype, tape, i)
                  for d, s, i in (self.x_part, self.w_part))
        g2 = g.reshape((n, o))
        gx = (g2 @ wh).reshape(self.x_part[1]) if needs[0] else None
        gw = _swap(g2) @ xh.reshape((n, k)) if needs[1] else None
        gb = None
        if needs[2]:
            gb = g2.sum(axis=0) if self.b_shape != () else g2.sum()
            if self.b_shape == () and not self.b_scalar:
                gb = _graph.as_tensor(gb, cls, be, dtype)
        return (gx, gw, gb) if self.has_b else (gx, gw)


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """``x @ weight.T + bias`` as one tape entry; ``weight`` is (out, in), ``bias`` (out,),
    a number or None. Tensors, arrays and numbers; at least one Tensor."""
    first = next((v for v in (x, weight, bias) if isinstance(v, TensorBase)), None)
    if first is None:
        raise TypeError("linear needs at least one Tensor")
    be, cls = first._backend, type(first)
    X, W = operand(x, be), operand(weight, be)
    B = operand(bias, be) if bias is not None else None
    if X is None or W is None or (bias is not None and B is None):
        raise TypeError("linear takes tensors, arrays or numbers")
    ops = [o for o in (X, W, B) if o is not None]
    if len(W.shape) != 2 or not X.shape or X.shape[-1] != W.shape[1]:
        raise ShapeError(f"linear: input of shape {X.shape} and weight of shape {W.shape} "
                         f"(out, in) do not fit")
    if B is not None and B.shape not in ((), (W.shape[0],)):
        raise ShapeError(f"linear: bias of shape {B.shape} for {W.shape[0]} outputs")
    (o, k), n = W.shape, math.prod(X.shape[:-1])
    out_shape = X.shape[:-1] + (o,)
    dtype = result_dtype(ops)
    tape = common_tape("linear", ops)
    xd, wd = (v.data if v.dtype == dtype else
              be.map("astype", ("x",), {"x": v.data}, v.shape, (dtype,))[0] for v in (X, W))
    x2 = be.reshape(xd, (n, k))
    out = be.reshape(be.linear(x2, wd, B.data if B is not None else None), out_shape)
    if tape is None or not any(v.needs_adjoint for v in ops):
        return record(cls, "linear", be, out, out_shape, dtype, None, (), None)
    needs = (X.needs_adjoint, W.needs_adjoint, B is not None and B.needs_adjoint)
    step = LinearStep(cls, be, dtype, (n, o, k), needs, x2 if needs[1] else None,
                      wd if needs[0] else None, (X.data, X.shape, X.index),
                      (W.data, W.shape, W.index), B.shape if B is not None else (),
                      B is not None and B.dtype is None, B is not None)
    inputs = tuple(v.index for v in ops)
    return record(cls, "linear", be, out, out_shape, dtype, tape, inputs, step, step.graph)


def _swap(t: Any) -> Any:
    return t.transpose((1, 0))


class CrossEntropyStep(Step):
    """cross_entropy's vjp: (softmax(z) - onehot(target)) · g · ``scale``, from what the
    forward kernel ``saved``; ``logits``: (data, shape, dtype, entry), for the graph."""

    __slots__ = ("cls", "be", "saved", "target", "scale", "logits")

    def __init__(self, cls: type[TensorBase], be: Backend, saved: Any, target: np.ndarray,
                 scale: float, logits: tuple[Any, ...]) -> None:
        self.cls, self.be, self.saved, self.target, self.scale, self.logits = \
            cls, be, saved, target, scale, logits

    def __call__(self, g: float) -> tuple[Any]:
        return (self.be.cross_entropy_vjp(self.saved, self.target, g * self.scale),)

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any]:
        # softmax recorded (shifted by the constant row maximum)
        cls, be, (data, shape, dtype, entry) = self.cls, self.be, self.logits
        z = _graph.handle(cls, be, data, shape, dtype, tape, entry)
        e = (z - z.detach().max(axis=1, keepdims=True)).exp()
        onehot = np.zeros(shape)
        onehot[np.arange(shape[0]), self.target] = 1.0
        hot = cls.constant(onehot, device=be.device, dtype=dtype)
        return ((e / e.sum(axis=1, keepdims=True) - hot) * (g * self.scale),)


def cross_entropy(logits: TensorBase, target: np.ndarray, reduction: str = "mean") -> Any:
    """``logsumexp(z[n]) - z[n, target[n]]`` over the rows of ``logits`` (N, C), averaged
    (``"mean"``) or summed (``"sum"``); ``target``: the class of each row, int64 (N,)
    within 0..C-1 (the caller checks). A scalar Record (a float for constants)."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction is 'mean' or 'sum', not {reduction!r}")
    if len(logits.shape) != 2 or np.shape(target) != logits.shape[:1]:
        raise ShapeError(f"cross_entropy: logits of shape {logits.shape} need targets of "
                         f"shape {logits.shape[:1]}, not {np.shape(target)}")
    if logits.dtype == BOOL:
        logits = logits.astype(np.float64)
    be, tape = logits._backend, live_tape(logits)
    target = np.asarray(target, dtype=np.int64)
    n = logits.shape[0]
    divisor = float(n) if reduction == "mean" else 1.0
    loss, saved = be.cross_entropy(logits._data, target, divisor)
    scale = (1.0 / n if n else math.nan) if reduction == "mean" else 1.0
    step = CrossEntropyStep(type(logits), be, saved, target, scale,
                            (logits._data, logits.shape, logits.dtype, logits._index))
    return record_scalar(type(logits), "cross_entropy", be, loss, tape, (logits._index,), step,
                         step.graph)


class SigmoidStep(Step):
    """sigmoid's vjp: g s (1 - s), from its output ``s``."""

    __slots__ = ("cls", "be", "s", "shape", "dtype")

    def __init__(self, cls: type, be: Backend, s: Any, shape: tuple[int, ...], dtype: Any) -> None:
        self.cls, self.be, self.s, self.shape, self.dtype = cls, be, s, shape, dtype

    def __call__(self, g: Any) -> tuple[Any]:
        return tuple(self.be.map("sigmoid_vjp", ("g * (s * (1.0 - s))",), {"g": g, "s": self.s},
                                 self.shape, (self.dtype,)))

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any]:
        out = _graph.handle(self.cls, self.be, self.s, self.shape, self.dtype, tape, index)
        return (g * (out * (1.0 - out)),)


def sigmoid(x: TensorBase) -> Any:
    """``1 / (1 + exp(-x))`` elementwise without overflow, as one tape entry."""
    if x.dtype == BOOL:
        x = x.astype(np.float64)
    be, shape, dtype = x._backend, x.shape, x.dtype
    (s,) = be.map("sigmoid", (_SIGMOID,), {"x": x._data}, shape, (dtype,))
    step = SigmoidStep(type(x), be, s, shape, dtype)
    return record(type(x), "sigmoid", be, s, shape, dtype, live_tape(x), (x._index,), step,
                  step.graph)


class SoftmaxStep(Step):
    """softmax's vjp, ``y (g - Σ g y)`` (the sum over ``axes``, kept), from its output
    ``y``: one tape entry, where the composition (shift, exp, sum, division) took four
    whose vjps ran seven passes over the array, two through the division's strong-zero
    products (attention's scores, 256x128x128 float32: ~40 -> ~15 ms). Written with tensor
    operations on constants, so every backend and the recorded programs run it."""

    __slots__ = ("cls", "be", "y", "shape", "dtype", "axes")

    def __init__(self, cls: type, be: Backend, y: Any, shape: tuple[int, ...], dtype: Any,
                 axes: tuple[int, ...]) -> None:
        self.cls, self.be, self.y, self.shape, self.dtype = cls, be, y, shape, dtype
        self.axes = axes

    def __call__(self, g: Any) -> tuple[Any]:
        y = wrap(self.cls, self.be, self.y, self.shape, self.dtype)
        gy = wrap(self.cls, self.be, g, self.shape, self.dtype) * y
        return ((gy - y * gy.sum(axis=self.axes, keepdims=True))._data,)

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any]:
        y = _graph.handle(self.cls, self.be, self.y, self.shape, self.dtype, tape, index)
        gy = g * y
        return (gy - y * gy.sum(axis=self.axes, keepdims=True),)


def softmax_node(x: TensorBase, y: TensorBase, axes: tuple[int, ...]) -> Any:
    """``y``, the softmax of ``x`` over ``axes`` computed on constants, as one tape entry
    on ``x``'s tape with ``SoftmaxStep`` for its vjp."""
    be, shape, dtype = x._backend, x.shape, x.dtype
    step = SoftmaxStep(type(x), be, y._data, shape, dtype, axes)
    return record(type(x), "softmax", be, y._data, shape, dtype, live_tape(x), (x._index,),
                  step, step.graph)


class ChannelBiasStep(Step):
    """add_channel_bias's vjp: dy = g, db = g summed over every axis but the channels."""

    __slots__ = ("be", "axes", "needs")

    def __init__(self, be: Backend, axes: tuple[int, ...], needs: tuple[bool, bool]) -> None:
        self.be, self.axes, self.needs = be, axes, needs

    def __call__(self, g: Any) -> tuple[Any, Any]:
        return (g if self.needs[0] else None,
                self.be.reduce("sum", g, self.axes) if self.needs[1] else None)

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, Any]:
        return (g if self.needs[0] else None,
                g.sum(axis=self.axes) if self.needs[1] else None)


def add_channel_bias(y: Any, bias: Any, d: int, fresh: int) -> Any:
    """``y + bias`` with one bias per channel (axis ``-d - 1`` of y; bias of shape (C,)).

    When y is a float tensor on the host, outside any transform's frame, whose buffer
    only y holds and y only ``fresh`` references besides this call's own (the caller's
    count: the op's output it just made and passes on, nothing else keeps), the bias is
    added into y's buffer: one
    pass, no new array, as torch's convolution adds its bias. Otherwise, or for anything
    else (Traces, batches, a recording, OpenCL, mixed dtypes), the ordinary broadcasting
    add, so every transform sees what it always saw."""
    if (type(y) is type(bias) and isinstance(y, TensorBase) and y._backend is bias._backend
            and y._backend.kind == "numpy" and y._dtype is bias._dtype
            and y._dtype is not BOOL and bias._shape == (y._shape[-d - 1],)
            and _interpreters.new_tensor_backend() is None
            and sys.getrefcount(y) == fresh + 2 and sys.getrefcount(y._data) == 2
            and type(y._data) is np.ndarray and y._data.flags.writeable
            and y._data.flags.c_contiguous and y._data.base is None):
        ops = [operand(v, y._backend) for v in (y, bias)]
        tape = common_tape("add", ops)   # type: ignore[arg-type]
        data = y._data
        b = bias._data.reshape((-1,) + (1,) * d)
        np.add(data, b, out=data)
        inputs = (ops[0].index, ops[1].index)    # type: ignore[union-attr]
        if tape is None or not (inputs[0] >= 0 or inputs[1] >= 0):
            return wrap(type(y), y._backend, data, y._shape, y._dtype)
        axes = tuple(a for a in range(len(y._shape)) if a != len(y._shape) - d - 1)
        step = ChannelBiasStep(y._backend, axes, (inputs[0] >= 0, inputs[1] >= 0))
        return record(type(y), "add", y._backend, data, y._shape, y._dtype, tape, inputs,
                      step, step.graph)
    return y + bias.reshape((-1,) + (1,) * d)
