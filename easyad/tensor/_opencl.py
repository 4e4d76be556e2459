"""The OpenCL backend: tensors as pyopencl arrays on one device, kernels from ``_kernels``.

Every buffer is C-contiguous (reshape is a view; transposes and slices are strided copies).
Kernels are compiled once per (device, source) and cached here; pyopencl and PoCL also
keep compiled binaries on disk, so a new process pays little. The host cost of an eager
operation is kept near a bare pyopencl launch: sources are rendered once per arguments
(``_kernels._memo``), an array of a shape seen before is a copy of a template's state with
a buffer from the pool (no constructor), a reshape is such a copy with the new shape (not
pyopencl's reshape, which validates through numpy), a strided copy's kernel and layout are
worked out once per view, and cross_entropy is two kernels of its own. One in-order queue per
device. Allocations are counted (``live_buffers``) so tests can see that clearing a
WengertList releases what its nodes held. An elementwise operation costs the host little
(``PreparedMap``: what a launch needs is worked out once per call signature) and never
waits for the device; only reading values to the host does.

No pyopencl exception leaves this module: every public method turns one into a DeviceError
naming the device, the operation and the fix (``_device_errors``). The tensor layer calls
the backend before it appends a tape entry, so a failed operation records nothing.
"""
from __future__ import annotations

import functools
import inspect
import math
import os
import tempfile
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyopencl as cl
import pyopencl.array as cl_array

from easyad.errors import DeviceError, KernelFallbackWarning
from easyad.tensor import _kernels as kernels
from easyad.tensor import _probe
from easyad.tensor._buffers import LiveBuffers
from easyad.tensor._composed import ComposedKernels
from easyad.tensor._shapes import contiguous_strides

# pyopencl's Array constructor takes private keywords (_fast, _size, _context, _queue) that
# skip its checks; a pyopencl without them gets the public constructor (slower, same array)
_FAST_CONSTRUCTOR = all(k in inspect.signature(cl_array.Array.__init__).parameters
                        for k in ("_fast", "_size", "_context", "_queue"))
# an Array whose state is its instance dict (pyopencl's, as of 2025) can be made without
# its constructor, as a copy of a template's dict (``OpenCLBackend._new_array``, ``reshape``)
_PLAIN_STATE = "__slots__" not in vars(cl_array.Array)
_ARRAY_STATE = frozenset({"base_data", "events", "shape", "strides", "size", "nbytes",
                          "offset", "dtype", "_flags"})
_new_object = object.__new__

_LONG = np.int64
_STORAGE = {np.dtype(np.bool_): np.dtype(np.uint8)}   # OpenCL buffers hold bools as uchar
_CACHED_INDEX = 4096         # index arrays up to this size are uploaded once (_index_buffer)


def _collapse(shape: tuple[int, ...], strides_list: list[tuple[int, ...]]
              ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge neighbours every stride list walks contiguously, so the
    kernels' index arithmetic runs over as few dims as possible."""
    dims = [d for d, n in enumerate(shape) if n != 1]
    out_shape = [shape[d] for d in dims]
    out_strides = [[s[d] for d in dims] for s in strides_list]
    d = len(out_shape) - 1
    while d > 0:
        if all(s[d - 1] == s[d] * out_shape[d] for s in out_strides):
            out_shape[d - 1] *= out_shape[d]
            del out_shape[d]
            for s in out_strides:
                s[d - 1] = s[d]
                del s[d]
        d -= 1
    return tuple(out_shape), [tuple(s) for s in out_strides]


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


def _device_errors(cls: type) -> type:
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


def _itself(backend: Any) -> Any:
    return backend


def _quiet_build(program: Any) -> Any:
    """``program.build()`` with the driver's own stderr output (PoCL's clang prints "1
    warning generated." there) captured: shown only inside the error when the build fails."""
    sys_fd = 2
    saved = os.dup(sys_fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), sys_fd)
        try:
            with warnings.catch_warnings():   # pyopencl's notes on a successful build
                warnings.simplefilter("ignore", cl.CompilerWarning)
                return program.build()
        except cl.Error as error:
            sink.seek(0)
            printed = sink.read().decode(errors="replace").strip()
            raise _BuildFailed(str(error) + ("\n" + printed if printed else "")) from None
        finally:
            os.dup2(saved, sys_fd)
            os.close(saved)


class _BuildFailed(Exception):
    pass


class DeviceArray(cl_array.Array):
    """A backend's buffer: pyopencl's Array, whose ``+`` of a buffer of the same backend,
    shape and float dtype (the backward sweep accumulating an adjoint, ``previous + c``)
    runs the backend's prepared add kernel instead of pyopencl's generic one (a third of
    its host cost, and the sum is counted in ``live_buffers``). Each backend has its own
    subclass (``OpenCLBackend.array_class``), whose ``add`` is that kernel."""

    add: PreparedMap

    def __add__(self, other: Any) -> Any:
        if (type(other) is type(self) and other.shape == self.shape
                and other.dtype == self.dtype and self.dtype.kind == "f"):
            return self.add((self, other), self.shape, (self.dtype,))[0]
        return super().__add__(other)


# a float operand in a call signature: a sentinel, as None would compare equal to a dtype
# (np.dtype(None) is float64)
_SCALAR = object()


class PreparedMap:
    """One elementwise kernel family (a label and its expressions over ``names``), the
    backend's ``prepared_map``: calling it with ``(args, shape, dtypes)`` launches it.

    What a launch needs apart from the data is worked out once per call signature (per
    operand: a float, or a buffer's dtype and whether it has the output's shape, is 0-d
    or broadcasts, with the shapes where it broadcasts; the output dtypes): the compiled
    kernel with its scalar argument dtypes set, the output storage dtypes and the dims
    and strides of a broadcast. A call then computes that signature, allocates the
    outputs, sets the arguments and enqueues: it never waits for the device.
    """

    __slots__ = ("backend", "label", "exprs", "names", "operation", "_signatures")

    # signatures kept per family: enough for the shapes of a program's broadcasts; past
    # it (shapes that keep changing) all are dropped and prepared again when met again
    MAX_SIGNATURES = 256

    def __init__(self, backend: OpenCLBackend, label: str, exprs: tuple[str, ...],
                 names: tuple[str, ...]) -> None:
        self.backend, self.label, self.exprs, self.names = backend, label, exprs, names
        self._signatures: dict[tuple[Any, ...], tuple[Any, tuple[np.dtype, ...],
                                                    tuple[int, ...]]] = {}
        self.operation = f"map ({label})"   # what a DeviceError names

    def _launch(self, args: tuple[Any, ...], shape: tuple[int, ...],
                dtypes: tuple[Any, ...]) -> list[Any]:
        # the signature and the kernel's operand arguments in one pass over the operands
        signature: list[Any] = [dtypes]
        operand_args: list[Any] = []
        broadcast = False
        for v in args:
            if isinstance(v, float):
                signature.append(_SCALAR)
                operand_args.append(v)
                continue
            vshape = v.shape
            if vshape == shape:
                signature.append(v.dtype)
            else:
                signature.append((v.dtype, vshape))
                broadcast = broadcast or vshape != ()
            operand_args.append(v.data)
        if broadcast:
            signature.append(shape)
        key = tuple(signature)
        launch = self._signatures.get(key)
        if launch is None:
            launch = self._prepare(key, args, shape, dtypes)
        kernel, storages, layout = launch
        backend = self.backend
        n = math.prod(shape)
        outs = [backend._new_array(shape, storage, n) for storage in storages]
        if n:
            group = backend.group
            # (new arrays have no offset: their buffers as they are, not through .data)
            kernel.set_args(*[o.base_data for o in outs], *operand_args, n, *layout)
            _enqueue(backend.queue, kernel, (-(-n // group) * group,), (group,))
        return outs

    def _prepare(self, key: tuple[Any, ...], args: tuple[Any, ...],
                 shape: tuple[int, ...], dtypes: tuple[Any, ...]
                 ) -> tuple[Any, tuple[np.dtype, ...], tuple[int, ...]]:
        """The launch of signature ``key`` (made from ``args``, ``shape`` and ``dtypes``):
        its kernel, output storage dtypes and layout arguments (dims, then each strided
        operand's strides). Depends on nothing the signature leaves out."""
        backend = self.backend
        out_dtypes = [np.dtype(d) for d in dtypes]
        storages = tuple(backend._storage(d) for d in out_dtypes)
        floats = [d for d in out_dtypes if d.kind == "f"] or [
            np.dtype(v.dtype) for v in args
            if not isinstance(v, float) and np.dtype(v.dtype).kind == "f"]
        real_dtype = np.result_type(*floats) if floats else np.dtype(np.float64)
        real = kernels.c_type(real_dtype)
        out_strides = contiguous_strides(shape)
        broadcast_names, stride_lists = [], []
        for name, v in zip(self.names, args):
            if isinstance(v, float) or v.shape in ((), shape):
                continue
            vshape = v.shape
            lead = len(shape) - len(vshape)
            own = contiguous_strides(vshape)
            stride_lists.append(tuple(0 if d < lead or vshape[d - lead] == 1 and shape[d] != 1
                                      else own[d - lead] for d in range(len(shape))))
            broadcast_names.append(name)
        dims, collapsed = _collapse(shape, [out_strides] + stride_lists)
        strided = {n: s for n, s in zip(broadcast_names, collapsed[1:]) if s != collapsed[0]}
        ndim = len(dims) if strided else 0
        spec: list[tuple[str, str, str]] = []
        scalar_dtypes: list[Any] = [None] * len(storages)
        for name, v in zip(self.names, args):
            if isinstance(v, float):
                spec.append((name, "scalar", real))
                scalar_dtypes.append(real_dtype)
                continue
            # a 0-d buffer ("first"): every work-item reads its one element on the device
            # (no read back to the host; a bool stays a bool, as a condition must)
            kind = ("same" if v.shape == shape else "first" if v.shape == ()
                    else "strided" if name in strided else "same")
            spec.append((name, kind, kernels.c_type(v.dtype)))
            scalar_dtypes.append(None)
        scalar_dtypes.append(_LONG)
        layout: list[int] = []
        if ndim:
            layout += dims
            for name, kind, _ in spec:
                if kind == "strided":
                    layout += strided[name]
        scalar_dtypes += [_LONG] * len(layout)
        out_ctypes = tuple(kernels.c_type(d) for d in out_dtypes)
        source = kernels.render_map(self.label, self.exprs, tuple(spec), out_ctypes, ndim,
                                    real)
        kernel = backend.kernel(source, f"easyad_{self.label}", scalar_dtypes)
        if len(self._signatures) >= self.MAX_SIGNATURES:
            self._signatures.clear()
        launch = self._signatures[key] = (kernel, storages, tuple(layout))
        return launch

    __call__ = _guarded(_launch, lambda prepared: prepared.backend,
                        lambda prepared, args: prepared.operation)


_enqueue = cl.enqueue_nd_range_kernel

# cross_entropy's fused kernel runs as one work-group: while each work-item's rows hold
# up to this many logits (a few microseconds on a GPU; batch 4096 of 10 classes is 160);
# more take the composed kernels, spread over the device
_CE_FUSED_WORK = 4096


class _CrossEntropySaved:
    """What the fused cross_entropy keeps for its vjp: the logits, each row's shift m and
    sum s of exp(z - m), and the targets on the device."""

    __slots__ = ("z", "m", "s", "idx")

    def __init__(self, z: Any, m: Any, s: Any, idx: Any) -> None:
        self.z, self.m, self.s, self.idx = z, m, s, idx


@_device_errors
class OpenCLBackend(LiveBuffers, ComposedKernels):
    """Tensor storage and kernels on one OpenCL device (the fused cross_entropy composed of
    its primitives, ``_composed.py``)."""

    kind = "opencl"
    # no OpenCL call in them, so no guard layer (its cost is most of a reshape's)
    _unguarded = ("reshape", "owns")
    lazy_numbers = True      # a read waits for the queue: numbers are read when first used
    _busy = False     # an operation is running: inner ones leave errors to it (_guarded)
    _plain = False    # arrays' state is a plain dict: copied to make views (_first_array)

    def __init__(self, device: Any) -> None:
        self.device = device
        self.context = cl.Context([device._handle])
        self.queue = cl.CommandQueue(self.context)
        self._indices: dict[Any, Any] = {}        # see _index_buffer
        self.group = min(256, device._handle.max_work_group_size)
        self.fp64 = bool(device._handle.double_fp_config)
        self._programs: dict[str, Any] = {}
        self._kernels: dict[Any, Any] = {}
        self._maps: dict[tuple[Any, ...], PreparedMap] = {}
        self._reductions: dict[tuple[str, Any], Any] = {}
        self.compiles = 0
        self._templates: dict[tuple[Any, ...], dict[str, Any]] = {}   # see _new_array
        self._strides: dict[tuple[Any, ...], tuple[int, ...]] = {}    # see _byte_strides
        self._copies: dict[tuple[Any, ...], tuple[Any, tuple[int, ...]]] = {}
        # buffers come from a pool: a freed buffer is reused by the next allocation of its
        # size class instead of new device memory being mapped (and faulted in) each time
        from pyopencl.tools import ImmediateAllocator, MemoryPool
        self.pool = MemoryPool(ImmediateAllocator(self.queue))
        self.array_class = type("DeviceArray", (DeviceArray,), {
            "add": self.prepared_map("add", ("x + y",), ("x", "y"))})

    # -- compiling --
    def kernel(self, source: str, name: str, scalar_dtypes: list[Any]) -> Any:
        """Kernel ``name`` of ``source``, compiled once per source."""
        key = (source, name)
        k = self._kernels.get(key)
        if k is None:
            program = self._programs.get(source)
            if program is None:
                try:
                    program = _quiet_build(cl.Program(self.context, source))
                except _BuildFailed as failure:
                    raise DeviceError(
                        f"building the OpenCL kernel {name} for device {self.device.name} "
                        f"({self.device.description}) failed: "
                        f"{_probe.first_log_line(str(failure))}. Fix: {_probe.FIX_BUILD}",
                        device=self.device, operation=name) from None
                self._programs[source] = program
                self.compiles += 1
            k = getattr(program, name)
            k.set_scalar_arg_dtypes(scalar_dtypes)
            self._kernels[key] = k
        return k

    def launch(self, k: Any, n: int, *args: Any) -> None:
        if n == 0:
            return
        global_size = -(-n // self.group) * self.group
        k(self.queue, (global_size,), (self.group,), *args)

    # -- buffers --
    def _storage(self, dtype: Any) -> np.dtype:
        """The dtype a buffer of ``dtype`` holds (bools as uchar); DeviceError for float64 on
        a device without it."""
        dtype = np.dtype(dtype)
        dtype = _STORAGE.get(dtype, dtype)
        if dtype == np.float64 and not self.device.fp64:
            raise DeviceError(f"device {self.device.name} ({self.device.description}) cannot "
                              f"run float64 kernels ({self.device.problem}). Fix: "
                              f"{self.device.fix}", device=self.device, operation="allocate")
        return dtype

    def _empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._new_array(shape, self._storage(dtype), math.prod(shape))

    def _byte_strides(self, shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
        """The C-contiguous strides in bytes of ``shape`` (kept per shape)."""
        key = (shape, itemsize)
        strides = self._strides.get(key)
        if strides is None:
            if len(self._strides) >= 4096:
                self._strides.clear()
            strides = self._strides[key] = tuple(
                step * itemsize for step in contiguous_strides(shape))
        return strides

    def _new_array(self, shape: tuple[int, ...], storage: np.dtype, size: int) -> Any:
        """A new C-contiguous array of ``size`` elements of ``storage`` (checked by
        ``_storage``) from the pool. The first of a shape and storage comes from pyopencl's
        fast constructor; the rest are copies of its state with their own buffer (a
        constructor call, even the fast one, was a third of an eager operation's host
        time)."""
        template = self._templates.get((shape, storage))
        if template is None:
            return self._first_array(shape, storage, size)
        a = _new_object(self.array_class)
        a.__dict__ = state = template.copy()
        if size:
            state["base_data"] = self.pool(state["nbytes"])
        state["events"] = []
        return self._track(a) if self.tracking else a

    def _first_array(self, shape: tuple[int, ...], storage: np.dtype, size: int) -> Any:
        """``_new_array`` by a constructor, keeping its state as the template of its shape
        and storage where the array's state is a plain dict."""
        if _FAST_CONSTRUCTOR:
            strides = self._byte_strides(shape, storage.itemsize)
            a = self.array_class(None, shape, storage, allocator=self.pool, strides=strides,
                                 _fast=True, _size=size, _context=self.context,
                                 _queue=self.queue)
        else:
            a = self.array_class(self.queue, shape, storage, allocator=self.pool)
        state = getattr(a, "__dict__", None)
        if _PLAIN_STATE and state is not None and _ARRAY_STATE <= state.keys():
            self._plain = True
            if len(self._templates) >= 1024:     # shapes that keep changing
                self._templates.clear()
            self._templates[shape, storage] = {**state, "base_data": None, "events": None,
                                               "_flags": None}
        return self._track(a)

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised buffer (for callers that fill it with their own kernels)."""
        return self._empty(shape, dtype)

    def asarray(self, array: Any, dtype: Any) -> Any:
        host = np.ascontiguousarray(np.asarray(array).astype(
            _STORAGE.get(np.dtype(dtype), dtype), copy=False))
        a = self._empty(host.shape, dtype)
        if host.size:
            a.set(host)
        return a

    def owns(self, obj: Any) -> bool:
        """Whether ``obj`` is a float buffer of this backend's context (made by it)."""
        return isinstance(obj, cl_array.Array) and obj.context == self.context and \
            obj.dtype in (np.float64, np.float32)

    def to_numpy(self, buf: Any) -> np.ndarray:
        if buf.size == 0:
            return np.empty(buf.shape, dtype=buf.dtype)
        host: np.ndarray = buf.get()
        return host

    def host_array(self, buf: Any) -> np.ndarray:
        return self.to_numpy(buf)

    def full(self, shape: tuple[int, ...], value: float, dtype: Any) -> Any:
        a = self._empty(shape, dtype)
        if a.size:
            a.fill(value)
        return a

    def reshape(self, buf: Any, shape: tuple[int, ...]) -> Any:
        """A view of ``buf`` (C-contiguous, as the backend's buffers are) in ``shape``: a
        copy of its state with the new shape and strides, where pyopencl's reshape works
        the strides out in Python and validates through numpy (several microseconds)."""
        shape = tuple(shape)
        if buf.shape == shape:
            return buf
        itemsize = buf.dtype.itemsize
        # an array of this backend's class, whose state _first_array found a plain dict
        if (not self._plain or type(buf) is not self.array_class or buf.offset
                or math.prod(shape) != buf.size or min(shape, default=0) < 0
                or buf.strides != self._byte_strides(buf.shape, itemsize)):
            return buf.reshape(shape)        # pyopencl's checks and errors
        view = _new_object(type(buf))
        view.__dict__ = state = buf.__dict__.copy()
        state["shape"], state["strides"] = shape, self._byte_strides(shape, itemsize)
        state["_flags"] = None
        return view

    # -- elementwise --
    def prepared_map(self, label: str, exprs: tuple[str, ...], names: tuple[str, ...]
                     ) -> PreparedMap:
        key = (label, exprs, names)
        prepared = self._maps.get(key)
        if prepared is None:
            prepared = self._maps[key] = PreparedMap(self, label, exprs, names)
        return prepared

    def map(self, label: str, exprs: tuple[str, ...], operands: Mapping[str, Any],
            shape: tuple[int, ...], dtypes: tuple[Any, ...]) -> list[Any]:
        return self.prepared_map(label, exprs, tuple(operands))(
            tuple(operands.values()), shape, dtypes)

    # -- reductions --
    def reduce(self, op: str, buf: Any, axes: tuple[int, ...]) -> Any:
        shape = buf.shape
        out_shape = tuple(n for d, n in enumerate(shape) if d not in axes)
        if not axes:
            return self.map("copy", ("x",), {"x": buf}, shape, (buf.dtype,))[0]
        first, last = axes[0], axes[-1]
        if list(axes) != list(range(first, last + 1)):   # bring the axes together
            rest = [d for d in range(len(shape)) if d not in axes]
            perm = tuple(rest[:1] + list(axes) + rest[1:]) if rest else tuple(axes)
            buf = self.strided(buf, 0, tuple(shape[p] for p in perm),
                               tuple(contiguous_strides(shape)[p] for p in perm))
            shape = buf.shape
            first = 1 if rest else 0
            last = first + len(axes) - 1
        outer = math.prod(shape[:first])
        K = math.prod(shape[first:last + 1])
        inner = math.prod(shape[last + 1:])
        if K == 0:
            value = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
            return self.full(out_shape, value, buf.dtype)
        storage = buf.dtype
        k = self._reductions.get((op, storage))
        if k is None:
            k = self._reductions[op, storage] = self.kernel(
                kernels.render_reduce(op, kernels.c_type(storage)), f"easyad_reduce_{op}",
                [None, None, *[_LONG] * 5])
        target = 4096 if self.device.is_gpu else 64   # work-items worth launching
        src = buf
        while True:
            rows = outer * inner
            C = 1 if rows >= target or K <= 64 else min(-(-target // rows), -(-K // 64))
            chunk = -(-K // C)
            total = outer * C * inner
            # the last pass writes the result in its own shape (no reshape afterwards)
            out = self._new_array(out_shape if C == 1 else (total,), storage, total)
            self.launch(k, total, out.data, src.data, K, inner, chunk, C, total)
            if C == 1:
                return out
            src, K = out, C

    # -- cross_entropy: two kernels of its own (the composed one is twelve launches) --
    def cross_entropy(self, z: Any, target: np.ndarray, divisor: float) -> tuple[Any, Any]:
        n, c = z.shape
        storage = z.dtype
        forward, group = self._ce_kernels(storage)[0]
        if not n or not c or -(-n // group) * c > _CE_FUSED_WORK:
            # one work-group would take too long: the composed kernels spread it out
            return ComposedKernels.cross_entropy(self, z, target, divisor)
        loss = self._new_array((), storage, 1)
        m = self._new_array((n,), storage, n)
        s = self._new_array((n,), storage, n)
        idx = self._index_buffer(target)
        forward(self.queue, (group,), (group,), loss.data, m.data, s.data, z.data, idx.data,
                n, c, divisor, cl.LocalMemory(group * storage.itemsize))
        return loss, _CrossEntropySaved(z, m, s, idx)

    def cross_entropy_vjp(self, saved: Any, target: np.ndarray, scale: float) -> Any:
        if not isinstance(saved, _CrossEntropySaved):
            return ComposedKernels.cross_entropy_vjp(self, saved, target, scale)
        z = saved.z
        n, c = z.shape
        out = self._new_array((n, c), z.dtype, n * c)
        self.launch(self._ce_kernels(z.dtype)[1], n * c, out.data, z.data, saved.m.data,
                    saved.s.data, saved.idx.data, n * c, c, scale)
        return out

    def _ce_kernels(self, storage: np.dtype) -> tuple[tuple[Any, int], Any]:
        """((forward kernel, its work-group size: a power of two), vjp kernel) for
        ``storage`` (render_cross_entropy)."""
        key = ("cross_entropy", storage)
        found = self._reductions.get(key)
        if found is None:
            source = kernels.render_cross_entropy(kernels.c_type(storage))
            forward = self.kernel(source, "easyad_ce_forward",
                                  [None] * 5 + [_LONG, _LONG, storage, None])
            limit = min(self.group, forward.get_work_group_info(
                cl.kernel_work_group_info.WORK_GROUP_SIZE, self.device._handle))
            group = 1 << (max(1, limit).bit_length() - 1)
            vjp = self.kernel(source, "easyad_ce_vjp", [None] * 5 + [_LONG, _LONG, storage])
            found = self._reductions[key] = ((forward, group), vjp)
        return found

    # -- matmul --
    def _transpose3(self, buf: Any) -> Any:
        b, r, c = buf.shape
        return self.strided(buf, 0, (b, c, r), (r * c, 1, c))

    # Which matmul kernel: "new" (render_gemm: reads transposed operands in place),
    # "tiled" (the old render_matmul, transposes copied first) or "nt" (render_matmul_nt, the
    # CPU kernel); None: $EASYAD_OPENCL_GEMM, else "new" on GPUs and "nt" elsewhere. An
    # attribute so that a benchmark can compare them in one process. "new" at every size
    # on GPUs: a small product costs its launches, and it has one where "tiled" has a copy
    # of each transposed operand too (and its thin tiles waste less on a 10-wide side).
    gemm: str | None = None

    def matmul(self, a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False
               ) -> Any:
        """(B|1, M, K) @ (B|1, K, N) -> (B, M, N), float64 or float32; with
        ``transpose_a`` a is given as (B|1, K, M), with ``transpose_b`` b as (B|1, N, K)."""
        ba, M, K = (a.shape[0], a.shape[2], a.shape[1]) if transpose_a else a.shape
        bb = b.shape[0]
        N = b.shape[1] if transpose_b else b.shape[2]
        batch = max(ba, bb)
        if batch * M * N == 0:
            return self._empty((batch, M, N), a.dtype)
        if K == 0:
            return self.full((batch, M, N), 0.0, a.dtype)
        real = kernels.c_type(a.dtype)
        choice = self.gemm or os.environ.get("EASYAD_OPENCL_GEMM") or (
            "new" if self.device.is_gpu else "nt")
        if choice == "new":
            return self._gemm(a, b, transpose_a, transpose_b, (batch, M, N, K),
                              (ba > 1, bb > 1))
        if choice not in ("nt", "tiled"):
            raise ValueError(f"EASYAD_OPENCL_GEMM (or the backend's gemm) is {choice!r}: "
                             "expected 'new', 'tiled' or 'nt'")
        if transpose_a:
            a = self._transpose3(a)
        out = self._empty((batch, M, N), a.dtype)
        if choice == "nt":
            # C = A (B^T)^T with both operands read along K (see _kernels)
            bt = b if transpose_b else self._transpose3(b)
            # 32-byte vectors (AVX2): a wider vector than the CPU has makes PoCL build the
            # program without the kernel (and abort at exit), and PoCL's LLVM may not know
            # a CPU has AVX-512 (it builds Zen 4 as Zen 3)
            k = self.kernel(kernels.render_matmul_nt(real, 32), "easyad_matmul_nt",
                            [None, None, None, np.int32, np.int32, np.int32, _LONG, _LONG])
            blk = kernels.MATMUL_NT_BLOCK
            group = kernels.MATMUL_NT_GROUP
            items = (-(-N // blk["RN"]), -(-M // blk["RM"]))
            global_size = (-(-items[0] // group[0]) * group[0],
                           -(-items[1] // group[1]) * group[1], batch)
            k(self.queue, global_size, (group[0], group[1], 1), out.data, a.data, bt.data,
              M, N, K, M * K if ba > 1 else 0, K * N if bb > 1 else 0)
            return out
        if transpose_b:
            b = self._transpose3(b)
        k = self.kernel(kernels.render_matmul(real), "easyad_matmul",
                        [None, None, None, np.int32, np.int32, np.int32, _LONG, _LONG])
        t = kernels.MATMUL_TILE
        local = (t["TN"] // t["WN"], t["TM"] // t["WM"], 1)
        global_size = (-(-N // t["TN"]) * local[0], -(-M // t["TM"]) * local[1], batch)
        k(self.queue, global_size, local, out.data, a.data, b.data, M, N, K,
          M * K if ba > 1 else 0, K * N if bb > 1 else 0)
        return out

    def _gemm(self, a: Any, b: Any, ta: bool, tb: bool, dims: tuple[int, int, int, int],
              batched: tuple[bool, bool], config: str | None = None,
              split: int | None = None) -> Any:
        """render_gemm's product; ``config`` and ``split`` override kernels.gemm_plan's
        choice (tests). The launch is planned once per shape and layout: rendering the
        source to look its kernel up would cost more host time than the launch."""
        key = (a.dtype, ta, tb, dims, config, split)
        cache = self.__dict__.setdefault("_gemm_plans", {})
        plan = cache.get(key)
        if plan is None:
            if len(cache) > 1024:       # shapes that keep changing: don't grow forever
                cache.clear()
            plan = cache[key] = self._plan_gemm(a.dtype, ta, tb, dims, config, split)
        k, global_size, local, ks, slices = plan
        batch, M, N, K = dims
        size = batch * M * N
        out = self._empty((batch, M, N) if slices == 1 else (slices, size), a.dtype)
        k(self.queue, global_size, local, out.data, a.data, b.data, M, N, K,
          M * K if batched[0] else 0, K * N if batched[1] else 0, ks, slices, batch)
        if slices == 1:
            return out
        return self.reshape(self.reduce("sum", out, (0,)), (batch, M, N))

    def _plan_gemm(self, dtype: Any, ta: bool, tb: bool, dims: tuple[int, int, int, int],
                   config: str | None, split: int | None) -> tuple[Any, ...]:
        batch, M, N, K = dims
        real = kernels.c_type(dtype)
        name, slices = kernels.gemm_plan(real, batch, M, N, K,
                                         int(self.device._handle.max_compute_units))
        name, slices = config or name, split or slices
        cfg = kernels.GEMM_CONFIGS[real][name]
        # whole slabs per slice, and no empty slice
        ks = -(-K // slices)
        ks = -(-ks // cfg["BK"]) * cfg["BK"]
        slices = -(-K // ks)
        k = self.kernel(kernels.render_gemm(real, cfg, ta, tb, slices > 1), "easyad_gemm",
                        [None, None, None, np.int32, np.int32, np.int32, _LONG, _LONG,
                         np.int32, np.int32, _LONG])
        tx, ty = kernels.gemm_group(cfg)
        global_size = (-(-N // cfg["BN"]) * tx, -(-M // cfg["BM"]) * ty, batch * slices)
        return k, global_size, (tx, ty, 1), ks, slices

    # -- data movement --
    def _strided_copy(self, dst: Any, src: Any, offset: int, shape: tuple[int, ...],
                      strides: tuple[int, ...], scatter: bool) -> None:
        n = math.prod(shape)
        if n == 0:
            return
        # the kernel and collapsed layout of a view, worked out once per view and dtype
        key = (tuple(shape), tuple(strides), src.dtype, scatter)
        found = self._copies.get(key)
        if found is None:
            dims, (st,) = _collapse(tuple(shape), [tuple(strides)])
            ctype = kernels.c_type(_STORAGE.get(np.dtype(src.dtype), np.dtype(src.dtype)))
            ndim = len(dims)
            k = self.kernel(kernels.render_strided(ctype, ndim, scatter),
                            "easyad_scatter" if scatter else "easyad_gather",
                            [None, None, *[_LONG] * (2 + 2 * ndim)])
            if len(self._copies) >= 1024:
                self._copies.clear()
            found = self._copies[key] = (k, (*dims, *st))
        k, layout = found
        self.launch(k, n, dst.data, src.data, offset, n, *layout)

    def op(self, op: Any, params: Any, bufs: list[Any], shape: tuple[int, ...],
           dtype: Any) -> Any:
        """An op of the op table (``easyad.ops``): its OpenCL kernel, else its composite of
        this backend's primitives, else its numpy lowering on host copies."""
        return op.lower(self, params, bufs, shape, dtype)

    def proven_op(self, op: Any, dtype: Any) -> bool:
        """Whether ``op``'s OpenCL kernel passed its proof on this device, in a child
        process (``_proofs``); one that did not runs on the host, with one warning."""
        real = "double" if np.dtype(dtype) == np.float64 else "float"
        known = self.__dict__.setdefault("_proven_ops", {})
        key = (op.name, real)
        if key not in known:
            from easyad.tensor import _proofs
            kind = _proofs.op_kind(op, real)
            verdict = _proofs.verdicts(self.device._handle, [kind])[kind]
            known[key] = verdict["ok"]
            if not verdict["ok"]:
                warnings.warn(KernelFallbackWarning(
                    f"OpenCL device {self.device.name}: the kernel of op {op.name!r} "
                    f"({real}) failed its proof ({verdict['problem']}); it runs on the "
                    f"host (numpy) instead"), stacklevel=_proofs.caller_stacklevel())
        return known[key]

    def strided(self, buf: Any, offset: int, shape: tuple[int, ...],
                strides: tuple[int, ...]) -> Any:
        out = self._empty(shape, buf.dtype)
        self._strided_copy(out, buf, offset, shape, strides, scatter=False)
        return out

    def assemble(self, shape: tuple[int, ...], dtype: Any, parts: Any) -> Any:
        out = self.full(shape, 0.0, dtype)
        for offset, part_shape, strides, src in parts:
            if src.shape != tuple(part_shape):
                src = self.map("broadcast", ("g",), {"g": src}, tuple(part_shape),
                               (src.dtype,))[0]
            self._strided_copy(out, src, offset, part_shape, strides, scatter=True)
        return out

    def _index_kernel(self, dtype: Any, name: str) -> Any:
        ctype = kernels.c_type(_STORAGE.get(np.dtype(dtype), np.dtype(dtype)))
        return self.kernel(kernels.render_take(ctype), name, [None, None, None, _LONG])

    def _index_buffer(self, index: np.ndarray) -> Any:
        """``index`` as int64 on the device. Small index arrays (a batch's class labels in
        cross_entropy, made anew each step with the same values) are uploaded once: the
        last few are kept by their bytes."""
        host = np.ascontiguousarray(index, dtype=np.int64)
        if host.size > _CACHED_INDEX:
            return cl_array.to_device(self.queue, host)
        key = (host.shape, host.tobytes())
        found = self._indices.pop(key, None)
        if found is None:
            found = cl_array.to_device(self.queue, host)
            if len(self._indices) >= 8:
                self._indices.pop(next(iter(self._indices)))
        self._indices[key] = found          # most recently used last
        return found

    def take(self, buf: Any, index: np.ndarray) -> Any:
        out = self._empty(index.shape, buf.dtype)
        idx = self._index_buffer(index) if index.size else None
        self.launch(self._index_kernel(buf.dtype, "easyad_take"), index.size, out.data,
                    buf.data, idx.data if idx is not None else None, index.size)
        return out

    def scatter_add(self, shape: tuple[int, ...], dtype: Any, index: np.ndarray, g: Any,
                    unique: bool = False) -> Any:
        if g.shape != index.shape:
            g = self.map("broadcast", ("g",), {"g": g}, index.shape, (dtype,))[0]
        if not unique:   # repeated indices add up: on the host (no float atomics in CL 1.2)
            out = np.zeros(math.prod(shape), dtype=dtype)
            np.add.at(out, index.reshape(-1), self.to_numpy(g).reshape(-1))
            return self.asarray(out.reshape(shape), dtype)
        out = self.full(shape, 0.0, dtype)
        if index.size:
            idx = self._index_buffer(index)
            self.launch(self._index_kernel(dtype, "easyad_put"), index.size, out.data,
                        g.data, idx.data, index.size)
        return out
