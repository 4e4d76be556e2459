"""The plan of a recorded tensor program's compiled form (the scheduler of tensor
programs, run after ``compiler.optimiser``), shared by the C and OpenCL renderers:

- ``Plan``: reshapes share memory (``root``), a *schedule* of segments of fusable
  instructions (maps, strided and gathered reads, reductions, assembles, scatter-adds)
  between Python/backend steps, and in a segment the *groups* (one loop shape each, values
  in registers; an instruction that reads nothing made in the segment, a slice of an
  input, starts the first, so loops of one shape on either side of it join) and *loops*
  (consecutive groups of shapes that differ only in the first dimension, run as one loop).
- ``stored_slots``: which values must be in memory (read by another loop, a Python step,
  the caller), with *selections* (``_selections``: values a comparison decides on are
  made once, with scalar libm) and *recomputation* (``_choose_recomputed``: cheap values
  recomputed where later loops read them, as XLA fuses producers into consumers).
- ``share_buffers``: workspace slots whose lives do not overlap share one buffer.
- flat index arithmetic for the renderers (``offset``, ``pad_position``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from easyad import _expr
from easyad.tensor._program import Instruction, Program
from easyad.tensor._shapes import contiguous_strides as flat_strides   # (C order)
from easyad.tensor._zero_signs import map_trees

ELEMENTWISE = {"map", "strided", "take"}
SINKS = {"reduce", "assemble", "scatter_add"}
_C_OPS = ELEMENTWISE | SINKS | {"reshape"}




def contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a view of ``shape`` with ``strides`` (in elements) is a run of consecutive
    elements in C order."""
    return all(s == c for n, s, c in zip(shape, strides, flat_strides(tuple(shape))) if n != 1)


def flat_offset(group: tuple[int, ...], strides: Sequence[int], base: int = 0,
            index: str = "i") -> str:
    """The element offset, for flat index ``index`` over ``group``, of a view with
    ``strides`` (in elements, aligned to group's dims; 0 where broadcast) and ``base``."""
    if contiguous(group, strides):
        return f"{base} + {index}" if base else index
    inner = flat_strides(group)
    terms = [] if not base else [str(base)]
    for d, (n, s) in enumerate(zip(group, strides)):
        if s == 0 or n == 1:
            continue
        idx = f"{index} / {inner[d]}" if inner[d] != 1 else index
        if d > 0:
            idx = f"({idx}) % {n}"
        terms.append(f"({idx}) * {s}" if s != 1 else f"({idx})")
    return " + ".join(terms) if terms else "0"


def pad_position(shape: tuple[int, ...], spec: list[tuple[int, int, int, int]],
                  part: tuple[int, ...], index: str, clamp: bool) -> tuple[str, str]:
    """For flat index ``index`` over a pad's output ``shape`` (its slice ``spec``, of
    ``_slice_of``): whether it is inside the slice, and the flat index into the part
    there (``clamp``: a position inside the part everywhere, the nearest one outside)."""
    inner = flat_strides(shape)
    part_strides = flat_strides(part)
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
    cs = flat_strides(out_shape)
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


def broadcast_strides(shape: tuple[int, ...], group: tuple[int, ...]) -> list[int]:
    own = flat_strides(shape)
    pad = len(group) - len(shape)
    return [0] * pad + [0 if n == 1 else s for n, s in zip(shape, own)]


class Plan:
    """What the renderer decided: per slot its root (reshapes share memory), where each
    instruction went (segments, and in a segment the loops: ``groups``, which the OpenCL
    renderer forms kernels of too). ``types``: the element types of the dialect the plan
    is rendered in (``cstyle.Dialect.types``): what it has no type for is a Python step."""

    def __init__(self, program: Program, instructions: list[Instruction],
                 outputs: Sequence[int], types: dict[Any, str]) -> None:
        self.program = program
        self.types = types
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
        # id of an index array -> its number in aux, kept across renders of the plan (the
        # OpenCL kernels over a batch of points are rendered again from it)
        self.aux_numbers: dict[int, int] = {}
        # a slice's adjoint (one part written into zeros) as an elementwise value over
        # its output: zero outside the slice, so sums of such adjoints fuse into one loop
        self.pads: dict[int, list[tuple[int, int, int, int]]] = {}
        self.pad_runs: dict[int, tuple[int, int]] = {}     # pads whose slice is a flat run
        for ins in instructions:
            if ins.op == "assemble" and len(ins.params.parts) == 1:
                (offset, part, strides), = ins.params.parts
                spec = _slice_of(tuple(ins.params.shape), offset, tuple(part), tuple(strides))
                if spec is not None:
                    self.pads[id(ins)] = spec
                    if contiguous(part, strides):   # [offset, offset + size) of the output
                        self.pad_runs[id(ins)] = (offset, offset + math.prod(part))

        # workspace buffers read past their ends by pads (zeros there): root -> (lo, hi)
        self.margins: dict[int, tuple[int, int]] = {}
        self.workspace: set[int] = set()      # set by fused(): roots in planned buffers
        # set by stored_slots: the instruction that makes each slot (by root), the values
        # recomputed where read instead of stored, and the slots in memory each one's
        # recomputation reads
        self.producer: dict[int, Instruction] = {}
        self.recomputed: set[int] = set()
        self.recipe_reads: dict[int, set[int]] = {}
        # set by stored_slots (see _selections): the roots a selection compares, never
        # recomputed, and the instructions (by id) those are computed from, whose libm
        # calls are the scalar ones wherever they run
        self.compared: set[int] = set()
        self.exact_math: set[int] = set()
        # the maps computed in float (fused_c: the rule table's float32 forms, float32.py)
        self.in_float: set[int] = set()
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
            return contiguous(reader.params.shape, reader.params.strides)
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

    def _renderable(self, ins: Instruction) -> bool:
        p = self.program
        dts = [p.dtypes[o] for o in ins.outs] + [p.dtypes[i] for i in ins.ins
                                                  if type(i) is int]
        if any(dt not in self.types for dt in dts):
            return False
        if ins.op == "map":
            return all(type(i) is int or type(i) is float for i in ins.ins)
        if ins.op == "reduce":
            return ins.params.op in ("sum", "max", "min")
        return True

    def loops(self, instructions: list[Instruction]
              ) -> list[list[tuple[Any, list[Instruction]]]]:
        """The loops of a segment: its groups, and once ``stored_slots`` has said what is in
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
            ins.op == "reduce" and ins.params.op == "sum"
            and math.prod(self.program.shapes[ins.outs[0]]) == 1)

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
            elif last < 0 and groups:
                # reads nothing made in the segment (a slice of an input): first, so the
                # loops after it that read it may join the loops before it
                target = 0
                made_in = {s: k + 1 for s, k in made_in.items()}
                groups.insert(0, (shape, [ins]))
            else:
                target = len(groups)
                groups.append((shape, [ins]))
            for o in ins.outs:
                made_in[r(o)] = target
        return groups

    def loop_shape(self, ins: Instruction) -> Any:
        """The shape a group's loop runs over (("assemble",) for a several-part assemble)."""
        p = self.program
        if ins.op in ELEMENTWISE or self.is_pad(ins):
            return p.shapes[ins.outs[0]]
        if ins.op == "assemble":
            parts = ins.params.parts
            return tuple(parts[0].shape) if len(parts) == 1 else ("assemble",)
        if ins.op == "scatter_add":
            return tuple(ins.params.index.shape)  # over the index (g may broadcast to it)
        return p.shapes[ins.ins[0]]           # reduce: over its input

    def joins(self, members: list[Instruction], ins: Instruction,
              shape: tuple[int, ...]) -> bool:
        made: set[int] = set()
        sunk: set[int] = set()
        for m in members:
            (sunk if m.op in SINKS and not self.is_pad(m) else made).update(
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
        if ins.op in SINKS:
            if ins.op == "assemble" and len(ins.params.parts) != 1:
                return False
            # a sink of a value made here: its input must be of the loop's shape
            return all(self.program.shapes[i] == shape for i in ins.ins if type(i) is int)
        return True


def group_numbers(plan: Plan) -> dict[int, int]:
    """The loop (or Python step) each instruction runs in, numbered in running order, by
    ``id`` of the instruction: the plan's loops, as the renderer forms them (before
    ``stored_slots`` has decided, one a group)."""
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


def stored_slots(plan: Plan, outputs: Sequence[int]) -> set[int]:
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
    group_of = group_numbers(plan)
    stored = {r(o) for o in outputs}
    for slot, ins in producer.items():
        if (ins.op in SINKS and not plan.is_pad(ins)) or slot in p.inputs:
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
_SELECTING_CALLS = frozenset({"sign", "heaviside", "maximum", "minimum", "pick", "fmax", "fmin"})
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


def renamed(tree: _expr.Node, names: dict[str, str]) -> _expr.Node:
    """The expression with its calls of ``names``' keys calling the values instead."""
    if isinstance(tree, _expr.Call):
        return _expr.Call(names.get(tree.name, tree.name),
                          tuple(renamed(a, names) for a in tree.args))
    if isinstance(tree, _expr.Bin):
        return _expr.Bin(tree.op, renamed(tree.left, names), renamed(tree.right, names))
    if isinstance(tree, _expr.Neg):
        return _expr.Neg(renamed(tree.operand, names))
    return tree


def _selections(plan: Plan, producer: dict[int, Instruction]) -> None:
    """Sets ``plan.compared`` (the roots a selection compares: a max's or min's operand,
    the compared operands of a map) and ``plan.exact_math`` (the instructions they are
    computed from, back to inputs, constants and Python steps)."""
    p, r = plan.program, plan.r
    compared: set[int] = set()
    for kind, item in plan.schedule:
        for ins in (item if kind == "c" else [item]):
            if ins.op == "reduce" and ins.params.op in ("max", "min"):
                compared.add(r(ins.ins[0]))
            elif ins.op == "map":
                names = set().union(*(compared_names(e) for e in ins.params.exprs))
                compared.update(r(i) for name, i in zip(ins.params.names, ins.ins)
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
MAX_RUNS = 9                 # ranges a loop is cut into at most (see Renderer._runs)


def _choose_recomputed(plan: Plan, stored: set[int], producer: dict[int, Instruction],
                       readers: dict[int, list[Instruction]]) -> None:
    """Takes out of ``stored`` the values to recompute where read (``plan.recomputed``):
    made by an elementwise instruction of a loop, read only by loops (a Python step, an
    output or an assemble of several parts needs it in memory) and in order
    (``Plan.reads_in_order``), cheap (see above). In program order, so a value's
    recomputation may go through earlier recomputed ones."""
    p, r = plan.program, plan.r
    in_loops = {id(ins) for kind, item in plan.schedule if kind == "c" for ins in item
                if plan.loop_shape(ins) != ("assemble",)}
    outputs = {r(o) for o in plan.outputs}
    for slot, ins in producer.items():
        if slot not in stored or slot in outputs or id(ins) not in in_loops or \
                not (ins.op in ELEMENTWISE or plan.is_pad(ins)) or \
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
        for expr in ins.params.exprs for node in _expr.walk(expr))


def _operation_cost(ins: Instruction) -> int:
    """Operations an element of ``ins`` takes (a read: 1; a libm call: _CALL_COST)."""
    if ins.op != "map":
        return 1
    exprs, names = ins.params.exprs, ins.params.names
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


def share_buffers(plan: Plan, work: list[int]) -> dict[int, int]:
    """Workspace slots that can live in another's buffer: the other's last reader runs in
    an earlier loop than this one's first writer (loops run one after another), same
    dtype and size. Slots with zero margins (pads read past them) keep their own."""
    p, r = plan.program, plan.r
    group_of = group_numbers(plan)
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
