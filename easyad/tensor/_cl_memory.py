"""Device memory of the OpenCL backend: buffers from the backend's pool (an array of a
shape seen before is a copy of a template's state, not a constructor call), reshapes as
views, host transfers, and data movement (strided copies with their layout worked out
once per view, take and scatter_add with small index arrays uploaded once). A mixin of
``OpenCLBackend`` (``_opencl.py``): what a buffer is, apart from what kernels compute.
"""
from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import pyopencl.array as cl_array

from easyad.errors import DeviceError
from easyad.tensor import _kernels as kernels
from easyad.tensor._cl_errors import _device_errors
from easyad.tensor._shapes import contiguous_strides

_LONG = np.int64
_STORAGE = {np.dtype(np.bool_): np.dtype(np.uint8)}   # OpenCL buffers hold bools as uchar
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


@_device_errors
class DeviceMemory:
    """Buffers and data movement of ``OpenCLBackend`` (see the module docstring); its public
    methods are guarded as the backend's are (``_device_errors``)."""

    # no OpenCL call in them, so no guard layer (its cost is most of a reshape's)
    _unguarded = ("reshape", "owns")

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
