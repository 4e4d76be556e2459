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
  (``_Renderer._runs``): there a plain shifted read, or 0, no condition. Consecutive
  groups that do not read what the others write, of shapes that differ only in the
  first dimension, run as one loop (``_Plan.loops``), each in the range of its own
  elements. Rosenbrock's value and gradient so read x once and write g, instead of
  storing three arrays to add in a second loop.
- **Selections** (``_selections``): a value that max/min, a comparison, maximum/minimum
  or sign compares is made once (never recomputed through libm) and, with what it is made
  of, by libm's scalar functions, so the backward sweep's "equals the max" sees the bits
  the max was taken over and equal inputs tie anywhere (docs/internals.md).
- **Numbers**: a recorded constant of one element (the gradient's seed) is a literal,
  and so is a value that is one number; ``mul0`` (the strong zero) of a number c with
  |c| >= 1 is written ``c * y + 0.0``, the same bits with no comparison.
- **Signs of zero** (``_zero_signs``): a ``+ 0.0`` (which makes -0 into +0, as eager
  execution's strong zeros and adjoint sums do) is left out where no reader can tell -0
  from +0: Rosenbrock's gradient loop keeps one of six, the same bits out.
- **Python steps**: matmul and ``linear`` (BLAS through numpy), the cross-entropy kernels
  and guards, as ``_program.step`` runs them.
- **Buffers** are planned once: a reshape is the same memory; values stored for later
  groups get workspace buffers, shared between values whose lives (in groups) do not
  overlap; results are new arrays each call.

The C is compiled by ``easyad.compiler.tape.library.build`` (gcc, cached on disk by the
source's hash, ``ad.CompilerWarning`` and the unfused program when there is no compiler).
Reductions add in loop order (numpy adds pairwise), so sums can differ from eager execution
in the last bits. Float32 values are computed in double and rounded when stored.
"""
from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from easyad import _expr, _pool
from easyad._csyntax import literal
from easyad._core import _point_at, _segment_call, _segments_batch
from easyad.compiler.tape import library as c_library
from easyad.tensor._program import Instruction, Program, live_instructions, step
from easyad.tensor._zero_signs import constant_strong_zeros, map_trees

# a batch (run_batch) goes over threads from this many points x largest buffer on (a thread
# costs ~20-50 us to hand work to), each thread on its own workspace
_PARALLEL_BATCH = 1 << 17
_BATCH_THREADS = _pool.CORES

_C_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
            np.dtype(np.bool_): "unsigned char"}
_ELEMENTWISE = {"map", "strided", "take"}
_SINKS = {"reduce", "assemble", "scatter_add"}
_C_OPS = _ELEMENTWISE | _SINKS | {"reshape"}


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, step_ = [], 1
    for n in reversed(shape):
        out.append(step_)
        step_ *= n
    return out[::-1]


def _contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a view of ``shape`` with ``strides`` (in elements) is a run of consecutive
    elements in C order."""
    return all(s == c for n, s, c in zip(shape, strides, _strides(tuple(shape))) if n != 1)


def _offset(group: tuple[int, ...], strides: Sequence[int], base: int = 0,
            index: str = "i") -> str:
    """The element offset, for flat index ``index`` over ``group``, of a view with
    ``strides`` (in elements, aligned to group's dims; 0 where broadcast) and ``base``."""
    if _contiguous(group, strides):
        return f"{base} + {index}" if base else index
    inner = _strides(group)
    terms = [] if not base else [str(base)]
    for d, (n, s) in enumerate(zip(group, strides)):
        if s == 0 or n == 1:
            continue
        idx = f"{index} / {inner[d]}" if inner[d] != 1 else index
        if d > 0:
            idx = f"({idx}) % {n}"
        terms.append(f"({idx}) * {s}" if s != 1 else f"({idx})")
    return " + ".join(terms) if terms else "0"


def _pad_position(shape: tuple[int, ...], spec: list[tuple[int, int, int, int]],
                  part: tuple[int, ...], index: str, clamp: bool) -> tuple[str, str]:
    """For flat index ``index`` over a pad's output ``shape`` (its slice ``spec``, of
    ``_slice_of``): whether it is inside the slice, and the flat index into the part
    there (``clamp``: a position inside the part everywhere, the nearest one outside)."""
    inner = _strides(shape)
    part_strides = _strides(part)
    conds, offsets = [], []
    for d, (start, step_, count, k) in enumerate(spec):
        if shape[d] == 1:
            continue
        idx = f"({index} / {inner[d]})" if inner[d] != 1 else index
        if d > 0:
            idx = f"({idx} % {shape[d]})"
        q = f"({idx} - {start})" if start else idx
        last = step_ * (count - 1)
        if count != shape[d] or step_ != 1:
            if start:
                conds.append(f"{q} >= 0")
            if step_ != 1:
                conds.append(f"{q} % {step_} == 0")
            conds.append(f"{q} < {last + 1}")
            if clamp:
                q = f"({q} < 0 ? 0 : {q} > {last} ? {last} : {q})" if start else \
                    f"({q} > {last} ? {last} : {q})"
        if k >= 0 and part_strides[k] and count > 1:
            term = f"({q} / {step_})" if step_ != 1 else q
            offsets.append(f"{term} * {part_strides[k]}" if part_strides[k] != 1 else term)
    return " && ".join(conds) or "1", " + ".join(offsets) or "0"


def _slice_of(out_shape: tuple[int, ...], offset: int, part: tuple[int, ...],
              strides: tuple[int, ...]) -> list[tuple[int, int, int, int]] | None:
    """The view (offset, part, strides) of a C-contiguous array of ``out_shape`` as a basic
    slice: per output dim (start, step, count, the part's dim or -1 where the part has
    none); None where it is not one (checked element by element)."""
    cs = _strides(out_shape)
    start, rest = [], offset
    for c in cs:
        start.append(rest // c)
        rest %= c
    spec = [(s, 1, 1, -1) for s in start]
    d = 0
    for k, (n, st) in enumerate(zip(part, strides)):
        while d < len(out_shape) and not (st > 0 and st % cs[d] == 0 and
                                          start[d] + (n - 1) * (st // cs[d]) < out_shape[d]):
            d += 1
        if d == len(out_shape):
            return None
        spec[d] = (start[d], st // cs[d], n, k)
        d += 1
    # the same positions as the view itself
    want = np.asarray(offset + sum(np.indices(part).reshape(len(part), -1)[k] * st
                                   for k, st in enumerate(strides))).reshape(-1) \
        if part else np.array([offset])
    grids = np.meshgrid(*[np.arange(s0, s0 + step * n, step) for s0, step, n, _ in spec],
                        indexing="ij")
    got = sum(g.reshape(-1) * c for g, c in zip(grids, cs)) if grids else np.array([0])
    if want.size != np.size(got) or not np.array_equal(np.sort(want), np.sort(got)):
        return None
    return spec


def _broadcast_strides(shape: tuple[int, ...], group: tuple[int, ...]) -> list[int]:
    own = _strides(shape)
    pad = len(group) - len(shape)
    return [0] * pad + [0 if n == 1 else s for n, s in zip(shape, own)]


class _Plan:
    """What the renderer decided: per slot its root (reshapes share memory), where each
    instruction went (segments, and in a segment the loops: ``groups``, which the OpenCL
    renderer forms kernels of too), and the C source."""

    def __init__(self, program: Program, instructions: list[Instruction],
                 outputs: Sequence[int]) -> None:
        self.program = program
        self.root: dict[int, int] = {}
        for ins in instructions:
            if ins.op == "reshape" and type(ins.ins[0]) is int:
                self.root[ins.outs[0]] = self.root.get(ins.ins[0], ins.ins[0])
        # schedule: segments of C-able instructions, Python steps between
        self.schedule: list[tuple[str, Any]] = []
        for ins in instructions:
            if ins.op == "reshape":
                continue
            if ins.op in _C_OPS and self._renderable(ins):
                if not self.schedule or self.schedule[-1][0] != "c":
                    self.schedule.append(("c", []))
                self.schedule[-1][1].append(ins)
            else:
                self.schedule.append(("py", ins))
        self.outputs = list(outputs)
        self.aux: list[np.ndarray] = []       # index arrays the C reads (after the slots)
        # a slice's adjoint (one part written into zeros) as an elementwise value over
        # its output: zero outside the slice, so sums of such adjoints fuse into one loop
        self.pads: dict[int, list[tuple[int, int, int, int]]] = {}
        self.pad_runs: dict[int, tuple[int, int]] = {}     # pads whose slice is a flat run
        for ins in instructions:
            if ins.op == "assemble" and len(ins.params[2]) == 1:
                (offset, part, strides), = ins.params[2]
                spec = _slice_of(tuple(ins.params[0]), offset, tuple(part), tuple(strides))
                if spec is not None:
                    self.pads[id(ins)] = spec
                    if _contiguous(part, strides):   # [offset, offset + size) of the output
                        self.pad_runs[id(ins)] = (offset, offset + math.prod(part))

        # workspace buffers read past their ends by pads (zeros there): root -> (lo, hi)
        self.margins: dict[int, tuple[int, int]] = {}
        self.workspace: set[int] = set()      # set by fused(): roots in planned buffers
        # set by _stored: the instruction that makes each slot (by root), the values
        # recomputed where read instead of stored, and the slots in memory each one's
        # recomputation reads
        self.producer: dict[int, Instruction] = {}
        self.recomputed: set[int] = set()
        self.recipe_reads: dict[int, set[int]] = {}
        # set by _stored (see _selections): the roots a selection compares, never
        # recomputed, and the instructions (by id) those are computed from, whose libm
        # calls are the scalar ones wherever they run
        self.compared: set[int] = set()
        self.exact_math: set[int] = set()
        self.stored: set[int] | None = None       # the roots in memory: loops merge then
        self._map_trees: dict[tuple[int, int], _expr.Node] | None = None

    def is_pad(self, ins: Instruction) -> bool:
        return id(ins) in self.pads

    def reads_in_order(self, reader: Instruction, slot: int) -> bool:
        """Whether ``reader`` reads value ``slot`` at its loop's flat index, or at that
        index shifted by a constant: where the value, recomputed, reads memory in order
        (a broadcast, gather or strided read would recompute it at scattered positions:
        gathers from memory, and more than once per element)."""
        p = self.program
        if reader.op == "take":
            return False
        if reader.op == "strided":
            return _contiguous(reader.params[1], reader.params[2])
        if self.is_pad(reader):
            return id(reader) in self.pad_runs
        loop_size = math.prod(self.loop_shape(reader))
        return all(math.prod(p.shapes[i]) == loop_size for i in reader.ins
                   if type(i) is int and self.r(i) == self.r(slot))

    def memory_reads(self, slot: int) -> set[int]:
        """The roots in memory that reading ``slot`` reads: its own, or those its
        recomputation reads."""
        root = self.r(slot)
        return self.recipe_reads.get(root, {root})

    def r(self, slot: int) -> int:
        return self.root.get(slot, slot)

    def map_tree(self, ins: Instruction, k: int) -> _expr.Node:
        """Output k of map ``ins`` as the loop computes it (``_zero_signs.map_trees``:
        recorded numbers in place, no ``+ 0.0`` that no reader can see)."""
        if self._map_trees is None:
            self._map_trees = map_trees(self)
        return self._map_trees[(id(ins), k)]

    types = _C_TYPES      # the dtypes the generated code handles

    def _renderable(self, ins: Instruction) -> bool:
        p = self.program
        dts = [p.dtypes[o] for o in ins.outs] + [p.dtypes[i] for i in ins.ins
                                                  if type(i) is int]
        if any(dt not in self.types for dt in dts):
            return False
        if ins.op == "map":
            return all(type(i) is int or type(i) is float for i in ins.ins)
        if ins.op == "reduce":
            return ins.params[0] in ("sum", "max", "min")
        return True

    def loops(self, instructions: list[Instruction]
              ) -> list[list[tuple[Any, list[Instruction]]]]:
        """The loops of a segment: its groups, and once ``_stored`` has said what is in
        memory, consecutive groups that do not read what the others write and whose
        shapes differ only in the first dimension run as one loop, over the largest, each
        group in the range of its own elements (Rosenbrock's sum over x[:-1] and its
        gradient over x share their loads, and the recomputed backward values)."""
        loops: list[list[tuple[Any, list[Instruction]]]] = []
        for shape, members in self.groups(instructions):
            if loops and self._merges(loops[-1], shape, members):
                loops[-1].append((shape, members))
            else:
                loops.append([(shape, members)])
        return loops

    def _merges(self, loop: list[tuple[Any, list[Instruction]]], shape: Any,
                members: list[Instruction]) -> bool:
        first = loop[0][0]
        if self.stored is None or ("assemble",) in (shape, first) or \
                len(shape) != len(first) or shape[1:] != first[1:]:
            return False
        if not all(self.vectorises(ins) for ins in members) or \
                not all(self.vectorises(ins) for _, others in loop for ins in others):
            return False
        written = {self.r(o) for _, others in loop for ins in others for o in ins.outs
                   if self.r(o) in self.stored}
        return not any(s in written for ins in members for i in ins.ins if type(i) is int
                       for s in self.memory_reads(i))

    def vectorises(self, ins: Instruction) -> bool:
        """Whether a loop's lanes may run ``ins`` together: not where two iterations write
        one place (scatters, reductions along axes, max/min, whose NaN rule is not a
        reduction)."""
        return ins.op not in ("scatter_add", "reduce") or (
            ins.params[0] == "sum" and math.prod(self.program.shapes[ins.outs[0]]) == 1)

    def groups(self, instructions: list[Instruction]) -> list[tuple[Any, list[Instruction]]]:
        """The loops of a segment: each instruction joins the last loop of its shape when
        every value it reads is made by then (moved up past loops of other shapes: a
        slice's adjoint between two parts of one sweep does not split it), else starts
        a loop of its own at the end."""
        groups: list[tuple[Any, list[Instruction]]] = []
        made_in: dict[int, int] = {}            # root slot -> its group
        r = self.r
        for ins in instructions:
            shape = self.loop_shape(ins)
            last = max((made_in.get(r(i), -1) for i in ins.ins if type(i) is int),
                       default=-1)
            target = next((k for k in range(len(groups) - 1, last - 1, -1)
                           if groups[k][0] == shape), None) if last >= 0 or groups else None
            if target is not None and target >= last and \
                    self.joins(groups[target][1], ins, shape):
                groups[target][1].append(ins)
            else:
                target = len(groups)
                groups.append((shape, [ins]))
            for o in ins.outs:
                made_in[r(o)] = target
        return groups

    def loop_shape(self, ins: Instruction) -> Any:
        """The shape a group's loop runs over (("assemble",) for a several-part assemble)."""
        p = self.program
        if ins.op in _ELEMENTWISE or self.is_pad(ins):
            return p.shapes[ins.outs[0]]
        if ins.op == "assemble":
            return tuple(ins.params[2][0][1]) if len(ins.params[2]) == 1 else ("assemble",)
        if ins.op == "scatter_add":
            return tuple(ins.params[2].shape)  # over the index (g may broadcast to it)
        return p.shapes[ins.ins[0]]           # reduce: over its input

    def joins(self, members: list[Instruction], ins: Instruction,
              shape: tuple[int, ...]) -> bool:
        made: set[int] = set()
        sunk: set[int] = set()
        for m in members:
            (sunk if m.op in _SINKS and not self.is_pad(m) else made).update(
                self.r(o) for o in m.outs)
        reads = [self.r(i) for i in ins.ins if type(i) is int]
        if any(r in sunk for r in reads):
            return False
        if (ins.op in ("strided", "take") or self.is_pad(ins)) and \
                any(r in made for r in reads):
            return False          # read at other positions than i: needs the whole array
        if self.is_pad(ins):
            return True
        if ins.op == "map":
            for i in ins.ins:
                if type(i) is int and self.r(i) in made and self.program.shapes[i] != shape:
                    return False
        if ins.op in _SINKS:
            if ins.op == "assemble" and len(ins.params[2]) != 1:
                return False
            # a sink of a value made here: its input must be of the loop's shape
            return all(self.program.shapes[i] == shape for i in ins.ins if type(i) is int)
        return True


class _Loop:
    """One loop's code while it is rendered: the lines before it, in it and after it, the
    registers of its values (by root slot and flat index name: ``i``, or a position a
    recomputed value is read at), its loads and constants, its named positions."""

    def __init__(self, inside: dict[int, bool] | None = None) -> None:
        self.inside = inside      # pads of recomputed values: over the whole range or not
        self.pre: list[str] = []
        self.loop: list[str] = []
        self.post: list[str] = []
        self.regs: dict[tuple[int, str], str] = {}
        self.loads: dict[str, str] = {}
        self.positions: dict[str, str] = {}
        self.ctypes: dict[str, str] = {}          # register or load -> its type
        self.sincos: set[str] = set()             # those whose sine and cosine are made

    def position(self, at: str) -> str:
        """A name for the flat index expression ``at`` (declared in the loop once)."""
        if at.isidentifier():
            return at
        name = self.positions.get(at)
        if name is None:
            name = self.positions[at] = f"j{len(self.positions)}"
            self.loop.append(f"        const long {name} = {at};")
        return name


_LANES = 8      # running sums of a sum to one number (as many as AVX-512's doubles)


def _pairwise(array: str, count: int, start: int = 0) -> str:
    """array[start] + ... + array[start + count - 1], added pairwise in a fixed order."""
    if count == 1:
        return f"{array}[{start}]"
    half = count // 2
    return f"({_pairwise(array, half, start)} + {_pairwise(array, count - half, start + half)})"


class _Renderer:
    """C of one segment (see the module docstring). The loop body of a group (``_body``) is
    shared with the OpenCL renderer (``_program_cl``), which changes the types, the
    expressions' target, the memory (``ptr``, ``aux``, ``_zero``) and the reductions."""

    types = _C_TYPES
    target = "c"          # of _expr.render
    real = "double"       # the type of constants and accumulators

    def __init__(self, plan: _Plan, needed_later: set[int]) -> None:
        self.plan, self.p = plan, plan.program
        self.needed_later = needed_later          # slots read outside their group
        self.lines: list[str] = []
        self.aux_numbers: dict[int, int] = {}     # id of an index array -> its number

    def ptr(self, slot: int, write: bool = False) -> str:
        """The slot's memory as a local pointer of the segment (loaded from P once, so
        the compiler knows no store of the loop changes it, and vectorises); ``write``:
        the loop stores to it (which the OpenCL renderer's parameters say)."""
        s = self.plan.r(slot)
        self.used[s] = f"    {_C_TYPES[self.p.dtypes[slot]]}* const p{s} = " \
                       f"({_C_TYPES[self.p.dtypes[slot]]}*)P[{s}];"
        return f"p{s}"

    def aux(self, array: np.ndarray) -> str:
        """A gather's or scatter's index array, as a pointer (after the slots in P)."""
        k = len(self.p.shapes) + self.aux_number(array)
        self.used[k] = f"    const long* const p{k} = (const long*)P[{k}];"
        return f"p{k}"

    def aux_number(self, array: np.ndarray) -> int:
        """The index array's number in ``plan.aux`` (added once, however often read)."""
        found = self.aux_numbers.get(id(array))
        if found is None:
            self.plan.aux.append(np.ascontiguousarray(array.reshape(-1), dtype=np.int64))
            found = self.aux_numbers[id(array)] = len(self.plan.aux) - 1
        return found

    def render(self, instructions: list[Instruction], index: int) -> str:
        self.used: dict[int, str] = {}
        body = [self._loop(groups) for groups in self.plan.loops(instructions)]
        pointers = [self.used[k] for k in sorted(self.used)]
        return (f"void easyad_segment_{index}(void** P) {{\n" + "\n".join(pointers) + "\n"
                + "\n".join(body) + "}\n")

    def _loop(self, groups: list[tuple[Any, list[Instruction]]]) -> str:
        if groups[0][0] == ("assemble",):
            return self._assemble_apart(groups[0][1][0])
        groups = [(shape, live) for shape, members in groups if (live := self.live(members))]
        if not groups:
            return ""             # its values are all recomputed where they are read
        members = [ins for _, group in groups for ins in group]
        # a sum to one number adds element i to the running sum of lane i % 8 (_LANES),
        # whatever loop it is in: so the program of the value alone and the one of the
        # value and gradient (whose loops are merged and cut elsewhere, and vectorised
        # another width) sum in one order, and give the same value to the bit
        lanes = any(ins.op == "reduce" and self.plan.vectorises(ins) for ins in members)
        simd = all(self.plan.vectorises(ins) for ins in members)
        pre: list[str] = []
        post: list[str] = []
        loops = []
        for lo, hi, inside in self._runs(groups):
            run_pre, loop, run_post = self._body(
                [(shape, group) for shape, group in groups if math.prod(shape) >= hi], inside)
            pre += [line for line in run_pre if line not in pre]     # the same in each
            post += [line for line in run_post if line not in post]
            body = "\n".join(loop) + "\n    }\n"
            if not lanes:
                loops.append(("    #pragma omp simd\n" if simd else "")
                             + f"    for (long i = {lo}; i < {hi}L; i++) {{\n" + body)
                continue
            # whole blocks of _LANES elements as vector lanes, the ends one at a time
            start = min(hi, -(-lo // _LANES) * _LANES)
            stop = max(start, hi - hi % _LANES) if simd else start
            for a, b, block in ((lo, start, False), (start, stop, True), (stop, hi, False)):
                if a >= b:
                    continue
                if block:
                    loops.append(f"    for (long block = {a}; block < {b}L; block += {_LANES})"
                                 f" {{\n    #pragma omp simd\n    for (long lane = 0; lane < "
                                 f"{_LANES}; lane++) {{\n        const long i = block + lane;\n"
                                 + body + "    }\n")
                else:
                    loops.append(f"    for (long i = {a}; i < {b}L; i++) {{\n        const "
                                 f"long lane = i % {_LANES};\n" + body)
        return ("    {\n" + "".join(line + "\n" for line in pre) + "".join(loops)
                + "".join(line + "\n" for line in post) + "    }\n")

    def _runs(self, groups: list[tuple[Any, list[Instruction]]]
              ) -> list[tuple[int, int, dict[int, bool] | None]]:
        """The ranges of flat indices a loop is cut into: where a group's elements end,
        and (at most ``_MAX_RUNS`` ranges) where the slice of a pad of a recomputed value
        starts or ends, each range with, per such pad, whether its slice covers the range
        (a plain read at a shift there, else 0: no condition, memory read in order; None:
        those pads under a condition)."""
        cuts = {0} | {math.prod(shape) for shape, _ in groups}
        runs = {id(ins): self.plan.pad_runs[id(ins)] for _, members in groups
                for ins in members if self.plan.is_pad(ins) and not self.in_memory(ins.ins[0])}
        at_pads = sorted(cuts | {c for run in runs.values() for c in run})
        if not runs or len(at_pads) - 1 > _MAX_RUNS:
            ends = sorted(cuts)
            return [(lo, hi, None) for lo, hi in zip(ends, ends[1:])]
        return [(lo, hi, {k: a <= lo and hi <= b for k, (a, b) in runs.items()})
                for lo, hi in zip(at_pads, at_pads[1:])]

    def _zero(self, o: int, pre: list[str]) -> None:
        """Slot o (a sink's output) set to 0 before the loop."""
        pre.append(f"    memset(P[{self.plan.r(o)}], 0, {math.prod(self.p.shapes[o])} * "
                   f"sizeof({_C_TYPES[self.p.dtypes[o]]}));")

    def _body(self, groups: list[tuple[Any, list[Instruction]]],
              inside: dict[int, bool] | None = None) -> tuple[list[str], list[str], list[str]]:
        """The lines before a loop (flat index i) over the groups' shapes, in it and after
        it; ``inside``: of a range of ``_runs``."""
        body = _Loop(inside)
        for shape, members in groups:
            for ins in self.live(members):
                self._emit(body, ins, shape, "i")
        # stores: values of the loop read after it
        for _, members in groups:
            for ins in members:
                if ins.op in _ELEMENTWISE or self.plan.is_pad(ins):
                    for o in ins.outs:
                        if self.plan.r(o) in self.needed_later:
                            body.loop.append(f"        {self.ptr(o, True)}[i] = "
                                             f"{body.regs[(self.plan.r(o), 'i')]};")
        return body.pre, body.loop, body.post

    def live(self, members: list[Instruction]) -> list[Instruction]:
        """The members of a loop whose values it uses: sinks, values stored for later and
        what those read; the rest are recomputed by the loops that read them."""
        plan = self.plan
        read: set[int] = set()
        live: list[Instruction] = []
        for ins in reversed(members):
            if (ins.op in _SINKS and not plan.is_pad(ins)) or any(
                    plan.r(o) in self.needed_later or plan.r(o) in read for o in ins.outs):
                live.append(ins)
                read.update(plan.r(i) for i in ins.ins if type(i) is int)
        return live[::-1]

    def _emit(self, body: _Loop, ins: Instruction, shape: Any, index: str) -> None:
        """The lines of one instruction at flat index ``index`` of ``shape``: the loop's
        own i, or (for values) a position where the loop reads a recomputed value."""
        p, plan, types = self.p, self.plan, self.types
        op, params, outs = ins.op, ins.params, ins.outs
        suffix = "" if index == "i" else f"_{index}"

        def put(o: int, text: str) -> None:
            reg = f"v{o}{suffix}"
            body.loop.append(f"        const {types[p.dtypes[o]]} {reg} = {text};")
            body.regs[(plan.r(o), index)] = reg
            body.ctypes[reg] = types[p.dtypes[o]]
        if op == "map":
            label, exprs, names, out_shape, dtypes = params
            mapping = {name: self._operand(body, i, shape, index)
                       for name, i in zip(names, ins.ins)}
            for k, (o, dt) in enumerate(zip(outs, dtypes)):
                tree = constant_strong_zeros(
                    _expr.substitute(self.plan.map_tree(ins, k), mapping))
                tree = self._scalar_calls(tree) if id(ins) in plan.exact_math \
                    else self._calls(body, tree)
                number = _expr.constant(tree)
                if number is not None and np.dtype(dt).kind == "f" and \
                        float(np.dtype(dt).type(number)) == number:
                    # a number (the seed, passed on by the sweep): a literal for what
                    # reads it, so the strong zeros around it simplify
                    body.regs[(plan.r(o), index)] = repr(number) if number >= 0 \
                        else f"({number!r})"
                    continue
                put(o, f"({types[np.dtype(dt)]})({_expr.render(tree, self.target)})")
        elif op == "strided":
            offset, _, strides = params
            put(outs[0], self._read(body, ins.ins[0], _offset(shape, strides, offset, index)))
        elif op == "take":
            put(outs[0], self._read(body, ins.ins[0], f"{self.aux(params[0])}[{index}]"))
        elif op == "reduce":
            self._reduce(ins, shape, self._operand(body, ins.ins[0], shape, index), body.pre,
                         body.loop, body.post)
        elif op == "assemble" and plan.is_pad(ins):
            put(outs[0], self._pad(body, ins, shape, index, f"in{outs[0]}{suffix}"))
        elif op == "assemble":
            (offset, _, strides), = params[2]
            o = outs[0]
            self._zero(o, body.pre)
            read = self._read(body, ins.ins[0], index)   # of the part's size, not its shape
            body.loop.append(f"        {self.ptr(o, True)}"
                             f"[{_offset(shape, strides, offset, index)}] = {read};")
        elif op == "scatter_add":
            o = outs[0]
            idx = self.aux(params[2])
            self._zero(o, body.pre)
            body.loop.append(f"        {self.ptr(o, True)}[{idx}[{index}]] += "
                             f"{self._operand(body, ins.ins[0], shape, index)};")

    def _calls(self, body: _Loop, tree: _expr.Node) -> _expr.Node:
        """An expression's calls as the target computes them best (here as they are)."""
        return tree

    def _scalar_calls(self, tree: _expr.Node) -> _expr.Node:
        """An expression of ``plan.exact_math``: its libm calls by names without vector
        versions (``easyad_s_*``, bound to libm's scalar symbols), the same function of
        its input in every lane and remainder of any loop (see ``_selections``)."""
        return _renamed(tree, {f: f"easyad_s_{f}" for f in _vector_math()})

    def _operand(self, body: _Loop, i: Any, shape: Any, index: str) -> str:
        """A name (or plain literal) for operand i (broadcast to ``shape``) at ``index``."""
        constant = self.p.constants.get(self.plan.r(i)) if type(i) is int else None
        if constant is not None and constant.size == 1 and constant.dtype.kind == "f":
            # one recorded number (the gradient's seed, 1.0): a literal, which the compiler
            # folds into the arithmetic (and the strong zero's tests) around it
            i = float(constant.reshape(-1)[0])
        if type(i) is float:
            if math.isfinite(i):
                return repr(i) if i >= 0 else f"({i!r})"
            name = "k_" + ("nan" if math.isnan(i) else "inf" if i > 0 else "minus_inf")
            if name not in body.loads:
                body.loads[name] = name
                real = "float" if self.target == "opencl-float" else "double"
                body.pre.append(f"    const {self.real} {name} = {literal(i, real)};")
            return name
        return self._read(body, i, _offset(shape, _broadcast_strides(self.p.shapes[i], shape),
                                           0, index))

    def _read(self, body: _Loop, slot: int, at: str) -> str:
        """The slot's element at flat index ``at`` (of its own shape): a register of the
        loop, else the slot's instructions rendered here where the plan recomputes it,
        else a load."""
        plan = self.plan
        s = plan.r(slot)
        found = body.regs.get((s, at))
        if found is not None:
            return found
        if not self.in_memory(s):      # made by another loop, which did not store it
            position = body.position(at)
            if (s, position) not in body.regs:
                self._emit(body, plan.producer[s], self.p.shapes[s], position)
            return body.regs[(s, position)]
        load = f"{self.ptr(slot)}[{at}]"
        found = body.loads.get(load)
        if found is None:
            found = body.loads[load] = f"l{len(body.loads)}"
            body.ctypes[found] = self.types[self.p.dtypes[slot]]
            body.loop.append(f"        const {body.ctypes[found]} {found} = {load};")
        return found

    def _pad(self, body: _Loop, ins: Instruction, shape: tuple[int, ...], index: str,
             inside: str) -> str:
        """A slice's adjoint at ``index`` of its output: the part's element where the slice
        is, 0 elsewhere (``inside``: the name of the condition)."""
        plan = self.plan
        src = ins.ins[0]
        spec = plan.pads[id(ins)]
        ctype = self.types[self.p.dtypes[ins.outs[0]]]
        part = tuple(ins.params[2][0][1])
        if index == "i" and body.inside is not None and id(ins) in body.inside:
            if not body.inside[id(ins)]:
                return f"({ctype})0"
            start = plan.pad_runs[id(ins)][0]
            return self._read(body, src, f"i - {start}" if start else "i")
        if not self.in_memory(src):
            # the part recomputed at a position clamped into it (every lane computes, so
            # the loop vectorises), then zeroed outside the slice
            condition, position = _pad_position(shape, spec, part, index, clamp=True)
            body.loop.append(f"        const int {inside} = {condition};")
            return self._zero_outside(inside, self._read(body, src, position), ctype)
        if len(shape) == 1 and spec[0][1] == 1 and plan.r(src) in plan.workspace:
            # a 1-D slice of step 1 read from a workspace buffer with zeros around it: a
            # plain load, no condition (the loop stays a run of vector loads)
            start, _, count, _ = spec[0]
            lo, hi = plan.margins.get(plan.r(src), (0, 0))
            plan.margins[plan.r(src)] = (max(lo, start), max(hi, shape[0] - start - count))
            return f"{self.ptr(src)}[{index} - {start}]" if start else \
                f"{self.ptr(src)}[{index}]"
        condition, position = _pad_position(shape, spec, part, index, clamp=False)
        body.loop.append(f"        const int {inside} = {condition};")
        return f"{inside} ? {self.ptr(src)}[{inside} ? {position} : 0] : ({ctype})0"

    def in_memory(self, slot: int) -> bool:
        s = self.plan.r(slot)
        return s in self.needed_later or s in self.p.inputs or s in self.p.constants

    def _zero_outside(self, inside: str, value: str, ctype: str) -> str:
        """``value`` where ``inside`` holds, else 0: as a bit mask (gcc if-converts no ?:
        in a loop that calls vector math)."""
        return f"({ctype})easyad_v_mask({value}, {inside})"

    def _reduce(self, ins: Instruction, shape: tuple[int, ...], v: str, pre: list[str],
                loop: list[str], post: list[str]) -> None:
        op, axes = ins.params
        o = ins.outs[0]
        ctype = _C_TYPES[self.p.dtypes[o]]
        init = {"sum": "0.0", "max": "(-INFINITY)", "min": "INFINITY"}[op]
        if op == "sum":
            update = "{acc} += {v};"
        else:
            cmp = ">" if op == "max" else "<"
            update = f"{{{{ const double t_ = {{v}}; if (t_ != t_ || t_ {cmp} {{acc}}) " \
                     f"{{acc}} = t_; }}}}"
        out_size = math.prod(self.p.shapes[o])
        if out_size == 1 and op == "sum":
            # one running sum per lane (see _loop: fewer rounding steps in a row, as
            # numpy's pairwise sum), added up in a fixed order after the loop
            pre.append(f"    double acc{o}[{_LANES}] = {{0.0}};")
            loop.append(f"        acc{o}[lane] += {v};")
            post.append(f"    {self.ptr(o)}[0] = ({ctype})({_pairwise(f'acc{o}', _LANES)});")
            return
        if out_size == 1:
            pre.append(f"    double acc{o} = {init};")
            loop.append("        " + update.format(acc=f"acc{o}", v=v))
            post.append(f"    {self.ptr(o)}[0] = ({ctype})(acc{o});")
            return
        kept = [0 if d in axes else s for d, s in
                enumerate(_strides(tuple(1 if d in axes else n
                                         for d, n in enumerate(shape))))]
        pre.append(f"    for (long j = 0; j < {out_size}L; j++) {self.ptr(o)}[j] = {init};")
        loop.append("        " + update.format(acc=f"{self.ptr(o)}[{_offset(shape, kept)}]",
                                               v=v))

    def _assemble_apart(self, ins: Instruction) -> str:
        out_shape, dtype, parts = ins.params
        o = ins.outs[0]
        lines = [f"    memset(P[{self.plan.r(o)}], 0, {math.prod(out_shape)} * "
                 f"sizeof({_C_TYPES[self.p.dtypes[o]]}));"]
        for (offset, pshape, strides), src in zip(parts, ins.ins):
            n = math.prod(pshape)
            lines.append(f"    for (long i = 0; i < {n}L; i++) "
                         f"{self.ptr(o)}[{_offset(tuple(pshape), strides, offset)}] = "
                         f"{self.ptr(src)}[i];")
        return "    {\n" + "\n".join(lines) + "\n    }\n"


class FusedProgram:
    """The schedule of ``_Plan`` bound to its compiled segments; ``run(inputs)`` as
    ``BoundProgram.run`` (numpy arrays in, new numpy arrays out)."""

    def __init__(self, plan: _Plan, library: Any, be: Any, on_guard: Any,
                 stored: set[int], source: str) -> None:
        p = plan.program
        self.plan, self.source, self.be = plan, source, be
        self.n_slots = len(p.shapes)
        self.inputs = list(p.inputs)
        self.outputs = plan.outputs
        self._lock = threading.Lock()
        # the slots written in C and read after: a fresh array for outputs, else workspace
        fresh = {plan.r(o) for o in plan.outputs}
        made_in_python = {plan.r(o) for kind, item in plan.schedule if kind == "py"
                          for o in item.outs}
        stored = {s for s in stored if s not in made_in_python and p.dtypes[s] is not None}
        self.made_in_python = made_in_python
        self.base: list[Any] = [None] * (self.n_slots + len(plan.aux))
        for i, v in p.constants.items():
            if p.dtypes[i] is not None:
                self.base[i] = np.ascontiguousarray(v)
        self.base[self.n_slots:] = plan.aux
        self.in_place = _written_in_place(plan)
        self.fresh = sorted(s for s in stored if s in fresh and s not in p.inputs
                            and s not in p.constants and s not in self.in_place)
        work = sorted(s for s in stored if s not in fresh and s not in p.inputs
                      and s not in p.constants)
        self.work = work          # written by the C between calls: per thread in a batch
        self._tables: list[tuple[np.ndarray, list[np.ndarray]]] = []
        shared = _share_buffers(plan, work)
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
            else:
                aliases = tuple(i for i in item.ins if type(i) is int and plan.r(i) != i)
                self.steps.append((None, step(item, be, on_guard), aliases, item.outs))

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._lock:
            return self._run(inputs)

    def batchable(self) -> bool:
        """Whether the program runs at many points in one C loop (``run_batch``): every
        step generated C, nothing written in place, every output made fresh in C."""
        fresh = set(self.fresh)
        return all(fn is not None for fn, *_ in self.steps) and not self.in_place \
            and all(self.plan.r(o) in fresh for o in self.outputs)

    def run_batch(self, inputs: Sequence[Any], count: int) -> list[np.ndarray]:
        """The program at ``count`` points in one C loop without the GIL (only where
        ``batchable``): an input with one more axis than its slot holds a point per row
        (leading axis ``count``), any other is the same at every point; the outputs come
        back with that leading axis."""
        plan, p = self.plan, self.plan.program
        slots, bases, strides, keep = [], [], [], []
        for s, a in zip(self.inputs, inputs):
            a = np.ascontiguousarray(a, dtype=p.dtypes[s])
            per_point = a.ndim > len(p.shapes[s])
            slots.append(s)
            bases.append(a.ctypes.data)
            strides.append(a.strides[0] if per_point and count else 0)
            keep.append(a)
        outputs: dict[int, np.ndarray] = {}
        for s in self.fresh:
            a = np.empty((count,) + tuple(p.shapes[s]), dtype=p.dtypes[s])
            outputs[s] = a
            slots.append(s)
            bases.append(a.ctypes.data)
            strides.append(a.strides[0] if count else 0)
        fns = np.array([fn for fn, *_ in self.steps], dtype=np.uint64)
        slot_table = np.array(slots, dtype=np.int64)
        step = np.array(strides, dtype=np.int64)
        size = max((math.prod(sh) for sh in p.shapes if sh is not None), default=1)
        workers = min(_BATCH_THREADS, count) if count * size >= _PARALLEL_BATCH else 1
        with self._lock:
            if workers > 1:      # contiguous chunks, each on its own table and workspace
                tables = self._thread_tables(workers)
                edges = [count * w // workers for w in range(workers + 1)]

                def chunk(w: int) -> None:
                    lo, hi = edges[w], edges[w + 1]
                    start = np.array(bases, dtype=np.uint64) + \
                        (step * lo).astype(np.uint64)
                    _segments_batch(fns, tables[w][0], slot_table, start, step, hi - lo)
                futures = [_pool.threads().submit(chunk, w) for w in range(1, workers)]
                chunk(0)
                for future in futures:
                    future.result()
            elif count:
                _segments_batch(fns, self.pointers, slot_table,
                                np.array(bases, dtype=np.uint64), step, count)
            for s in self.inputs:       # the table must not keep addresses of this call's
                if isinstance(self.base[s], np.ndarray):     # arrays (run sets its own)
                    _point_at(self.pointers, s, self.base[s])
        del keep
        return [outputs[plan.r(o)].reshape((count,) + tuple(p.shapes[o]))
                for o in plan.outputs]

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
        return _results(plan, arrays, set(self.fresh) | self.made_in_python
                        | self.in_place.keys(), np.array)


def _written_in_place(plan: _Plan) -> dict[int, int]:
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


def _results(plan: _Plan, arrays: list[Any], fresh: set[int], copy: Any) -> list[Any]:
    """The outputs' buffers: those made new by this call as they are, others (workspace,
    an input, a constant) by ``copy``."""
    out = []
    for s in plan.outputs:
        root = plan.r(s)
        a = arrays[root]
        if root not in fresh:
            a = arrays[root] = copy(a)
            fresh.add(root)
        out.append(a.reshape(plan.program.shapes[s]))
    return out


# libm's functions that glibc's libmvec has vector versions of (x86-64): declared
# ``simd`` the vectoriser calls them on 4 or 8 lanes at once (glibc documents at most
# 4 ulp of error, as numpy's own SIMD loops have). By glibc version; the build is linked
# with -z defs, so a missing one fails the build, which is then tried without them.
_LIBMVEC_2_22 = ("exp", "log", "sin", "cos")
_LIBMVEC_2_35 = ("tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh",
                 "atanh", "exp2", "expm1", "log2", "log10", "log1p", "cbrt", "erf")


def _vector_math() -> tuple[str, ...]:
    """The libm functions to declare simd here (none off x86-64 glibc)."""
    import os
    import platform
    if platform.machine() not in ("x86_64", "AMD64") or not hasattr(os, "confstr"):
        return ()
    try:
        name, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()
        major, minor = (int(v) for v in version.split(".")[:2])
    except (ValueError, OSError):
        return ()
    if name != "glibc" or (major, minor) < (2, 22):
        return ()
    return _LIBMVEC_2_22 + (_LIBMVEC_2_35 if (major, minor) >= (2, 35) else ())


# mul0 and div0 as _helpers.h defines them (its EASYAD_*_ZERO tests say where they are 0),
# written without ?: (a bit mask on the result: +0.0 where the strong zero applies, as
# there), so a loop that also calls vector math still vectorises (gcc if-converts no ?: in
# such loops)
_STRONG_ZERO = """static inline double easyad_v_mask(double r, int keep) {
    uint64_t bits;
    memcpy(&bits, &r, sizeof bits);
    bits &= (uint64_t)0 - (uint64_t)keep;
    memcpy(&r, &bits, sizeof r);
    return r;
}
static inline double easyad_v_mul0(double a, double b) {
    return easyad_v_mask(a * b, !EASYAD_MUL0_ZERO(double, a, b));
}
static inline double easyad_v_div0(double a, double b) {
    return easyad_v_mask(a / b, !EASYAD_DIV0_ZERO(double, a, b));
}
#undef mul0
#define mul0 easyad_v_mul0
#undef div0
#define div0 easyad_v_div0"""


def _header() -> list[str]:
    lines = ["/* GENERATED by easyad/tensor/_program_c.py from a recorded tensor program: "
             "do not edit. */",
             "#include <math.h>", "#include <stddef.h>", "#include <stdint.h>",
             "#include <string.h>", '#include "_rule_functions.h"', _STRONG_ZERO,
             "#ifdef EASYAD_VECTOR_MATH"]
    # under names of their own (bound to libm's symbols): gcc then does not merge sin(x)
    # and cos(x) into one sincos call, which has no vector version
    for f in _vector_math():
        lines += [f'extern double easyad_v_{f}(double) __asm__("{f}") '
                  f'__attribute__((const, __simd__("notinbranch")));',
                  f"#define {f} easyad_v_{f}"]
    # the same functions with no vector versions, for the values selections compare
    lines.append("#endif")
    lines += [f'extern double easyad_s_{f}(double) __asm__("{f}") __attribute__((const));'
              for f in _vector_math()]
    return lines + [""]


def fused(program: Program, outputs: Sequence[int], be: Any, on_guard: Any
          ) -> FusedProgram | None:
    """The fused, compiled program for ``outputs`` on the numpy backend ``be``; None when
    nothing would be compiled (no C-able instruction) or no compiler works."""
    instructions = live_instructions(program, outputs)
    plan = _Plan(program, instructions, outputs)
    segments = [item for kind, item in plan.schedule if kind == "c"]
    if not segments:
        return None
    # which values are read outside the group that makes them: by Python steps, outputs,
    # other segments; computed by rendering once with everything stored, then again
    stored = _stored(plan, outputs)
    made_in_python = {plan.r(o) for kind, item in plan.schedule if kind == "py"
                      for o in item.outs}
    plan.workspace = {s for s in stored if s not in {plan.r(o) for o in outputs}
                      and s not in made_in_python and program.dtypes[s] is not None}
    renderer = _Renderer(plan, stored)
    source = _header() + [renderer.render(seg, k) for k, seg in enumerate(segments)]
    text = "\n".join(source)
    extra = ("-fopenmp-simd", "-Wl,-z,defs") + (("-DEASYAD_VECTOR_MATH",) if _vector_math()
                                                 else ())
    path = c_library.build(text, sum(len(s) for s in segments), extra, purpose="tensor")
    library = None if path is None else c_library.load(path, purpose="tensor")
    if library is None:
        return None
    return FusedProgram(plan, library, be, on_guard, stored, text)


def _group_numbers(plan: _Plan) -> dict[int, int]:
    """The loop (or Python step) each instruction runs in, numbered in running order, by
    ``id`` of the instruction: the plan's loops, as the renderer forms them (before
    ``_stored`` has decided, one a group)."""
    group_of: dict[int, int] = {}
    g = 0
    for kind, item in plan.schedule:
        if kind != "c":
            g += 1
            group_of[id(item)] = g
            continue
        for loop in plan.loops(item):
            g += 1
            for _, members in loop:
                for ins in members:
                    group_of[id(ins)] = g
    return group_of


def _stored(plan: _Plan, outputs: Sequence[int]) -> set[int]:
    """Slots (roots) that must be in memory: outputs, what sinks and Python steps make,
    and every value read by another loop than the one that makes it (or by a Python
    step); the rest live in registers only."""
    p = plan.program
    r = plan.r
    readers: dict[int, list[Instruction]] = {}
    producer: dict[int, Instruction] = {}
    for kind, item in plan.schedule:
        members = item if kind == "c" else [item]
        for ins in members:
            for i in ins.ins:
                if type(i) is int:
                    readers.setdefault(r(i), []).append(ins)
            for o in ins.outs:
                producer[r(o)] = ins
    group_of = _group_numbers(plan)
    stored = {r(o) for o in outputs}
    for slot, ins in producer.items():
        if (ins.op in _SINKS and not plan.is_pad(ins)) or slot in p.inputs:
            stored.add(slot)
            continue
        for reader in readers.get(slot, []):
            if group_of.get(id(reader)) != group_of.get(id(ins)) or reader.op not in _C_OPS:
                stored.add(slot)
                break
    for ins in producer.values():
        if ins.op not in _C_OPS or not plan._renderable(ins):
            stored.update(r(o) for o in ins.outs)
    stored -= set(p.inputs) | set(p.constants)
    plan.producer = producer
    _selections(plan, producer)
    _choose_recomputed(plan, stored, producer, readers)
    plan.stored = stored
    return stored


# Selections (max/min along axes, comparisons, where, abs and relu at 0, maximum/minimum,
# sign, heaviside) decide on the very value they compare. A max's adjoint goes to the
# elements equal to the max: if the backward loop recomputed exp(x) with the vector exp
# of glibc's libmvec while the max was taken over the scalar exp's values, no element
# would be equal and the gradient of the row would be lost. So a compared value is made
# once and read from memory (or its loop's register) by every reader, never recomputed
# through a function that may round two ways (_rounds_apart; arithmetic, sqrt and the
# helpers give the same bits anywhere, and are still recomputed); and it, with everything
# it is computed from, calls the scalar libm (one function of its input): a vectorised
# loop's lanes and its scalar remainder round vector math two ways, so equal inputs would
# stop being a tie depending on where they are in the array.
# The strong zeros are not selections here: mul0 and div0, and the tests of a value's
# kind that their recorded forms make (u == 0.0, u - u == 0.0, u == u) only decide between
# a product and the zero it is next to.
_SELECTING_CALLS = frozenset({"sign", "heaviside", "maximum", "minimum"})
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})


def compared_names(tree: _expr.Node | str) -> set[str]:
    """The variables of an expression whose values a selection in it compares: the
    operands of a comparison (not of a strong zero's test) and of sign, heaviside, maximum
    and minimum. A bool that a choose reads (where's condition) is not among them: the
    comparison that made it compares values already, and those are computed once, so
    it comes out the same wherever it is made."""
    found: set[str] = set()
    for node in _expr.walk(tree):
        if isinstance(node, _expr.Bin) and node.op in _COMPARISONS and not _kind_test(node):
            found |= _expr.variables(node)
        elif isinstance(node, _expr.Call) and node.name in _SELECTING_CALLS:
            found |= set().union(*(_expr.variables(a) for a in node.args))
    return found


def _kind_test(node: _expr.Bin) -> bool:
    """Whether a comparison tests what kind of number a value is (zero, finite, NaN: an
    equality with a number, or of an expression with itself), as strong zeros do."""
    if node.op not in ("==", "!="):
        return False
    left, right = node.left, node.right
    if isinstance(left, _expr.Bin) and left.op == "-" and left.left == left.right:
        left = _expr.Num(0.0)                 # u - u: 0 where u is finite
    return left == right or isinstance(left, _expr.Num) or isinstance(right, _expr.Num)


def _renamed(tree: _expr.Node, names: dict[str, str]) -> _expr.Node:
    """The expression with its calls of ``names``' keys calling the values instead."""
    if isinstance(tree, _expr.Call):
        return _expr.Call(names.get(tree.name, tree.name),
                          tuple(_renamed(a, names) for a in tree.args))
    if isinstance(tree, _expr.Bin):
        return _expr.Bin(tree.op, _renamed(tree.left, names), _renamed(tree.right, names))
    if isinstance(tree, _expr.Neg):
        return _expr.Neg(_renamed(tree.operand, names))
    return tree


def _selections(plan: _Plan, producer: dict[int, Instruction]) -> None:
    """Sets ``plan.compared`` (the roots a selection compares: a max's or min's operand,
    the compared operands of a map) and ``plan.exact_math`` (the instructions they are
    computed from, back to inputs, constants and Python steps)."""
    p, r = plan.program, plan.r
    compared: set[int] = set()
    for kind, item in plan.schedule:
        for ins in (item if kind == "c" else [item]):
            if ins.op == "reduce" and ins.params[0] in ("max", "min"):
                compared.add(r(ins.ins[0]))
            elif ins.op == "map":
                names = set().union(*(compared_names(e) for e in ins.params[1]))
                compared.update(r(i) for name, i in zip(ins.params[2], ins.ins)
                                if type(i) is int and name in names)
    exact: set[int] = set()
    pending = list(compared)
    seen: set[int] = set()
    while pending:
        slot = pending.pop()
        made_by = producer.get(slot)
        if slot in seen or made_by is None or made_by.op not in _C_OPS:
            continue
        seen.add(slot)
        exact.add(id(made_by))
        pending += [r(i) for i in made_by.ins if type(i) is int]
    plan.compared = compared - set(p.inputs) - set(p.constants)
    plan.exact_math = exact


# A value that later loops read is recomputed in them instead of stored (XLA fuses
# elementwise producers into their consumers the same way) when its instructions, back to
# values in memory, cost less than the store and the loads: on arrays larger than the
# caches a store and a load move 16-24 bytes an element, time for some 50 vector
# operations or 2-3 calls of vector math. So the backward sweep's values that the adjoints
# of slices (pads) add up are recomputed at shifted positions in the pad loop, which then
# reads the inputs once and writes the gradient: one pass instead of three stores and
# three loads per element.
_RECOMPUTE_COST = 48          # operations an element, at most
_CALL_COST = 16               # a call of libm (sin, exp, pow with a variable exponent...)
_CHEAP_CALLS = frozenset({"abs", "fabs", "sqrt", "mul0", "div0", "maximum", "minimum",
                          "sign", "heaviside"})
_RECOMPUTE_ARRAYS = 2         # arrays (of more than one element) it may read instead
_MAX_RUNS = 9                 # ranges a loop is cut into at most (see _Renderer._runs)


def _choose_recomputed(plan: _Plan, stored: set[int], producer: dict[int, Instruction],
                       readers: dict[int, list[Instruction]]) -> None:
    """Takes out of ``stored`` the values to recompute where read (``plan.recomputed``):
    made by an elementwise instruction of a loop, read only by loops (a Python step, an
    output or an assemble of several parts needs it in memory) and in order
    (``_Plan.reads_in_order``), cheap (see above). In program order, so a value's
    recomputation may go through earlier recomputed ones."""
    p, r = plan.program, plan.r
    in_loops = {id(ins) for kind, item in plan.schedule if kind == "c" for ins in item
                if plan.loop_shape(ins) != ("assemble",)}
    outputs = {r(o) for o in plan.outputs}
    for slot, ins in producer.items():
        if slot not in stored or slot in outputs or id(ins) not in in_loops or \
                not (ins.op in _ELEMENTWISE or plan.is_pad(ins)) or \
                any(id(reader) not in in_loops or not plan.reads_in_order(reader, slot)
                    for reader in readers.get(slot, ())):
            continue
        cost, reads, rounds_apart = 0, set(), False
        seen: set[int] = set()
        pending = [slot]
        while pending:
            made_by = producer[pending.pop()]
            if id(made_by) in seen:
                continue
            seen.add(id(made_by))
            cost += _operation_cost(made_by)
            rounds_apart = rounds_apart or _rounds_apart(made_by)
            for i in made_by.ins:
                if type(i) is int:
                    u = r(i)
                    if u in stored or u in p.inputs or u in p.constants:
                        reads.add(u)
                    else:
                        pending.append(u)
        if slot in plan.compared and rounds_apart:
            continue          # a selection's operand: made once (see _selections)
        arrays = sum(1 for u in reads if math.prod(p.shapes[u]) > 1)
        if cost <= _RECOMPUTE_COST and arrays <= _RECOMPUTE_ARRAYS:
            stored.discard(slot)
            plan.recomputed.add(slot)
            plan.recipe_reads[slot] = reads


# calls that give the same bits in every loop, lane and remainder (correctly rounded, or
# easyad's helpers, which vector loops run lane by lane); other libm functions may not
_SAME_EVERYWHERE = frozenset({"fabs", "sqrt", "mul0", "div0", "tmul", "maximum", "minimum",
                              "sign", "heaviside", "choose", "pow"})


def _rounds_apart(ins: Instruction) -> bool:
    """Whether ``ins``, computed in two places, may round two ways: a map calling a
    function with vector versions (exp, sin...)."""
    return ins.op == "map" and any(
        isinstance(node, _expr.Call) and node.name not in _SAME_EVERYWHERE
        for expr in ins.params[1] for node in _expr.walk(expr))


def _operation_cost(ins: Instruction) -> int:
    """Operations an element of ``ins`` takes (a read: 1; a libm call: _CALL_COST)."""
    if ins.op != "map":
        return 1
    _, exprs, names, _, _ = ins.params
    constants = {name: _expr.Num(i) for name, i in zip(names, ins.ins) if type(i) is float}
    cost = 0
    for expr in exprs:
        for node in _expr.walk(_expr.substitute(expr, constants)):
            if isinstance(node, _expr.Call) and node.name not in _CHEAP_CALLS and not (
                    node.name == "pow" and not _expr.variables(node.args[1])):
                cost += _CALL_COST
            elif isinstance(node, (_expr.Bin, _expr.Neg, _expr.Call)):
                cost += 1
    return cost


def _share_buffers(plan: _Plan, work: list[int]) -> dict[int, int]:
    """Workspace slots that can live in another's buffer: the other's last reader runs in
    an earlier loop than this one's first writer (loops run one after another), same
    dtype and size. Slots with zero margins (pads read past them) keep their own."""
    p, r = plan.program, plan.r
    group_of = _group_numbers(plan)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for kind, item in plan.schedule:
        for ins in (item if kind == "c" else [item]):
            g = group_of[id(ins)]
            for o in ins.outs:
                first.setdefault(r(o), g)
                last[r(o)] = max(last.get(r(o), g), g)
            for i in ins.ins:
                if type(i) is int:
                    for s in plan.memory_reads(i):
                        last[s] = max(last.get(s, g), g)
    owner: dict[int, int] = {}
    free: dict[tuple[Any, tuple[int, ...]], list[tuple[int, int]]] = {}   # -> (free after, slot)
    for s in sorted(work, key=lambda s: first.get(s, 0)):
        if s in plan.margins:
            continue
        key = (p.dtypes[s], p.shapes[s])
        pool = free.setdefault(key, [])
        found = next((k for k, (after, _) in enumerate(pool) if after < first.get(s, 0)), None)
        if found is not None:
            _, holder = pool.pop(found)
            owner[s] = holder
        else:
            holder = s
        pool.append((last.get(s, first.get(s, 0)), holder))
    return owner
