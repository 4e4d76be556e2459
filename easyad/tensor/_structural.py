"""Tensor operations that are not elementwise rules: reductions, matmul, reshape and
transpose, indexing, joins (concatenate, stack) and where.

Each asks ``_shapes`` for its output shape first (ShapeError before any kernel), runs the
backend's kernels, and records one node whose vjp is the operation's adjoint: a sum's is a
broadcast, a max's splits the adjoint evenly among ties, a slice's writes the adjoint into
zeros, matmul's is two matmuls. The backends (``_numpy.py``, ``_opencl.py``) provide only
the primitive kernels named here (map, reduce, matmul, strided, assemble, take, scatter_add).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad._core import Record
from easyad.errors import TapeMismatchError
from easyad.tensor import _graph
from easyad.tensor import _shapes as shapes
from easyad.tensor._base import (BOOL, T, TensorBase, common_tape, fold, live_tape, operand,
                                 record, record_scalar, result_dtype, wrap)


def _tensor_operand(t: Any, be: Any) -> Any:
    o = operand(t, be)
    if o is None:
        raise TypeError(f"expected a Tensor, array or number, got {type(t).__name__}")
    return o


# ---- reductions ----

def _reduction(t: TensorBase, axis: Any, keepdims: bool, op: str
               ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], Any]:
    if t._dtype == BOOL:
        t = t.astype(np.float64)
    axes = shapes.normalize_axes(op, axis, t.ndim)
    kept = shapes.reduce(t._shape, axes, True)
    out_shape = shapes.reduce(t._shape, axes, keepdims)
    return axes, kept, out_shape, t


def _finish(label: str, t: TensorBase, raw: Any, kept: tuple[int, ...], out_shape: tuple[int, ...],
            vjp: Any, graph: Any) -> Any:
    be, tape = t._backend, live_tape(t)
    if out_shape == ():
        return record_scalar(type(t), label, be, raw, tape, (t._index,), vjp, graph)
    return record(type(t), label, be, be.reshape(raw, out_shape), out_shape, t._dtype, tape,
                  (t._index,), vjp, graph)


def reduce_sum(t: TensorBase, axis: Any = None, keepdims: bool = False) -> Any:
    axes, kept, out_shape, t = _reduction(t, axis, keepdims, "sum")
    be, shape, dtype = t._backend, t._shape, t._dtype
    raw = be.reduce("sum", t._data, axes)

    def vjp(g: Any) -> tuple[Any]:
        g = g if isinstance(g, float) else be.reshape(g, kept)
        return tuple(be.map("broadcast", ("g",), {"g": g}, shape, (dtype,)))
    cls = type(t)

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        return (_graph.broadcast(g, kept, shape, cls, be, dtype),)
    return _finish("sum", t, raw, kept, out_shape, vjp, graph)


def mean(t: TensorBase, axis: Any = None, keepdims: bool = False) -> Any:
    axes = shapes.normalize_axes("mean", axis, t.ndim)
    count = math.prod(t._shape[a] for a in axes)
    return reduce_sum(t, axis, keepdims) * (1.0 / count if count else math.nan)


def reduce_extreme(op: str, t: TensorBase, axis: Any = None, keepdims: bool = False) -> Any:
    """max or min; the adjoint goes to the elements equal to the result, split evenly."""
    axes, kept, out_shape, t = _reduction(t, axis, keepdims, op)
    be, shape, dtype, x = t._backend, t._shape, t._dtype, t._data
    if t.size == 0:
        raise ValueError(f"{op} of an empty tensor (shape {shape}) has no value")
    raw = be.reduce(op, x, axes)
    m = be.reshape(raw, kept)

    def vjp(g: Any) -> tuple[Any]:
        (ties,) = be.map("ties", ("choose(x == m, 1.0, 0.0)",), {"x": x, "m": m}, shape,
                         (dtype,))
        n = be.reshape(be.reduce("sum", ties, axes), kept)
        g = g if isinstance(g, float) else be.reshape(g, kept)
        return tuple(be.map("share", ("choose(x == m, g / n, 0.0)",),
                            {"x": x, "m": m, "g": g, "n": n}, shape, (dtype,)))
    cls = type(t)

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        # the share of each element is piecewise constant: a constant factor
        (ties,) = be.map("ties", ("choose(x == m, 1.0, 0.0)",), {"x": x, "m": m}, shape,
                         (dtype,))
        n = be.reshape(be.reduce("sum", ties, axes), kept)
        (share,) = be.map("share", ("choose(x == m, 1.0 / n, 0.0)",),
                          {"x": x, "m": m, "n": n}, shape, (dtype,))
        return (_graph.broadcast(g, kept, shape, cls, be, dtype) * wrap(cls, be, share, shape,
                                                                         dtype),)
    return _finish(op, t, raw, kept, out_shape, vjp, graph)


# ---- reshape, transpose ----

def reshape(t: T, new: Any) -> T:
    new_shape = shapes.reshape(t._shape, new)
    be, old = t._backend, t._shape

    def vjp(g: Any) -> tuple[Any]:
        return (be.reshape(g, old),)

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        return (g.reshape(old),)
    return record(type(t), "reshape", be, be.reshape(t._data, new_shape), new_shape, t._dtype,
                  live_tape(t), (t._index,), vjp, graph)


def _permute(be: Any, data: Any, shape: tuple[int, ...], perm: tuple[int, ...]) -> Any:
    strides = shapes.contiguous_strides(shape)
    return be.strided(data, 0, tuple(shape[p] for p in perm), tuple(strides[p] for p in perm))


def transpose(t: T, axes: Any) -> T:
    perm = shapes.transpose(t._shape, axes)
    be, shape = t._backend, t._shape
    out_shape = tuple(shape[p] for p in perm)
    inverse = tuple(int(i) for i in np.argsort(perm))
    if perm == tuple(range(len(perm))):
        return t

    def vjp(g: Any) -> tuple[Any]:
        return (_permute(be, g, out_shape, inverse),)

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        return (g.transpose(inverse),)
    return record(type(t), "transpose", be, _permute(be, t._data, shape, perm), out_shape, t._dtype,
                  live_tape(t), (t._index,), vjp, graph)


# ---- indexing ----

def _index_key(key: Any) -> Any:
    # tensors used as indices are constants: index with their values
    if isinstance(key, tuple):
        return tuple(_index_key(k) for k in key)
    if isinstance(key, TensorBase):
        v = key.value
        return v if v.dtype == bool else v.astype(np.int64)
    if isinstance(key, list):
        return np.asarray(key)
    return key


def getitem(t: TensorBase, key: Any) -> Any:
    key = _index_key(key)
    be, shape, dtype, tape = t._backend, t._shape, t._dtype, live_tape(t)
    basic = shapes.basic_index(shape, key)
    if basic is not None:
        offset, out_shape, strides = basic
        out = be.strided(t._data, offset, out_shape, strides)

        def vjp(g: Any) -> tuple[Any]:
            if isinstance(g, float):
                g = be.full((), g, dtype)
            return (be.assemble(shape, dtype, [(offset, out_shape, strides, g)]),)
    else:
        index = shapes.advanced_index(shape, key)
        out_shape = index.shape
        out = be.reshape(be.take(t._data, index.reshape(-1)), out_shape)
        unique = np.unique(index).size == index.size

        def vjp(g: Any) -> tuple[Any]:
            if isinstance(g, float):
                g = be.full((), g, dtype)
            return (be.scatter_add(shape, dtype, index, g, unique),)
    cls = type(t)

    def graph(tape: Any, index: int, g: Any) -> tuple[Any]:
        return (put(_graph.as_tensor(g, cls, be, dtype), shape, key),)
    if out_shape == () and dtype != BOOL:
        return record_scalar(type(t), "getitem", be, out, tape, (t._index,), vjp, graph)
    return record(type(t), "getitem", be, out, out_shape, dtype, tape, (t._index,), vjp, graph)


def put(g: T, shape: tuple[int, ...], key: Any) -> T:
    """Zeros of ``shape`` with ``g`` added at ``t[key]`` (repeated indices add up):
    getitem's adjoint, recorded, whose own adjoint is getitem again."""
    be, dtype, tape = g._backend, g._dtype, live_tape(g)
    basic = shapes.basic_index(shape, key)
    if basic is not None:
        offset, part, strides = basic
        out = be.assemble(shape, dtype, [(offset, part, strides, g._data)])
    else:
        index = shapes.advanced_index(shape, key)
        out = be.scatter_add(shape, dtype, index, g._data, np.unique(index).size == index.size)
    g_shape = g._shape

    def vjp(a: Any) -> tuple[Any]:
        if basic is not None:
            return (be.strided(a, offset, part, strides),)
        return (be.reshape(be.take(a, index.reshape(-1)), g_shape),)

    def graph(tape: Any, index_: int, a: Any) -> tuple[Any]:
        return (a[key],)
    return record(type(g), "put", be, out, shape, dtype, tape, (g._index,), vjp, graph)


# ---- matmul ----

def _as_batched(be: Any, data: Any, shape: tuple[int, ...], batch: tuple[int, ...]) -> Any:
    """``data`` (shape batch' + (R, C)) as (B or 1, R, C) for the backend's matmul."""
    rows, cols = shape[-2:]
    own = shape[:-2]
    if math.prod(own) == 1:
        return be.reshape(data, (1, rows, cols))
    full = batch + (rows, cols)
    if tuple((1,) * (len(batch) - len(own)) + own) != batch:   # broadcast inside the batch
        strides = shapes.contiguous_strides(shape)
        lead = len(full) - len(shape)
        bstrides = tuple(0 if d < lead or shape[d - lead] == 1 else strides[d - lead]
                         for d in range(len(full)))
        data = be.strided(data, 0, full, bstrides)
    return be.reshape(data, (math.prod(batch), rows, cols))


def _transposed(be: Any, data3: Any, shape3: tuple[int, int, int]) -> Any:
    b, r, c = shape3
    return be.strided(data3, 0, (b, c, r), (r * c, 1, c))


def matmul(a: Any, b: Any) -> Any:
    first = a if isinstance(a, TensorBase) else b
    be, cls = first._backend, type(first)
    A, B = operand(a, be), operand(b, be)
    if A is None or B is None:
        return NotImplemented
    out_shape = shapes.matmul(A.shape, B.shape)
    dtype = result_dtype([A, B])
    tape = common_tape("matmul", [A, B])
    a2 = (1,) + A.shape if len(A.shape) == 1 else A.shape
    b2 = B.shape + (1,) if len(B.shape) == 1 else B.shape
    batch = shapes.broadcast("matmul", a2[:-2], b2[:-2])
    (m, k), n = a2[-2:], b2[-1]
    adata, bdata = (o.data if o.dtype == dtype else
                    be.map("astype", ("x",), {"x": o.data}, o.shape, (dtype,))[0]
                    for o in (A, B))
    A3 = _as_batched(be, be.reshape(adata, a2), a2, batch)
    B3 = _as_batched(be, be.reshape(bdata, b2), b2, batch)
    out = be.matmul(A3, B3)
    nb = math.prod(batch)
    result = be.reshape(out, out_shape)
    if (tape is None or not (A.needs_adjoint or B.needs_adjoint)) and out_shape:
        return wrap(cls, be, result, out_shape, dtype)
    a_shape3 = (nb if math.prod(a2[:-2]) != 1 else 1, m, k)
    keep_a, keep_b = (A3 if B.needs_adjoint else None), (B3 if A.needs_adjoint else None)
    a_needs, b_needs, a_full, b_full = A.needs_adjoint, B.needs_adjoint, A.shape, B.shape

    def vjp(g: Any) -> tuple[Any, Any]:
        g3 = be.reshape(be.full((), g, dtype) if isinstance(g, float) else g, (nb, m, n))
        ga = gb = None
        if a_needs:
            ga = be.matmul(g3, keep_b, transpose_b=True)                      # (nb, m, k)
            ga = fold(be, be.reshape(ga, batch + (m, k)), batch + (m, k), a2)
            ga = be.reshape(ga, a_full)
        if b_needs:
            gb = be.matmul(_transposed(be, keep_a, a_shape3), g3)          # (nb, k, n)
            gb = fold(be, be.reshape(gb, batch + (k, n)), batch + (k, n), b2)
            gb = be.reshape(gb, b_full)
        return ga, gb
    parts = [(o.data, o.shape, dtype if o.dtype is not None else None, o.index)
             for o in (A, B)]

    def graph(tape: Any, index: int, g: Any) -> tuple[Any, Any]:
        a, b = (_graph.handle(cls, be, d, s, dt, tape, i) if dt is not None
                else _graph.as_tensor(_graph.handle(cls, be, d, s, dt, tape, i), cls, be, dtype)
                for d, s, dt, i in parts)
        a, b = a.reshape(a2), b.reshape(b2)
        g2 = _graph.as_tensor(g, cls, be, dtype).reshape(batch + (m, n))
        ga = gb = None
        if a_needs:
            ga = _graph.fold(g2 @ _swap_last(b), batch + (m, k), a2).reshape(a_full)
        if b_needs:
            gb = _graph.fold(_swap_last(a) @ g2, batch + (k, n), b2).reshape(b_full)
        return ga, gb
    if out_shape == ():
        return record_scalar(cls, "matmul", be, result, tape, (A.index, B.index), vjp, graph)
    return record(cls, "matmul", be, result, out_shape, dtype, tape, (A.index, B.index), vjp,
                  graph)


def _swap_last(t: Any) -> Any:
    """``t`` with its last two axes swapped (recorded)."""
    perm = tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2)
    return t.transpose(perm)


# ---- joins ----

def concatenate(tensors: Any, axis: int = 0) -> Any:
    tensors = list(tensors)
    first = next((t for t in tensors if isinstance(t, TensorBase)), None)
    if first is None:
        raise TypeError("concatenate: needs at least one Tensor")
    be, cls = first._backend, type(first)
    ops = [_tensor_operand(t, be) for t in tensors]
    out_shape, ax = shapes.concatenate("concatenate", [o.shape for o in ops], axis)
    dtype = result_dtype(ops)
    tape = common_tape("concatenate", ops)
    strides = shapes.contiguous_strides(out_shape)
    places, start = [], 0
    for o in ops:
        places.append((start * strides[ax], o.shape, strides))
        start += o.shape[ax]
    parts = []
    for (offset, shape, st), o in zip(places, ops):
        data = o.data
        if o.dtype != dtype:
            (data,) = be.map("astype", ("x",), {"x": data}, shape, (dtype,))
        parts.append((offset, shape, st, data))
    out = be.assemble(out_shape, dtype, parts)
    needs = [o.needs_adjoint for o in ops]

    def vjp(g: Any) -> tuple[Any, ...]:
        return tuple(be.strided(g, offset, shape, st) if need else None
                     for (offset, shape, st), need in zip(places, needs))
    spans: list[tuple[int, int]] = []
    for o in ops:
        begin = sum(s for _, s in spans)
        spans.append((begin, o.shape[ax]))

    def graph(tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        lead = (slice(None),) * ax
        return tuple(g[lead + (slice(begin, begin + size),)] if need else None
                     for (begin, size), need in zip(spans, needs))
    return record(cls, "concatenate", be, out, out_shape, dtype, tape, tuple(o.index for o in ops),
                  vjp, graph)


def stack(tensors: Any, axis: int = 0) -> Any:
    tensors = list(tensors)
    first = next((t for t in tensors if isinstance(t, TensorBase)), None)
    if first is None:
        raise TypeError("stack: needs at least one Tensor")
    cls, device = type(first), first._backend.device
    items = [t if isinstance(t, TensorBase) else cls.constant(np.asarray(t), device)
             for t in tensors]
    ax = shapes.stack([t.shape for t in items], axis)
    return concatenate([reshape(t, t.shape[:ax] + (1,) + t.shape[ax:]) for t in items], ax)


# ---- scalars into a tensor ----

def from_scalars(cls: type[T], be: Any, dtype: Any, items: list[Any],
                 shape: tuple[int, ...]) -> T:
    """A tensor of ``shape`` from scalars (Records and numbers), one node whose vjp hands
    each Record its element of the adjoint."""
    values = np.array([float(v.number) if type(v) is Record else float(v) for v in items],
                      dtype=np.float64)
    records = [v for v in items if type(v) is Record and v.tape is not None]
    tape = records[0].tape if records else None
    if any(r.tape is not tape for r in records):
        raise TapeMismatchError("scalars of two different lists in one tensor")
    inputs = tuple(v.index if type(v) is Record and v.tape is not None else -1 for v in items)
    data = be.asarray(values.reshape(shape), dtype)

    def vjp(g: Any) -> tuple[Any, ...]:
        return tuple(np.asarray(be.to_numpy(g), dtype=np.float64).reshape(-1).tolist())

    def graph(tape_: Any, index: int, g: Any) -> tuple[Any, ...]:
        flat = g.reshape(-1)
        return tuple(flat[k] if i >= 0 else None for k, i in enumerate(inputs))
    return record(cls, "from_scalars", be, data, shape, dtype, tape, inputs, vjp, graph)


# ---- where ----

def where(condition: Any, a: Any, b: Any) -> Any:
    first = next(v for v in (condition, a, b) if isinstance(v, TensorBase))
    be, cls = first._backend, type(first)
    if isinstance(condition, TensorBase):
        C = _tensor_operand(condition, be)
    else:
        c = np.asarray(condition)
        C = _tensor_operand(c.astype(bool) if c.dtype != bool else c, be)
    A, B = _tensor_operand(a, be), _tensor_operand(b, be)
    shape = shapes.broadcast("where", C.shape, A.shape, B.shape)
    dtype = result_dtype([A, B])
    tape = common_tape("where", [A, B])
    (out,) = be.map("where", ("choose(c, x, y)",), {"c": C.data, "x": A.data, "y": B.data},
                    shape, (dtype,))
    if tape is None or not (A.needs_adjoint or B.needs_adjoint):
        return wrap(cls, be, out, shape, dtype)
    cond, needs, targets = C.data, (A.needs_adjoint, B.needs_adjoint), (A.shape, B.shape)
    scalars = (A.dtype is None, B.dtype is None)
    exprs = ("choose(c, g, 0.0)", "choose(c, 0.0, g)")

    def vjp(g: Any) -> tuple[Any, ...]:
        chosen = tuple(e for e, need in zip(exprs, needs) if need)
        outs = iter(be.map("where_vjp", chosen, {"c": cond, "g": g}, shape,
                           (dtype,) * len(chosen)))
        return tuple(fold(be, next(outs), shape, target, scalar) if need else None
                     for need, target, scalar in zip(needs, targets, scalars))
    c_shape = C.shape

    def graph(tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        c = wrap(cls, be, cond, c_shape, BOOL)
        zero = _graph.zeros(cls, be, (), dtype)
        chosen = (where(c, g, zero), where(c, zero, g))
        return tuple(_graph.fold(v, shape, target, scalar) if need else None
                     for v, need, target, scalar in zip(chosen, needs, targets, scalars))
    return record(cls, "where", be, out, shape, dtype, tape, (A.index, B.index), vjp, graph)
