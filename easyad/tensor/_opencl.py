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
naming the device, the operation and the fix (``_device_errors``, ``_cl_errors.py``). The
tensor layer calls the backend before it appends a tape entry, so a failed operation
records nothing.

This module holds the backend class with its compiling, elementwise (``PreparedMap``),
reduction and cross-entropy kernels; its buffers and data movement are the mixin
``_cl_memory.DeviceMemory``, its matrix products ``_cl_matmul.Matmul``.
"""
from __future__ import annotations

import math
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
from easyad.tensor._cl_errors import _BuildFailed, _device_errors, _guarded, _quiet_build
from easyad.tensor._cl_errors import _translate  # noqa: F401  (compiler/program reads it here)
from easyad.tensor._cl_matmul import Matmul
from easyad.tensor._cl_memory import _LONG, DeviceMemory, _collapse
from easyad.tensor._composed import ComposedKernels
from easyad.tensor._interpreters import EVALUATE
from easyad.tensor._shapes import contiguous_strides


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

    def __float__(self) -> float:
        # a one-element buffer as a number: the sweep adds a table op's contribution to a
        # scalar input (det's output reshaped to a matrix, in a second-order sweep) as a
        # float, as it does a 0-d numpy array
        if self.size != 1:
            raise TypeError(f"only a one-element device buffer is a number, not shape "
                            f"{self.shape}")
        return float(self.get().reshape(()))


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
class OpenCLBackend(DeviceMemory, Matmul, LiveBuffers, ComposedKernels):
    """Tensor storage and kernels on one OpenCL device (the fused cross_entropy composed of
    its primitives, ``_composed.py``)."""

    kind = "opencl"
    interpreter = EVALUATE   # operations compute their values now (queued on the device)
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
                    program = _quiet_build(cl.Program(self.context, source), self.context)
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


