"""Tensor: an array on a device, recorded on a WengertList as ONE entry per operation.

The public class, at the top of the tensor layer: its storage, constructors and recording
come from ``TensorBase`` (``_base.py``), its elementwise methods and operators from the
rule table (``RuleMethods``, generated into ``_rule_methods.py``), and the methods written
here call the operation modules below it (``_elementwise``, ``_structural``, ``_generic``),
which import nothing above ``_base``: the imports run one way.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _arrays, _core
from easyad.errors import TapeMismatchError
from easyad.tensor import _elementwise, _generic, _structural
from easyad.tensor._interpreters import innermost
from easyad.tensor._program import ProgramBackend
from easyad.tensor._base import Node, TensorBase, _no_vjp, live_tape, wrap
from easyad._generated.tensor_methods import RuleMethods


class Tensor(TensorBase, RuleMethods):
    """An array of float64 (or float32) on a device, for reverse mode on a WengertList.

    Make inputs with ``Tensor.variable(array, lst)``; every operation on them appends one
    entry to ``lst``, the same list scalar Records use. The derivatives of a scalar result
    (``loss = ad.sum(y * y)`` is a Record) with respect to a tensor are an array of its
    shape: ``loss.derivatives()[x]``.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> lst = ad.WengertList()
    >>> x = ad.Tensor.variable(np.array([1.0, 2.0, 3.0]), lst)
    >>> loss = ad.sum(x * x)            # a scalar Record on lst
    >>> loss.number
    14.0
    >>> loss.derivatives()[x]
    array([2., 4., 6.])
    """

    __slots__ = ()

    # -- the rule table's hooks (RuleMethods calls them): the core's dispatch, in C for
    # the common cases, the rest through _elementwise.unary / binary --
    _unary_rule = _core.tensor_unary_rule
    _binary_rule = _core.tensor_binary_rule

    # -- reverse mode --
    def retain(self) -> "Tensor":
        """Keep this intermediate tensor's adjoint in the next sweeps, so ``d[t]`` works."""
        if self._tape is not None:
            self._tape._node(self._index).retain = True
        return self

    def derivatives(self, seed: Any = None, *, release: bool = False) -> Any:
        """One backward sweep from this tensor with adjoint ``seed`` (an array of its shape;
        may be left out for a tensor of one element). Returns the ``Derivatives``.

        ``release=True`` frees the values each tensor operation saved for its vjp as the
        sweep passes it (memory of intermediates comes back during the sweep, not at
        ``lst.clear()``); a later sweep through those operations then raises RuntimeError.
        For a list swept once, as in a training step."""
        tape = live_tape(self)
        if tape is None:
            raise ValueError("a constant tensor has no derivatives")
        if seed is None:
            if self.size != 1:
                raise ValueError(f"the backward sweep from a tensor of shape {self._shape} "
                                 f"needs a seed of that shape; or sweep from ad.sum(t)")
            seed = np.ones(self._shape)
        # (a complex seed would lose its imaginary part to numpy's cast: refused)
        seed = np.broadcast_to(_arrays.real_array(seed, "seed", self._dtype), self._shape)
        return tape._backward_from(self._handle, self._backend.asarray(seed, self._dtype),
                                   release=release)

    def _derivative_from(self, d: Any) -> np.ndarray:
        """``d[t]``: the adjoint of this tensor in the sweep ``d``, as a numpy array."""
        adjoint = self._adjoint_buffer(d)
        if adjoint is None:
            return np.zeros(self._shape, dtype=self._dtype)
        return np.asarray(self._backend.to_numpy(adjoint)).reshape(self._shape)

    def _derivative_tensor(self, d: Any) -> Any:
        """``d.tensor(t)``: the adjoint as a constant tensor on this tensor's device."""
        adjoint = self._adjoint_buffer(d)
        if adjoint is None:
            return wrap(type(self), self._backend,
                        self._backend.full(self._shape, 0.0, self._dtype), self._shape,
                        self._dtype)
        if tuple(adjoint.shape) != self._shape:
            adjoint = self._backend.reshape(adjoint, self._shape)
        return wrap(type(self), self._backend, adjoint, self._shape, self._dtype)

    def _adjoint_buffer(self, d: Any) -> Any:
        """The backend buffer of this tensor's adjoint in ``d``; None where nothing flowed
        into it (a constant, an output of no list, recorded after the output)."""
        if self._tape is None or d.tape is None:
            return None
        if d.tape is not self._tape:
            raise TapeMismatchError(f"Derivatives mixes records of two different lists, "
                                    f"{d.tape!r} and {self._tape!r}; record a whole "
                                    f"computation on one WengertList")
        live_tape(self)
        adjoint = d._node_adjoint(self._index)
        if adjoint is None:
            node = self._tape._node(self._index)
            if node.inputs and not node.retain:
                raise ValueError("the adjoint of an intermediate tensor is not kept; call "
                                 "t.retain() before the backward sweep to read d[t]")
        return adjoint

    # -- numpy interoperability: ufuncs and functions on tensors dispatch here --
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _generic.array_ufunc(Tensor, ufunc, method, inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _generic.array_function(func, args, kwargs)

    # -- comparisons: constant boolean tensors (no derivative) --
    def __lt__(self, other: Any) -> Any:
        return _elementwise.compare("<", self, other)

    def __le__(self, other: Any) -> Any:
        return _elementwise.compare("<=", self, other)

    def __gt__(self, other: Any) -> Any:
        return _elementwise.compare(">", self, other)

    def __ge__(self, other: Any) -> Any:
        return _elementwise.compare(">=", self, other)

    def __eq__(self, other: Any) -> Any:
        return _elementwise.compare("==", self, other)

    def __ne__(self, other: Any) -> Any:
        return _elementwise.compare("!=", self, other)

    def __pos__(self) -> Tensor:
        return self

    # -- structure: the core's dispatch (_engine/structural.pxi), in C for the common
    # cases on the numpy device, the rest in _structural.py --
    sum = _core.tensor_sum
    mean = _core.tensor_mean
    max = _core.tensor_max
    min = _core.tensor_min
    amax = max
    amin = min
    reshape = _core.tensor_reshape
    transpose = _core.tensor_transpose
    T = property(_core.tensor_T)
    __getitem__ = _core.tensor_getitem

    def __iter__(self) -> Any:
        if self._elements is not None and len(self._shape) == 1 and self._shape[0]:
            self[0]                        # the elements, made once
            return iter(self._records)
        return (self[i] for i in range(len(self)))

    __matmul__ = _core.tensor_matmul

    def __rmatmul__(self, other: Any) -> Any:
        return _structural.matmul(other, self)

    matmul = __matmul__

    @staticmethod
    def _where(condition: Any, a: Any, b: Any) -> Any:
        """ad.where(condition, a, b) when any of them is a Tensor."""
        for v in (condition, a, b):
            if type(v).__name__ == "TraceTensor":
                return type(v)._where(condition, a, b)
        return _structural.where(condition, a, b)


class _RecordedParameter:
    """``recorded_parameter(read, tape)``: while ``ad.record`` records tensor code, an
    input of the program that replay fills from ``read()`` at every call (a module
    parameter's current data), as a variable on ``tape`` (a constant when None); None
    when nothing is being recorded. ``made(t)``: whether ``t`` is one of the recording
    now under way (not of an earlier one)."""

    def __call__(self, read: Any, tape: Any) -> Tensor | None:
        be = innermost(ProgramBackend)
        if be is None:
            return None
        slot = be.live_input(read)
        if tape is None:
            return wrap(Tensor, be, slot, slot.shape, slot.dtype)
        return wrap(Tensor, be, slot, slot.shape, slot.dtype, tape,
                    tape._push_node(Node("variable", (), _no_vjp)))

    @staticmethod
    def made(t: Tensor) -> bool:
        be = innermost(ProgramBackend)
        return be is not None and t._backend is be


recorded_parameter = _RecordedParameter()


def recorded_host_value(make: Any, dtype: Any) -> Tensor | None:
    """While ``ad.record`` records tensor code: a constant tensor whose values ``make()``
    (host code: a random mask) computes again at every replay, as a host call of the
    program; None when nothing is being recorded (the caller computes it once)."""
    be = innermost(ProgramBackend)
    if be is None:
        return None
    (slot,) = be.host_call("host value", lambda: [np.asarray(make(), dtype=dtype)], [])
    return wrap(Tensor, be, slot, slot.shape, slot.dtype)


def recorded_effect(apply: Any, make: Any) -> bool:
    """While ``ad.record`` records tensor code: register ``apply`` to run on the host
    after every replay at one point, with the host values at that point of the tensors
    ``make()`` computes (recorded operations of f's values; ``Program.effect``); False
    when nothing is being recorded (the caller applies it now, and make is not called)."""
    be = innermost(ProgramBackend)
    if be is None:
        return False
    tensors = list(make())
    for t in tensors:
        if not (isinstance(t, Tensor) and t._backend is be):
            raise ValueError("an effect of a recording reads tensors of that recording "
                             f"(computed in f), not {type(t).__name__}")
    be.program.effect(apply, [t._data for t in tensors])
    return True


def _element_getitem(t: Tensor, key: Any) -> Any:
    """``t[key]`` on a transform's input (``_elements``): one element is a Record."""
    element = t._elements.get(key, live_tape(t))
    if element is not None:
        if len(t._shape) == 1:
            t._records = t._elements.records
        return element
    return _structural.getitem(t, key)


_core._register_service("tensor.element_getitem", _element_getitem)
