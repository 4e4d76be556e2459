"""A fused numpy program (``fused_c.FusedProgram``) at many points, step by step:
``TensorFunction``'s batches on the numpy device when the program has Python steps
(matmul, ``linear``, reductions, guards) and so cannot run in one C loop
(``FusedProgram.run_batch``).

Each run of consecutive C steps (segments, and the cross-entropy functions ``softmax_c``
lowers) goes over all the points of a chunk in one C loop without the GIL
(``_core._segments_batch``: before point b, each of the point's slots points at
``base + b * stride``); each Python step runs once for the whole chunk:

- a slot is either the point's own (a buffer of B points, one after another; zero margins
  around each point where the C reads past a slot: a pad) or shared (constants, arguments
  given once, products of shared operands: one value, pointed at by every point);
- **matmul**, **linear**, **linear_vjp**, **reduce**: as ``batch_plan`` plans them for
  both devices (the OpenCL batch runs the same plans): one product per product for the
  chunk (``_matmul``: numpy's BLAS or easyad's kernels, as ``tensor/_blas.py`` picks;
  x @ W one GEMM of points * rows rows, A @ w the points' vectors as rows against A
  read transposed, a shared operand of a stack at stride 0), linear's bias added in
  place, reductions over the point's axes shifted by one. Outputs made only of shared
  values stay one value (``hold_shared``);
- **guard**: every point's value is checked; where any point reads another value than
  recorded, ``Diverged`` sends the batch back to one replay per point (each point then
  retapes or raises as alone).

- **host** calls of a registered kernel that batches (``ops._table.Kernel``: attention's
  forward and sweep): one call for the chunk, the points first.

Any other Python step (host calls of Python code, gathers, ...) works on one point:
``batched`` says None.
Per-point BLAS calls of a few rows (often gemv) and the batch's one GEMM block their sums
differently, so results agree with one replay per point to ~1e-15 relative, not bitwise
(tests/test_batch_np_matmul.py checks 1e-12); C steps give the same bits. B is split into
chunks whose buffers fit ``_BUDGET``; the C runs of a chunk go over threads as
``run_batch`` does, each thread with its own pointer table.
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _pool
from easyad._core import _point_at, _segments_batch
from easyad.compiler.program import batch_steps
from easyad.compiler.program.batch_plan import (
    Bias, LineOp, Product, Read, Reduction, Scatter, StepPlan, plan_step, supported)
from easyad.tensor import _blas

if TYPE_CHECKING:
    from easyad.tensor._numpy import NumpyBackend

_BUDGET = 1 << 28        # bytes of per-point buffers one chunk of the batch may take
_PARALLEL = 1 << 17      # points x largest slot from which a C run goes over threads
_kept: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Every product of a batch (one place, so a test can count them)."""
    return _blas.matmul(a, b)


class Diverged(Exception):
    """A guard read another value at some point of the batch (see the module docstring)."""


def batched(fused: Any) -> "BatchedNumpyProgram | None":
    """The step-wise batch of ``fused`` (a ``FusedProgram``), made once per program; None
    where a Python step works on one point only, or an output is written in place."""
    if fused not in _kept:
        shapes = fused.plan.program.shapes
        ok = not fused.in_place and all(
            fn is not None or id(item) in fused.lowered or item.op == "guard"
            or supported(item, shapes) or _batching_kernel(item)
            for (fn, *_), (kind, item) in zip(fused.steps, fused.plan.schedule))
        _kept[fused] = BatchedNumpyProgram(fused) if ok else None
    return _kept[fused]


class BatchedNumpyProgram:
    """``run(inputs, count)`` as ``FusedProgram.run_batch``: an input with one more axis
    than its slot holds a point per row, any other is the same at every point; the
    outputs come back with the leading axis ``count``."""

    def __init__(self, fused: Any) -> None:
        self.fused = fused
        self.plans: dict[tuple[int, tuple[bool, ...]], StepPlan] = {}   # batch_plan's
        plan, p = fused.plan, fused.plan.program
        self.r, self.shapes, self.dtypes = plan.r, p.shapes, p.dtypes
        # the slots C writes: one buffer of the batch's points each ((shape, dtype, margins))
        written = {s: (tuple(p.shapes[s]), p.dtypes[s], plan.margins.get(s, (0, 0)))
                   for s in list(fused.fresh) + list(fused.work)}
        self.steps: list[tuple[str, Any]] = []
        for (fn, *_), (kind, item) in zip(fused.steps, plan.schedule):
            if fn is not None:
                if kind == "py":       # a lowered step: its saved workspace is a point's
                    saved = fused.lowered[id(item)].extra.get("saved")
                    if saved is not None:
                        written[item.outs[1]] = (saved.shape, saved.dtype, (0, 0))
                    for o in item.outs[:1]:
                        written[plan.r(o)] = (tuple(p.shapes[o]), p.dtypes[o], (0, 0))
                if self.steps and self.steps[-1][0] == "c":
                    self.steps[-1][1].append(fn)
                else:
                    self.steps.append(("c", [fn]))
            else:
                self.steps.append(("py", item))
        self.written = written
        self.constants = {i: fused.base[i] if fused.base[i] is not None else v
                          for i, v in p.constants.items()}
        self.steps = [(k, np.array(v, dtype=np.uint64) if k == "c" else v)
                      for k, v in self.steps]
        self.per_point = sum((math.prod(sh) + sum(m)) * np.dtype(dt).itemsize
                             for sh, dt, m in written.values())
        # the C loops' length: what C writes (a large constant such as W is not looped over)
        self.largest = max((math.prod(sh) for sh, _, _ in written.values()), default=1)

    def run(self, inputs: Sequence[Any], count: int) -> list[np.ndarray]:
        p = self.fused.plan.program
        own, shared = [], []
        for s, a in zip(self.fused.inputs, inputs):
            a = np.ascontiguousarray(a, dtype=p.dtypes[s])
            (own if a.ndim > len(p.shapes[s]) else shared).append((s, a))
        chunk = max(1, _BUDGET // max(1, self.per_point + sum(
            a[0].nbytes for _, a in own)))
        parts = [self._chunk(own, shared, lo, min(count, lo + chunk))
                 for lo in range(0, count, chunk)]
        if len(parts) == 1:
            return parts[0]
        return [np.concatenate(o) for o in zip(*parts)]

    def _chunk(self, own: list[tuple[int, np.ndarray]], shared: list[tuple[int, np.ndarray]],
               lo: int, hi: int) -> list[np.ndarray]:
        """The program at points lo..hi-1; ``rows[root]``: (B, ...) a point's own value,
        ``one[root]``: a value shared by every point."""
        B, fused = hi - lo, self.fused
        rows: dict[int, np.ndarray] = {s: a[lo:hi] for s, a in own}
        one: dict[int, Any] = dict(self.constants)
        one.update(shared)
        table = fused.pointers.copy()
        for s, a in shared:
            _point_at(table, s, a)
        strided: dict[int, tuple[int, int]] = {}     # root -> (address, stride) of C's
        for s, (shape, dtype, (before, after)) in self.written.items():
            size = math.prod(shape)
            whole = np.zeros((B, before + size + after), dtype=dtype) if before or after \
                else np.empty((B, size), dtype=dtype)
            rows[s] = whole[:, before:before + size]
            strided[s] = (rows[s].ctypes.data, whole.strides[0])
        for kind, item in self.steps:
            if kind == "c":
                for s, a in rows.items():
                    if s not in strided:
                        strided[s] = (a.ctypes.data, a.strides[0])
                self._c_run(item, table, strided, B)
                continue
            made = _RUN[item.op](self, item, rows, one, B)
            for o, (a, is_own) in zip(item.outs, made):
                o = self.r(o)
                if is_own:
                    rows[o] = np.ascontiguousarray(a).reshape(B, -1)
                    strided.pop(o, None)
                else:
                    one[o] = np.ascontiguousarray(a)
                    _point_at(table, o, one[o])
        out = []
        for o in fused.plan.outputs:
            root, shape = self.r(o), (B,) + tuple(self.shapes[o])
            if root in rows:
                a = rows[root]
                made_here = root in self.written or root not in dict(own)
                a = (a if made_here and a.flags.c_contiguous else np.array(a)).reshape(shape)
            else:
                a = np.array(np.broadcast_to(one[root].reshape(self.shapes[o]), shape))
            out.append(a)
        for k, (moved, axes) in fused.views.items():     # (fused_c.final_views)
            out[k] = out[k].reshape((B,) + moved).transpose((0,) + tuple(a + 1 for a in axes))
        return out

    def _c_run(self, fns: np.ndarray, table: np.ndarray, strided: dict[int, tuple[int, int]],
               B: int) -> None:
        """The C functions ``fns`` at every point, over threads where the work repays it
        (each thread its own pointer table: every slot C writes is a point's own)."""
        slots = np.array(list(strided), dtype=np.int64)
        bases = np.array([a for a, _ in strided.values()], dtype=np.uint64)
        steps = np.array([d for _, d in strided.values()], dtype=np.int64)
        workers = min(_pool.CORES, B) if B * self.largest >= _PARALLEL else 1
        if workers == 1:
            _segments_batch(fns, table, slots, bases, steps, B)
            return
        edges = [B * w // workers for w in range(workers + 1)]

        def part(w: int) -> None:
            start = bases + (steps * edges[w]).astype(np.uint64)
            _segments_batch(fns, table.copy(), slots, start, steps, edges[w + 1] - edges[w])
        futures = [_pool.threads().submit(part, w) for w in range(1, workers)]
        part(0)
        for future in futures:
            future.result()

    def buffer(self, s: Any, rows: dict[int, np.ndarray], one: dict[int, np.ndarray]
               ) -> tuple[Any, bool]:
        """(slot s's buffer, whether each point has its own): (B, size) rows of the
        points, or the one value; a literal operand (None, a number) as it is, shared."""
        if type(s) is not int:
            return s, False
        root = self.r(s)
        if root in rows:
            return rows[root], True
        return one[root], False

    def operand(self, s: Any, rows: dict[int, np.ndarray], one: dict[int, np.ndarray],
                B: int) -> tuple[Any, bool]:
        """(slot s's value, whether each point has its own): (B,) + s's shape, or s's
        shape; a literal operand (None, a number) as it is, shared."""
        if type(s) is not int:
            return s, False
        root, shape = self.r(s), tuple(self.shapes[s])
        if root in rows:
            return rows[root].reshape((B,) + shape), True
        return one[root].reshape(shape), False


def _step(prog: BatchedNumpyProgram, ins: Any, rows: Any, one: Any, B: int) -> Any:
    """A matmul, linear, linear_vjp or reduce step as ``batch_plan`` plans it."""
    bufs, own = zip(*(prog.buffer(s, rows, one) for s in ins.ins))
    key = (id(ins), own)
    plan = prog.plans.get(key)
    if plan is None:
        plan = prog.plans[key] = plan_step(ins, prog.shapes, own, True)
    return run_plan(prog.fused.be, plan, bufs, B)


def run_plan(be: NumpyBackend, plan: StepPlan, bufs: Sequence[Any], B: int
             ) -> list[tuple[np.ndarray, bool]]:
    """(value, whether each point has its own) per output of a step planned with
    ``hold_shared=True``; ``bufs``: the step's operands, (B, size) rows where own."""
    found = []
    for result in plan.results:
        if type(result) is Product:
            out = _product(be, result, bufs, B)
            if plan.bias is not None:
                out = _add_bias(plan.bias, result, out, bufs, B)
        elif type(result) is Reduction:
            out = be.reduce(result.op, bufs[result.arg].reshape(result.shape(B)),
                            result.axes)
        elif type(result) is LineOp:       # (a line op C could not take: mixed dtypes)
            out = np.asarray(batch_steps.line_op(
                be, result, [np.ascontiguousarray(b) for b in bufs], B))
        elif type(result) is Scatter:
            g = bufs[result.arg]
            copy = result.copy(B)
            if copy is not None:
                g = be.strided(np.ascontiguousarray(g), 0, *copy)
            out = be.scatter_add(result.shape(B), result.dtype, result.index_at(B),
                                 g.reshape(result.g_at(B)), result.unique)
        else:
            parts = []
            for k, (place, src) in enumerate(zip(result.parts_at(B), bufs)):
                if result.spread[k]:
                    src = be.strided(np.ascontiguousarray(src), 0, *result.copy(k, B))
                parts.append((*place, src.reshape(place[1])))
            out = be.assemble(result.shape(B), result.dtype, parts)
        if type(result) is not Product and result.tile:
            out = np.repeat(out.reshape(1, -1), B, axis=0)
        found.append((out, result.own or result.tile))
    return found


def _read(be: NumpyBackend, read: Read, buf: Any, points: int) -> np.ndarray:
    copy = read.copy(points)
    if copy is not None:
        return be.strided(np.ascontiguousarray(buf), 0, *copy).reshape(read.shape(points))
    return buf.reshape(read.shape(points))


def _product(be: NumpyBackend, p: Product, bufs: Sequence[Any], B: int) -> np.ndarray:
    a = _read(be, p.left, bufs[p.left.arg], B)
    b = _read(be, p.right, bufs[p.right.arg], B)
    if a.shape[0] == b.shape[0] == 1:         # one matrix each: a plain 2-d product
        a, b = a[0], b[0]
    c = _matmul(a.swapaxes(-1, -2) if p.transpose_left else a,
                b.swapaxes(-1, -2) if p.transpose_right else b)
    if p.tile:
        return np.repeat(c.reshape(1, -1), B, axis=0)
    return c


def _add_bias(bias: Bias, p: Product, out: np.ndarray, bufs: Sequence[Any], B: int
              ) -> np.ndarray:
    """linear's product plus its bias, added in place (a row a point, or one for all)."""
    out = np.ascontiguousarray(out).reshape(bias.out(p.points(B)))
    out += bufs[bias.arg].reshape(bias.shape(B)) if bias.arg is not None else bias.value
    return out


def _guard_step(prog: BatchedNumpyProgram, ins: Any, rows: Any, one: Any, B: int) -> Any:
    """Every point's value against the recorded one (``_program.step``'s guard)."""
    value, own = prog.operand(ins.ins[0], rows, one, B)
    recorded, key = ins.params.recorded, ins.params.key
    if key is None and own:       # all the points at once
        rec = np.asarray(recorded)
        if value.shape[1:] != rec.shape:
            raise Diverged
        same = value == rec
        if value.dtype.kind in "fc" and rec.dtype.kind in "fc":
            same |= np.isnan(value) & np.isnan(rec)
        if not same.all():
            raise Diverged
        return []
    for v in (value if own else [value]):
        v = np.asarray(key(v)) if key is not None else v
        if not np.array_equal(v, recorded, equal_nan=True):
            raise Diverged
    return []


def _batching_kernel(ins: Any) -> bool:
    """A host call of a registered kernel that takes a batch's points in one call."""
    # (a HostKernel says so; the op table sits above this layer: read, not imported)
    return ins.op == "host" and getattr(ins.params.fn, "batches", False) is True


def _kernel_step(prog: BatchedNumpyProgram, ins: Any, rows: Any, one: Any, B: int) -> Any:
    """A batching host kernel (``ops._table.Kernel``) called once for the chunk: every
    slot operand with the points first (a shared one broadcast to them, read only; ranks
    made equal), each result cut into the points' equal parts."""
    p, slots = ins.params, iter(ins.ins)
    rank = max(len(prog.shapes[s]) for s in ins.ins)
    args = []
    for kind, value in p.template:
        if kind != "slot":
            args.append(value)
            continue
        s = next(slots)
        a, own = prog.operand(s, rows, one, B)
        # the points' axis first; a lower operand padded with ones after it, so that the
        # kernel's broadcasting still lines its axes up with the others' (a mask under q)
        shape = (B,) + (1,) * (rank - len(prog.shapes[s])) + tuple(prog.shapes[s])
        args.append(a.reshape(shape) if own else np.broadcast_to(a, shape))
    found = []
    for r, dtype in zip(p.fn(*args), p.dtypes):
        r = np.asarray(r, dtype=dtype)
        if r.size % B:
            raise AssertionError(f"host kernel {p.fn.name!r} made {r.shape} for {B} points: "
                                 f"not the points' equal parts (its batches=True is wrong)")
        found.append((np.ascontiguousarray(r).reshape(B, -1), True))
    return found


_RUN = {"matmul": _step, "reduce": _step, "linear": _step, "linear_vjp": _step,
        "guard": _guard_step, "host": _kernel_step}
