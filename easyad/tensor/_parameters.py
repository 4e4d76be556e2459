"""A trainable parameter's values, on the host or on a device: what ``nn.Parameter`` holds
and the optimizers update, so that training on an OpenCL device moves no parameter,
gradient or optimizer state between host and device (nn and optim use this public API,
never a backend).

``ParameterValues`` keeps one array that counts: the host's numpy array, or (from the first
step on a device) a device buffer, the host copy then stale until it is read. Updates
make new buffers (``update``: one elementwise kernel of the new values and the new
optimizer state) and never write into one, so a tensor made from the values earlier keeps
what it saw.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.tensor import _devices, _interpreters

if TYPE_CHECKING:
    from easyad.tensor._backend import Backend


class ParameterValues:
    """The values of one parameter (see the module docstring)."""

    __slots__ = ("_host", "_host_valid", "_buffer", "_backend")

    def __init__(self, host: np.ndarray) -> None:
        self._host = host
        self._host_valid = True          # False: the device buffer holds newer values
        self._buffer: Any = None         # the values on a device, or None
        self._backend: Backend | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._host.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._host.dtype

    @property
    def _device_backend(self) -> Backend:
        """The backend of the device buffer (asked only where there is one)."""
        if self._backend is None:
            raise RuntimeError("these values have no device buffer")
        return self._backend

    def on_device(self) -> bool:
        """Whether a device buffer holds the values (the newest, or a copy of the host's)."""
        return self._buffer is not None

    def read(self) -> np.ndarray:
        """The values on the host, to be read only (a device copy stays)."""
        if not self._host_valid:
            self._host = self._device_backend.to_numpy(self._buffer).reshape(self._host.shape)
            self._host_valid = True
        return self._host

    def writable(self) -> np.ndarray:
        """The values on the host, which may be written in place: the host array counts
        from now (a device copy is dropped, and uploaded again when next needed)."""
        host = self.read()
        self._buffer = self._backend = None
        return host

    def replace(self, host: np.ndarray) -> None:
        """New values on the host."""
        self._host = host
        self._host_valid = True
        self._buffer = self._backend = None

    def adopt(self, buffer: Any, backend: Backend) -> None:
        """New values as ``buffer``, a new buffer of ``backend``'s device (a replayed step's
        output, which nothing else holds): they stay there, the host copy is stale."""
        self._buffer, self._backend, self._host_valid = buffer, backend, False

    def for_tensor(self, device: Any) -> Any:
        """What a tensor of these values on ``device`` is made from: the host array on the
        numpy device (the tensor copies it) and while ``eval_shape`` traces (shapes only),
        else the device buffer (uploaded once; never written afterwards)."""
        if not _interpreters.new_tensors_have_values():
            return self._host
        be = _devices.resolve(device)
        if be.device.kind == "numpy":
            return self.writable()
        if self._buffer is None or self._backend is not be:
            host = self.read()
            self._buffer, self._backend = be.asarray(host, host.dtype), be
        return self._buffer

    def gradient(self, tensor: Any, d: Any) -> Any:
        """The derivative of ``tensor`` (made from ``for_tensor`` on this device) in the
        sweep ``d`` as a buffer of this device, or None (not on this device's copy, or no
        derivative reached it)."""
        if self._buffer is None or tensor._backend is not self._backend:
            return None
        return d._node_adjoint(tensor._index)

    def update(self, label: str, exprs: tuple[str, ...], gradient: Any,
               state: dict[str, Any], names: tuple[str, ...],
               numbers: Mapping[str, float]) -> None:
        """One optimizer step on the device: ``exprs`` over ``p`` (the values), ``g`` (the
        gradient buffer), the state buffers ``names`` (zeros where ``state`` has none yet)
        and ``numbers``; the first expression gives the new values, the others the new
        state buffers, in ``names``' order. One kernel; new buffers."""
        be = self._device_backend
        operands: dict[str, Any] = {"p": self._buffer, "g": gradient, **numbers}
        for name in names:
            if name not in state:
                state[name] = be.full(self.shape, 0.0, self.dtype)
            operands[name] = state[name]
        outs = be.map(label, exprs, operands, self.shape, (self.dtype,) * len(exprs))
        self._buffer = outs[0]
        self._host_valid = False
        for name, out in zip(names, outs[1:]):
            state[name] = out

    def move_state(self, state: dict[str, Any], to_device: bool) -> None:
        """An optimizer's state for these values as buffers of this device
        (``to_device``) or as host arrays, where it is kept on the other side."""
        for k, v in state.items():
            if to_device and isinstance(v, np.ndarray):
                state[k] = self._device_backend.asarray(v, v.dtype)
            elif not to_device:
                state[k] = host_copy(v)


def host_copy(value: Any) -> Any:
    """A device buffer as a numpy array (a copy); anything else as it is."""
    if isinstance(value, np.ndarray) or not hasattr(value, "get") or \
            not hasattr(value, "queue"):
        return value
    return value.get()
