"""A fused OpenCL program (``fused_cl.FusedCLProgram``) at many points in one launch per
kernel: ``TensorFunction``'s batches (``F(X)``, ``F.value_and_gradient(X)``, ``F.hvp(X, v)``,
the unit-direction batches of ``hessian`` and ``jacobian``) on an OpenCL device.

The program's kernels are rendered again from its plan with a second NDRange dimension
over the points (``render_cl.OpenCLRenderer``'s ``points`` option): point
``get_global_id(1)`` moves its pointers to its own part (``b * size`` of the slot; a
reduction's partials by ``b * get_global_size(0)``) before the one point's body.
Constants and index arrays are shared, unmoved; an input moves by a stride given at
launch (0 where it is the same at every point: an argument, the hvp direction given once
for all; so one built source serves every mix); everything else (workspace, results) is a
buffer of B points, one after another. x's rows are uploaded as one buffer, or used
where they are when they are on the device already (a Tensor or a pyopencl array). A
reduction to one number gives one partial per work-item of its point, added up per
point by one backend ``reduce`` over the last axis (none when each point has one
work-item, as on a CPU device with many points).

Programs made of group kernels, guards and matmul, reduce and linear steps run this way
(``batchable``): a guard (a value f read on the host while recorded) is checked at every
point at once, and where any point reads another value, ``Diverged`` sends the batch back
to one replay per point (each point retapes or raises there, as alone); a matmul step is
one batched product for all the points of a chunk, a reduce step one reduction
(``batch_plan`` decides each such step's products once for both devices, ``batch_steps``
carries them out: point b's operand at ``b * size``, a shared one at batch stride 0, the
points' rows of x @ W one matrix; transposed operands read in place); a scatter-add of
repeated indices and an assemble of several parts are one backend call for the chunk.
Any other backend step (cross-entropy, host calls, ...) works on one point's buffers, so
such a program keeps one replay per point.

Work per point: on a GPU a work-group of at least a warp per point (several small points
a group; work-items per element, or strided loops for reductions); on a CPU device one
work-item per point when there are enough points to fill the cores (its vector loop runs
the whole point), more when there are few. B is split into chunks whose buffers fit the
device (``_BUDGET``), each chunk one launch per kernel and one product
per matmul step.
"""
from __future__ import annotations

import math
import threading
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from easyad.compiler.program.batch_plan import supported
from easyad.compiler.program.batch_steps import BatchStep
from easyad.compiler.program.fused_cl import FusedCLProgram, HostStep, Launch
from easyad.compiler.program.render_cl import Kernel, render_kernels
from easyad.errors import CompilerWarning, DeviceError

_BUDGET = 1 << 29       # bytes of per-point buffers one chunk of the batch may take
_WARP = 32              # the smallest work-group dimension worth giving a point on a GPU
_kept: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _enqueue(kernel: Any, queue: Any, global_size: tuple[int, ...],
             local_size: tuple[int, ...] | None, *args: Any) -> None:
    """Every launch of a batched kernel (one place, so a test can count them)."""
    kernel(queue, global_size, local_size, *args)


def batched(fused: Any) -> "BatchedCLProgram | None":
    """The batched form of ``fused`` (a ``FusedCLProgram``), made once per program; None
    when it has a backend step that works on one point (then: one replay per point)."""
    if not isinstance(fused, FusedCLProgram):
        return None
    if fused not in _kept:
        program = None
        if batchable(fused):
            try:
                program = BatchedCLProgram(fused)
            except DeviceError as error:        # the batched kernels did not build
                warnings.warn(f"the batched OpenCL kernels of a recorded program did not "
                              f"build; its batches replay point by point: {error}",
                              CompilerWarning, stacklevel=4)
        _kept[fused] = program
    return _kept[fused]


class Diverged(Exception):
    """A guard read another value at some point of the batch: the caller replays point by
    point (each point then retapes or raises as a single call would)."""


def batchable(fused: FusedCLProgram) -> bool:
    """Whether every step of the program is a group kernel, a guard (a value read on
    the host, checked at every point) or a backend step run for all points at once
    (``batch_plan.supported``: matmul, reduce, linear, linear_vjp, scatter_add,
    assemble, the table's line ops); any other backend step works on one point."""
    shapes = fused.plan.program.shapes
    return all(step.instruction.op == "guard" or supported(step.instruction, shapes)
               for step in fused.steps if type(step) is HostStep)


class _Guard:
    """A step of the batch: a value f read on the host while recorded (``slot``), which
    every point must read as ``recorded``."""

    __slots__ = ("slot", "recorded", "key")

    def __init__(self, slot: int, recorded: Any, key: Any = None) -> None:
        self.slot, self.recorded, self.key = slot, recorded, key


class _BatchLaunch:
    """A step of the batch: one launch of a group kernel rendered over points (``spec``;
    built: ``kernel``) for all the points of a chunk."""

    __slots__ = ("spec", "kernel")

    def __init__(self, spec: Kernel, kernel: Any) -> None:
        self.spec, self.kernel = spec, kernel


class BatchedCLProgram:
    """``fused``'s kernels with a dimension over points; ``run(inputs, count)`` as
    ``fused_c.FusedProgram.run_batch``: an input with one more axis than its slot
    holds a point per row, any other is the same at every point; host arrays out, each
    with the leading axis ``count``."""

    def __init__(self, fused: FusedCLProgram) -> None:
        self.fused, self.be, self.plan = fused, fused.be, fused.plan
        self._lock = threading.Lock()
        kernels, self.source = render_kernels(fused.plan, fused.needed_later, self.be,
                                              fused.real, fused.width, points=True)
        specs = iter([k for segment in kernels for k in segment])
        self.steps: list[_BatchLaunch | _Guard | BatchStep] = []
        for step in fused.steps:
            if type(step) is HostStep:
                ins = step.instruction
                if ins.op == "guard":
                    self.steps.append(_Guard(ins.ins[0], ins.params.recorded, ins.params.key))
                else:
                    self.steps.append(BatchStep(ins, fused.plan.r, fused.plan.program.shapes))
                continue
            spec = next(specs)
            assert type(step) is Launch and spec.name == step.spec.name  # one plan, one order
            kernel = self.be.kernel(self.source, spec.name, [None] * len(spec.params)
                                    + [np.int64] * (2 + len(spec.strides)))
            self.steps.append(_BatchLaunch(spec, kernel))
        self.launches = [step for step in self.steps if type(step) is _BatchLaunch]
        # the slots backend steps make (a buffer of all the points, made by the step)
        self.stepped = {o for step in self.steps if type(step) is BatchStep
                        for o in step.instruction.outs}

    def run(self, inputs: Sequence[Any], count: int) -> list[np.ndarray]:
        with self._lock:
            return self._run(inputs, count)

    def _run(self, inputs: Sequence[Any], count: int) -> list[np.ndarray]:
        import pyopencl

        from easyad.tensor._opencl import _translate
        p, plan, be = self.plan.program, self.plan, self.be
        if len(inputs) != len(self.fused.inputs):
            raise ValueError(f"the program takes {len(self.fused.inputs)} inputs, got "
                             f"{len(inputs)}")
        batched_inputs, hosts = set(), []
        for s, a in zip(self.fused.inputs, inputs):
            if be.owns(a):            # already on the device (rows of x): not copied
                if a.dtype != np.dtype(p.dtypes[s]):
                    raise ValueError(f"an input of the recorded program is {p.dtypes[s]}, "
                                     f"got a device array of {a.dtype}")
                if not a.flags.c_contiguous or a.offset:
                    a = a.copy()
            else:
                a = np.asarray(a)
            shape = tuple(p.shapes[s])
            size = math.prod(shape)
            # a point per row (as run_batch reads it); a number per point may come as
            # (count,) where the program holds it as (1,) (a scalar output's cotangent)
            if a.shape[:1] == (count,) and a.size == count * size and \
                    (a.ndim > len(shape) or size == 1):
                batched_inputs.add(s)
                a = a.reshape((count,) + shape)
            elif a.size == size:
                a = a.reshape(shape)
            else:
                raise ValueError(f"an input of the recorded program has shape {shape} (or "
                                 f"{(count,) + shape}: one a point), got {a.shape}")
            hosts.append(a)
        specs = [step.spec for step in self.launches]
        stride = {s: math.prod(p.shapes[s]) if s in batched_inputs else 0
                  for s in self.fused.inputs}
        reduced = {plan.r(o) for k in specs for o, _ in k.reductions}
        outside = set(p.constants) | set(self.fused.inputs)
        # the slots each point needs a buffer of: whatever a kernel reads or writes, and
        # the outputs, but for the shared ones and those a reduction makes
        made = sorted(({key for k in specs for kind, key in k.params
                        if kind == "slot"} | {plan.r(o) for o in plan.outputs})
                      - outside - reduced - self.stepped)
        per_point = sum(math.prod(p.shapes[s]) * np.dtype(p.dtypes[s]).itemsize
                        for s in made + sorted(batched_inputs) + sorted(reduced)
                        + sorted(self.stepped))
        one = set(p.constants) | (set(self.fused.inputs) - batched_inputs)
        shared = one.__contains__       # a root slot the same at every point
        chunk = max(1, min(count, _BUDGET // max(per_point, 1)))
        results = [np.empty((count,) + tuple(p.shapes[o]), dtype=p.dtypes[o])
                   for o in plan.outputs]
        uploaded = {s: a if be.owns(a) else be.asarray(a, p.dtypes[s])
                    for s, a in zip(self.fused.inputs, hosts) if s not in batched_inputs}
        try:
            for lo in range(0, count, chunk):
                hi = min(count, lo + chunk)
                arrays = list(self.fused.base)
                for s, a in zip(self.fused.inputs, hosts):
                    if s not in batched_inputs:
                        arrays[s] = uploaded[s]
                    elif type(a) is np.ndarray:
                        arrays[s] = be.asarray(a[lo:hi], p.dtypes[s])
                    else:             # device rows: the whole buffer, or a chunk's copy
                        arrays[s] = a if hi - lo == count else a[lo:hi].copy()
                for s in made:
                    arrays[s] = be.allocate((hi - lo,) + tuple(p.shapes[s]), p.dtypes[s])
                for step in self.steps:
                    if type(step) is _BatchLaunch:
                        self._launch(arrays, hi - lo, stride, step)
                    elif type(step) is BatchStep:
                        step.run(be, arrays, hi - lo, shared)
                    else:
                        self._check(arrays, hi - lo, step, batched_inputs)
                for k, o in enumerate(plan.outputs):
                    root = plan.r(o)
                    a = arrays[root]
                    if root in set(p.constants) | (set(self.fused.inputs) - batched_inputs):
                        host = np.asarray(a if p.dtypes[root] is None else be.to_numpy(a))
                        results[k][lo:hi] = host.reshape(p.shapes[o])
                    else:
                        results[k][lo:hi] = be.to_numpy(a).reshape(
                            (hi - lo,) + tuple(p.shapes[o]))
        except pyopencl.Error as error:
            raise _translate(be, "batched replay of a recorded program", error) from None
        return results

    def _check(self, arrays: list[Any], points: int, guard: _Guard,
               batched_inputs: set[int]) -> None:
        """A guard at every point: Diverged where any point reads another value."""
        slot, recorded, key = guard.slot, guard.recorded, guard.key
        p, root = self.plan.program, self.plan.r(slot)
        value = np.asarray(self.be.to_numpy(arrays[root]))
        shape = tuple(p.shapes[slot]) if key is not None else np.shape(recorded)
        rows = [value] if root in p.constants or root in set(self.fused.inputs) - \
            batched_inputs else value.reshape((points,) + shape)
        rows = [row.reshape(shape) for row in rows]
        if key is not None:
            rows = [np.asarray(key(row)) for row in rows]
        if not all(np.array_equal(row, recorded, equal_nan=True) for row in rows):
            raise Diverged

    def _launch(self, arrays: list[Any], points: int, stride: dict[int, int],
                step: _BatchLaunch) -> None:
        p, be, r = self.plan.program, self.be, self.plan.r
        k, real = step.spec, self.fused.real_dtype
        for s in k.zero:
            arrays[s].fill(0)
        items = 0
        if k.n:
            args = []
            partials = {}
            global0, local = self._shape(k, points)
            items = global0
            for kind, key in k.params:
                if kind == "slot":
                    args.append(arrays[key].data)
                elif kind == "aux":
                    args.append(self.fused.aux[key].data)
                else:
                    partials[key] = be.allocate((points, items), real)
                    args.append(partials[key].data)
            rows = points if local is None else -(-points // local[1]) * local[1]
            _enqueue(step.kernel, be.queue, (global0, rows), local, *args, k.n, points,
                     *(stride[s] for s in k.strides))
        for o, op in k.reductions:
            if not k.n:          # nothing to reduce: the operation's identity per point
                value = {"sum": 0.0, "max": -np.inf, "min": np.inf}[op]
                total = be.full((points,), value, real)
            elif items == 1:     # one partial a point: it is the point's total
                total = partials[o].reshape((points,))
            else:
                total = be.reduce(op, partials[o], (1,))
            if p.dtypes[o] != real:      # partials are real_t: the slot's dtype
                total = be.map("cast", ("x",), {"x": total}, (points,), (p.dtypes[o],))[0]
            arrays[r(o)] = total

    def _shape(self, k: Any, points: int) -> tuple[int, tuple[int, int] | None]:
        """Work-items per point (the first dimension) and the work-group: on a GPU a group
        of at least a warp per point and several points per group for small ones; on a
        CPU device, left to the driver, as few work-items per point as fill the cores."""
        be = self.be
        units = be.device._handle.max_compute_units
        if be.device.is_gpu:
            width = min(be.group, -(-k.n // _WARP) * _WARP)
            if k.reductions:      # strided loops: enough groups in all to fill the GPU
                groups = max(1, min(-(-k.n // width), -(-units * 2048 // (width * points))))
            else:                 # a work-item per element
                groups = -(-k.n // width)
            return groups * width, (width, max(1, be.group // width))
        # a few work-groups per core: PoCL runs a group's work-items one after another,
        # and a group per point cost ~1 us each (10^4 points of 100 elements: 10 ms)
        items = max(1, min(-(-k.n // 256), -(-units * 4 // points)))
        rows = max(1, min(be.group, points // (units * 4)))
        return items, (1, rows)
