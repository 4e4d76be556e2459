"""Recorded tensor programs as generated C on the numpy device: fusion and buffer planning.

``fused(program, outputs, on_guard)`` turns the instructions a result needs
(``_program.live_instructions``) into a schedule:

- **C segments**: maximal runs of elementwise maps, strided and gathered reads,
  reductions, assembles and scatter-adds, rendered into one C function each. Inside a
  segment, instructions whose output has one shape form a *group*: one loop over the
  elements, every value in a register (``v12``), each written to memory only where a later
  group, a Python step or the caller reads it. A reduction of a value of the group
  accumulates inside the same loop; a slice's adjoint (assemble) and a scatter write
  straight from it. Expressions are the rule table's strings (the same the eager kernels
  and the OpenCL kernels use), rendered by ``_expr`` over ``_helpers.h``.
- **Recomputation** (``_choose_recomputed``): a cheap value that later loops read at
  their own index, or at a fixed shift of it (a slice, a slice's adjoint), is computed
  again in those loops from what is in memory instead of being stored and loaded, as XLA
  fuses elementwise producers into their consumers. A loop that adds up slices' adjoints
  of recomputed values is cut into ranges where each slice covers all or nothing
  (``Renderer._runs``): there a plain shifted read, or 0, no condition. Consecutive
  groups that do not read what the others write, of shapes that differ only in the
  first dimension, run as one loop (``Plan.loops``), each in the range of its own
  elements. Rosenbrock's value and gradient so read x once and write g, instead of
  storing three arrays to add in a second loop.
- **Selections** (``_selections``): a value that max/min, a comparison, maximum/minimum
  or sign compares is made once (never recomputed through libm) and, with what it is made
  of, by libm's scalar functions, so the backward sweep's "equals the max" sees the bits
  the max was taken over and equal inputs tie anywhere (docs/internals.md).
- **Bools** (masks) are ``int`` registers with int 0/1 branches, stored as unsigned char:
  gcc 12 vectorises no loop computing an unsigned char from a double.
- **Numbers**: a recorded constant of one element (the gradient's seed) is a literal,
  and so is a value that is one number; ``mul0`` (the strong zero) of a number c with
  |c| >= 1 is written ``c * y + 0.0``, the same bits with no comparison.
- **Signs of zero** (``_zero_signs``): a ``+ 0.0`` (which makes -0 into +0, as eager
  execution's strong zeros and adjoint sums do) is left out where no reader can tell -0
  from +0: Rosenbrock's gradient loop keeps one of six, the same bits out.
- **Python steps**: matmul and ``linear`` (BLAS through numpy) and guards, as
  ``_program.step`` runs them. ``cross_entropy`` and its vjp are C functions of the same
  library (``softmax_c``), called from the pointer table like segments; so are the op
  table's ops with a line loop (``Op.loop``: prod, cumprod, recurrence; ``table_c``),
  which keep a program batchable in one C loop. An ``sgd_step`` update of a large weight
  whose gradient is one linear's product is done inside that product, not in a loop
  (``blas_steps.fold_updates``: GEMM with beta = 1; one rounding of the update apart).
- **Vector width**: segments calling no libmvec function with a loop of at least
  ``_WIDE_FROM`` elements are built 512 bits wide on x86-64 (``_WIDE``; the same bits),
  the others as ``-march=native`` chooses.
- **Buffers** are planned once: a reshape is the same memory; values stored for later
  groups get workspace buffers, shared between values whose lives (in groups) do not
  overlap; results are new arrays each call.

The C is compiled by ``easyad.compiler.tape.library.build`` (gcc, cached on disk by the
source's hash, ``ad.CompilerWarning`` and the unfused program when there is no
compiler). Reductions add in loop order (numpy adds pairwise), so sums can differ from
eager execution in the last bits. Float32 values are computed in double and rounded when stored,
but for the rule table's float32 forms (``float32.py``: tanh in float), computed in float.
"""
from __future__ import annotations

import ctypes
import math
import platform
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _pool
from easyad.compiler.tape import library as c_library
from easyad._core import _point_at, _segment_call, _segments_batch
from easyad.compiler.program import blas_steps, float32, softmax_c, table_c
from easyad.compiler.program.cstyle import CDialect, Renderer, c_header, libmvec_functions
from easyad.compiler.optimiser import narrow_constants, optimise_program
from easyad.compiler.program.plan import Plan, share_buffers, stored_slots
from easyad.tensor._program import Program, live_instructions, step

if TYPE_CHECKING:
    from easyad.tensor._numpy import NumpyBackend

# a batch (run_batch) goes over threads from this many points x largest buffer on (a thread
# costs ~20-50 us to hand work to), each thread on its own workspace
_PARALLEL_BATCH = 1 << 17
_BATCH_THREADS = _pool.CORES
# gcc's -march=native on AVX-512 CPUs (Sapphire Rapids, Zen 4) vectorises 256 bits wide; a
# loop converting float32 to double and back (every float32 loop: values are computed in
# double) is then bound by its shuffles, and 512-bit vectors halve them: the MLP step's
# update of 100,352 float32 parameters 33 -> 21 us. Only segments that call no libmvec
# function are built so (a function attribute, defined by a flag: a compiler refusing it
# builds without): arithmetic gives the same bits at any width (no reassociation or
# contraction; sums run in the renderer's fixed 8 lanes), but libmvec's 4- and 8-lane
# variants and the scalar remainder may differ in the last bits, and where an element
# falls among them depends on the width. aarch64 has no such option.
_WIDE = ('-DEASYAD_WIDE=__attribute__((target("prefer-vector-width=512")))',) \
    if platform.machine().lower() in ("x86_64", "amd64") else ()
_WIDE_DEFAULT = "#ifndef EASYAD_WIDE\n#define EASYAD_WIDE\n#endif\n"
# ...and only where a loop of the segment is this long: short 512-bit loops cost more than
# they save (Rosenbrock's replayed gradient, Sapphire Rapids, one core: n = 100 3.2 -> 3.5
# us, n = 1000 3.8 -> 4.2, at par near 6,000, faster from 16,000), and so do the batch
# and per-point calls of small programs that run them (issue 25 item 6's before/after)
_WIDE_FROM = 1 << 13


def _widened(segment: str, elements: int) -> str:
    """A segment's C with the 512-bit attribute, unless it calls a libmvec function or its
    longest loop (``elements``) is short."""
    if elements < _WIDE_FROM or any(f"{name}(" in segment for name in libmvec_functions()):
        return segment
    return "EASYAD_WIDE " + segment


def _largest(plan: Plan, segment: list[Any]) -> int:
    """The element count of the largest value a segment reads or writes (its longest
    loop: a reduction runs over its input)."""
    shapes = plan.program.shapes
    return max((math.prod(shapes[s]) for ins in segment for s in (*ins.outs, *ins.ins)
                if type(s) is int and shapes[s] is not None), default=0)


class FusedProgram:
    """The schedule of ``Plan`` bound to its compiled segments; ``run(inputs)`` as
    ``BoundProgram.run`` (numpy arrays in, new numpy arrays out)."""

    def __init__(self, plan: Plan, library: Any, be: NumpyBackend, on_guard: Any,
                 stored: set[int], source: str,
                 lowered: tuple[dict[int, Any], list[np.ndarray]] = ({}, []),
                 folded: dict[int, tuple[int, int]] | None = None) -> None:
        p = plan.program
        self.plan, self.source, self.be = plan, source, be
        self.n_slots = len(p.shapes)
        self.inputs = list(p.inputs)
        self.outputs = plan.outputs
        self._lock = threading.Lock()
        # output k is a view of what the program returns: (shape, axes) (final_views)
        self.views: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        # the slots written in C and read after: a fresh array for outputs, else workspace
        fresh = {plan.r(o) for o in plan.outputs}
        # Python steps with a C lowering (softmax_c: cross-entropy) write into buffers too
        in_c, extra = lowered
        self.lowered = in_c
        made_in_python = {plan.r(o) for kind, item in plan.schedule if kind == "py"
                          and id(item) not in in_c for o in item.outs}
        stored = {s for s in stored if s not in made_in_python and p.dtypes[s] is not None}
        stored |= {o for step in in_c.values() for o in step.writes}
        self.made_in_python = made_in_python
        self.base: list[Any] = [None] * (self.n_slots + len(plan.aux) + len(extra))
        for i, v in p.constants.items():
            if p.dtypes[i] is not None:
                self.base[i] = np.ascontiguousarray(v)
        self.base[self.n_slots:] = list(plan.aux) + extra
        for kind, item in plan.schedule:      # a lowered forward's saved workspace
            if kind == "py" and "saved" in getattr(in_c.get(id(item)), "extra", {}):
                self.base[item.outs[1]] = in_c[id(item)].extra["saved"]
        self.in_place = _written_in_place(plan)
        self.fresh = sorted(s for s in stored if s in fresh and s not in p.inputs
                            and s not in p.constants and s not in self.in_place)
        work = sorted(s for s in stored if s not in fresh and s not in p.inputs
                      and s not in p.constants)
        self.work = work          # written by the C between calls: per thread in a batch
        self._made = set(self.fresh) | made_in_python | self.in_place.keys()   # new per call
        self._result_specs = [(plan.r(o), p.shapes[o]) for o in plan.outputs]
        self._tables: list[tuple[np.ndarray, list[np.ndarray]]] = []
        self._batchable: bool | None = None
        # run_batch's segment addresses, slot numbers and largest buffer (made once)
        self._batch_tables: tuple[np.ndarray, np.ndarray, int] | None = None
        shared = share_buffers(plan, work)
        for s in work:
            if s in shared:
                continue
            lo, hi = plan.margins.get(s, (0, 0))
            if lo or hi:       # zeros around it, which pads read (never written)
                size = math.prod(p.shapes[s])
                whole = np.zeros(lo + size + hi, dtype=p.dtypes[s])
                self.base[s] = whole[lo:lo + size].reshape(p.shapes[s])
            else:
                self.base[s] = np.empty(p.shapes[s], dtype=p.dtypes[s])
        for s, holder in shared.items():
            self.base[s] = self.base[holder]
        self.pointers = np.zeros(len(self.base), dtype=np.uint64)
        for k, a in enumerate(self.base):
            if isinstance(a, np.ndarray):
                _point_at(self.pointers, k, a)
        # the GIL is let go around segments that loop long enough to repay it
        release = max((math.prod(sh) for sh in p.shapes), default=0) >= 1 << 14
        self.steps: list[tuple[Any, Any, tuple[int, ...], tuple[int, ...]]] = []
        n_segment = 0
        for kind, item in plan.schedule:
            if kind == "c":
                fn = getattr(library, f"easyad_segment_{n_segment}")
                address = ctypes.cast(fn, ctypes.c_void_p).value
                n_segment += 1
                self.steps.append((address, release, (), ()))
            elif id(item) in in_c:
                fn = getattr(library, in_c[id(item)].name)
                self.steps.append((ctypes.cast(fn, ctypes.c_void_p).value, False, (), ()))
            else:
                aliases = tuple(i for i in item.ins if type(i) is int and plan.r(i) != i)
                ready = blas_steps.prepare(item, plan, fresh, folded) \
                    if be.kind == "numpy" else None
                if ready is not None:      # into buffers made once (no output among them),
                    for o, buffer in ready[1].items():      # pointed at once, here
                        self.base[o] = buffer
                        _point_at(self.pointers, o, buffer)
                self.steps.append((None, ready[0] if ready else step(item, be, on_guard),
                                   aliases, () if ready else item.outs))
        # the outputs: (root, shape, whether made new by this call); others (workspace,
        # an input, a constant) are copied, once per root
        self._result_specs = [(root, shape, root in self._made)
                              for root, shape in self._result_specs]

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._lock:
            return self._run(inputs)

    def batchable(self) -> bool:
        """Whether the program runs at many points in one C loop (``run_batch``): every
        step generated C, nothing written in place, every output made fresh in C."""
        if self._batchable is None:     # (asked at every batch call: decided once)
            fresh = set(self.fresh)
            # (cross-entropy's lowered steps keep one saved workspace: not per point)
            self._batchable = all(fn is not None for fn, *_ in self.steps) \
                and not self.in_place \
                and not any("saved" in step.extra or "target" in step.extra
                            for step in self.lowered.values()) \
                and all(self.plan.r(o) in fresh for o in self.outputs)
        return self._batchable

    def run_batch(self, inputs: Sequence[Any], count: int) -> list[np.ndarray]:
        """The program at ``count`` points in one C loop without the GIL (only where
        ``batchable``): an input with one more axis than its slot holds a point per row
        (leading axis ``count``), any other is the same at every point; the outputs come
        back with that leading axis."""
        plan, p = self.plan, self.plan.program
        if self._batch_tables is None:  # what no call changes: the segments, the slots
            self._batch_tables = (
                np.array([fn for fn, *_ in self.steps], dtype=np.uint64),
                np.array(self.inputs + self.fresh, dtype=np.int64),
                max((math.prod(sh) for sh in p.shapes if sh is not None), default=1))
        fns, slot_table, size = self._batch_tables
        bases = np.empty(len(slot_table), dtype=np.uint64)     # (_point_at fills it)
        strides, keep = [], []
        k = 0
        for s, a in zip(self.inputs, inputs):
            a = np.ascontiguousarray(a, dtype=p.dtypes[s])
            per_point = a.ndim > len(p.shapes[s])
            _point_at(bases, k, a)
            strides.append(a.strides[0] if per_point and count else 0)
            keep.append(a)
            k += 1
        outputs: dict[int, np.ndarray] = {}
        for s in self.fresh:
            a = np.empty((count,) + tuple(p.shapes[s]), dtype=p.dtypes[s])
            outputs[s] = a
            _point_at(bases, k, a)
            strides.append(a.strides[0] if count else 0)
            k += 1
        step = np.array(strides, dtype=np.int64)
        workers = min(_BATCH_THREADS, count) if count * size >= _PARALLEL_BATCH else 1
        with self._lock:
            if workers > 1:      # contiguous chunks, each on its own table and workspace
                tables = self._thread_tables(workers)
                edges = [count * w // workers for w in range(workers + 1)]

                def chunk(w: int) -> None:
                    lo, hi = edges[w], edges[w + 1]
                    start = bases + (step * lo).astype(np.uint64)
                    _segments_batch(fns, tables[w][0], slot_table, start, step, hi - lo)
                futures = [_pool.threads().submit(chunk, w) for w in range(1, workers)]
                chunk(0)
                for future in futures:
                    future.result()
            elif count:
                _segments_batch(fns, self.pointers, slot_table, bases, step, count)
            for s in self.inputs:       # the table must not keep addresses of this call's
                if isinstance(self.base[s], np.ndarray):     # arrays (run sets its own)
                    _point_at(self.pointers, s, self.base[s])
        del keep
        out = [outputs[plan.r(o)].reshape((count,) + tuple(p.shapes[o]))
               for o in plan.outputs]
        for k, (moved, axes) in self.views.items():      # (final_views)
            out[k] = out[k].reshape((count,) + moved).transpose((0,) + tuple(
                a + 1 for a in axes))
        return out

    def _thread_tables(self, workers: int) -> list[tuple[np.ndarray, list[np.ndarray]]]:
        """One pointer table per thread of a batch, the first the program's own, the
        others pointing at private copies of the workspace (shared buffers stay shared,
        zero margins are copied with them); made once."""
        tables = self._tables or [(self.pointers, [])]
        while len(tables) < workers:
            pointers, copies, kept = self.pointers.copy(), {}, []
            for s in self.work:
                a = self.base[s]
                if not isinstance(a, np.ndarray):
                    continue
                root = a if a.base is None else a.base
                if id(root) not in copies:
                    copies[id(root)] = root.copy()
                    kept.append(copies[id(root)])
                whole = copies[id(root)]
                offset = a.ctypes.data - root.ctypes.data
                view = np.ndarray(a.shape, a.dtype, buffer=whole, offset=offset)
                _point_at(pointers, s, view)
            tables.append((pointers, kept))
        self._tables = tables
        return tables[:workers]

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        plan, p = self.plan, self.plan.program
        arrays = list(self.base)
        pointers = self.pointers
        for s, a in zip(self.inputs, inputs):
            a = np.ascontiguousarray(a)
            arrays[s] = a
            _point_at(pointers, s, a)
        for s in self.fresh:
            a = np.empty(p.shapes[s], dtype=p.dtypes[s])
            arrays[s] = a
            _point_at(pointers, s, a)
        for s, target in self.in_place.items():
            arrays[s] = arrays[target]
            _point_at(pointers, s, arrays[s])
        for fn, run, aliases, outs in self.steps:
            if fn is not None:
                _segment_call(fn, pointers, run)
                continue
            for s in aliases:
                arrays[s] = arrays[plan.r(s)].reshape(p.shapes[s])
            run(arrays)
            for s in outs:
                a = arrays[s]
                if isinstance(a, np.ndarray):
                    if not a.flags.c_contiguous:
                        a = arrays[s] = np.ascontiguousarray(a)
                    _point_at(pointers, s, a)
        out, copied = [], set()
        for root, shape, made in self._result_specs:
            a = arrays[root]
            if not made and root not in copied:
                a = arrays[root] = np.array(a)
                copied.add(root)
            out.append(a.reshape(shape))
        for k, (moved, axes) in self.views.items():      # (final_views)
            out[k] = out[k].reshape(moved).transpose(axes)
        return out


def _written_in_place(plan: Plan) -> dict[int, int]:
    """The outputs written into the memory of the input they are the next value of
    (``Program.in_place``: a descent step's parameters): those made in a segment where
    nothing else reads that input (a loop then never reads an element it has already
    overwritten, e.g. a gradient recomputed at shifted positions). Root -> input."""
    p, found = plan.program, {}
    for kind, segment in plan.schedule:
        if kind != "c":
            continue
        for ins in segment:
            target = p.in_place.get(ins.outs[0]) if len(ins.outs) == 1 else None
            if target is None or ins.outs[0] not in plan.outputs:
                continue
            reads = [i for other in segment for i in other.ins if type(i) is int
                     and not (other is ins and i == target)]
            if not any(target in plan.memory_reads(i) for i in reads):
                found[plan.r(ins.outs[0])] = target
    return found


def fused(program: Program, outputs: Sequence[int], be: NumpyBackend, on_guard: Any
          ) -> FusedProgram | None:
    """The fused, compiled program for ``outputs`` on the numpy backend ``be``; None when
    nothing would be compiled (no C-able instruction) or no compiler works."""
    program, outputs = optimise_program(program, outputs)
    program = narrow_constants(program, outputs)
    outputs, views = final_views(program, outputs)
    in_float = float32.rewrite(program)          # the rule table's float32 forms
    instructions = live_instructions(program, outputs)
    plan = Plan(program, instructions, outputs, CDialect.types)
    plan.in_float = in_float
    segments = [item for kind, item in plan.schedule if kind == "c"]
    in_c = table_c.lower(plan)            # op-table steps with a line loop: C functions
    if not segments and not in_c:
        return None
    # which values are read outside the group that makes them: by Python steps, outputs,
    # other segments; computed by rendering once with everything stored, then again
    stored = stored_slots(plan, outputs)
    made_in_python = {plan.r(o) for kind, item in plan.schedule if kind == "py"
                      for o in item.outs}
    plan.workspace = {s for s in stored if s not in {plan.r(o) for o in outputs}
                      and s not in made_in_python and program.dtypes[s] is not None}
    # descent steps folded into their weight gradient's product: their loops not rendered
    folded = blas_steps.fold_updates(plan)
    renderer = Renderer(plan, stored - {plan.r(u.outs[0]) for u in plan.folded}, CDialect())
    lowered = softmax_c.lower(plan, len(program.shapes) + len(plan.aux))
    lowered[0].update(in_c)
    source = c_header() + (float32.header() if in_float else []) + [_WIDE_DEFAULT] \
        + [_widened(renderer.render(seg, k), _largest(plan, seg))
           for k, seg in enumerate(segments)] \
        + [step.text for step in lowered[0].values()]
    text = "\n".join(source)
    extra = ("-fopenmp-simd", "-Wl,-z,defs", *_WIDE) + (
        ("-DEASYAD_VECTOR_MATH",) if libmvec_functions() else ())
    path = c_library.build(text, sum(len(s) for s in segments), extra, purpose="tensor")
    library = None if path is None else c_library.load(path, purpose="tensor")
    if library is None:
        return None
    fp = FusedProgram(plan, library, be, on_guard, stored, text, lowered, folded)
    fp.views = views
    return fp


def final_views(program: Program, outputs: Sequence[int]
                ) -> tuple[list[int], dict[int, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """Outputs that are a permutation of the axes of a value only they read (a batched
    Jacobian's basis axis moved last, ``out_axes``): the program returns that value and
    the output is a numpy view of it, (reshaped as, transposed by), not a copy made in
    C. The same numbers; the array is not C-contiguous."""
    outputs = list(outputs)
    producer = {o: ins for ins in program.instructions for o in ins.outs}
    reads: dict[int, int] = {}
    for ins in program.instructions:
        for i in ins.ins:
            if type(i) is int:
                reads[i] = reads.get(i, 0) + 1
    views = {}
    for k, o in enumerate(outputs):
        ins = producer.get(o)
        if ins is None or ins.op != "strided" or outputs.count(o) != 1 \
                or o in program.in_place or type(ins.ins[0]) is not int:
            continue
        q = ins.ins[0]
        shape, strides = tuple(ins.params.shape), tuple(ins.params.strides)
        if q in outputs or q in program.inputs or q in program.constants or \
                reads.get(q) != 1 or ins.params.offset or 1 in shape or \
                program.dtypes[q] != program.dtypes[o] or \
                math.prod(program.shapes[q]) != math.prod(shape):
            continue
        order = sorted(range(len(shape)), key=lambda d: -strides[d])
        moved = tuple(shape[d] for d in order)
        if [strides[d] for d in order] != [math.prod(moved[j + 1:]) for j in range(len(moved))]:
            continue
        outputs[k] = q
        views[k] = (moved, tuple(order.index(d) for d in range(len(shape))))
    return outputs, views
