"""The structural tensor operations' entry points: sum, mean, max, min, reshape,
transpose, indexing, matmul, where, stack and from_scalars.

All but mean (sum times a constant), stack (concatenate, on operands given a new axis)
and from_scalars are ops of the op table (``easyad.ops``, its ``_structural`` module: the
shape rule, vjp, jvp, batching rule and lowerings, each said once). This module keeps
what sits in front of the table and below it:

- the fast paths for the common cases on the numpy device (a live float tensor, the
  simplest arguments), after the compiled core's own (``_engine/structural.pxi``:
  ``Tensor.sum`` is ``_core.tensor_sum``, and so on, which comes here through the
  services registered at the end). They make the same steps as the table's and give the
  same bits (tests/test_tensor_structural_fast.py, tests/test_structural_core.py);
- everything else goes to the table through ``TABLE_OPS`` (``easyad.ops`` sits above
  this layer and fills it when imported: no import goes upward);
- the core's step classes' methods not worth C (other devices' vjps), their graphs,
  which call the table's vjps, and the helpers the table's lowerings call here
  (``permute``, ``as_batched``, ``extreme_share``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _core
from easyad._core import (ExtremeStep, KeySliceStep, MatmulStep, Record, ReshapeStep, SumStep,
                          TransposeStep)
from easyad._levels import BatchedBase
from easyad.errors import TapeMismatchError
from easyad.tensor import _blas, _graph
from easyad.tensor import _shapes as shapes
from easyad.tensor._base import (FLOAT32, FLOAT64, Node, T, TensorBase, fold, record, wrap)
from easyad.tensor._meta import ShapeDtype
from easyad.tensor._numpy import _ERRSTATE, _IGNORE, NumpyBackend
from easyad.tensor._steps import Step
from easyad.tensor._table_steps import (TABLE_OPS, PutStep, SliceStep, TakeStep,  # noqa: F401
                                        WhereStep, _buffer, put)

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend
    from easyad.tensor._numpy import NumpyBackend


# ---- fast paths: the numpy backend, a float tensor, the common arguments ----
#
# Each operation below first tries a fast path for the common case (``_fast``: a live
# float tensor on the numpy backend, checked by type, so the other backends (OpenCL,
# eval_shape's meta, ad.record's program backend) always take the general path) with
# its arguments in the simplest form (an int axis, ints and slices as the index, ...).
# Anything else, and every error, goes the general way, which raises as before. The fast
# path runs the same numpy kernels on the same operands, so its results equal the general
# path's bit for bit (tests/test_tensor_structural_fast.py).

def _fast(t: Any) -> bool:
    """Whether ``t`` is a live float tensor on the numpy backend."""
    dtype = t._dtype
    if type(t._backend) is not NumpyBackend or (dtype is not FLOAT64 and dtype is not FLOAT32):
        return False
    tape = t._tape
    return tape is None or tape.generation == t._generation


def _quiet(f: Any, *args: Any) -> Any:
    """``f(*args)`` under numpy's "ignore" error state (as the backend's kernels run)."""
    if _ERRSTATE is None:   # pragma: no cover (numpy < 2)
        with np.errstate(all="ignore"):
            return f(*args)
    token = _ERRSTATE.set(_IGNORE)
    try:
        return f(*args)
    finally:
        _ERRSTATE.reset(token)


def _scalar_result(t: Any, label: str, number: float, step: Step) -> Any:
    """record_scalar for the numpy backend: a scalar Record, or the float."""
    tape, index = t._tape, t._index
    if tape is None or index < 0:
        return number
    return tape._push_node(Node(label, (index,), step, scalar_output=True, graph=step.graph),
                           number)


_REDUCE_SHAPES: dict[tuple[Any, ...], Any] = {}


def _reduce_shapes(shape: tuple[int, ...], axis: Any, keepdims: bool) -> Any:
    """(axes, kept, out_shape) of reducing ``shape`` over ``axis`` (None or an int in
    range), cached per shape; None for other axes (the general path)."""
    key = (shape, axis, keepdims)
    found = _REDUCE_SHAPES.get(key)
    if found is None:
        ndim = len(shape)
        if axis is None:
            axes: tuple[int, ...] = tuple(range(ndim))
        elif -ndim <= axis < ndim:
            axes = (axis % ndim,)
        else:
            return None
        found = (axes, shapes.reduce(shape, axes, True), shapes.reduce(shape, axes, keepdims))
        if len(_REDUCE_SHAPES) > 4096:
            _REDUCE_SHAPES.clear()
        _REDUCE_SHAPES[key] = found
    return found


def _fast_reduction(t: Any, axis: Any, keepdims: Any) -> Any:
    if (axis is None or type(axis) is int) and type(keepdims) is bool and _fast(t):
        return _reduce_shapes(t._shape, axis, keepdims)
    return None


def _own(be: Backend, raw: Any) -> Any:
    # only the numpy fast paths call it (after `_fast` or a type test): the narrowing is
    # theirs; an annotation, not a cast, so the eager path pays nothing for it
    host: NumpyBackend = be  # type: ignore[assignment]
    if host.tracking:
        host._track(raw)
    return raw


# ---- reductions ----

# SumStep (the core's): its vjp off the numpy device, and its graph

def _kept(step: Any, g: Any) -> Any:
    return g if isinstance(g, float) else step.be.reshape(g, step.kept)


def _sum_vjp(step: SumStep, g: Any) -> tuple[Any]:
    be = step.be
    if type(be) is NumpyBackend:    # what map's "broadcast" kernel makes, directly
        out = np.empty(step.shape, dtype=step.dtype)
        out[...] = _kept(step, g)
        return (_own(be, out),)
    return tuple(be.map("broadcast", ("g",), {"g": _kept(step, g)}, step.shape, (step.dtype,)))


def _sum_graph(step: Any, tape: Any, index: int, g: Any) -> tuple[Any]:
    # the table's vjp (easyad.ops' sum), on the adjoint made a tensor
    g = _graph.as_tensor(g, step.cls, step.be, step.dtype)
    axes = tuple(d for d, (k, n) in enumerate(zip(step.kept, step.shape)) if k != n)
    return (TABLE_OPS["sum_vjp"](g, axes, ShapeDtype(step.shape, step.dtype),
                                 ShapeDtype(step.kept, step.dtype)),)


def reduce_sum(t: TensorBase, axis: Any = None, keepdims: bool = False) -> Any:
    found = _fast_reduction(t, axis, keepdims)
    if found is not None:
        axes, kept, out_shape = found
        be = t._backend
        raw = _quiet(np.add.reduce, t._data, axes)
        step = SumStep(type(t), be, kept, t._shape, t._dtype)
        if out_shape == ():
            return _scalar_result(t, "sum", float(raw), step)
        raw = _own(be, np.ascontiguousarray(raw))
        return record(type(t), "sum", be, raw.reshape(out_shape) if keepdims else raw,
                      out_shape, t._dtype, t._tape, (t._index,), step, step.graph)
    return TABLE_OPS["sum"](t, axis, keepdims)      # the op table's sum


def mean(t: TensorBase, axis: Any = None, keepdims: bool = False) -> Any:
    found = _fast_reduction(t, axis, keepdims)
    if found is not None:
        shape = t._shape
        count = math.prod(shape[a] for a in found[0])
        return reduce_sum(t, axis, keepdims) * (1.0 / count if count else math.nan)
    axes = shapes.normalize_axes("mean", axis, t.ndim)
    count = math.prod(t._shape[a] for a in axes)
    return reduce_sum(t, axis, keepdims) * (1.0 / count if count else math.nan)


# ExtremeStep (the core's: max's or min's vjp, the adjoint to the operand's elements ``x``
# equal to the result ``m``, split evenly among ties): its vjp and graph

def _ties(be: Backend, x: Any, m: Any, axes: tuple[int, ...], kept: tuple[int, ...],
          shape: tuple[int, ...], dtype: Any) -> Any:
    """How many elements of ``x`` equal the result ``m``, per result (shape ``kept``)."""
    (ties,) = be.map("ties", ("choose(x == m, 1.0, 0.0)",), {"x": x, "m": m}, shape, (dtype,))
    return be.reshape(be.reduce("sum", ties, axes), kept)


def extreme_share(be: Backend, x: Any, m: Any, axes: tuple[int, ...], kept: tuple[int, ...],
                  shape: tuple[int, ...], dtype: Any) -> Any:
    """Each element's share of a max's or min's adjoint: 1/ties where ``x`` equals the
    result ``m`` (of shape ``kept``), else 0 (a buffer; the table's vjp reads it)."""
    n = _ties(be, x, m, axes, kept, shape, dtype)
    (share,) = be.map("share", ("choose(x == m, 1.0 / n, 0.0)",), {"x": x, "m": m, "n": n},
                      shape, (dtype,))
    return share


def _extreme_vjp(step: ExtremeStep, g: Any) -> tuple[Any]:
    n = _ties(step.be, step.x, step.m, step.axes, step.kept, step.shape, step.dtype)
    return tuple(step.be.map("share", ("choose(x == m, g / n, 0.0)",),
                             {"x": step.x, "m": step.m, "g": _kept(step, g), "n": n},
                             step.shape, (step.dtype,)))


def _extreme_graph(step: ExtremeStep, tape: Any, index: int, g: Any) -> tuple[Any]:
    # the table's vjp (easyad.ops' max and min), on the values as constants (it reads them)
    cls, be, dtype = step.cls, step.be, step.dtype
    g = _graph.as_tensor(g, cls, be, dtype)
    return (TABLE_OPS["extreme_vjp"](g, step.axes, wrap(cls, be, step.x, step.shape, dtype),
                                     wrap(cls, be, step.m, step.kept, dtype)),)


def reduce_extreme(op: str, t: TensorBase, axis: Any = None, keepdims: bool = False) -> Any:
    """max or min; the adjoint goes to the elements equal to the result, split evenly."""
    found = _fast_reduction(t, axis, keepdims)
    if found is not None and t._data.size:
        axes, kept, out_shape = found
        be, x = t._backend, t._data
        raw = _quiet(np.maximum.reduce if op == "max" else np.minimum.reduce, x, axes)
        raw = _own(be, np.ascontiguousarray(raw))
        step = ExtremeStep(type(t), be, kept, t._shape, t._dtype, x, raw.reshape(kept), axes)
        if out_shape == ():
            return _scalar_result(t, op, float(raw.reshape(())), step)
        return record(type(t), op, be, raw.reshape(out_shape) if keepdims else raw,
                      out_shape, t._dtype, t._tape, (t._index,), step, step.graph)
    return TABLE_OPS[op](t, axis, keepdims)      # the op table's max or min


# ---- reshape, transpose ----

# ReshapeStep: the core's (the adjoint in the operand's shape ``old``)

_RESHAPES: dict[tuple[Any, ...], tuple[int, ...]] = {}


def _ints(items: tuple[Any, ...]) -> bool:
    for n in items:
        if type(n) is not int:
            return False
    return True


def reshape(t: T, new: Any) -> T:
    if _fast(t) and (type(new) is int or type(new) is tuple and _ints(new)):
        shape = t._shape
        key = (shape, new)
        new_shape = _RESHAPES.get(key)
        if new_shape is None:
            new_shape = shapes.reshape(shape, new)      # raises for a bad target
            if len(_RESHAPES) > 4096:
                _RESHAPES.clear()
            _RESHAPES[key] = new_shape
        step = ReshapeStep(t._backend, shape)
        return record(type(t), "reshape", t._backend, t._data.reshape(new_shape), new_shape,
                      t._dtype, t._tape, (t._index,), step, step.graph)
    return TABLE_OPS["reshape"](t, new)          # the op table's reshape


def permute(be: Backend, data: Any, shape: tuple[int, ...], perm: tuple[int, ...]) -> Any:
    """``data`` (of ``shape``) with its axes permuted by ``perm``: one strided copy."""
    strides = shapes.contiguous_strides(shape)
    return be.strided(data, 0, tuple(shape[p] for p in perm), tuple(strides[p] for p in perm))


def _transpose_vjp(step: TransposeStep, g: Any) -> tuple[Any]:
    """TransposeStep's (the core's) vjp where it does not run in C: the adjoint (of shape
    ``out_shape``) permuted back by ``inverse``."""
    be = step.be
    if type(be) is NumpyBackend:    # strided's contiguous copy of the permuted view
        return (_own(be, g.reshape(step.out_shape).transpose(step.inverse).copy()),)
    return (permute(be, g, step.out_shape, step.inverse),)


_SWAP = (1, 0)


def transpose(t: T, axes: Any) -> T:
    if len(t._shape) == 2 and (axes == () or axes == _SWAP and _ints(axes)) and _fast(t):
        be, (r, c) = t._backend, t._shape
        step = TransposeStep(be, (c, r), _SWAP)
        return record(type(t), "transpose", be, _own(be, t._data.T.copy()), (c, r), t._dtype,
                      t._tape, (t._index,), step, step.graph)
    perm = shapes.transpose(t._shape, axes)
    if perm == tuple(range(len(perm))):
        return t
    return TABLE_OPS["transpose"](t, perm)       # the op table's transpose


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


# the numpy backend's step for an index of ints and slices (``_simple_key``) is the core's
# KeySliceStep: the adjoint written into zeros at ``key`` by numpy's own basic indexing
# (the same elements as SliceStep's assemble at the index's offset and strides)
_KeySliceStep = KeySliceStep


def _index_graph(step: Any, tape: Any, index: int, g: Any) -> tuple[Any]:
    return (put(_graph.as_tensor(g, step.cls, step.be, step.dtype), step.shape, step.key),)


def _simple_key(shape: tuple[int, ...], key: Any) -> int:
    """For an index of ints in range and slices of ints (no more items than axes): how
    many ints it has; -1 for anything else (the general path)."""
    items = key if type(key) is tuple else (key,)
    if len(items) > len(shape):
        return -1
    ints = 0
    for item, n in zip(items, shape):
        if type(item) is int:
            if not -n <= item < n:
                return -1
            ints += 1
        elif type(item) is slice:
            start, stop, step = item.start, item.stop, item.step
            if not ((start is None or type(start) is int) and (stop is None or type(stop) is int)
                    and (step is None or type(step) is int and step != 0)):
                return -1
        else:
            return -1
    return ints


def getitem(t: TensorBase, key: Any) -> Any:
    if _fast(t):
        shape = t._shape
        ints = _simple_key(shape, key)
        if ints >= 0:
            be, data = t._backend, t._data
            step = _KeySliceStep(type(t), be, shape, t._dtype, key)
            if ints == len(shape):
                return _scalar_result(t, "getitem", float(data[key]), step)
            view = data[key]
            out = _own(be, view.copy())
            return record(type(t), "getitem", be, out, out.shape, t._dtype, t._tape,
                          (t._index,), step, step.graph)
        key = _index_key(key)
        if shapes.basic_index(shape, key) is None:
            # an integer-array take: the table's composite and step (TakeStep), called
            # directly (the table's call costs a few microseconds more than the take)
            be, index = t._backend, shapes.advanced_index(shape, key)
            out = be.reshape(be.take(t._data, index.reshape(-1)), index.shape)
            step = TakeStep(type(t), be, shape, t._dtype, key, index,
                            np.unique(index).size == index.size)
            if index.shape == ():
                return _scalar_result(t, "getitem", float(out), step)
            return record(type(t), "getitem", be, out, index.shape, t._dtype, t._tape,
                          (t._index,), step, step.graph)
        return TABLE_OPS["getitem"](t, key)      # the op table's getitem
    return TABLE_OPS["getitem"](t, _index_key(key))


# ---- matmul ----

def as_batched(be: Backend, data: Any, shape: tuple[int, ...], batch: tuple[int, ...]) -> Any:
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


# MatmulStep is the core's (two matmuls, batched over ``batch`` and folded back to the
# operands' shapes; see its docstring), which runs the numpy device's unbatched vjp in C:
# its vjp everywhere else, and its graph

def _matmul_vjp(step: MatmulStep, g: Any) -> tuple[Any, Any]:
    be, batch, a2, b2, (m, k, n) = step.be, step.batch, step.a2, step.b2, step.mkn
    (_, a_full, _, a_entry), (_, b_full, _, b_entry) = step.parts
    g3 = be.reshape(_buffer(be, g, step.dtype), (math.prod(batch), m, n))
    ga = gb = None
    if a_entry >= 0:
        ga = be.matmul(g3, step.keep_b, transpose_b=True)                 # (nb, m, k)
        ga = fold(be, be.reshape(ga, batch + (m, k)), batch + (m, k), a2)
        ga = be.reshape(ga, a_full)
    if b_entry >= 0:
        # aᵀ g with aᵀ a BLAS flag, not a copy (attention's (256, 128, 128) scores: a
        # 17 MB copy, ~10 ms a step; the same floats from OpenBLAS)
        gb = be.matmul(step.keep_a, g3, transpose_a=True)                 # (nb, k, n)
        gb = fold(be, be.reshape(gb, batch + (k, n)), batch + (k, n), b2)
        gb = be.reshape(gb, b_full)
    return ga, gb


def _matmul_graph(step: MatmulStep, tape: Any, index: int, g: Any) -> tuple[Any, Any]:
    # the table's vjp (easyad.ops' matmul) on the operands' recorded tensors
    cls, be, dtype = step.cls, step.be, step.dtype
    (_, _, _, a_entry), (_, _, _, b_entry) = step.parts
    a, b = (_graph.handle(cls, be, d, s, dtype, tape, i) if dt is not None
            else _graph.as_tensor(_graph.handle(cls, be, d, s, None, tape, i), cls, be, dtype)
            for d, s, dt, i in step.parts)
    g = _graph.as_tensor(g, cls, be, dtype)
    return TABLE_OPS["matmul_vjp"](g, a, b, (a_entry >= 0, b_entry >= 0))


_MATMUL_SHAPES: dict[tuple[Any, ...], Any] = {}


def _matmul_shapes(sa: tuple[int, ...], sb: tuple[int, ...]) -> Any:
    """What the general path works out for (m, k) @ (k, n), (m, k) @ (k,), (k,) @ (k, n),
    (k,) @ (k,) and (B, m, k) @ (B, k, n): (out_shape, batch, a2, b2, mkn, a3, b3),
    cached per pair of shapes; None for other shapes (and for a mismatch: the general path
    raises)."""
    key = (sa, sb)
    found = _MATMUL_SHAPES.get(key)
    if found is None:
        na, nb = len(sa), len(sb)
        if not (0 < na <= 2 and 0 < nb <= 2 or na == nb == 3 and sa[0] == sb[0]):
            return None
        a2 = (1,) + sa if na == 1 else sa
        b2 = sb + (1,) if nb == 1 else sb
        if a2[-1] != b2[-2]:
            return None
        batch = a2[:-2]
        (m, k), n = a2[-2:], b2[-1]
        first = math.prod(batch) if math.prod(batch) != 1 else 1
        found = (shapes.matmul(sa, sb), batch, a2, b2, (m, k, n), (first, m, k), (first, k, n))
        if len(_MATMUL_SHAPES) > 4096:
            _MATMUL_SHAPES.clear()
        _MATMUL_SHAPES[key] = found
    return found


def _fast_matmul(a: Any, b: Any) -> Any:
    """matmul of two live float tensors on one numpy backend, of one dtype and list, of
    the shapes ``_matmul_shapes`` takes: np.matmul of the buffers as they are (the same
    core loop, on the same numbers, as the general path's batched (1|B, m, k) operands);
    None for anything else."""
    be = a._backend
    if (b._backend is not be or b._dtype is not a._dtype or not _fast(a) or not _fast(b)):
        return None
    tape, tb = a._tape, b._tape
    if tape is None:
        tape = tb
    elif tb is not None and tb is not tape:
        return None
    found = _matmul_shapes(a._shape, b._shape)
    if found is None:
        return None
    out_shape, batch, a2, b2, mkn, a3, b3 = found
    cls, dtype, ia, ib = type(a), a._dtype, a._index, b._index
    adata, bdata = a._data, b._data
    result = _blas.matmul(adata, bdata)
    if (tape is None or ia < 0 and ib < 0) and out_shape:
        return wrap(cls, be, _own(be, np.ascontiguousarray(result)), out_shape, dtype)
    step = MatmulStep(cls, be, dtype, batch, a2, b2, mkn, a3,
                      adata.reshape(a3) if ib >= 0 else None,
                      bdata.reshape(b3) if ia >= 0 else None,
                      ((adata, a._shape, dtype, ia), (bdata, b._shape, dtype, ib)))
    if out_shape == ():
        number = float(result)
        if tape is None or ia < 0 and ib < 0:
            return number
        return tape._push_node(Node("matmul", (ia, ib), step, scalar_output=True,
                                    graph=step.graph), number)
    return record(cls, "matmul", be, _own(be, np.ascontiguousarray(result)), out_shape, dtype,
                  tape, (ia, ib), step, step.graph)


def matmul(a: Any, b: Any) -> Any:
    if isinstance(a, TensorBase) and isinstance(b, TensorBase):
        out = _fast_matmul(a, b)
        if out is not None:
            return out
    if type(a).__name__ == "TraceTensor" or type(b).__name__ == "TraceTensor":
        return NotImplemented               # forward mode: TraceTensor's own
    return TABLE_OPS["matmul"](a, b)         # the op table's matmul


# ---- joins ----

def stack(tensors: Any, axis: int = 0) -> Any:
    tensors = list(tensors)
    first = next((t for t in tensors if isinstance(t, TensorBase)), None)
    if first is None:
        raise TypeError("stack: needs at least one Tensor")
    cls, device = type(first), first._backend.device
    items = [t if isinstance(t, TensorBase) else cls.constant(np.asarray(t), device)
             for t in tensors]
    ax = shapes.stack([t.shape for t in items], axis)
    return TABLE_OPS["concatenate"]([reshape(t, t.shape[:ax] + (1,) + t.shape[ax:])
                                     for t in items], ax)


# ---- scalars into a tensor ----

class FromScalarsStep(Step):
    """from_scalars' vjp: each scalar its element of the adjoint (a float; in the graph a
    Record, None for the constants: ``inputs`` < 0)."""

    __slots__ = ("be", "inputs")

    def __init__(self, be: Backend, inputs: tuple[int, ...]) -> None:
        self.be, self.inputs = be, inputs

    def __call__(self, g: Any) -> tuple[Any, ...]:
        return tuple(np.asarray(self.be.to_numpy(g), dtype=np.float64).reshape(-1).tolist())

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        flat = g.reshape(-1)
        return tuple(flat[k] if i >= 0 else None for k, i in enumerate(self.inputs))


def from_scalars(cls: type[T], be: Backend, dtype: Any, items: list[Any],
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
    step = FromScalarsStep(be, inputs)
    return record(cls, "from_scalars", be, data, shape, dtype, tape, inputs, step, step.graph)


# ---- where (the op table's: its call's condition made ready) ----

def where(condition: Any, a: Any, b: Any) -> Any:
    for v in (condition, a, b):       # inside ad.vmap: the batched select
        if isinstance(v, BatchedBase):
            return type(v)._where(condition, a, b)  # type: ignore[attr-defined]
    if not isinstance(condition, TensorBase):
        c = np.asarray(condition)
        condition = c.astype(bool) if c.dtype != bool else c
    return TABLE_OPS["where"](condition, a, b)      # the op table's where


# the compiled core's fast paths (_engine/structural.pxi) come here for everything else
_core._register_structural(NumpyBackend, _blas.matmul, _blas._SMALLEST)
for _name, _function in {
        "sum": reduce_sum, "mean": mean, "extreme": reduce_extreme, "reshape": reshape,
        "transpose": transpose, "getitem": getitem, "matmul": matmul,
        "sum_vjp": _sum_vjp, "sum_graph": _sum_graph, "extreme_vjp": _extreme_vjp,
        "extreme_graph": _extreme_graph, "transpose_vjp": _transpose_vjp,
        "index_graph": _index_graph, "matmul_vjp": _matmul_vjp,
        "matmul_graph": _matmul_graph}.items():
    _core._register_service("structural." + _name, _function)
