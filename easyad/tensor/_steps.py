"""Steps: a recorded tensor operation's vjp as data.

A tensor operation's node (``Node``) holds ``vjp(g)`` and ``graph(tape, index, g)`` (the
same vjp in recorded operations, for ``create_graph``). For every built-in operation both
are one object, a *step*: an instance of a small class per operation kind whose slots hold
what the adjoint reads (backend, shapes, dtypes, saved buffers, operand entries), whose
``__call__`` is the vjp and whose method ``graph`` is the graph. No closure per operation:
a recorded program can be read as data, and a releasing sweep, which replaces a node's
``vjp`` and ``graph``, drops the step and with it the buffers it saved.

A step holds no tape (no ``Operand``, no recorded tensor): a tape whose nodes point back
at it is a reference cycle, freed only by the garbage collector.

The steps live next to their operations (``_elementwise``, ``_structural``, ``_fused``,
``_custom``); the conversions' (``astype``, ``to``) are here, since ``_base`` makes them
and the operation modules sit above it. Layering: a leaf (numpy and the core only), so
every tensor module can import it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _core

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend

_BOOL = np.dtype(np.bool_)    # _base's BOOL (this module sits below _base)


# The base class is the core's (``_core.Step``: ``__call__`` and ``graph`` raise
# NotImplementedError), so the core's own steps (SumStep, MatmulStep, ...: cdef classes
# whose adjoints the sweep runs in C) are steps too; it has no fields, and a step written
# here is an ordinary object with slots.
Step = _core.Step


class AstypeStep(Step):
    """astype's vjp: the adjoint converted back to the source dtype (none for a boolean
    source)."""

    __slots__ = ("be", "shape", "source")

    def __init__(self, be: Backend, shape: tuple[int, ...], source: Any) -> None:
        self.be, self.shape, self.source = be, shape, source

    def __call__(self, g: Any) -> tuple[Any]:
        if self.source == _BOOL:
            return (None,)
        return tuple(self.be.map("astype", ("g",), {"g": g}, self.shape, (self.source,)))

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any]:
        return (None,) if self.source == _BOOL else (g.astype(self.source),)


class ToStep(Step):
    """to's vjp: the adjoint moved back to the source device."""

    __slots__ = ("source", "target", "dtype")

    def __init__(self, source: Any, target: Any, dtype: Any) -> None:
        self.source, self.target, self.dtype = source, target, dtype

    def __call__(self, g: Any) -> tuple[Any]:
        return (self.source.asarray(self.target.to_numpy(g), self.dtype),)

    def graph(self, tape: Any, index: int, g: Any) -> tuple[Any]:
        return (g.to(self.source.device),)
