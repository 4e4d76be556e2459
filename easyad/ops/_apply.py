"""A call of a table op (``call``), interpreted for what its operands are:

- TraceTensors (forward mode, nested to any depth): the op on the values, the op's jvp
  on the tangents (a linear op: the op itself);
- Tensors of any device, recorded or not (reverse mode): the backend's ``op`` (the
  lowering of the table), and one node whose step calls the op's vjp, on constant
  tensors in the sweep and on recorded ones for create_graph (``OpStep``). The meta
  backend (``eval_shape``) and the recording backend of ``ad.record`` are backends too:
  the first answers from the shape rule, the second records an ``op`` instruction (or the
  composite's primitives);
- numpy object arrays of Records, Traces or NestedTraces: the numpy lowering of an op
  marked ``objects`` (a composition of scalar operations: the scalar engines record it);
- plain arrays and numbers: the numpy lowering.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from easyad._core import Record, Trace
from easyad._levels import VMAPS, BatchedBase
from easyad.errors import ShapeError
from easyad.ops._table import Op
from easyad.tensor import _graph
from easyad.tensor._base import (BOOL, FLOAT32, FLOAT64, ObjectArrayOperand, Operand,
                                 TensorBase, common_tape, operand, record, record_scalar,
                                 result_dtype, wrap)
from easyad.tensor._meta import ShapeDtype
from easyad.tensor._steps import Step
from easyad.tensor._tensor import Tensor
from easyad.tensor._trace import TraceTensor, _scalar

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


def call(op: Op, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``op(*args, **kwargs)`` for operands of any kind (see the module's docstring)."""
    params = op.bind(kwargs)
    return apply(op, params, args)


def apply(op: Op, params: Any, args: tuple[Any, ...]) -> Any:
    """``op`` with parameters already bound (its vjps and jvps call this)."""
    if VMAPS[0]:        # inside ad.vmap: a batched operand runs the op's batching rule
        for a in args:
            if isinstance(a, BatchedBase):
                return a._batched_apply(op, params, args)   # type: ignore[attr-defined]
    tensors = False
    for a in args:           # (a loop, not any(...): eager calls come through here)
        if isinstance(a, TraceTensor):
            return _forward(op, params, args)
        if isinstance(a, TensorBase):
            tensors = True
    if tensors:
        return _tensors(op, params, args)
    if any(isinstance(a, np.ndarray) and a.dtype == object for a in args):
        return _objects(op, params, args)
    if any(isinstance(a, (Record, Trace)) for a in args):
        raise TypeError(f"{op.name} takes arrays: put the numbers in a numpy array "
                        f"(np.array([...], dtype=object)) or a Tensor")
    arrays = [np.asarray(a, dtype=np.float64) if not isinstance(a, np.ndarray) or
              a.dtype.kind not in "f" else a for a in args]
    _, params = op.rule(params, *(a.shape for a in arrays))
    return op.numpy(params, *arrays)


# ---- reverse mode (and every device, eval_shape, ad.record) ----

def _tensors(op: Op, params: Any, args: tuple[Any, ...]) -> Any:
    first = args[0] if isinstance(args[0], TensorBase) else \
        next(a for a in args if isinstance(a, TensorBase))
    be, cls = first._backend, type(first)
    ops: list[Operand] = []
    for a in args:
        o = operand(a, be)
        if o is None or o.dtype is None and op.casts:
            raise TypeError(f"{op.name}: every operand must be an array or tensor, got "
                            f"{type(a).__name__}")
        ops.append(o)
    shape, params = op.rule(params, *[o.shape for o in ops])
    if op.dtype is not None:
        dtype = np.dtype(op.dtype(params, *[o.dtype for o in ops]))
    elif len(ops) == 1 and (ops[0].dtype is FLOAT64 or ops[0].dtype is FLOAT32):
        dtype = ops[0].dtype            # (the common case, without result_type)
    else:
        dtype = result_dtype(ops)
    # (``is`` first: comparing numpy dtypes by == costs a microsecond)
    bufs = [o.data if o.dtype is dtype or not op.casts or o.dtype == dtype else
            be.map("astype", ("x",), {"x": o.data}, o.shape, (dtype,))[0] for o in ops]
    data = be.op(op, params, bufs, shape, dtype)
    if op.saves:                       # (result, buffers the composite made for the step)
        data, bufs = data if isinstance(data, tuple) else (data, None)
    tape = common_tape(op.name, ops)
    inputs = tuple([o.index for o in ops])
    number = shape == () and op.numbers and dtype is not BOOL    # (a number is a float)
    if tape is None or max(inputs) < 0:
        if number:
            return record_scalar(cls, op.name, be, data, None, (), None)
        return record(cls, op.name, be, data, shape, dtype, None, (), None)
    step = OpStep(op, params, cls, be, ops, data, shape, dtype) if op.step is None else \
        op.step(params, cls, be, ops, bufs, data, shape, dtype)
    if number:
        return record_scalar(cls, op.name, be, data, tape, inputs, step, step.graph)
    return record(cls, op.name, be, data, shape, dtype, tape, inputs, step, step.graph)


class OpStep(Step):
    """A table op's node: its vjp, as data (the op, its parameters, the operands' values and
    entries, the output). The sweep calls the op's vjp on constant tensors over the
    buffers; ``graph`` calls it on recorded tensors (create_graph)."""

    __slots__ = ("op", "params", "cls", "be", "operands", "data", "shape", "dtype")

    def __init__(self, op: Op, params: Any, cls: type, be: Backend, ops: list[Any], data: Any,
                 shape: tuple[int, ...], dtype: Any) -> None:
        self.op, self.params, self.cls, self.be = op, params, cls, be
        # (data, shape, dtype, entry) of each operand: no tape held (no reference cycle); a
        # linear op's vjp reads no values, so none is kept alive (its vjp sees ShapeDtypes)
        keep = not op.linear
        self.operands = tuple((o.data if keep else None, o.shape, o.dtype, o.index)
                              for o in ops)
        self.data, self.shape, self.dtype = (data if keep else None), shape, dtype

    def __call__(self, g: Any) -> tuple[Any, ...]:
        cls, be = self.cls, self.be
        if not hasattr(g, "shape"):          # a scalar output's adjoint: a float
            g = be.full((), float(g), self.dtype)
        gt = wrap(cls, be, g, self.shape, self.dtype)
        xs = [_value(cls, be, d, s, dt) for d, s, dt, _ in self.operands]
        out = _value(cls, be, self.data, self.shape, self.dtype)
        cts = self._cotangents(self.op.vjp(self.params, gt, *xs, out))
        return tuple(None if ct is None or index < 0 else
                     _buffer(ct, cls, be, shape, dt)
                     for ct, (_, shape, dt, index) in zip(cts, self.operands))

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        cls, be = self.cls, self.be
        if self.op.linear:
            xs = [ShapeDtype(s, dt) for _, s, dt, _ in self.operands]
            out: Any = ShapeDtype(self.shape, self.dtype)
        else:
            xs = [_graph.handle(cls, be, d, s, dt, tape, i) for d, s, dt, i in self.operands]
            # (no output kept: a step whose vjp never reads it, as conv's)
            out = ShapeDtype(self.shape, self.dtype) if self.data is None else \
                _graph.handle(cls, be, self.data, self.shape, self.dtype, tape, index)
        g = _graph.as_tensor(g, cls, be, self.dtype)
        cts = self._cotangents(self.op.vjp(self.params, g, *xs, out))
        return tuple(None if ct is None or i < 0 else _graph.as_tensor(ct, cls, be, dt)
                     for ct, (_, _, dt, i) in zip(cts, self.operands))

    def _cotangents(self, cts: Any) -> tuple[Any, ...]:
        cts = tuple(cts) if isinstance(cts, (tuple, list)) else (cts,)
        if len(cts) != len(self.operands):
            raise TypeError(f"the vjp of op {self.op.name!r} returned {len(cts)} "
                            f"cotangent(s) for {len(self.operands)} operand(s)")
        for ct, (_, shape, _, _) in zip(cts, self.operands):
            if ct is not None and tuple(np.shape(ct) if not isinstance(ct, TensorBase)
                                        else ct.shape) != shape:
                raise ShapeError(f"the vjp of op {self.op.name!r} returned a cotangent of "
                                 f"shape {np.shape(ct)} for an operand of shape {shape}")
        return cts


def _value(cls: type, be: Backend, data: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An operand or the output as the vjp sees it: a constant tensor, or for a linear op
    (whose step keeps no values) its ShapeDtype."""
    return ShapeDtype(shape, dtype) if data is None else wrap(cls, be, data, shape, dtype)


def _buffer(ct: Any, cls: type, be: Backend, shape: tuple[int, ...], dtype: Any) -> Any:
    """A cotangent (a constant tensor, or a number) as a buffer of the operand's dtype."""
    if isinstance(ct, TensorBase):
        return ct._data if ct.dtype == dtype else ct.astype(dtype)._data
    return be.full(shape, float(ct), dtype)


# ---- forward mode ----

def _forward(op: Op, params: Any, args: tuple[Any, ...]) -> Any:
    values = [a._value if isinstance(a, TraceTensor) else a for a in args]
    tangents = [a._tangent if isinstance(a, TraceTensor) else None for a in args]
    out = apply(op, params, tuple(values))
    # the jvp sees canonical parameters (axes made non-negative...), as the vjp does
    _, params = op.rule(params, *(tuple(v.shape) if hasattr(v, "shape") else np.shape(v)
                                  for v in values))
    full = tuple(t if t is not None else _zeros_like(v) for t, v in zip(tangents, values))
    if op.jvp is None:           # linear in its operands: the op of the tangents
        tangent = apply(op, params, full)
    else:
        tangent = op.jvp(params, full, *values, out)
    if not isinstance(out, (TensorBase, TraceTensor)):     # one number
        return _scalar(out, tangent)
    value: Any = out
    return TraceTensor._of(value, tangent)


def _zeros_like(v: Any) -> Any:
    if isinstance(v, (TensorBase, TraceTensor)):
        tensor: Any = v
        return tensor * 0.0
    return Tensor.constant(np.zeros(np.shape(v)))


# ---- object arrays of scalars (Records, Traces, NestedTraces) ----

def _objects(op: Op, params: Any, args: tuple[Any, ...]) -> Any:
    if not op.objects:      # ObjectArrayOperand (a TypeError): ad.hessian then uses tensors
        raise ObjectArrayOperand(f"{op.name} has no scalar form (its numpy lowering does not "
                                 f"run on object arrays): pass a Tensor (ad.record(..., "
                                 f"tensor=True) records tensor code)")
    arrays = [np.asarray(a) for a in args]
    _, params = op.rule(params, *(a.shape for a in arrays))
    return op.numpy(params, *arrays)


# ---- batching (what vmap will call) ----

def batched(op: Op, x: Any, batch_axis: int, **kwargs: Any) -> Any:
    """``op`` applied to each slice of ``x`` along ``batch_axis`` at once, by the op's
    batching rule (one call, not a loop): the result has the batch axis where the rule
    puts it, moved to ``batch_axis``."""
    if op.batch is None:
        raise NotImplementedError(f"op {op.name!r} has no batching rule")
    params = op.bind(kwargs)
    shape = tuple(np.shape(x) if not isinstance(x, (TensorBase, TraceTensor)) else x.shape)
    if not -len(shape) <= batch_axis < len(shape):
        raise ValueError(f"ops.batched({op.name}): batch axis {batch_axis} is not an axis of "
                         f"an operand of shape {shape}")
    batch_axis %= len(shape)
    inner = shape[:batch_axis] + shape[batch_axis + 1:]
    _, params = op.rule(params, inner)            # canonical for one slice
    # a rule whose op works on the last core_axes axes (linalg's matrices) takes a batch
    # axis only before them: one among them is moved to the front, and back after
    core = getattr(op.batch, "core_axes", 0)
    moved = core and batch_axis > len(inner) - core
    if moved:
        x = np.moveaxis(x, batch_axis, 0) if isinstance(x, np.ndarray) else \
            _moveaxis(x, batch_axis, 0)
    params, out_axis = op.batch(params, 0 if moved else batch_axis)
    out = apply(op, params, (x,))
    return _placed(out, out_axis, batch_axis)


def _placed(out: Any, out_axis: int, batch_axis: int) -> Any:
    # the result's batch axis where np.stack of the slices' results along batch_axis puts
    # it: batch_axis, or the last axis where the results have fewer axes (det's numbers)
    target = min(batch_axis, np.ndim(out) - 1 if isinstance(out, np.ndarray) else out.ndim - 1)
    if out_axis == target:
        return out
    return np.moveaxis(out, out_axis, target) if isinstance(out, np.ndarray) else \
        _moveaxis(out, out_axis, target)


def _moveaxis(t: Any, source: int, destination: int) -> Any:
    order = [k for k in range(t.ndim) if k != source]
    order.insert(destination, source)
    return t.transpose(*order)
