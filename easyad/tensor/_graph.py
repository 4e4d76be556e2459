"""Tensor vjps written with recorded operations, for ``create_graph=True``.

A tensor operation's node carries two vjps: ``vjp`` on the backend's buffers (the plain
backward sweep, fast) and ``graph`` (``Node.graph(tape, index, g)``), the same adjoint
built from tensor operations on handles of the operands' entries, so the backward sweep
lands on the tape and can be differentiated again (Hessians, HVPs of tensor code).

The elementwise ones come from the rule table: each partial expression is compiled once
against ``tensor_namespace()``, which is the generic one (``ad.sin`` on a Tensor records
a sin) with the strong-zero helpers made elementwise. What a helper decides from values
(``mul0``'s zero factors, ``sign``) is a constant mask: its derivative is 0 wherever it is
defined, as in every other mode.

Layering: below ``_tensor``; the operation modules import it. It makes its tensors with
the class of the operand it was given (``cls``), like the operations do.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from easyad import _expr, _rules
from easyad._levels import BatchedBase
from easyad._expressions import (CompiledRule, compile_rule, derivative_namespace,
                                 generic_namespace, number_of)
from easyad.tensor import _shapes as shapes
from easyad.tensor._backend import Backend
from easyad.tensor._base import BOOL, TensorBase, wrap


def handle(cls: type, be: Backend, data: Any, shape: tuple[int, ...], dtype: Any, tape: Any,
           index: int) -> Any:
    """Entry ``index`` of ``tape`` as a recorded tensor over ``data`` (its value); a
    constant tensor when ``index`` < 0. ``dtype`` None: a scalar operand (a Record or a
    float, ``data`` its value)."""
    if dtype is None:
        return float(data) if index < 0 else tape._record_at(index)
    if index < 0:
        return wrap(cls, be, data, shape, dtype)
    return wrap(cls, be, data, shape, dtype, tape, tape._record_at(index))


def zeros(cls: type, be: Backend, shape: tuple[int, ...], dtype: Any) -> Any:
    return wrap(cls, be, be.full(shape, 0.0, dtype), shape, dtype)


def as_tensor(g: Any, cls: type, be: Backend, dtype: Any) -> Any:
    """A scalar adjoint (Record or float) as a 0-d tensor of class ``cls`` on ``be``;
    tensors (and vmap's batched values) pass through."""
    if isinstance(g, (TensorBase, BatchedBase)):
        return g
    return zeros(cls, be, (), dtype) + g


def broadcast(g: Any, kept: tuple[int, ...], shape: tuple[int, ...], cls: type, be: Backend,
              dtype: Any) -> Any:
    """``g`` (an adjoint of the reduced shape ``kept``) broadcast to ``shape``, recorded."""
    g = as_tensor(g, cls, be, dtype).reshape(kept)
    if kept == shape:
        return g
    if isinstance(g, BatchedBase):      # (a batched seed's adjoint: broadcast per example)
        return g + np.zeros(shape, dtype)
    return g + zeros(cls, be, shape, dtype)


def fold(g: Any, shape: tuple[int, ...], target: tuple[int, ...], scalar: bool = False) -> Any:
    """A broadcast adjoint of ``shape`` summed back to ``target``, recorded; a scalar (a
    Record) for a ``scalar`` operand."""
    if not isinstance(g, (TensorBase, BatchedBase)):
        return g
    t: Any = g      # a Tensor: sum is the subclass's
    if scalar:
        return t.sum()
    if shape == target:
        return g
    total = t.sum(axis=shapes.reduced_axes(shape, target))
    if isinstance(total, BatchedBase):
        return total.reshape(target)  # type: ignore[attr-defined]
    return as_tensor(total, type(g), g._backend, g._dtype).reshape(target)


def constant_mask(mask: np.ndarray, like: TensorBase) -> TensorBase:
    be = like._backend
    return wrap(type(like), be, be.asarray(mask, BOOL), mask.shape, BOOL)


def where(condition: Any, a: Any, b: Any) -> Any:
    """``ad.where`` for tensors and numbers alike (the operation the table's ``choose`` is)."""
    for v in (condition, a, b):
        if isinstance(v, TensorBase):
            return type(v)._where(condition, a, b)    # type: ignore[attr-defined]
    return a if condition else b


# ---- the strong-zero helpers on tensors ----

def _values(v: Any) -> np.ndarray:
    if isinstance(v, TensorBase):
        return v.value
    if isinstance(v, np.ndarray):
        return v
    return np.asarray(number_of(v))


def _like(*vs: Any) -> TensorBase | None:
    return next((v for v in vs if isinstance(v, TensorBase)), None)


# where the strong zero applies, as kernels of the operands' values (a recorded program
# cannot read values on the host: its masks are computed at every replay)
# (in _expr: the optimiser knows them, and drops a mask a constant operand makes all 0)
_STRONG_MUL, _STRONG_DIV = _expr.STRONG_MUL_MASK, _expr.STRONG_DIV_MASK


def _kernel_mask(expr: str, a: Any, b: Any, like: TensorBase) -> TensorBase:
    """A constant boolean tensor: ``expr`` of the values of a and b, as a kernel."""
    be = like._backend
    # (an array operand, a batched seed's basis: a constant of the program)
    a, b = (wrap(type(like), be, be.asarray(v, like._dtype), v.shape, like._dtype)
            if isinstance(v, np.ndarray) and v.ndim else v for v in (a, b))
    shapes_ = [v._shape for v in (a, b) if isinstance(v, TensorBase)]
    shape = shapes.broadcast("mul0", *shapes_) if len(shapes_) == 2 else shapes_[0]
    data = [v._data if isinstance(v, TensorBase) else float(number_of(v)) for v in (a, b)]
    (mask,) = be.map("strong_zero", (expr,), {"x": data[0], "y": data[1]}, shape, (BOOL,))
    return wrap(type(like), be, mask, shape, BOOL)


def _recording(like: TensorBase) -> bool:
    # values read on the host would be baked into the replay: the masks are kernels then
    return like._backend.interpreter.replays


def _batched(function: Any, args: tuple[Any, ...]) -> Any:
    """``function`` of operands one of which is vmap's batched value (a sweep recorded
    with a batched seed: vmap_lift's Jacobians), on the whole batch; else None."""
    for v in args:
        if isinstance(v, BatchedBase):
            return v._elementwise(function, args)  # type: ignore[attr-defined]
    return None


def _mul0(a: Any, b: Any) -> Any:
    # as the generic helper, elementwise: a zero factor against inf or NaN gives exactly 0;
    # elsewhere the plain product, so a factor whose value is 0 still passes on its
    # derivative
    batched = _batched(_mul0, (a, b))
    if batched is not None:
        return batched
    like = _like(a, b)
    if like is None:
        return generic_namespace()["mul0"](a, b)
    if _recording(like):
        return where(_kernel_mask(_STRONG_MUL, a, b, like), 0.0, a * b)
    va, vb = _values(a), _values(b)
    if np.isfinite(va).all() and np.isfinite(vb).all():
        return a * b      # no inf or NaN: no strong zero (two passes, not ten)
    with np.errstate(invalid="ignore"):
        strong = ((va == 0) & ~np.isfinite(vb)) | ((vb == 0) & ~np.isfinite(va))
    if not strong.any():
        return a * b
    shape = np.broadcast_shapes(va.shape, vb.shape)
    return where(constant_mask(np.broadcast_to(strong, shape), like), 0.0, a * b)


def _div0(a: Any, b: Any) -> Any:
    # 0/0 and 0/NaN count as 0, elementwise
    batched = _batched(_div0, (a, b))
    if batched is not None:
        return batched
    like = _like(a, b)
    if like is None:
        return generic_namespace()["div0"](a, b)
    if _recording(like):
        mask = _kernel_mask(_STRONG_DIV, a, b, like)
        return where(mask, 0.0, a / where(mask, 1.0, b))
    va, vb = _values(a), _values(b)
    zero = (va == 0) & ((vb == 0) | np.isnan(vb))
    if not zero.any():
        return a / b
    mask = constant_mask(np.broadcast_to(zero, np.broadcast_shapes(va.shape, vb.shape)), like)
    return where(mask, 0.0, a / where(mask, 1.0, b))


def _piecewise(name: str, function: Any, generic: Any) -> Any:
    # a piecewise-constant helper: its value as a constant (no derivative)
    def apply(t: Any) -> Any:
        if isinstance(t, BatchedBase):
            return t._elementwise(apply, (t,))  # type: ignore[attr-defined]
        if not isinstance(t, TensorBase):
            return generic(t)
        if _recording(t):
            (data,) = t._backend.map(name, (f"{name}(x)",), {"x": t._data}, t._shape,
                                     (t._dtype,))
            return wrap(type(t), t._backend, data, t._shape, t._dtype)
        out = function(t.value)
        return wrap(type(t), t._backend, t._backend.asarray(out, t._dtype), t._shape,
                    t._dtype)
    return apply


def _pick(a: Any, b: Any) -> Any:
    # fmax's share of a, elementwise: piecewise constant, so a constant tensor computed
    # as a kernel of the values (a recorded program reads them at every replay)
    batched = _batched(_pick, (a, b))
    if batched is not None:
        return batched
    like = _like(a, b)
    if like is None:
        return generic_namespace()["pick"](a, b)
    be = like._backend
    shapes_ = [v._shape for v in (a, b) if isinstance(v, TensorBase)]
    shape = shapes.broadcast("pick", *shapes_) if len(shapes_) == 2 else shapes_[0]
    data = [v._data if isinstance(v, TensorBase) else float(number_of(v)) for v in (a, b)]
    (share,) = be.map("pick", ("pick(x, y)",), {"x": data[0], "y": data[1]}, shape,
                      (like._dtype,))
    return wrap(type(like), be, share, shape, like._dtype)


@functools.lru_cache(maxsize=1)
def tensor_namespace() -> Mapping[str, Any]:
    """The generic namespace with the value-reading helpers made elementwise."""
    ns = dict(derivative_namespace())    # partials of plain numbers: C's NaN, no raise
    ns.update(mul0=_mul0, div0=_div0, choose=where, pick=_pick,
              sign=_piecewise("sign", np.sign, ns["sign"]),
              heaviside=_piecewise("heaviside", lambda v: np.heaviside(v, 0.5),
                                   ns["heaviside"]))
    return ns


@functools.lru_cache(maxsize=1)
def tensor_rules() -> Mapping[str, CompiledRule]:
    """Every rule's partials compiled against ``tensor_namespace()``, by rule name."""
    ns = tensor_namespace()
    return {r.name: compile_rule(r, ns) for r in _rules.RULES}


def mul0(g: Any, partial: Any) -> Any:
    """An adjoint times a partial, with the strong zero (a literal 1 costs nothing)."""
    if isinstance(partial, float) and partial == 1.0:
        return g
    return _mul0(g, partial)
