"""Errors of the OpenCL backend: every pyopencl error an operation raises becomes a
DeviceError naming the device, the outermost operation and the fix (``_translate``,
``_guarded``, the class decorator ``_device_errors``), and a kernel build's driver output
is kept for its error (``_quiet_build``). Apart from the backend (``_opencl.py``) because
its mixins (``_cl_memory``, ``_cl_matmul``) and the program executors
(``compiler/program/fused_cl.py``, ``batch_cl.py``) guard their launches with it too.
"""
from __future__ import annotations

import functools
import os
import tempfile
import warnings
from typing import TYPE_CHECKING, Any, TypeVar

import pyopencl as cl

from easyad.errors import DeviceError
from easyad.tensor import _probe

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend

_Class = TypeVar("_Class", bound=type)   # a class decorator keeps the class's type


_CODE = cl.status_code

_MEMORY = {_CODE.MEM_OBJECT_ALLOCATION_FAILURE, _CODE.OUT_OF_HOST_MEMORY,
           _CODE.INVALID_BUFFER_SIZE, _CODE.OUT_OF_RESOURCES}

_LOST = {_CODE.DEVICE_NOT_AVAILABLE, _CODE.INVALID_COMMAND_QUEUE, _CODE.INVALID_CONTEXT,
         _CODE.INVALID_DEVICE, -9999}   # -9999: NVIDIA's "illegal read or write"


def _translate(backend: "OpenCLBackend", operation: str, error: Exception) -> DeviceError:
    """The DeviceError for a pyopencl error raised while ``operation`` ran."""
    device = backend.device
    where = f"{operation} on device {device.name} ({device.description})"
    code = getattr(error, "code", None)
    if isinstance(error, cl.MemoryError) or code in _MEMORY:
        limit = device._handle.max_mem_alloc_size
        return DeviceError(
            f"{where} ran out of device memory ({_probe.first_log_line(str(error))}; one "
            f"buffer may hold at most {limit} bytes here). Fix: use smaller arrays or batches "
            f"or float32, release tensors you no longer need (del them, lst.clear()), or use "
            f"device='numpy'", device=device, operation=operation)
    if code in _LOST:
        return DeviceError(
            f"{where} failed: the device was lost or reset "
            f"({_probe.first_log_line(str(error))}). Fix: its tensors are gone; restart the "
            f"process (or use another device) and check the driver (dmesg, nvidia-smi)",
            device=device, operation=operation)
    return DeviceError(
        f"{where} failed in the OpenCL driver: {_probe.first_log_line(str(error))}. Fix: "
        f"check `python -m easyad devices`; use device='numpy' meanwhile, and report this "
        f"with the message if the device passes the probe", device=device, operation=operation)


def _guarded(method: Any, backend_of: Any, operation_of: Any) -> Any:
    """``method`` with pyopencl errors turned into DeviceErrors that name the outermost
    operation of the backend (``backend_of(self)``): an operation called inside another
    (``map`` inside ``reduce``) lets its errors pass to the outer one, which names itself
    (``operation_of(self, args)``), so the user hears of what they asked for."""
    if backend_of is _itself:      # a backend's own method: one call less per operation
        @functools.wraps(method)
        def guarded_method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self._busy:
                return method(self, *args, **kwargs)
            self._busy = True
            try:
                return method(self, *args, **kwargs)
            except cl.Error as error:
                raise _translate(self, operation_of(self, args), error) from None
            finally:
                self._busy = False
        return guarded_method

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        backend = backend_of(self)
        if backend._busy:
            return method(self, *args, **kwargs)
        backend._busy = True
        try:
            return method(self, *args, **kwargs)
        except cl.Error as error:
            raise _translate(backend, operation_of(self, args), error) from None
        finally:
            backend._busy = False
    return guarded


def _device_errors(cls: _Class) -> _Class:
    """Guard ``__init__`` and every public method of ``cls`` (``_guarded``): an operation is
    named by its method and its label (``map`` and ``reduce`` take one first)."""
    def operation_of(name: str) -> Any:
        def operation(self: Any, args: tuple[Any, ...]) -> str:
            label = (f" ({args[0]})" if args and isinstance(args[0], str)
                     and "\n" not in args[0] and len(args[0]) < 60 else "")
            return name + label
        return operation
    unguarded = getattr(cls, "_unguarded", ())
    for name, member in list(vars(cls).items()):
        if callable(member) and (name == "__init__" or not name.startswith("_")) and \
                name not in unguarded:
            setattr(cls, name, _guarded(member, _itself, operation_of(name)))
    return cls


def _itself(backend: object) -> object:
    return backend


def _quiet_build(program: Any, context: Any) -> Any:
    """``program.build()`` with easyad's build options for ``context``'s devices (the
    program's own attributes are not read before the build: that would defeat pyopencl's
    binary cache) and the driver's own stderr output (PoCL's clang prints "1 warning
    generated." there) captured: shown only inside the error when the build fails."""
    sys_fd = 2
    saved = os.dup(sys_fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), sys_fd)
        try:
            with warnings.catch_warnings():   # pyopencl's notes on a successful build
                warnings.simplefilter("ignore", cl.CompilerWarning)
                return program.build(_probe.build_options(cl, context.devices))
        except cl.Error as error:
            sink.seek(0)
            printed = sink.read().decode(errors="replace").strip()
            raise _BuildFailed(str(error) + ("\n" + printed if printed else "")) from None
        finally:
            os.dup2(saved, sys_fd)
            os.close(saved)


class _BuildFailed(Exception):
    pass
