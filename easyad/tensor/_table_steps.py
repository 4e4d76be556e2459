"""The op table's steps written in Python, and the table's entry points for the tensor
layer (``TABLE_OPS``).

A table op's node holds a step whose call is the op's vjp on backend buffers (the sweep's
fast form) and whose ``graph`` is the table's vjp in easyad operations (create_graph). The
older structural ops' steps are mostly the compiled core's classes (``SumStep``,
``MatmulStep``...); these are the ones in Python: getitem's (``SliceStep`` for a basic
index, ``TakeStep`` for an advanced one), put's (``PutStep``) and where's (``WhereStep``).
``easyad.ops`` names them in its registrations; ``tensor._structural`` re-exports them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.tensor import _graph
from easyad.tensor._base import BOOL, T, TensorBase, fold, wrap
from easyad.tensor._steps import Step

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

# the op table's ops this layer calls (easyad.ops sits above the tensor layer and registers
# them here when it is imported, as easyad's __init__ does: no import goes upward)
TABLE_OPS: dict[str, Any] = {}


def _buffer(be: Backend, g: Any, dtype: Any) -> Any:
    """The adjoint of a single-number output (a float) as a 0-d buffer; buffers pass."""
    return be.full((), g, dtype) if isinstance(g, float) else g


# ---- getitem's and put's ----

class _IndexStep(Step):
    """getitem's vjp: the adjoint written into zeros of the operand's ``shape`` at ``key``;
    recorded, that is ``put``."""

    __slots__ = ("cls", "be", "shape", "dtype", "key")
    cls: type
    be: Backend
    shape: tuple[int, ...]
    dtype: Any
    key: Any

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any]:
        return (put(_graph.as_tensor(g, self.cls, self.be, self.dtype), self.shape, self.key),)


class SliceStep(_IndexStep):
    """getitem's vjp for a basic index: the part at ``offset`` with ``strides``."""

    __slots__ = ("offset", "out_shape", "strides")

    def __init__(self, cls: type, be: Backend, shape: tuple[int, ...], dtype: Any, key: Any,
                 offset: int, out_shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.cls, self.be, self.shape, self.dtype, self.key = cls, be, shape, dtype, key
        self.offset, self.out_shape, self.strides = offset, out_shape, strides

    def __call__(self, g: Any) -> tuple[Any]:
        g = _buffer(self.be, g, self.dtype)
        return (self.be.assemble(self.shape, self.dtype,
                                 [(self.offset, self.out_shape, self.strides, g)]),)


class TakeStep(_IndexStep):
    """getitem's vjp for an advanced index: the flat element ``index`` (``unique``: no
    element twice)."""

    __slots__ = ("index", "unique")

    def __init__(self, cls: type, be: Backend, shape: tuple[int, ...], dtype: Any, key: Any,
                 index: np.ndarray, unique: bool) -> None:
        self.cls, self.be, self.shape, self.dtype, self.key = cls, be, shape, dtype, key
        self.index, self.unique = index, unique

    def __call__(self, g: Any) -> tuple[Any]:
        g = _buffer(self.be, g, self.dtype)
        return (self.be.scatter_add(self.shape, self.dtype, self.index, g, self.unique),)


class PutStep(Step):
    """put's vjp: the adjoint at ``key`` (getitem again), of the part's shape
    ``g_shape``: the ``basic`` index's (offset, shape, strides), else the flat element
    ``index``."""

    __slots__ = ("be", "key", "basic", "index", "g_shape")

    def __init__(self, be: Backend, key: Any, basic: Any, index: Any,
                 g_shape: tuple[int, ...]) -> None:
        self.be, self.key, self.basic, self.index, self.g_shape = be, key, basic, index, g_shape

    def __call__(self, a: Any) -> tuple[Any]:
        be = self.be
        if self.basic is not None:
            offset, part, strides = self.basic
            return (be.strided(a, offset, part, strides),)
        return (be.reshape(be.take(a, self.index.reshape(-1)), self.g_shape),)

    def graph(self, tape: Any, index: int, a: Any) -> tuple[Any]:
        return (a[self.key],)


def put(g: T, shape: tuple[int, ...], key: Any) -> T:
    """Zeros of ``shape`` with ``g`` added at ``t[key]`` (repeated indices add up):
    getitem's adjoint, recorded, whose own adjoint is getitem again (the op table's)."""
    return TABLE_OPS["put"](g, shape, key)  # type: ignore[no-any-return]


# ---- where's ----

# the adjoints of where's operands
_WHERE_VJP = ("choose(c, g, 0.0)", "choose(c, 0.0, g)")


class WhereStep(Step):
    """where's vjp on buffers: the adjoint where the condition ``cond`` (of shape
    ``c_shape``) holds to the first operand, elsewhere to the second, each folded to its
    ``targets`` shape (a float for ``scalars``) where it ``needs`` one; none to the
    condition. Its graph is the op table's vjp."""

    __slots__ = ("cls", "be", "shape", "dtype", "cond", "c_shape", "needs", "targets",
                 "scalars")

    def __init__(self, cls: type[TensorBase], be: Backend, shape: tuple[int, ...], dtype: Any,
                 cond: Any, c_shape: tuple[int, ...], needs: tuple[bool, bool],
                 targets: tuple[Any, Any], scalars: tuple[bool, bool]) -> None:
        self.cls, self.be, self.shape, self.dtype = cls, be, shape, dtype
        self.cond, self.c_shape, self.needs, self.targets, self.scalars = \
            cond, c_shape, needs, targets, scalars

    def __call__(self, g: Any) -> tuple[Any, ...]:
        be, shape, needs = self.be, self.shape, self.needs
        chosen = tuple(e for e, need in zip(_WHERE_VJP, needs) if need)
        outs = iter(be.map("where_vjp", chosen, {"c": self.cond, "g": g}, shape,
                           (self.dtype,) * len(chosen)))
        return (None,) + tuple(fold(be, next(outs), shape, target, scalar) if need else None
                               for need, target, scalar in zip(needs, self.targets,
                                                               self.scalars))

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any, ...]:
        c = wrap(self.cls, self.be, self.cond, self.c_shape, BOOL)
        return TABLE_OPS["where_vjp"](g, c, self.needs, self.targets, self.scalars)
