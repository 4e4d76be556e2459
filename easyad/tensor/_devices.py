"""Devices: where tensors live and their kernels run.

``numpy`` (the host) is always there. With the ``opencl`` extra (pyopencl; the
pocl-binary-distribution package gives a CPU device) every OpenCL device is one more.
The device of a new tensor is its ``device=`` argument, else the one ``set_device`` chose,
else the ``EASYAD_DEVICE`` environment variable, else numpy. A device is named by a spec:
``"numpy"``, ``"opencl"`` (the first GPU, else the first OpenCL device),
``"opencl:N"`` (the N-th OpenCL device of ``devices()``), or a ``Device``.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Device:
    """One place tensors can live: ``name`` is the spec that selects it.

    >>> import easyad as ad
    >>> [d.name for d in ad.devices()][0]       # numpy is always there
    'numpy'
    """

    name: str                       # "numpy", "opencl:0", ...
    kind: str                       # "numpy" or "opencl"
    description: str
    is_gpu: bool = False
    _handle: Any = field(default=None, repr=False, compare=False)  # pyopencl.Device

    def __str__(self) -> str:
        return self.name

    @property
    def backend(self) -> Any:
        """The backend object that stores this device's buffers and runs its kernels."""
        return _backend_of(self)

    @property
    def live_buffers(self) -> int:
        """Buffers allocated on this device and not yet released."""
        return int(self.backend.live_buffers)


NUMPY = Device("numpy", "numpy", "numpy on the host")


@functools.lru_cache(maxsize=1)
def _opencl_devices() -> tuple[Device, ...]:
    try:
        import pyopencl as cl
    except Exception:   # not installed, or its ICD loader is broken: no OpenCL
        return ()
    try:
        platforms = cl.get_platforms()
    except Exception:   # no platform at all (pyopencl raises LogicError)
        return ()
    found = []
    for platform in platforms:
        try:
            handles = platform.get_devices()
        except Exception:
            continue
        for handle in handles:
            is_gpu = bool(handle.type & cl.device_type.GPU)
            found.append((handle, is_gpu, platform.name.strip()))
    return tuple(Device(f"opencl:{i}", "opencl", f"{h.name.strip()} ({p})", gpu, h)
                 for i, (h, gpu, p) in enumerate(found))


def devices() -> list[Device]:
    """Every device tensors can use: numpy first, then each OpenCL device.

    >>> import easyad as ad
    >>> ad.devices()[0].name
    'numpy'
    """
    return [NUMPY, *_opencl_devices()]


def find_device(spec: Any) -> Device:
    """The Device a spec names (see the module docstring); ValueError if there is none."""
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"a device is a Device or a name such as 'numpy' or 'opencl', "
                        f"got {type(spec).__name__}")
    name = spec.strip().lower()
    if name in ("numpy", "cpu-numpy", "host"):
        return NUMPY
    cl_devices = _opencl_devices()
    if name == "opencl":
        if not cl_devices:
            raise ValueError("no OpenCL device: install the 'opencl' extra "
                             "(pip install 'easyad[opencl]'), or use device='numpy'")
        return next((d for d in cl_devices if d.is_gpu), cl_devices[0])
    for d in cl_devices:
        if d.name == name:
            return d
    known = ", ".join(d.name for d in devices())
    raise ValueError(f"no device {spec!r}; available: {known}")


_chosen: list[Device] = []


def set_device(device: Any) -> Device:
    """Make ``device`` (a Device or a spec such as ``"opencl"``) the default for new
    tensors; returns it.

    >>> import easyad as ad
    >>> previous = ad.get_device()
    >>> ad.set_device("numpy").name
    'numpy'
    >>> _ = ad.set_device(previous)
    """
    d = find_device(device)
    _chosen[:] = [d]
    return d


def get_device() -> Device:
    """The device new tensors go to when none is given.

    >>> import easyad as ad
    >>> ad.get_device().kind in ("numpy", "opencl")
    True
    """
    if _chosen:
        return _chosen[0]
    spec = os.environ.get("EASYAD_DEVICE", "").strip()
    return find_device(spec) if spec else NUMPY


def resolve(device: Any = None) -> Any:
    """The backend for ``device`` (None: the default device)."""
    return (get_device() if device is None else find_device(device)).backend


@functools.lru_cache(maxsize=None)
def _backend_of(device: Device) -> Any:
    if device.kind == "numpy":
        from easyad.tensor._numpy import NumpyBackend
        return NumpyBackend(device)
    from easyad.tensor._opencl import OpenCLBackend
    return OpenCLBackend(device)
