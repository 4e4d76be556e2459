"""``Batched``: vmap's batched value, and the interpreter that runs f on it.

A ``Batched`` wraps the value of a whole batch (an ndarray, a Tensor, recorded or not, a
TraceTensor, or the Batched of an outer vmap) with the batch axis always first, and its
``level`` (which vmap made it: an inner vmap's level is higher). f sees one example: its
``shape`` is the value's without the batch axis. Every operation runs once on the whole
batch:

- the rule table's functions (``x.sin()``, ``a + b``, ``ad.exp(x)``, ``np.exp(x)``)
  broadcast after aligning: a batched operand of lower rank gets unit axes after its batch
  axis, so numpy's right-aligned broadcasting pairs the examples' axes;
- the op table's ops reach ``_batched_apply`` (``easyad.ops.apply`` sends any call with a
  batched operand here): the op's ``batch`` rule with the batch axis first; unbatched
  operands of a several-operand op are broadcast along the batch first. matmul and where
  have rules of their own here (matmul keeps one matrix product where one side is
  unbatched; where aligns ranks as the elementwise functions do);
- an op without a batching rule raises NotImplementedError naming it: there is no
  per-example loop to fall back on.

Values of two levels meet when f closes over an outer vmap's batched value: the higher
level is interpreted first and the lower-level value is an unbatched operand at that
level (its own level's interpretation runs when the op reaches it).
"""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from easyad import _core
from easyad._generated.tensor_methods import RuleMethods
from easyad._levels import BatchedBase
from easyad._rules import Rule
from easyad.ops import _structural as table
from easyad.ops._apply import apply
from easyad.ops._npfunctions import broadcast_to
from easyad.tensor import _generic

_OPERATORS = {"neg": operator.neg, "add": operator.add, "sub": operator.sub,
              "mul": operator.mul, "div": operator.truediv, "pow": operator.pow}


class Batched(BatchedBase, RuleMethods):
    """One example of a vmapped function's argument, standing for the whole batch."""

    __slots__ = ("_value", "_level", "_size")
    _shared = False           # (vmap_shared.Shared: the same value in every example)
    __array_priority__ = 2000.0        # above TraceTensor's: ndarray op Batched comes here
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, value: Any, level: int, size: int) -> None:
        self._value, self._level, self._size = value, level, size

    # -- what f sees: one example --
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(_shape(self._value)[1:])

    @property
    def ndim(self) -> int:
        return len(_shape(self._value)) - 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def dtype(self) -> Any:
        return getattr(self._value, "dtype", np.dtype(np.float64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d value (one example of the vmapped argument "
                            "is a number)")
        return self.shape[0]

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return (f"<one example of ad.vmap's batch of {self._size} (level {self._level}), "
                f"shape {self.shape}>")

    def __bool__(self) -> bool:
        raise TypeError("the truth value of a batched value depends on the example: "
                        "Python control flow on it cannot be vmapped; use ad.where")

    def __float__(self) -> float:
        raise TypeError("float() of a batched value: each example has its own number, "
                        "so it cannot be one Python float inside ad.vmap")

    # -- the rule table: elementwise, after aligning --
    def _unary_rule(self, rule: Rule) -> "Batched":
        return Batched(_function(rule)(self._value), self._level, self._size)

    def _binary_rule(self, rule: Rule, other: Any, reflected: bool) -> Any:
        return elementwise(_function(rule), (other, self) if reflected else (self, other))

    def __pos__(self) -> "Batched":
        return self

    def __lt__(self, other: Any) -> Any:
        return elementwise(operator.lt, (self, other))

    def __le__(self, other: Any) -> Any:
        return elementwise(operator.le, (self, other))

    def __gt__(self, other: Any) -> Any:
        return elementwise(operator.gt, (self, other))

    def __ge__(self, other: Any) -> Any:
        return elementwise(operator.ge, (self, other))

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return elementwise(operator.eq, (self, other))

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return elementwise(operator.ne, (self, other))

    def detach(self) -> "Batched":
        v = self._value
        return Batched(v.detach() if hasattr(v, "detach") else v, self._level, self._size)

    # -- the op table's ops (each one's batching rule, through _batched_apply) --
    def sum(self, axis: Any = None, keepdims: bool = False) -> Any:
        return _sum(self, axis, keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Any:
        return apply(table.MAX, table.ReduceParams(_axes(axis), bool(keepdims)), (self,))

    def min(self, axis: Any = None, keepdims: bool = False) -> Any:
        return apply(table.MIN, table.ReduceParams(_axes(axis), bool(keepdims)), (self,))

    amax, amin = max, min

    def mean(self, axis: Any = None, keepdims: bool = False) -> Any:
        axes = range(self.ndim) if axis is None else _axes(axis)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        return self.sum(axis, keepdims) / float(count)

    def reshape(self, *shape: Any) -> "Batched":
        new = shape[0] if len(shape) == 1 else shape
        new = (new,) if isinstance(new, (int, np.integer)) else tuple(new)
        return apply(table.RESHAPE, table.ReshapeParams(new), (self,))  # type: ignore

    def transpose(self, *axes: Any) -> "Batched":
        perm = tuple(reversed(range(self.ndim))) if not axes or axes == (None,) else \
            tuple(axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else axes)
        return apply(table.TRANSPOSE, table.TransposeParams(perm), (self,))  # type: ignore

    @property
    def T(self) -> "Batched":
        return self.transpose()

    def __getitem__(self, key: Any) -> Any:
        return getitem(self, key)

    def __matmul__(self, other: Any) -> Any:
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return matmul(other, self)

    def astype(self, dtype: Any) -> "Batched":
        return Batched(self._value.astype(dtype), self._level, self._size)

    # -- numpy's ufuncs and functions --
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _generic.array_ufunc(Batched, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        own = _NUMPY.get(func)
        if own is not None:
            return own(*args, **kwargs)
        return _generic.array_function(func, args, kwargs)

    @staticmethod
    def _where(condition: Any, a: Any, b: Any) -> Any:     # ad.where's hook
        return where(condition, a, b)

    @staticmethod
    def _elementwise(function: Any, args: tuple[Any, ...]) -> Any:   # _levels' hook
        return elementwise(function, args)

    def _batched_apply(self, op: Any, params: Any, args: tuple[Any, ...]) -> Any:
        return batched_apply(op, params, args)


# ---- levels and alignment ----

def _shape(v: Any) -> tuple[int, ...]:
    shape = getattr(v, "shape", None)
    return tuple(shape) if shape is not None else np.shape(v)


def _axes(axis: Any) -> Any:
    if axis is None or type(axis) is tuple:
        return axis
    return (int(axis),) if isinstance(axis, (int, np.integer)) else tuple(axis)


def top(args: Any) -> Batched:
    """The operand of the highest level (the one interpreted first)."""
    best: Batched | None = None
    for a in args:
        if isinstance(a, Batched) and (best is None or a._level > best._level):
            best = a
    assert best is not None
    return best


def at(v: Any, level: int) -> tuple[Any, bool]:
    """(the value to compute with, whether it has the batch axis of ``level`` first)."""
    if isinstance(v, Batched) and v._level == level:
        return v._value, True
    return v, False


def with_units(value: Any, units: int) -> Any:
    """A batched value with ``units`` axes of length 1 after its batch axis."""
    if units <= 0:
        return value
    shape = _shape(value)
    return value.reshape(shape[:1] + (1,) * units + shape[1:])


def expanded(v: Any, size: int) -> Any:
    """An unbatched operand given the batch axis first (broadcast: the same example)."""
    shape = (size,) + _shape(v)
    if isinstance(v, (int, float, np.ndarray, np.number, bool)):
        return np.broadcast_to(np.asarray(v), shape)
    return broadcast_to(v, shape)


def _function(rule: Rule) -> Any:
    return _OPERATORS.get(rule.name) or getattr(_core, rule.name)


def elementwise(function: Any, args: tuple[Any, ...]) -> Any:
    """``function`` (elementwise, numpy's broadcasting) of operands of which one at least
    is batched: batched ones of lower rank get unit axes after their batch axis."""
    first = top(args)
    for a in args:           # (a Shared: vmap_shared.py, the weights' probes)
        if getattr(a, "_shared", False) and a._level == first._level:
            out = a._elementwise(function, args)
            if out is not NotImplemented:
                return out
            break
    level, size = first._level, first._size
    pairs = [at(a, level) for a in args]
    ranks = [len(_shape(v)) - 1 if b else len(_shape(v)) for v, b in pairs]
    rank = max(ranks)
    values = [with_units(v, rank - r) if b else v for (v, b), r in zip(pairs, ranks)]
    return Batched(function(*values), level, size)


# ---- the op table ----

def batched_apply(op: Any, params: Any, args: tuple[Any, ...]) -> Any:
    """``op(*args)`` with a batched operand, by the op's batching rule: one call on the
    whole batch (the batch axis first), the result batched."""
    if op is table.MATMUL:
        return matmul(*args)
    if op is table.WHERE:
        return where(*args)
    if op is table.PUT:
        return put(params, *args)
    if op.batch is None:
        raise NotImplementedError(
            f"ad.vmap: op {op.name!r} has no batching rule (its Op.batch is None), so it "
            f"cannot run on a batch at once; give it one (docs/internals.md, 'How to add an "
            f"op'), or move the call out of the vmapped function")
    first = top(args)
    level, size = first._level, first._size
    pairs = [at(a, level) for a in args]
    shapes = [_shape(v)[1:] if b else _shape(v) for v, b in pairs]
    _, params = op.rule(params, *shapes)           # canonical for one example
    if getattr(op.batch, "first_operand_only", False):
        # (conv: the rule batches the input's leading axes; the weight must be the same
        # for every example, so it is not broadcast to the batch; a per-example weight
        # has the op's own rule: conv's grouped convolution)
        grouped = getattr(op.batch, "per_example_weight", None)
        if grouped is not None and len(pairs) == 2 and pairs[1][1]:
            x, bx = pairs[0]
            return Batched(grouped(op, params, x if bx else expanded(x, size), pairs[1][0],
                                   size), level, size)
        if any(b for _, b in pairs[1:]):
            raise NotImplementedError(
                f"ad.vmap: op {op.name!r} batches its first operand only and has no rule "
                f"for its other operands batched (a per-example weight); differentiate in "
                f"the input, or loop over the examples")
        values = [v if b or k else expanded(v, size) for k, (v, b) in enumerate(pairs)]
    else:
        values = [v if b else expanded(v, size) for v, b in pairs]
    params, out_axis = op.batch(params, 0)
    out = apply(op, params, tuple(values))
    if out_axis != 0:
        order = list(range(len(_shape(out))))
        order.insert(0, order.pop(out_axis))
        out = out.transpose(*order) if not isinstance(out, np.ndarray) else \
            out.transpose(order)
    return Batched(out, level, size)


def _sum(x: Any, axis: Any, keepdims: bool) -> Any:
    return apply(table.SUM, table.ReduceParams(_axes(axis), bool(keepdims)), (x,))


def matmul(a: Any, b: Any) -> Any:
    """numpy's matmul of one example; a batched vector or stack times an unbatched matrix
    stays one matrix product (the batch folded into its rows)."""
    first = top((a, b))
    shared = a if getattr(a, "_shared", False) else b
    if getattr(shared, "_shared", False) and shared._level == first._level:
        out = shared._matmul(a, b)
        if out is not NotImplemented:
            return out
    level, size = first._level, first._size
    (av, ab), (bv, bb) = at(a, level), at(b, level)
    sa = _shape(av)[1:] if ab else _shape(av)
    sb = _shape(bv)[1:] if bb else _shape(bv)
    if not sa or not sb:
        raise ValueError("matmul: an operand is a scalar (one example has shape ()): use *")
    if ab and not bb and len(sb) == 2:              # (B, ..., k) @ (k, n): one product
        out = av.reshape((-1, sa[-1])) @ bv
        return Batched(out.reshape((size,) + sa[:-1] + sb[-1:]), level, size)
    if bb and not ab and len(sa) == 2 and len(sb) == 1:    # (m, k) @ (B, k): (B, k) @ a^T
        return Batched(bv @ av.T, level, size)
    a_vector, b_vector = len(sa) == 1, len(sb) == 1
    if a_vector:
        sa = (1,) + sa
        av = av.reshape(((size,) if ab else ()) + sa)
    if b_vector:
        sb = sb + (1,)
        bv = bv.reshape(((size,) if bb else ()) + sb)
    rank = max(len(sa), len(sb))
    if ab:
        av = with_units(av, rank - len(sa))
    if bb:
        bv = with_units(bv, rank - len(sb))
    out = av @ bv
    shape = _shape(out)
    if b_vector:
        shape = shape[:-1]
    if a_vector:
        shape = shape[:-2] + shape[-1:] if not b_vector else shape[:-1]
    return Batched(out.reshape(shape), level, size)


def where(condition: Any, a: Any, b: Any) -> Any:
    """``a`` where the condition holds, else ``b``, for each example."""
    def chosen(c: Any, x: Any, y: Any) -> Any:
        if not hasattr(c, "_backend") and not isinstance(c, BatchedBase):
            c = np.asarray(c).astype(bool)
        if all(isinstance(v, (np.ndarray, int, float, np.number)) for v in (c, x, y)):
            return np.where(c, x, y)
        return apply(table.WHERE, table.WhereParams(), (c, x, y))
    return elementwise(chosen, (condition, a, b))


def put(params: Any, g: Batched) -> Batched:
    """getitem's adjoint (a recorded sweep with a batched seed): each example's part put
    into zeros of one example's shape, the key after the batch axis."""
    key = params.key if isinstance(params.key, tuple) else (params.key,)
    batched = table.PutParams((g._size,) + tuple(params.shape), (slice(None),) + key)
    return Batched(apply(table.PUT, batched, (g._value,)), g._level, g._size)


def getitem(x: Any, key: Any) -> Any:
    """``x[key]`` for one example: the key after the batch axis (getitem's batching
    rule); an index that is itself batched (one integer per example) gathers."""
    keys = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, Batched) for k in keys):
        return _gather(x, keys)
    if not isinstance(x, Batched):
        raise TypeError("vmap: indexing an unbatched array with a batched key needs an "
                        "integer key per example")
    arrays = [i for i, k in enumerate(keys) if isinstance(k, (list, np.ndarray))]
    if arrays and arrays[-1] - arrays[0] + 1 != len(arrays):
        raise NotImplementedError(
            "vmap: an index with integer arrays separated by slices moves numpy's result "
            "axes to the front, away from the batch axis; index in two steps")
    params, _ = table.GETITEM.batch(table.GetitemParams(keys), 0)
    return Batched(x._value[params.key], x._level, x._size)


def _gather(x: Any, keys: tuple[Any, ...]) -> Any:
    index = top(keys)
    level, size = index._level, index._size
    if len(keys) != 1 or not isinstance(index._value, np.ndarray) or \
            index._value.dtype.kind not in "iu":
        raise NotImplementedError(
            "vmap: a batched index must be one integer array (an int or int array per "
            "example, as numpy integers), x[i]; got the key " + repr(keys))
    i = index._value
    xv, xb = at(x, level)
    if not xb:
        return Batched(xv[i], level, size)
    rows = np.arange(size).reshape((size,) + (1,) * (i.ndim - 1))
    return Batched(xv[rows, i], level, size)


def concatenate(items: Any, axis: int = 0) -> Any:
    return _generic.concatenate(list(items), axis)


def stack(items: Any, axis: int = 0) -> Any:
    items = list(items)
    ranks = {len(_shape(v)) for v in items}
    if len(ranks) != 1:
        raise ValueError("stack: the arrays of one example must have one shape")
    rank = ranks.pop()
    axis = axis + rank + 1 if axis < 0 else axis
    parts = []
    for v in items:
        s = _shape(v)
        parts.append(v.reshape(s[:axis] + (1,) + s[axis:]) if not isinstance(v, np.ndarray)
                     else v.reshape(s[:axis] + (1,) + s[axis:]))
    return concatenate(parts, axis)


_NUMPY = {np.where: where, np.concatenate: concatenate, np.stack: stack,
          np.matmul: matmul, np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim,
          np.size: lambda a: a.size}
