"""Recorded tensor programs replayed on an OpenCL device: the plan's schedule as group
kernels (``render_cl``) and backend steps.

- **backend steps** (``_program.step``): matmul and ``linear``, reductions over some axes,
  cross-entropy, scatter-adds with repeated indices, assembles of several parts, host
  calls (array primitives) and the guards (the only reads on the host, besides what the
  backend itself does there).
- **buffers** are planned once: constants and index arrays uploaded once, values stored
  for later groups in device workspace kept between calls (and the totals only kernels
  read), results new buffers each call. Each group kernel's launch is prepared once
  (``Launch``: the fixed buffers' handles and the sizes), so a call sets only the
  buffers that change (inputs, results, backend steps' results); ``linear`` and
  ``linear_vjp`` steps make their 3-d views with pyopencl's fast constructor.
  The program's kernels are one OpenCL source, built once (the backend caches programs by
  source; PoCL and drivers also cache binaries on disk).
"""
from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad.compiler.program.cstyle import OpenCLDialect
from easyad.compiler.optimiser import optimise_program
from easyad.compiler.program.plan import Plan, stored_slots
from easyad.compiler.program.render_cl import (
    Kernel, OpenCLPlan, finish_group_size, finish_name, render_kernels)
from easyad.compiler.program.vector_cl import fused_width, proven
from easyad.errors import CompilerWarning, DeviceError
from easyad.tensor._program import Instruction, Program, live_instructions, step
from easyad.tensor._shapes import contiguous_strides

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend

# pyopencl's Array constructor with the private keywords that skip its checks (as the
# backend's _new_array uses them): views for _view
try:
    import pyopencl.array as _cl_array
    _FAST_VIEW = all(k in inspect.signature(_cl_array.Array.__init__).parameters
                     for k in ("_fast", "_size", "_context", "_queue"))
except ImportError:     # (no OpenCL here: nothing of this module runs)
    _FAST_VIEW = False


def _items(be: OpenCLBackend, n: int) -> int:
    """The work-items of a kernel that loops over n elements: whole work-groups, enough to
    fill the device (a few per compute unit on a CPU, many on a GPU)."""
    per_unit = 64 if be.device.is_gpu else 4
    groups = min(-(-n // be.group), be.device._handle.max_compute_units * per_unit)
    return int(max(groups, 1) * be.group)


class Launch:
    """A step of ``FusedCLProgram``: a group kernel's launch, prepared once: the kernel
    as rendered (``spec``: its name, parameters, reductions...) and built (``kernel``), its
    argument list with the buffers that stay the same across calls (aux arrays, partials,
    workspace, constants, finished reductions kept there) in place and, at ``slots``, the
    positions filled at each call (inputs, new results, backend steps' results); its
    sizes; the slots zeroed before it; and its reductions' finishing launches."""

    __slots__ = ("spec", "kernel", "n", "global_size", "local_size", "args", "slots", "zero",
                 "finish")

    def __init__(self, spec: Kernel, kernel: Any, global_size: tuple[int, ...],
                 local_size: tuple[int, ...], args: list[Any], slots: list[tuple[int, int]],
                 finish: list[tuple[Any, ...]]) -> None:
        self.spec, self.kernel, self.n = spec, kernel, spec.n
        self.global_size, self.local_size = global_size, local_size
        self.args, self.slots, self.zero, self.finish = args, slots, list(spec.zero), finish


class HostStep:
    """A step of ``FusedCLProgram`` that is not a group kernel: the backend's kernels or
    the host (``_program.step``) for ``instruction``, the reshaped views it reads made
    first (``aliases``: (slot, root, shape))."""

    __slots__ = ("instruction", "run", "aliases", "outs")

    def __init__(self, instruction: Instruction, run: Any,
                 aliases: tuple[tuple[int, int, tuple[int, ...]], ...]) -> None:
        self.instruction, self.run, self.aliases = instruction, run, aliases
        self.outs = instruction.outs


class FusedCLProgram:
    """The plan's schedule on an OpenCL backend: group kernels and backend steps;
    ``run(inputs)`` as ``BoundProgram.run`` (device buffers in, new device buffers out).

    A call costs the host little beyond the backend steps: each group kernel's launch is
    prepared once (``Launch``: its fixed buffers' handles, sizes), a reduction to one
    number is finished by one launch of a generated kernel (``_render_finish``) into a
    buffer kept between calls where no backend step or output sees it, and nothing is read
    back (the guards and backend steps that read values aside)."""

    def __init__(self, plan: Plan, be: OpenCLBackend, on_guard: Any, stored: set[int],
                 kernels: list[list[Kernel]], source: str, real: str, width: int) -> None:
        p = plan.program
        self.plan, self.be, self.source = plan, be, source
        # what the kernels were rendered from (batch_cl renders them again over points)
        self.needed_later, self.real, self.width = stored, real, width
        self.outputs = plan.outputs
        self.inputs = list(p.inputs)
        self._lock = threading.Lock()
        real_dtype = self.real_dtype = np.dtype(np.float64 if real == "double" else np.float32)
        reduced = {plan.r(o) for segment in kernels for k in segment for o, _ in k.reductions}
        made_in_python = {plan.r(o) for kind, item in plan.schedule if kind == "py"
                          for o in item.outs} | reduced
        self.made_in_python = made_in_python
        stored = {s for s in stored if s not in made_in_python and p.dtypes[s] is not None}
        n = len(p.shapes)
        self.base: list[Any] = [None] * n
        for i, v in p.constants.items():
            self.base[i] = v if p.dtypes[i] is None else be.asarray(v, v.dtype)
        self.aux = [be.asarray(a, np.int64) if a.size else be.allocate((1,), np.int64)
                    for a in plan.aux]
        fresh = {plan.r(o) for o in plan.outputs}
        outside = set(p.inputs) | set(p.constants)
        self.fresh = sorted(s for s in stored if s in fresh and s not in outside)
        for s in sorted(s for s in stored if s not in fresh and s not in outside):
            self.base[s] = be.allocate(p.shapes[s], p.dtypes[s])
        # a reduction's total kept in one buffer across calls, where only kernels read it
        # (a backend step's result or an output may be handed on: those are new each call)
        read_in_python = {plan.r(i) for kind, item in plan.schedule if kind == "py"
                          for i in item.ins if type(i) is int}
        kept = {s for s in reduced if s not in fresh and s not in read_in_python}
        varying = set(p.inputs) | set(self.fresh) | (made_in_python - kept)
        self._fresh_results = set(self.fresh) | made_in_python
        self._results = [(plan.r(s), p.shapes[s]) for s in plan.outputs]
        group = be.group
        finish_group = finish_group_size(be)
        self.steps: list[Launch | HostStep] = []
        self._finish_group = (finish_group,)
        segments = iter(kernels)
        for kind, item in plan.schedule:
            if kind == "c":
                for k in next(segments):
                    cl_kernel = be.kernel(source, k.name, [None] * len(k.params) + [np.int64])
                    loops = k.reductions or not be.device.is_gpu
                    items = _items(be, k.n) if loops else None
                    partials = {o: be.allocate((items,), real_dtype) for o, _ in k.reductions} \
                        if items is not None else {}
                    args: list[Any] = []
                    slots: list[tuple[int, int]] = []
                    for kind_, key in k.params:
                        if kind_ == "aux":
                            args.append(self.aux[key].data)
                        elif kind_ == "partial":
                            args.append(partials[key].data)
                        elif key in varying:
                            slots.append((len(args), key))
                            args.append(None)
                        else:       # a constant, workspace or kept total: the same buffer
                            if key in kept and self.base[key] is None:
                                self.base[key] = be.allocate(p.shapes[key], p.dtypes[key])
                            args.append(self.base[key].data)
                    args.append(k.n)
                    size = (items if items is not None else
                            -(-k.n // group) * group)   # a work-item per element
                    finish = []
                    for o, op in k.reductions:
                        ctype = OpenCLDialect.types[p.dtypes[o]]
                        finisher = be.kernel(source, finish_name(op, ctype),
                                             [None, None, np.int64])
                        root = plan.r(o)
                        if root in kept:
                            if self.base[root] is None:
                                self.base[root] = be.allocate(p.shapes[o], p.dtypes[o])
                            out = self.base[root]
                        else:
                            out = None
                        finish.append((finisher, partials[o].data, root, p.shapes[o],
                                       p.dtypes[o], out, items if k.n else 0))
                    self.steps.append(Launch(k, cl_kernel, (size,), (group,), args, slots,
                                             finish))
            else:
                aliases = tuple((i, plan.r(i), p.shapes[i]) for i in item.ins
                                if type(i) is int and plan.r(i) != i)
                run = _linear_step(item, be, p) or step(item, be, on_guard)
                self.steps.append(HostStep(item, run, aliases))

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._lock:
            return self._run(inputs)

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        import pyopencl

        from easyad.tensor._opencl import _translate
        p, be = self.plan.program, self.be
        arrays = list(self.base)
        for s, a in zip(self.inputs, inputs):
            # kernels take whole buffers: a view at an offset (none made today) is copied
            arrays[s] = a.copy() if getattr(a, "offset", 0) else a
        for s in self.fresh:
            arrays[s] = be.allocate(p.shapes[s], p.dtypes[s])
        queue = be.queue
        try:
            for launch in self.steps:
                if type(launch) is Launch:
                    for s in launch.zero:
                        arrays[s].fill(0)
                    if launch.n:
                        args = launch.args.copy()
                        for position, s in launch.slots:
                            args[position] = arrays[s].data
                        launch.kernel(queue, launch.global_size, launch.local_size, *args)
                    for finisher, partial, root, shape, dtype, out, count in launch.finish:
                        if out is None:
                            out = be.allocate(shape, dtype)
                        finisher(queue, self._finish_group, self._finish_group, partial,
                                 out.data, count)
                        arrays[root] = out
                    continue
                for s, root, shape in launch.aliases:
                    arrays[s] = arrays[root].reshape(shape)
                launch.run(arrays)
                for s in launch.outs:
                    a = arrays[s]
                    if getattr(a, "offset", 0):      # kernels take whole buffers
                        arrays[s] = a.copy()
        except pyopencl.Error as error:
            raise _translate(be, "replay of a recorded program", error) from None
        out = []
        fresh = set(self._fresh_results)
        for root, shape in self._results:      # (no needless views)
            a = arrays[root]
            if root not in fresh:        # workspace, an input, a constant: a copy
                a = arrays[root] = a.copy()
                fresh.add(root)
            out.append(a if a.shape == shape else a.reshape(shape))
        return out


def _view(be: OpenCLBackend, buf: Any, shape: tuple[int, ...]) -> Any:
    """``buf`` (C-contiguous, at offset 0) as ``shape``: pyopencl's fast constructor where
    it has one (its ``reshape`` validates, at 3x the host cost), else ``reshape``."""
    if buf.shape == shape:
        return buf
    if not _FAST_VIEW or buf.offset:
        return buf.reshape(shape)
    itemsize = buf.dtype.itemsize
    strides = tuple(n * itemsize for n in contiguous_strides(shape))
    return be.array_class(None, shape, buf.dtype, data=buf.base_data, strides=strides,
                          _fast=True, _size=buf.size, _context=buf.context, _queue=buf.queue)


def _linear_step(ins: Instruction, be: OpenCLBackend, p: Program) -> Any:
    """``linear`` and ``linear_vjp`` as the backend composes them (``_composed``: matmul,
    a bias map, a reduce), with the 3-d views made once each by ``_view``; None for other
    instructions, or where the backend has kernels of its own for them."""
    from easyad.tensor._composed import ComposedKernels
    a, o = ins.ins, ins.outs
    if ins.op == "linear" and type(be).linear is ComposedKernels.linear:
        (n, k), (m, _) = p.shapes[a[0]], p.shapes[a[1]]
        bias = be.prepared_map("linear_bias", ("x + b",), ("x", "b"))
        dtypes = (p.dtypes[a[0]],)

        def run_linear(s: list[Any]) -> None:
            out = _view(be, be.matmul(_view(be, s[a[0]], (1, n, k)),
                                      _view(be, s[a[1]], (1, m, k)), transpose_b=True), (n, m))
            b = s[a[2]] if type(a[2]) is int else a[2]
            s[o[0]] = out if b is None else bias((out, b), (n, m), dtypes)[0]
        return run_linear
    if ins.op == "linear_vjp" and type(be).linear_vjp is ComposedKernels.linear_vjp:
        needs = ins.params.needs
        n, m = p.shapes[a[0]]

        def run_linear_vjp(s: list[Any]) -> None:
            g = s[a[0]]
            g3 = _view(be, g, (1, n, m))
            found = []
            if needs[0]:
                k = p.shapes[a[2]][1]
                found.append(_view(be, be.matmul(g3, _view(be, s[a[2]], (1, m, k))), (n, k)))
            if needs[1]:
                k = p.shapes[a[1]][1]
                found.append(_view(be, be.matmul(g3, _view(be, s[a[1]], (1, n, k)),
                                                 transpose_a=True), (m, k)))
            if needs[2]:
                found.append(be.reduce("sum", g, (0,)))
            for slot, v in zip(o, found):
                s[slot] = v
        return run_linear_vjp
    return None


def fused(program: Program, outputs: Sequence[int], be: OpenCLBackend, on_guard: Any
          ) -> FusedCLProgram | None:
    """The fused program for ``outputs`` on the OpenCL backend ``be``; None when nothing
    would be fused (no instruction a kernel can do) or the kernels do not build (with a
    CompilerWarning: the instructions then run one kernel each). Where kernels with vector
    loops do not build, the scalar kernels (no warning)."""
    program, outputs = optimise_program(program, outputs)
    instructions = live_instructions(program, outputs)
    plan = OpenCLPlan(program, instructions, outputs)
    segments = [item for kind, item in plan.schedule if kind == "c"]
    if not segments:
        return None
    used = {program.dtypes[s] for ins in instructions if ins.op != "guard"
            for s in ins.outs + tuple(i for i in ins.ins if type(i) is int)
            if program.dtypes[s] is not None}
    # one real_t for the program's kernels: float when its values are float32 (and bools)
    real = "float" if used & {np.dtype(np.float64), np.dtype(np.float32)} == \
        {np.dtype(np.float32)} else "double"
    width = fused_width(be, real)
    if width is None:         # not even the scalar kernels passed their proof (warned)
        return None
    while True:
        stored = stored_slots(plan, outputs)
        kernels, source = render_kernels(plan, stored, be, real, width)
        vector = any(k.width for segment in kernels for k in segment)
        try:
            return FusedCLProgram(plan, be, on_guard, stored, kernels, source, real, width)
        except (DeviceError, AttributeError) as error:
            # a kernel missing from a built program is an AttributeError of pyopencl
            # the vector loops do not build here: the scalar kernels, if proven
            if vector and proven(be, real, 0):
                width, plan = 0, OpenCLPlan(program, instructions, outputs)
                continue
            if not isinstance(error, DeviceError) or "build" not in str(error):
                raise
            warnings.warn(f"the fused OpenCL kernels of a recorded program did not build; "
                          f"its instructions run one kernel each: {error}", CompilerWarning,
                          stacklevel=4)
            return None
