"""The older structural ops, moved into the table: reshape, transpose, sum, max, min and
where, getitem (and put, its adjoint) and matmul.

Each is one registration. Their composites are the primitives the tensor layer always
called (``reshape``, ``strided``, ``reduce``), and they run on the numpy device too
(``composite_first``), so eager results, recorded programs and what those fuse into are
what they were. The common cases on the numpy device never get here: the compiled core's
fast paths (``_engine/structural.pxi``) and ``tensor._structural``'s run first and make
the same steps as the ``step`` fields below (the core's step classes: the sweep's vjp on
buffers, in C on the numpy device); those steps' ``graph`` (create_graph) is the table's
``vjp``, reached through ``tensor._structural``'s services.

- ``reshape``: linear; a 0-d result stays a tensor. Batching: the batch axis first only.
- ``transpose``: linear; the axes a permutation (the rule makes ``None`` the reversal).
- ``sum``: linear; its vjp broadcasts the adjoint back.
- ``max``/``min``: the adjoint goes to the elements equal to the result, split evenly
  among ties (docs/tensors.md); the jvp is the mean of the tied elements' tangents.
- ``where(c, a, b)``: ``a`` where the condition holds, else ``b``, broadcast; linear in
  ``a`` and ``b`` (the condition is a constant). Its operands keep their dtypes
  (``casts=False``): a bool condition, and numbers or scalar Records as literals of its
  one map, as before.
- ``getitem``: a basic index (ints, slices, None, Ellipsis: one strided copy) or an
  advanced one (integer arrays, masks: a take of the flat elements); its vjp is ``put``
  (the adjoint written into zeros, repeated elements adding up), whose vjp is getitem.
- ``matmul``: numpy's, batched and broadcast; its vjp is two matmuls folded back to the
  operands' shapes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad._core import ExtremeStep, MatmulStep, ReshapeStep, SumStep, TransposeStep
from easyad.ops._apply import _tensors, apply
from easyad.ops._builtin import _shifted
from easyad.ops._table import Op, get, register
from easyad.tensor import _graph, _structural
from easyad.tensor._table_steps import PutStep, SliceStep, TakeStep, WhereStep
from easyad.tensor import _shapes as shapes
from easyad.tensor._base import BOOL, wrap

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


def _same_dtype(p: Any, dtype: Any) -> Any:
    return dtype           # reshape and transpose keep bools bools


# ---- reshape ----

@dataclasses.dataclass(frozen=True)
class ReshapeParams:
    shape: tuple[int, ...]           # may hold one -1 (the rule works it out)


def _reshape_rule(p: ReshapeParams, shape: tuple[int, ...]
                  ) -> tuple[tuple[int, ...], ReshapeParams]:
    new = shapes.reshape(shape, p.shape)
    return new, ReshapeParams(new)


def _reshape_batch(p: ReshapeParams, b: int) -> tuple[ReshapeParams, int]:
    if b != 0:
        raise NotImplementedError("reshape's batching rule takes the batch axis first "
                                  "(batch_axis=0): move it there first")
    return ReshapeParams((-1,) + p.shape), 0


RESHAPE: Op = register(Op(
    name="reshape", params=ReshapeParams, rule=_reshape_rule,
    numpy=lambda p, x: np.reshape(x, p.shape),
    vjp=lambda p, g, x, out: (g.reshape(x.shape),),
    batch=_reshape_batch, dtype=_same_dtype,
    composite=lambda be, p, buf: be.reshape(buf, p.shape), composite_first=True,
    step=lambda p, cls, be, ops, bufs, out, shape, dtype: ReshapeStep(be, ops[0].shape),
    linear=True, objects=True, numbers=False, doc="the elements in a new shape"))


# ---- transpose ----

@dataclasses.dataclass(frozen=True)
class TransposeParams:
    axes: tuple[int, ...] | None = None      # None: the axes reversed


_PERMUTED: dict[tuple[Any, ...], Any] = {}     # the rule's answers, per call signature


def _transpose_rule(p: TransposeParams, shape: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], TransposeParams]:
    key = (shape, p.axes)
    found = _PERMUTED.get(key)
    if found is None:
        perm = shapes.transpose(shape, p.axes)
        found = (tuple(shape[a] for a in perm), TransposeParams(perm))
        if len(_PERMUTED) > 4096:
            _PERMUTED.clear()
        _PERMUTED[key] = found
    return found      # type: ignore[no-any-return]


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for k, a in enumerate(perm):
        inverse[a] = k
    return tuple(inverse)


def _transpose_batch(p: TransposeParams, b: int) -> tuple[TransposeParams, int]:
    perm = [_shifted(a, b) for a in p.axes or ()]
    perm.insert(b, b)              # the batch axis stays where it is
    return TransposeParams(tuple(perm)), b


TRANSPOSE: Op = register(Op(
    name="transpose", params=TransposeParams, rule=_transpose_rule,
    numpy=lambda p, x: np.transpose(x, p.axes),
    vjp=lambda p, g, x, out: (g.transpose(_inverse(p.axes)),),
    batch=_transpose_batch, dtype=_same_dtype,
    composite=lambda be, p, buf: _structural.permute(be, buf, tuple(buf.shape), p.axes),
    composite_first=True,
    step=lambda p, cls, be, ops, bufs, out, shape, dtype: TransposeStep(be, shape,
                                                                  _inverse(p.axes)),
    linear=True, objects=True, numbers=False, doc="the axes permuted"))


# ---- reductions: sum, max, min ----

@dataclasses.dataclass(frozen=True)
class ReduceParams:
    axes: tuple[int, ...] | None = None      # None: every axis
    keepdims: bool = False


_REDUCED: dict[tuple[Any, ...], Any] = {}      # the rule's answers, per call signature


def _reduce_rule(name: str) -> Any:
    def rule(p: ReduceParams, shape: tuple[int, ...]) -> tuple[tuple[int, ...], ReduceParams]:
        key = (name, shape, p.axes, p.keepdims)
        found = _REDUCED.get(key)
        if found is None:
            axes = shapes.normalize_axes(name, p.axes, len(shape))
            if name != "sum" and 0 in shape:
                raise ValueError(f"{name} of an empty tensor (shape {shape}) has no value")
            found = (shapes.reduce(shape, axes, p.keepdims), ReduceParams(axes, p.keepdims))
            if len(_REDUCED) > 4096:
                _REDUCED.clear()
            _REDUCED[key] = found
        return found      # type: ignore[no-any-return]
    return rule


def _canonical_axes(p: ReduceParams) -> tuple[int, ...]:
    """The axes of canonical params (the shape rule names every axis where None was)."""
    if p.axes is None:
        raise AssertionError("a reduction's lowering got params its shape rule did not "
                             "make canonical")
    return p.axes


def _reduce_batch(p: ReduceParams, b: int) -> tuple[ReduceParams, int]:
    axes = p.axes or ()
    out = b if p.keepdims else b - sum(1 for a in axes if a < b)
    return ReduceParams(tuple(_shifted(a, b) for a in axes), p.keepdims), out


def _reduce_composite(kind: str) -> Any:
    rule = _reduce_rule(kind)

    def composite(be: Backend, p: ReduceParams, buf: Any) -> Any:
        raw = be.reduce(kind, buf, _canonical_axes(p))
        shape = rule(p, tuple(buf.shape))[0]
        return raw if shape == () else be.reshape(raw, shape)
    return composite


_KEPT: dict[tuple[Any, ...], tuple[int, ...]] = {}


def _kept(p: ReduceParams, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` reduced over the axes with them kept (1), per signature."""
    key = (shape, p.axes)
    found = _KEPT.get(key)
    if found is None:
        found = shapes.reduce(shape, p.axes or (), True)
        if len(_KEPT) > 4096:
            _KEPT.clear()
        _KEPT[key] = found
    return found


def _sum_vjp(p: ReduceParams, g: Any, x: Any, out: Any) -> tuple[Any]:
    # (g may be vmap's batched value: a recorded sweep with a batched seed)
    return (_graph.broadcast(g, _kept(p, x.shape), x.shape, type(g),
                             getattr(g, "_backend", None), x.dtype),)


SUM: Op = register(Op(
    name="sum", params=ReduceParams, rule=_reduce_rule("sum"),
    numpy=lambda p, x: np.add.reduce(x, axis=p.axes, keepdims=p.keepdims),
    vjp=_sum_vjp, batch=_reduce_batch,
    composite=_reduce_composite("sum"), composite_first=True,
    step=lambda p, cls, be, ops, bufs, out, shape, dtype: SumStep(
        cls, be, _kept(p, ops[0].shape), ops[0].shape, dtype),
    linear=True, objects=True, doc="sums along axes"))


def _extreme_vjp(p: ReduceParams, g: Any, x: Any, out: Any) -> tuple[Any]:
    # each element's share of the adjoint (1/ties where it equals the result, else 0) is
    # piecewise constant: a constant factor of the broadcast adjoint
    # (x's backend: g may be vmap's batched value, a recorded sweep's batched seed)
    cls = type(g) if hasattr(g, "_backend") else type(x)
    be, dtype = x._backend, x.dtype
    kept = _kept(p, x.shape)
    m = out._data if hasattr(out, "_data") else be.full((), float(out), dtype)
    if tuple(m.shape) != kept:
        m = be.reshape(m, kept)
    share = _structural.extreme_share(be, x._data, m, _canonical_axes(p), kept, x.shape, dtype)
    spread = _graph.broadcast(g, kept, x.shape, cls, be, dtype)
    return (spread * wrap(cls, be, share, x.shape, dtype),)


def _extreme_jvp(name: str) -> Any:
    def jvp(p: ReduceParams, tangents: tuple[Any], x: Any, out: Any) -> Any:
        # the mean of the tangents of the elements equal to the result (the comparisons
        # are of values: constant masks)
        (dx,) = tangents
        if hasattr(out, "reshape"):
            m = out.reshape(_kept(p, x.shape))
        else:       # a number, or a Trace (forward over forward): the result kept as a tensor
            m = apply(get(name), ReduceParams(p.axes, True), (x,))
        mask = _graph.where(x == m, 1.0, 0.0)
        return (dx * mask).sum(axis=p.axes, keepdims=p.keepdims) / \
            mask.sum(axis=p.axes, keepdims=p.keepdims)
    return jvp


def _extreme_step(p: ReduceParams, cls: type, be: Backend, ops: Any, bufs: Any, out: Any,
                  shape: tuple[int, ...], dtype: Any) -> Any:
    kept = _kept(p, ops[0].shape)
    return ExtremeStep(cls, be, kept, ops[0].shape, dtype, bufs[0], be.reshape(out, kept),
                       _canonical_axes(p))


def _register_extreme(name: str, ufunc: Any) -> Op:
    return register(Op(
        name=name, params=ReduceParams, rule=_reduce_rule(name),
        numpy=lambda p, x: ufunc.reduce(x, axis=p.axes, keepdims=p.keepdims),
        vjp=_extreme_vjp, jvp=_extreme_jvp(name), batch=_reduce_batch,
        composite=_reduce_composite(name), composite_first=True, step=_extreme_step,
        doc=f"{name}ima along axes (the adjoint split among ties)"))


MAX: Op = _register_extreme("max", np.maximum)
MIN: Op = _register_extreme("min", np.minimum)


# ---- where ----

@dataclasses.dataclass(frozen=True)
class WhereParams:
    pass                     # none: the operands' shapes say everything


_WHERE_SHAPES: dict[tuple[Any, ...], tuple[int, ...]] = {}     # broadcasts, per signature


def _where_shape(c: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
                 ) -> tuple[int, ...]:
    key = (c, a, b)
    found = _WHERE_SHAPES.get(key)
    if found is None:
        found = shapes.broadcast("where", c, a, b)
        if len(_WHERE_SHAPES) > 4096:
            _WHERE_SHAPES.clear()
        _WHERE_SHAPES[key] = found
    return found


def _where_rule(p: WhereParams, c: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
                ) -> tuple[tuple[int, ...], WhereParams]:
    return _where_shape(c, a, b), p


def _where_dtype(p: WhereParams, c: Any, a: Any, b: Any) -> Any:
    # the values' common float dtype (numbers are weak; the condition has no say)
    if a is None or a is BOOL:
        a = b
    elif b is None or b is BOOL:
        b = a
    if a is b and a is not None and a is not BOOL:
        return a
    found = [d for d in (a, b) if d is not None and d != BOOL]
    return np.result_type(*found) if found else np.dtype(np.float64)


def _where_composite(be: Backend, p: WhereParams, c: Any, a: Any, b: Any) -> Any:
    shape = _where_shape(tuple(c.shape), tuple(a.shape) if hasattr(a, "shape") else (),
                         tuple(b.shape) if hasattr(b, "shape") else ())
    dtype = _where_dtype(p, None, getattr(a, "dtype", None), getattr(b, "dtype", None))
    return be.map("where", ("choose(c, x, y)",), {"c": c, "x": a, "y": b}, shape, (dtype,))[0]


def _number(v: Any) -> bool:
    return not hasattr(v, "shape")        # a float or a scalar Record


def _where_vjp(p: WhereParams, g: Any, c: Any, a: Any, b: Any, out: Any) -> tuple[Any, ...]:
    return _where_cotangents(g, c, (True, True), (np.shape(a), np.shape(b)),
                             (_number(a), _number(b)))


def _where_cotangents(g: Any, c: Any, needs: tuple[bool, bool], targets: tuple[Any, Any],
                      scalars: tuple[bool, bool]) -> tuple[Any, ...]:
    # the adjoint where c holds to a, elsewhere to b, each summed back to its shape
    cls, be, shape = type(c), c._backend, None
    dtype = g.dtype if hasattr(g, "dtype") else np.dtype(np.float64)
    g = _graph.as_tensor(g, cls, be, dtype)
    shape = g.shape
    zero = _graph.zeros(cls, be, (), g.dtype)
    chosen = (apply(WHERE, WhereParams(), (c, g, zero)) if needs[0] else None,
              apply(WHERE, WhereParams(), (c, zero, g)) if needs[1] else None)
    return (None,) + tuple(_graph.fold(v, shape, target, scalar) if v is not None else None
                           for v, target, scalar in zip(chosen, targets, scalars))


def _where_jvp(p: WhereParams, tangents: tuple[Any, ...], c: Any, a: Any, b: Any,
               out: Any) -> Any:
    return apply(WHERE, p, (c, tangents[1], tangents[2]))


def _where_step(p: WhereParams, cls: type, be: Backend, ops: Any, bufs: Any, out: Any,
                shape: tuple[int, ...], dtype: Any) -> Any:
    c, a, b = ops
    return WhereStep(cls, be, shape, dtype, c.data, c.shape, (a.index >= 0, b.index >= 0),
                     (a.shape, b.shape), (a.dtype is None, b.dtype is None))


WHERE: Op = register(Op(
    name="where", params=WhereParams, rule=_where_rule,
    numpy=lambda p, c, a, b: np.where(c, a, b),
    vjp=_where_vjp, jvp=_where_jvp, batch=lambda p, b: (p, b), dtype=_where_dtype,
    composite=_where_composite, composite_first=True, step=_where_step,
    objects=True, numbers=False, casts=False,
    doc="a where the condition holds, else b"))


# ---- getitem (basic indexing and integer-array takes) and put, its adjoint ----

@dataclasses.dataclass(frozen=True, eq=False)
class GetitemParams:
    key: Any                     # ints, slices, None, Ellipsis, integer or bool arrays
    basic: Any = None            # canonical: (offset, shape, strides) of a basic index
    index: Any = None            # canonical: the flat elements an advanced index takes


def _indexed(shape: tuple[int, ...], key: Any) -> tuple[Any, Any, tuple[int, ...]]:
    """(basic, index, the part's shape) of ``key`` on an operand of ``shape``."""
    basic = shapes.basic_index(shape, key)
    if basic is not None:
        return basic, None, basic[1]
    index = shapes.advanced_index(shape, key)
    return None, index, index.shape


def _getitem_rule(p: GetitemParams, shape: tuple[int, ...]
                  ) -> tuple[tuple[int, ...], GetitemParams]:
    basic, index, part = _indexed(shape, p.key)
    return part, GetitemParams(p.key, basic, index)


def _getitem_composite(be: Backend, p: GetitemParams, buf: Any) -> Any:
    if p.basic is not None:            # a strided view's copy: fuses in recorded programs
        offset, part, strides = p.basic
        return be.strided(buf, offset, part, strides)
    return be.reshape(be.take(buf, p.index.reshape(-1)), p.index.shape)


def _unique(index: Any) -> bool:
    return bool(np.unique(index).size == index.size)


def _getitem_step(p: GetitemParams, cls: type, be: Backend, ops: Any, bufs: Any, out: Any,
                  shape: tuple[int, ...], dtype: Any) -> Any:
    x = ops[0]
    if p.basic is not None:
        offset, part, strides = p.basic
        return SliceStep(cls, be, x.shape, dtype, p.key, offset, part, strides)
    return TakeStep(cls, be, x.shape, dtype, p.key, p.index, _unique(p.index))


def _getitem_batch(p: GetitemParams, b: int) -> tuple[GetitemParams, int]:
    if b != 0:
        raise NotImplementedError("getitem's batching rule takes the batch axis first "
                                  "(batch_axis=0): move it there first")
    key = p.key if isinstance(p.key, tuple) else (p.key,)
    return GetitemParams((slice(None),) + key), 0


GETITEM: Op = register(Op(
    name="getitem", params=GetitemParams, rule=_getitem_rule,
    numpy=lambda p, x: x[p.key],
    vjp=lambda p, g, x, out: (apply(PUT, PutParams(tuple(x.shape), p.key), (g,)),),
    batch=_getitem_batch, dtype=_same_dtype,
    composite=_getitem_composite, composite_first=True, step=_getitem_step,
    linear=True, objects=True, doc="the elements at an index (basic, or integer arrays)"))


@dataclasses.dataclass(frozen=True, eq=False)
class PutParams:
    shape: tuple[int, ...]       # the result's: zeros of it, the operand added at ``key``
    key: Any
    basic: Any = None            # canonical, as getitem's
    index: Any = None


def _put_rule(p: PutParams, shape: tuple[int, ...]) -> tuple[tuple[int, ...], PutParams]:
    basic, index, part = _indexed(p.shape, p.key)
    if tuple(shape) != part:
        raise ValueError(f"put: an operand of shape {shape} for the part {part} that index "
                         f"{p.key!r} picks of shape {p.shape}")
    return p.shape, PutParams(p.shape, p.key, basic, index)


def _put_composite(be: Backend, p: PutParams, g: Any) -> Any:
    if p.basic is not None:
        offset, part, strides = p.basic
        return be.assemble(p.shape, g.dtype, [(offset, part, strides, g)])
    return be.scatter_add(p.shape, g.dtype, p.index, g, _unique(p.index))


def _put_numpy(p: PutParams, g: Any) -> Any:
    out = np.zeros(p.shape, dtype=g.dtype)
    np.add.at(out, p.key, g)            # repeated indices add up
    return out


PUT: Op = register(Op(
    name="put", params=PutParams, rule=_put_rule, numpy=_put_numpy,
    vjp=lambda p, g, x, out: (apply(GETITEM, GetitemParams(p.key), (g,)),),
    dtype=_same_dtype, composite=_put_composite, composite_first=True,
    step=lambda p, cls, be, ops, bufs, out, shape, dtype: PutStep(
        be, p.key, p.basic, p.index, ops[0].shape),
    linear=True, objects=True, numbers=False,
    doc="zeros with the operand added at an index (getitem's adjoint)"))


# ---- matmul ----

@dataclasses.dataclass(frozen=True)
class MatmulParams:
    pass                     # none: the operands' shapes say everything


def _geometry(sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[Any, ...]:
    """(a2, b2, batch, (m, k, n)): the operands as matrices (a vector made one) and the
    broadcast batch of (m, k) @ (k, n)."""
    a2 = (1,) + sa if len(sa) == 1 else sa
    b2 = sb + (1,) if len(sb) == 1 else sb
    return a2, b2, shapes.broadcast("matmul", a2[:-2], b2[:-2]), (a2[-2], a2[-1], b2[-1])


def _batched(be: Backend, buf: Any, full: tuple[int, ...], batch: tuple[int, ...]) -> Any:
    return _structural.as_batched(be, be.reshape(buf, full), full, batch)


def _matmul_composite(be: Backend, p: MatmulParams, a: Any, b: Any) -> Any:
    sa, sb = tuple(a.shape), tuple(b.shape)
    a2, b2, batch, _ = _geometry(sa, sb)
    a3, b3 = _batched(be, a, a2, batch), _batched(be, b, b2, batch)
    return be.reshape(be.matmul(a3, b3), shapes.matmul(sa, sb)), (a3, b3)   # (saves)


def _matmul_step(p: MatmulParams, cls: type, be: Backend, ops: Any, bufs: Any, out: Any,
                 shape: tuple[int, ...], dtype: Any) -> Any:
    # the core's step (its numpy sweep in C) keeps each operand as the backend's matmul
    # took it, where the other one needs an adjoint
    # (``bufs``: the composite's batched operands, saved; None from eval_shape)
    A, B = ops
    a2, b2, batch, (m, k, n) = _geometry(A.shape, B.shape)
    nb = math.prod(batch)
    if bufs is None:
        bufs = (_batched(be, ops[0].data, a2, batch), _batched(be, ops[1].data, b2, batch))
    a3, b3 = bufs
    return MatmulStep(cls, be, dtype, batch, a2, b2, (m, k, n),
                      (nb if math.prod(a2[:-2]) != 1 else 1, m, k),
                      a3 if B.index >= 0 else None, b3 if A.index >= 0 else None,
                      ((A.data, A.shape, A.dtype, A.index), (B.data, B.shape, B.dtype, B.index)))


def _swap_last(t: Any) -> Any:
    perm = tuple(range(t.ndim - 2)) + (t.ndim - 1, t.ndim - 2)
    return apply(TRANSPOSE, TransposeParams(perm), (t,))


def _matmul_cotangents(g: Any, a: Any, b: Any, needs: tuple[bool, bool]) -> tuple[Any, Any]:
    # g (m, n) @ b^T to a, a^T @ g to b, batched, summed back over broadcast batch axes
    a2, b2, batch, (m, k, n) = _geometry(tuple(a.shape), tuple(b.shape))
    g2 = g.reshape(batch + (m, n))
    ga = gb = None
    if needs[0]:
        ga = _graph.fold(apply(MATMUL, MatmulParams(), (g2, _swap_last(b.reshape(b2)))),
                         batch + (m, k), a2).reshape(a.shape)
    if needs[1]:
        gb = _graph.fold(apply(MATMUL, MatmulParams(), (_swap_last(a.reshape(a2)), g2)),
                         batch + (k, n), b2).reshape(b.shape)
    return ga, gb


def _matmul_jvp(p: MatmulParams, tangents: tuple[Any, Any], a: Any, b: Any, out: Any) -> Any:
    return apply(MATMUL, p, (tangents[0], b)) + apply(MATMUL, p, (a, tangents[1]))


def _matmul_batch(p: MatmulParams, axis: int) -> tuple[MatmulParams, int]:
    if axis != 0:
        raise NotImplementedError("matmul's batching rule takes the batch axis first "
                                  "(batch_axis=0) on operands of two axes or more")
    return p, 0


MATMUL: Op = register(Op(
    name="matmul", params=MatmulParams, rule=lambda p, a, b: (shapes.matmul(a, b), p),
    numpy=lambda p, a, b: np.matmul(a, b),
    vjp=lambda p, g, a, b, out: _matmul_cotangents(g, a, b, (True, True)),
    jvp=_matmul_jvp, batch=_matmul_batch,
    composite=_matmul_composite, composite_first=True, step=_matmul_step, saves=True,
    objects=True, doc="numpy's matmul (batched, broadcast)"))


# ---- the tensor layer's calls (it sits below the table: registered there) ----

def _axes(axis: Any) -> Any:
    if axis is None or type(axis) is tuple:
        return axis
    return (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)


_NO_PARAMS, _MATMUL_PARAMS = WhereParams(), MatmulParams()

_structural.TABLE_OPS.update({
    "reshape": lambda t, new: apply(RESHAPE, ReshapeParams(
        (new,) if isinstance(new, (int, np.integer)) else tuple(new)), (t,)),
    "transpose": lambda t, perm: apply(TRANSPOSE, TransposeParams(perm), (t,)),
    "sum": lambda t, axis, keepdims: apply(SUM, ReduceParams(_axes(axis), bool(keepdims)),
                                           (t,)),
    "max": lambda t, axis, keepdims: apply(MAX, ReduceParams(_axes(axis), bool(keepdims)),
                                           (t,)),
    "min": lambda t, axis, keepdims: apply(MIN, ReduceParams(_axes(axis), bool(keepdims)),
                                           (t,)),
    # (the tensor layer calls these with Tensors only, never TraceTensors: no dispatch)
    "where": lambda c, a, b: _tensors(WHERE, _NO_PARAMS, (c, a, b)),
    "where_vjp": _where_cotangents,
    "getitem": lambda t, key: _tensors(GETITEM, GetitemParams(key), (t,)),
    "matmul": lambda a, b: _tensors(MATMUL, _MATMUL_PARAMS, (a, b)),
    "matmul_vjp": _matmul_cotangents,
    "put": lambda g, shape, key: apply(PUT, PutParams(tuple(shape), key), (g,)),
    "sum_vjp": lambda g, axes, x, out: SUM.vjp(ReduceParams(axes, True), g, x, out)[0],
    "extreme_vjp": lambda g, axes, x, out: _extreme_vjp(ReduceParams(axes, True), g, x,
                                                        out)[0],
})
