"""Parameter: a trainable array that a module holds between training steps.

A parameter is a numpy array (``p.data``) that becomes a tensor only for one forward pass:
``p.tensor(lst)`` records it on ``lst`` as a ``Tensor.variable`` (once per list and
generation: a second use on the same list reuses that variable, so a parameter used twice
gets the sum of both derivatives), or gives a constant tensor when ``lst`` is None
(inference). After the backward sweep ``d[p]`` reads its derivative, and the optimizers
update the parameter. Nothing is accumulated between steps, so there is no ``zero_grad``:
each WengertList is one step's gradient. (The variable does not share memory that an
update writes, so updating never changes what a recorded step saw. A parameter keeps the
list of its last step alive until the next step records it, as PyTorch keeps ``.grad``.)

**On a device** (OpenCL) the parameter's values live in a device buffer from its first
step on: the optimizers update it there (new buffers, never written in place), so a
training step moves no parameter, gradient or optimizer state between host and device.
Reading ``p.data`` brings the values back to the host and makes the host array the one
that counts (it may be written in place); the next step uploads it again. ``shape``,
``dtype``, ``state_dict`` and ``repr`` read without taking the device copy away.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _arrays
from easyad.tensor import ParameterValues, Tensor, recorded_parameter

FLOAT_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


def float_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as float64 or float32 (None: float64)."""
    dt = np.dtype(np.float64 if dtype is None else dtype)
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"parameters are float64 or float32, not {dt}")
    return dt


class Parameter:
    """A trainable array of a module.

    Parameters
    ----------
    data : array_like
        The initial values (copied).
    dtype : float64 (default: that of ``data`` when it is float32, else float64) or float32.
    device : where its tensors go (``"numpy"``, ``"opencl"``, a Device; None: the default).
    requires_grad : False freezes it: recorded as a constant, so optimizers leave it alone.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> p = ad.nn.Parameter(np.array([1.0, 2.0]))
    >>> lst = ad.WengertList()
    >>> loss = ad.sum(p.tensor(lst) ** 2)
    >>> loss.derivatives()[p]
    array([2., 4.])
    """

    __slots__ = ("_values", "device", "requires_grad", "_tensor", "_override")

    def __init__(self, data: Any, dtype: Any = None, device: Any = None,
                 requires_grad: bool = True) -> None:
        array = np.asarray(data)
        _arrays.check_real(array, "a Parameter's data")    # complex: not dropped to real
        if dtype is None and array.dtype.kind == "f" and array.dtype.itemsize == 4:
            dtype = np.float32
        self._values = ParameterValues(np.array(array, dtype=float_dtype(dtype), order="C",
                                                copy=True))
        self.device = device
        self.requires_grad = bool(requires_grad)
        self._tensor: Tensor | None = None
        self._override: Any = None      # what functional_call gives in its place

    @property
    def data(self) -> np.ndarray:
        """The values as a numpy array, which may be written in place: reading it makes the
        host array the one that counts (a device copy is dropped, and uploaded again by
        the next step)."""
        return self._values.writable()

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._values.replace(value)

    # -- pickling and copying: the values (from the device if they are newer there) and
    # settings; no tensor of a step, no device buffer --
    def __getstate__(self) -> dict[str, Any]:
        return {"data": self._values.read(), "device": self.device,
                "requires_grad": self.requires_grad}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._values = ParameterValues(np.array(state["data"], order="C", copy=True))
        self.device = state["device"]
        self.requires_grad = state["requires_grad"]
        self._tensor = None
        self._override = None

    # -- what it is --
    @property
    def shape(self) -> tuple[int, ...]:
        return self._values.shape

    @property
    def dtype(self) -> np.dtype:
        return self._values.dtype

    @property
    def size(self) -> int:
        return int(np.prod(self._values.shape))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self._values.read()
        return host.copy() if dtype is None else host.astype(dtype)

    def __repr__(self) -> str:
        body = np.array2string(self._values.read(), separator=", ", threshold=10)
        return f"Parameter({body}, dtype={self.dtype})"

    # -- one step's tensor --
    def tensor(self, tape: Any = None) -> Tensor:
        """This parameter as a tensor: a variable on ``tape`` (the same one for every use
        on that list until it is cleared), or a constant when ``tape`` is None or the
        parameter is frozen. Inside ``ad.nn.functional_call``: the value given there."""
        if self._override is not None:
            return self._override  # type: ignore[no-any-return]
        recorded = self._recorded(tape)
        if recorded is not None:
            return recorded
        values = self._values.for_tensor(self.device)
        if tape is None or not self.requires_grad:
            return Tensor.constant(values, device=self.device)
        t = self._tensor
        if t is not None and t.recorded_on(tape):
            return t
        t = Tensor.variable(values, tape, device=self.device)
        self._tensor = t
        return t

    def _recorded(self, tape: Any) -> Tensor | None:
        """While ``ad.record`` records tensor code: an input of the program that replay
        reads from ``self.data`` at every call (so it sees the values of later training
        steps); a variable on ``tape`` unless frozen. None when nothing is recorded."""
        t = self._tensor
        if t is not None and recorded_parameter.made(t) and \
                (tape is None or not self.requires_grad or t.recorded_on(tape)):
            return t
        t = recorded_parameter(lambda: self.data, tape if self.requires_grad else None)
        if t is not None:
            self._tensor = t
        return t

    def bound(self, tape: Any) -> Tensor | None:
        """The variable recorded for this parameter on ``tape`` since it was last cleared,
        or None when this step did not use it."""
        t = self._tensor
        if t is None or not t.recorded_on(tape):
            return None
        return t

    def gradient(self, d: Any) -> np.ndarray | None:
        """Its derivative in the backward sweep ``d`` (an array of its shape), or None
        when the step did not record this parameter or no derivative reached it (where
        PyTorch leaves ``grad`` None, and its optimizers skip the parameter)."""
        t = self.bound(d.tape)
        adjoint = None if t is None else t.adjoint(d)
        return None if adjoint is None else np.array(adjoint)

    def _adjoint(self, d: Any) -> np.ndarray | None:
        """``gradient(d)`` without the copy on the numpy device: the sweep's own array, to
        be read only (what the optimizers use)."""
        t = self.bound(d.tape)
        return None if t is None else t.adjoint(d)

    def _device_adjoint(self, d: Any) -> Any:
        """Its derivative in ``d`` as a buffer of its device, where this step ran there
        (``ParameterValues.gradient``); else None."""
        t = self.bound(d.tape)
        return None if t is None else self._values.gradient(t, d)

    def _derivative_tensor(self, d: Any) -> Any:
        """``d.tensor(p)``: its derivative as a constant tensor on its device."""
        t = self.bound(d.tape)
        if t is None:
            self._derivative_from(d)        # raises where d[p] would
            return Tensor.constant(np.zeros(self.shape, dtype=self.dtype), device=self.device)
        return t._derivative_tensor(d)

    def _derivative_from(self, d: Any) -> np.ndarray:
        # d[p]: the Derivatives' hook for objects that are not Records
        t = self.bound(d.tape)
        if t is None:
            if not self.requires_grad:
                return np.zeros(self.shape, dtype=self.dtype)
            raise ValueError("this parameter was not recorded on the list these derivatives "
                             "come from: call the model with tape=lst (model(x, tape=lst)) "
                             "in the step that made the loss")
        result: np.ndarray = d[t]     # zeros when no derivative reached it
        return result
