"""The renderer of planned tensor programs, with a dialect per target language.

- ``Dialect``: what C and OpenCL spell differently in one loop body, each stated once:
  element types, the type of constants and accumulators (``real``), the target of the
  rule table's expressions (``_expr.render``) and the constant printer's rounding
  (``easyad._csyntax.literal``), a value zeroed outside a slice (the strong zero's bit
  mask in C, ``?:`` in OpenCL), the builtins of values a selection compares, and the
  generated file's header (``_helpers.h`` and, in C, libmvec's declarations; in OpenCL
  ``_kernels.preamble``, with its vector types). ``CDialect`` here, ``OpenCLDialect`` in
  ``compiler/dialect.py`` (the scalar tape's OpenCL replay uses it too).
- ``Renderer`` (a ``compiler.cstyle.CStyleRenderer``, the one renderer): the loop body
  shared by both (``_body``, ``_emit``, ``_read``, ``_pad``, ``_operand``, over ``Loop``),
  written through its dialect; as it stands, the program
  form of C: one function per segment over the table of pointers ``P``, a loop per group
  (``_loop``: vector lanes for sums to one number, ``#pragma omp simd``), sums in 8
  running lanes. ``render_cl.OpenCLRenderer`` subclasses it with OpenCL's program form:
  a kernel per group, work-items instead of the loop, reductions as partials per
  work-item, vector loops on CPU devices, and optionally a dimension over points.

A new backend (CUDA, Metal...) is a ``Dialect`` (its types, qualifiers, header, builtins'
names) and, where its program form is not one of these two, a renderer subclass of its
own kernels' head and launch shape (``render_cl`` is the model for GPU-like targets).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad import _expr
from easyad.compiler import dialect, libm
from easyad.compiler.cstyle import CStyleRenderer
from easyad.compiler.program import float32, loop_split
from easyad.compiler.program.plan import (
    ELEMENTWISE, MAX_RUNS, SINKS, Plan, broadcast_strides, contiguous, flat_offset,
    flat_strides,
    pad_position, renamed)
from easyad.tensor._program import Instruction
from easyad.tensor._zero_signs import constant_strong_zeros


Dialect = dialect.Dialect      # (the base of the dialects: compiler/dialect.py)


class CDialect(dialect.CSpelling):
    """C for gcc on the numpy device: values computed in double, stored in their dtype
    (the scalar tape's renderer spells its C with ``compiler.dialect.C``, this dialect's
    base)."""

    def zero_outside(self, inside: str, value: str, ctype: str) -> str:
        # a bit mask: gcc if-converts no ?: in a loop that calls vector math
        return f"({ctype})easyad_v_mask({value}, {inside})"

    def exact_calls(self, tree: _expr.Node) -> _expr.Node:
        # libm by names without vector versions (easyad_s_*, bound to libm's symbols)
        return renamed(tree, {f: f"easyad_s_{f}" for f in libmvec_functions()})

    def header(self) -> list[str]:
        return c_header()


OpenCLDialect = dialect.OpenCLDialect     # (compiler/dialect.py)


class Loop:
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
        self.outer: list[str] = []    # (_outer_split) loads the same at every inner index
        self.after: list[str] = []    # (_outer_split) partial sums stored after the inner loop

    def position(self, at: str) -> str:
        """A name for the flat index expression ``at`` (declared in the loop once)."""
        if at.isidentifier():
            return at
        name = self.positions.get(at)
        if name is None:
            name = self.positions[at] = f"j{len(self.positions)}"
            self.loop.append(f"        const long {name} = {at};")
        return name


_INNER = 256    # the fewest elements an inner loop of _outer_split runs over
_LANES = 8      # running sums of a sum to one number (as many as AVX-512's doubles)


def _pairwise(array: str, count: int, start: int = 0) -> str:
    """array[start] + ... + array[start + count - 1], added pairwise in a fixed order."""
    if count == 1:
        return f"{array}[{start}]"
    half = count // 2
    return f"({_pairwise(array, half, start)} + {_pairwise(array, count - half, start + half)})"


class Renderer(CStyleRenderer):
    """C of one segment (see the module docstring). The loop body of a group (``_body``) is
    shared with the OpenCL renderer (``render_cl``), which changes the memory (``ptr``,
    ``aux``, ``_zero``), the reductions and the program's form."""

    def __init__(self, plan: Plan, needed_later: set[int],
                 dialect: Dialect | None = None) -> None:
        super().__init__(dialect or CDialect())
        self.types = self.dialect.types       # (vector types while a vector loop renders)
        self.plan, self.p = plan, plan.program
        self.needed_later = needed_later          # slots read outside their group
        self.lines: list[str] = []
        self.split: tuple[tuple[int, ...], int] | None = None    # (_outer_split)
        self._sums = False          # (_outer_split) with reduces over the inner axes
        self._outer: list[str] = []
        self._after: list[str] = []

    def ptr(self, slot: int, write: bool = False) -> str:
        """The slot's memory as a local pointer of the segment (loaded from P once, so
        the compiler knows no store of the loop changes it, and vectorises); ``write``:
        the loop stores to it (which the OpenCL renderer's parameters say)."""
        s = self.plan.r(slot)
        ctype = self.dialect.types[self.p.dtypes[slot]]
        self.used[s] = f"    {ctype}* const p{s} = ({ctype}*)P[{s}];"
        return f"p{s}"

    def aux(self, array: np.ndarray) -> str:
        """A gather's or scatter's index array, as a pointer (after the slots in P)."""
        k = len(self.p.shapes) + self.aux_number(array)
        self.used[k] = f"    const long* const p{k} = (const long*)P[{k}];"
        return f"p{k}"

    def aux_number(self, array: np.ndarray) -> int:
        """The index array's number in ``plan.aux`` (added once, however often read)."""
        numbers = self.plan.aux_numbers
        found = numbers.get(id(array))
        if found is None:
            self.plan.aux.append(np.ascontiguousarray(array.reshape(-1), dtype=np.int64))
            found = numbers[id(array)] = len(self.plan.aux) - 1
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
        runs = self._runs(groups)
        self.split = None if lanes or len(runs) != 1 or runs[0][2] is not None else \
            self._outer_split(groups)
        for lo, hi, inside in runs:
            run_pre, loop, run_post = self._body(
                [(shape, group) for shape, group in groups if math.prod(shape) >= hi], inside)
            pre += [line for line in run_pre if line not in pre]     # the same in each
            post += [line for line in run_post if line not in post]
            body = "\n".join(loop) + "\n    }\n"
            if not lanes and self.split is not None:
                shape, k = self.split
                inner = math.prod(shape[k:])
                loops.append(f"    for (long o = 0; o < {math.prod(shape[:k])}L; o++) {{\n"
                             + "".join(line + "\n" for line in self._outer)
                             + ("    #pragma omp simd\n" if simd and not self._sums else "")
                             + f"    for (long ii = 0; ii < {inner}L; ii++) {{\n"
                             + f"        const long i = o * {inner}L + ii;\n" + body
                             + "".join(line + "\n" for line in self._after) + "    }\n")
                continue
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
        self.split, self._sums = None, False
        return ("    {\n" + "".join(line + "\n" for line in pre) + "".join(loops)
                + "".join(line + "\n" for line in post) + "    }\n")

    def _outer_split(self, groups: list[tuple[Any, list[Instruction]]]
                     ) -> tuple[tuple[int, ...], int] | None:
        """(the loop's shape, k): an outer loop over its first k axes around a vector loop
        over the rest (``loop_split.outer_split``); None: one flat loop."""
        found = loop_split.outer_split(self.plan, groups, _INNER, _LANES)
        if found is None:
            return None
        shape, k, self._sums = found
        return shape, k

    def _partial(self, body: Loop, ins: Instruction, v: str) -> None:
        """A reduce over the inner axes of an _outer_split loop (output index o)."""
        op, o = ins.params.op, ins.outs[0]
        acc = f"acc{o}"
        init = {"sum": "0.0", "max": "(-INFINITY)", "min": "INFINITY"}[op]
        body.outer.append(f"        double {acc} = {init};")
        if op == "sum":
            body.loop.append(f"        {acc} += {v};")
        else:
            cmp = ">" if op == "max" else "<"
            body.loop.append(f"        {{ const double t_ = {v}; if (t_ != t_ || t_ {cmp} "
                             f"{acc}) {acc} = t_; }}")
        ctype = self.dialect.types[self.p.dtypes[o]]
        body.after.append(f"        {self.ptr(o, True)}[o] = ({ctype})({acc});")

    def _runs(self, groups: list[tuple[Any, list[Instruction]]]
              ) -> list[tuple[int, int, dict[int, bool] | None]]:
        """The ranges of flat indices a loop is cut into: where a group's elements end,
        and (at most ``MAX_RUNS`` ranges) where the slice of a pad of a recomputed value
        starts or ends, each range with, per such pad, whether its slice covers the range
        (a plain read at a shift there, else 0: no condition, memory read in order; None:
        those pads under a condition)."""
        cuts = {0} | {math.prod(shape) for shape, _ in groups}
        runs = {id(ins): self.plan.pad_runs[id(ins)] for _, members in groups
                for ins in members if self.plan.is_pad(ins) and not self.in_memory(ins.ins[0])}
        at_pads = sorted(cuts | {c for run in runs.values() for c in run})
        if not runs or len(at_pads) - 1 > MAX_RUNS:
            ends = sorted(cuts)
            return [(lo, hi, None) for lo, hi in zip(ends, ends[1:])]
        return [(lo, hi, {k: a <= lo and hi <= b for k, (a, b) in runs.items()})
                for lo, hi in zip(at_pads, at_pads[1:])]

    def _zero(self, o: int, pre: list[str]) -> None:
        """Slot o (a sink's output) set to 0 before the loop."""
        pre.append(f"    memset(P[{self.plan.r(o)}], 0, {math.prod(self.p.shapes[o])} * "
                   f"sizeof({self.dialect.types[self.p.dtypes[o]]}));")

    def _body(self, groups: list[tuple[Any, list[Instruction]]],
              inside: dict[int, bool] | None = None) -> tuple[list[str], list[str], list[str]]:
        """The lines before a loop (flat index i) over the groups' shapes, in it and after
        it; ``inside``: of a range of ``_runs``."""
        body = Loop(inside)
        for shape, members in groups:
            for ins in self.live(members):
                self._emit(body, ins, shape, "i")
        # stores: values of the loop read after it
        for _, members in groups:
            for ins in members:
                if ins.op in ELEMENTWISE or self.plan.is_pad(ins):
                    for o in ins.outs:
                        if self.plan.r(o) in self.needed_later:
                            body.loop.append(f"        {self.ptr(o, True)}[i] = "
                                             f"{body.regs[(self.plan.r(o), 'i')]};")
        self._outer, self._after = body.outer, body.after
        return body.pre, body.loop, body.post

    def live(self, members: list[Instruction]) -> list[Instruction]:
        """The members of a loop whose values it uses: sinks, values stored for later and
        what those read; the rest are recomputed by the loops that read them."""
        plan = self.plan
        read: set[int] = set()
        live: list[Instruction] = []
        for ins in reversed(members):
            if (ins.op in SINKS and not plan.is_pad(ins)) or any(
                    plan.r(o) in self.needed_later or plan.r(o) in read for o in ins.outs):
                live.append(ins)
                read.update(plan.r(i) for i in ins.ins if type(i) is int)
        return live[::-1]

    def _emit(self, body: Loop, ins: Instruction, shape: Any, index: str) -> None:
        """The lines of one instruction at flat index ``index`` of ``shape``: the loop's
        own i, or (for values) a position where the loop reads a recomputed value."""
        p, plan, types = self.p, self.plan, self.types
        op, params, outs = ins.op, ins.params, ins.outs
        suffix = "" if index == "i" else f"_{index}"

        def put(o: int, text: str, ctype: str | None = None) -> None:
            reg = f"v{o}{suffix}"
            ctype = ctype or types[p.dtypes[o]]
            body.loop.append(f"        const {ctype} {reg} = {text};")
            body.regs[(plan.r(o), index)] = reg
            body.ctypes[reg] = ctype
        if op == "map":
            names, dtypes = params.names, params.dtypes
            mapping = {name: self._operand(body, i, shape, index)
                       for name, i in zip(names, ins.ins)}
            for k, (o, dt) in enumerate(zip(outs, dtypes)):
                tree = constant_strong_zeros(
                    _expr.substitute(self.plan.map_tree(ins, k), mapping))
                if id(ins) in plan.in_float and id(ins) not in plan.exact_math:
                    # a row's float32 form (float32.py): float arithmetic and functions
                    put(o, f"(float)({float32.in_float(tree)})")
                    continue
                tree = self.dialect.exact_calls(tree) if id(ins) in plan.exact_math \
                    else self._calls(body, tree)
                number = _expr.constant(tree)
                if number is not None and np.dtype(dt).kind == "f" and \
                        float(np.dtype(dt).type(number)) == number:
                    # a number (the seed, passed on by the sweep): a literal for what
                    # reads it, so the strong zeros around it simplify
                    body.regs[(plan.r(o), index)] = self.inline(number)
                    continue
                if np.dtype(dt) == np.bool_ and self.dialect.name == "c":
                    # a truth value in an int register, its branches int literals: gcc 12
                    # vectorises no loop that computes an unsigned char from a double
                    # (every strong zero's mask); stored, it is 0 or 1 as before
                    put(o, f"(int)({self.expression(_truth_literals(tree))})", "int")
                    continue
                put(o, f"({types[np.dtype(dt)]})({self.expression(tree)})")
        elif op == "strided":
            offset, strides = params.offset, params.strides
            put(outs[0], self._read(body, ins.ins[0], flat_offset(shape, strides, offset, index)))
        elif op == "take":
            put(outs[0], self._read(body, ins.ins[0], f"{self.aux(params.index)}[{index}]"))
        elif op == "reduce" and self._sums and index == "i":
            self._partial(body, ins, self._operand(body, ins.ins[0], shape, index))
        elif op == "reduce":
            self._reduce(ins, shape, self._operand(body, ins.ins[0], shape, index), body.pre,
                         body.loop, body.post)
        elif op == "assemble" and plan.is_pad(ins):
            put(outs[0], self._pad(body, ins, shape, index, f"in{outs[0]}{suffix}"))
        elif op == "assemble":
            (part,) = params.parts
            offset, strides = part.offset, part.strides
            o = outs[0]
            self._zero(o, body.pre)
            read = self._read(body, ins.ins[0], index)   # of the part's size, not its shape
            body.loop.append(f"        {self.ptr(o, True)}"
                             f"[{flat_offset(shape, strides, offset, index)}] = {read};")
        elif op == "scatter_add":
            o = outs[0]
            idx = self.aux(params.index)
            self._zero(o, body.pre)
            body.loop.append(f"        {self.ptr(o, True)}[{idx}[{index}]] += "
                             f"{self._operand(body, ins.ins[0], shape, index)};")

    def _calls(self, body: Loop, tree: _expr.Node) -> _expr.Node:
        """An expression's calls as the target computes them best (here as they are)."""
        return tree

    def _operand(self, body: Loop, i: Any, shape: Any, index: str) -> str:
        """A name (or plain literal) for operand i (broadcast to ``shape``) at ``index``."""
        constant = self.p.constants.get(self.plan.r(i)) if type(i) is int else None
        if constant is not None and constant.size == 1 and constant.dtype.kind == "f":
            # one recorded number (the gradient's seed, 1.0): a literal, which the compiler
            # folds into the arithmetic (and the strong zero's tests) around it
            i = float(constant.reshape(-1)[0])
        if type(i) is float:
            if math.isfinite(i):
                return self.inline(i)
            name = "k_" + ("nan" if math.isnan(i) else "inf" if i > 0 else "minus_inf")
            if name not in body.loads:
                body.loads[name] = name
                body.pre.append(f"    const {self.dialect.real} {name} = "
                                f"{self.literal(i)};")
            return name
        strides = broadcast_strides(self.p.shapes[i], shape)
        if self.split is not None and index == "i" and tuple(shape) == self.split[0] and \
                not contiguous(shape, strides):
            k = self.split[1]          # (_outer_split: the outer index o, the inner ii)
            terms = [flat_offset(shape[:k], strides[:k], 0, "o"),
                     flat_offset(shape[k:], strides[k:], 0, "ii")]
            if terms[1] == "0" and self.in_memory(i):
                # the same at every inner index: loaded before the inner loop (gcc sinks
                # a load in the loop into the branch that uses it, a masked load of one
                # address, which it does not vectorise)
                load = f"{self.ptr(i)}[{terms[0]}]"
                found = body.loads.get(load)
                if found is None:
                    found = body.loads[load] = f"l{len(body.loads)}"
                    body.ctypes[found] = self.types[self.p.dtypes[i]]
                    body.outer.append(f"        const {body.ctypes[found]} {found} = {load};")
                return found
            return self._read(body, i, " + ".join(t for t in terms if t != "0") or "0")
        return self._read(body, i, flat_offset(shape, strides, 0, index))

    def _read(self, body: Loop, slot: int, at: str) -> str:
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

    def _pad(self, body: Loop, ins: Instruction, shape: tuple[int, ...], index: str,
             inside: str) -> str:
        """A slice's adjoint at ``index`` of its output: the part's element where the slice
        is, 0 elsewhere (``inside``: the name of the condition)."""
        plan = self.plan
        src = ins.ins[0]
        spec = plan.pads[id(ins)]
        ctype = self.types[self.p.dtypes[ins.outs[0]]]
        part = tuple(ins.params.parts[0].shape)
        if index == "i" and body.inside is not None and id(ins) in body.inside:
            if not body.inside[id(ins)]:
                return f"({ctype})0"
            start = plan.pad_runs[id(ins)][0]
            return self._read(body, src, f"i - {start}" if start else "i")
        if not self.in_memory(src):
            # the part recomputed at a position clamped into it (every lane computes, so
            # the loop vectorises), then zeroed outside the slice
            condition, position = pad_position(shape, spec, part, index, clamp=True)
            body.loop.append(f"        const int {inside} = {condition};")
            return self.dialect.zero_outside(inside, self._read(body, src, position), ctype)
        if len(shape) == 1 and spec[0][1] == 1 and plan.r(src) in plan.workspace:
            # a 1-D slice of step 1 read from a workspace buffer with zeros around it: a
            # plain load, no condition (the loop stays a run of vector loads)
            start, _, count, _ = spec[0]
            lo, hi = plan.margins.get(plan.r(src), (0, 0))
            plan.margins[plan.r(src)] = (max(lo, start), max(hi, shape[0] - start - count))
            return f"{self.ptr(src)}[{index} - {start}]" if start else \
                f"{self.ptr(src)}[{index}]"
        condition, position = pad_position(shape, spec, part, index, clamp=False)
        body.loop.append(f"        const int {inside} = {condition};")
        return f"{inside} ? {self.ptr(src)}[{inside} ? {position} : 0] : ({ctype})0"

    def in_memory(self, slot: int) -> bool:
        s = self.plan.r(slot)
        return s in self.needed_later or s in self.p.inputs or s in self.p.constants

    def _reduce(self, ins: Instruction, shape: tuple[int, ...], v: str, pre: list[str],
                loop: list[str], post: list[str]) -> None:
        op, axes = ins.params.op, ins.params.axes
        o = ins.outs[0]
        ctype = self.dialect.types[self.p.dtypes[o]]
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
                enumerate(flat_strides(tuple(1 if d in axes else n
                                         for d, n in enumerate(shape))))]
        pre.append(f"    for (long j = 0; j < {out_size}L; j++) {self.ptr(o)}[j] = {init};")
        loop.append("        " + update.format(acc=f"{self.ptr(o)}[{flat_offset(shape, kept)}]",
                                               v=v))

    def _assemble_apart(self, ins: Instruction) -> str:
        out_shape, parts = ins.params.shape, ins.params.parts
        o = ins.outs[0]
        lines = [f"    memset(P[{self.plan.r(o)}], 0, {math.prod(out_shape)} * "
                 f"sizeof({self.dialect.types[self.p.dtypes[o]]}));"]
        for (offset, pshape, strides), src in zip(parts, ins.ins):
            n = math.prod(pshape)
            lines.append(f"    for (long i = 0; i < {n}L; i++) "
                         f"{self.ptr(o)}[{flat_offset(tuple(pshape), strides, offset)}] = "
                         f"{self.ptr(src)}[i];")
        return "    {\n" + "\n".join(lines) + "\n    }\n"



libmvec_functions = libm.libmvec_functions     # (compiler/libm.py)


# mul0 and div0 as _helpers.h defines them (its EASYAD_*_ZERO tests say where they are 0),
# written without ?: (a bit mask on the result: +0.0 where the strong zero applies, as
# there), so a loop that also calls vector math still vectorises (gcc if-converts no ?: in
# such loops)
STRONG_ZERO = """static inline double easyad_v_mask(double r, int keep) {
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


def c_header() -> list[str]:
    lines = ["/* GENERATED by easyad/compiler/program/cstyle.py from a recorded tensor program: "
             "do not edit. */",
             "#include <math.h>", "#include <stddef.h>", "#include <stdint.h>",
             "#include <string.h>", '#include "_rule_functions.h"', STRONG_ZERO,
             "#ifdef EASYAD_VECTOR_MATH"]
    # under names of their own (bound to libm's symbols): gcc then does not merge sin(x)
    # and cos(x) into one sincos call, which has no vector version
    for f in libmvec_functions():
        lines += [f'extern double easyad_v_{f}(double) __asm__("{f}") '
                  f'__attribute__((const, __simd__("notinbranch")));',
                  f"#define {f} easyad_v_{f}"]
    # the same functions with no vector versions, for the values selections compare
    lines.append("#endif")
    lines += [f'extern double easyad_s_{f}(double) __asm__("{f}") __attribute__((const));'
              for f in libmvec_functions()]
    return lines + [""]


def _truth_literals(tree: _expr.Node) -> _expr.Node:
    """A bool value's ``choose`` branches that are 0.0 or 1.0 written as C's int 0 and 1
    (the same truth value)."""
    if isinstance(tree, _expr.Call) and tree.name == "choose" and len(tree.args) == 3:
        c, a, b = tree.args
        return _expr.Call("choose", (c, _truth_literals(a), _truth_literals(b)))
    if isinstance(tree, _expr.Num) and tree.value in (0.0, 1.0):
        return _expr.Var(str(int(tree.value)))     # (a name is printed as it is)
    return tree
