"""The renderer of planned tensor programs as OpenCL: one kernel per group of elementwise
instructions (``fused_cl.fused`` builds and launches them).

``fused_cl.fused(program, outputs, be, on_guard)`` is ``fused_c.fused`` for an OpenCL device: the
same plan (``plan.Plan``: reshapes share memory, segments of fusable instructions
between backend steps, groups of one loop shape whose values stay in registers, an
instruction joining the last group of its shape once what it reads is made, and
``plan.stored_slots``: what must be in memory, cheap values read by later groups
recomputed there instead) and the same loop body
(``cstyle.Renderer._body``: the rule table's expressions rendered by ``_expr`` over
``_helpers.h``, as the eager kernels of ``_kernels.render_map`` are), each group rendered
as one kernel: on a GPU a work-item per element, on a CPU device a contiguous run of
elements per work-item (PoCL runs a work-group's items one after another; a loop of
elements in each ran 3.5x faster than a work-item per element):

- **in a kernel**: maps, strided reads (slices, transposes, broadcasts), gathers, a slice's
  adjoint (an assemble of one part: as in C a *pad*, an elementwise value over its output,
  zero outside the slice, where the part is a basic slice of it; read under a condition,
  not from zero margins, which only the C's workspace has; a recomputed part at a
  position clamped into it, then 0 outside the slice), scatter-adds whose indices do
  not repeat, and reductions to one number: each work-item adds up its own partials over
  its elements (eight running ones on a CPU, so that the loop vectorizes; a strided loop
  on a GPU; a tree in local memory, with its barriers, ran 1.3x slower on PoCL), then one
  work-group of a generated finishing kernel adds the partials and writes the total in
  its slot's dtype (``_render_finish``: one launch where the backend's ``reduce`` took
  one to three, with allocations and a cast kernel). A kernel that calls both sin and
  cos takes them from one ``sincos`` per value (the sine's gradient is the cosine: on
  PoCL sincos costs what sin does; the chain's gradient ran 1.5x faster). Values are
  ``real_t`` (double, or float when the program has no float64 value, float literals
  then), each rounded to its own dtype when made, as the eager kernels do.
- **vector loops** (CPU devices): a group's kernel runs its body on ``vreal_t``, W
  values at once (``double8`` with AVX-512: W is the device's preferred vector width,
  ``vector_width``), over the work-item's whole vectors, then the same body on scalars
  for the last work-item's rest. PoCL's float64 sin, exp, sqrt... take 7x as long one
  value at a time as on vectors (LLVM vectorizes no loop that calls them); the chain's
  value ran 6x faster, value and gradient 5x. The body is ``Renderer._body`` with this
  renderer's ``_emit``, ``_read`` and ``ptr`` for vectors: maps (the expressions
  rendered by ``_vector_expr``: the helpers as ``easyad_v_*`` of
  ``_kernels.vector_helpers``, bools as 0/1 ``vbool_t`` and as the masks the vector
  ``?:`` reads), reads at the loop's index or a fixed shift of it, numbers broadcast,
  reductions to one number (a vector of partials, added up lane by lane after the rest)
  and a slice's adjoint at the loop's index. A group with anything else (gathers,
  scatters, pads under a condition, broadcasts of arrays, dtypes other than real_t and
  bools) keeps the scalar kernel. Loads and stores go through a vector type aligned as
  its elements: plain vector moves (some PoCL builds call vload/vstore out of line).
  Each width is built here only after a child process proved it (``fused_width``,
  ``_proofs``: PyPI's PoCL 3.0 crashes in LLVM on double8 on some AVX-512 AMD CPUs):
  where it fails, the widest narrower one that passed, then scalar kernels, then none
  (one KernelFallbackWarning). Where a device does not build the vector kernels of a
  program, its scalar kernels are built instead; ``EASYAD_OPENCL_VECTOR=0`` asks for
  them (a width asks for at most that width).
  A driver's vector builtins need not equal its scalar ones (PoCL 3.1's double8 pow got
  lanes wrong next to a zero: pow is lane by lane always), so the proof of a width runs
  one kernel comparing every vector builtin with the scalar one at special values mixed
  in vectors (``check_vector_math``; its finding is kept in the verdict and read by
  ``untrusted_vector_math``); those that differ by more than a few units in the last
  place are called lane by lane (``_kernels.lanewise_math``). So are all the builtins of
  the values a selection compares and of what they are made of
  (``plan._selections``), so those are one function of their input in the vector
  loop and its scalar rest alike. The helpers of _helpers.h with no vector builtin (the
  scipy.special rows, fmax/fmin and pick) are their scalar code lane by lane
  (``_kernels.LANEWISE_HELPERS``): the rest of such a loop stays vector.

Sums add in another order than the eager kernels (partials per work-item and lane), so
they can differ from eager execution in the last bits.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from easyad import _expr
from easyad.compiler.program.cstyle import Loop, OpenCLDialect, Renderer
from easyad.compiler.program.plan import Plan, flat_offset, pad_position
from easyad.compiler.program.vector_cl import LANE_NAMES, VECTOR_MATH, untrusted_vector_math
from easyad.tensor import _kernels
from easyad.tensor._program import Instruction, Program
from easyad.tensor._zero_signs import constant_strong_zeros

if TYPE_CHECKING:
    from easyad.tensor._opencl import OpenCLBackend

INIT = {"sum": "(real_t)0", "max": "(-INFINITY)", "min": "INFINITY"}
COMBINE = {"sum": "({a} + {b})", "max": "maximum({a}, {b})",   # NaN wins, as in numpy
            "min": "minimum({a}, {b})"}
_LANES = 8       # running partials per work-item of a reduction on a CPU device
_VECTOR_COMBINE = {"sum": "({a} + {b})", "max": "easyad_v_maximum({a}, {b})",
                   "min": "easyad_v_minimum({a}, {b})"}
# helpers of _helpers.h, as easyad_v_* of _kernels.vector_helpers (tmul: mul0's value)
_VECTOR_HELPERS = frozenset({"sign", "heaviside", "mul0", "div0", "maximum", "minimum", "pow",
                             "tmul", *_kernels.LANEWISE_HELPERS})
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})


class _NotVector(Exception):
    """A group the vector loop does not express: its kernel is the scalar one."""



class OpenCLPlan(Plan):
    """``Plan`` with what one OpenCL kernel can do (see the module docstring)."""

    def __init__(self, program: Program, instructions: list[Instruction],
                 outputs: Sequence[int]) -> None:
        super().__init__(program, instructions, outputs, OpenCLDialect.types)

    def _renderable(self, ins: Instruction) -> bool:
        if not super()._renderable(ins):
            return False
        if ins.op == "reduce":
            return math.prod(self.program.shapes[ins.outs[0]]) == 1
        if ins.op == "assemble":
            return len(ins.params.parts) == 1
        if ins.op == "scatter_add":
            return bool(ins.params.unique)          # unique indices: no two work-items add
        return True


class Kernel:
    """One group's kernel: its name, parameters (("slot", root) or ("aux", k) or
    ("partial", slot)), elements, the slots zeroed before it, its reductions ((slot,
    op), each from a buffer of one partial per work-item), its vector width and, rendered
    over points, the inputs whose step between points is an argument (``S<slot>``)."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n
        self.width = 0            # lanes of its vector loop (0: scalar loops only)
        self.params: list[tuple[str, int]] = []
        self.zero: list[int] = []
        self.reductions: list[tuple[int, str]] = []
        self.strides: list[int] = []


class OpenCLRenderer(Renderer):
    """A group as an OpenCL kernel (``Renderer``'s loop body, the loop made work-items;
    on a CPU device with ``width`` lanes, the body on vectors first where it can be).

    ``points``: each kernel also runs over a second NDRange dimension, one point of a
    batch per ``get_global_id(1)`` (``batch_cl``): it takes the number of points (NB_)
    and the inputs' steps between points (S<slot>: 0 where an input is the same at every
    point) after N_, and moves its pointers to its point before the body, which is the
    one point's body unchanged. Constants and index arrays are shared, unmoved; every
    other slot is a buffer of NB_ points one after another, as are the partials."""

    def __init__(self, plan: Plan, needed_later: set[int], real: str, gpu: bool,
                 width: int = 0, lanewise: frozenset[str] = frozenset(),
                 points: bool = False) -> None:
        dialect = OpenCLDialect(real)
        super().__init__(plan, needed_later, dialect)
        self.points = points
        self.gpu = gpu
        self.width = width
        self.lanewise = lanewise      # math builtins whose vector versions disagree here
        self.real_dtype = dialect.real_dtype
        self.vector_types = dialect.vector_types
        self.kernel: Kernel | None = None
        self._sincos = False      # the kernel calls both sin and cos
        self._written: dict[int, bool] = {}
        self._vector = False      # rendering the body of a vector loop
        self._tail = False        # rendering the scalar loop after a vector loop
        self._masks: dict[str, str] = {}    # a vbool_t register -> the mask it was made of
        self._lanewise_now = False  # rendering a map of plan.exact_math in a vector loop

    def ptr(self, slot: int, write: bool = False) -> str:
        s = self.plan.r(slot)
        self._written[s] = self._written.get(s, False) or write
        if write and self._vector:
            # a store of the vector loop, at its index i, which counts vectors
            memory = self.dialect.memory[self.vector_types[self.p.dtypes[slot]]]
            return f"((__global {memory}*)P{s})"
        return f"P{s}"

    def aux(self, array: np.ndarray) -> str:
        k = self.aux_number(array)
        assert self.kernel is not None
        if ("aux", k) not in self.kernel.params:
            self.kernel.params.append(("aux", k))
        return f"A{k}"

    def _zero(self, o: int, pre: list[str]) -> None:
        assert self.kernel is not None
        self.kernel.zero.append(self.plan.r(o))

    def _reduce(self, ins: Instruction, shape: tuple[int, ...], v: str, pre: list[str],
                loop: list[str], post: list[str]) -> None:
        op = ins.params.op
        o = ins.outs[0]
        assert self.kernel is not None
        if (o, op) not in self.kernel.reductions:     # once for a vector loop and its rest
            self.kernel.reductions.append((o, op))
            self.kernel.params.append(("partial", o))
        if self._vector:
            # one running partial a lane; added up after the scalar rest (below)
            pre.append(f"    vreal_t w{o} = (vreal_t)({INIT[op]});")
            loop.append(f"        w{o} = "
                        + _VECTOR_COMBINE[op].format(a=f"w{o}", b=f"(vreal_t)({v})") + ";")
            return
        lanes = 1 if self.gpu or self._tail else _LANES
        pre.append(f"    real_t r{o}[{lanes}] = {{{', '.join([INIT[op]] * lanes)}}};")
        loop.append(f"        r{o}[U_] = " + COMBINE[op].format(a=f"r{o}[U_]", b=v) + ";")
        total = _fold(op, [f"r{o}[{k}]" for k in range(lanes)])
        if self._tail:
            lanes_total = _fold(op, [f"w{o}.s{LANE_NAMES[k]}" for k in range(self.width)])
            total = COMBINE[op].format(a=lanes_total, b=total)
        post.append(f"    Q{o}[get_global_id(0)] = {total};")

    def _calls(self, body: Loop, tree: _expr.Node) -> _expr.Node:
        """sin(v) and cos(v), in a kernel that calls both, from one sincos(v) (PoCL takes
        the time of one of them for it: the sine's gradient needs the cosine)."""
        if not self._sincos or self._vector and {"sin", "cos"} & self.lanewise:
            # no vector sincos where the proof found vector sin or cos wrong: their lanes
            # are computed one by one, and sincos was not (PyPI's PoCL 3.0, AVX-512:
            # float8 sincos(1e-8) = sin(1e-8 * 2**20); tests/test_conformance.py)
            return tree
        if isinstance(tree, _expr.Call):
            v = tree.args[0]
            if tree.name in ("sin", "cos") and isinstance(v, _expr.Var):
                if v.name not in body.sincos:
                    body.sincos.add(v.name)
                    ctype = body.ctypes.get(v.name, self.dialect.real)
                    body.loop.append(f"        {ctype} cos_{v.name}; const {ctype} sin_{v.name} "
                                     f"= sincos({v.name}, &cos_{v.name});")
                    body.ctypes[f"sin_{v.name}"] = body.ctypes[f"cos_{v.name}"] = ctype
                return _expr.Var(f"{tree.name}_{v.name}")
            return _expr.Call(tree.name, tuple(self._calls(body, a) for a in tree.args))
        if isinstance(tree, _expr.Bin):
            return _expr.Bin(tree.op, self._calls(body, tree.left), self._calls(body, tree.right))
        if isinstance(tree, _expr.Neg):
            return _expr.Neg(self._calls(body, tree.operand))
        return tree

    # -- the vector loop's body: i counts vectors of ``width`` elements --

    def _emit(self, body: Loop, ins: Instruction, shape: Any, index: str) -> None:
        if not self._vector:
            return super()._emit(body, ins, shape, index)
        p = self.p
        # maps, contiguous reads and reductions to one number, over real_t and bools
        # (and a slice's adjoint written, or read as a pad, at the loop's own index)
        slots = ins.outs + tuple(i for i in ins.ins if type(i) is int)
        pad = ins.op == "assemble" and self.plan.is_pad(ins)
        in_order = ins.op == "assemble" and not pad and \
            flat_offset(shape, ins.params.parts[0].strides, ins.params.parts[0].offset,
                        index) == index
        if index != "i" or not (pad or in_order or ins.op in ("map", "strided", "reduce")) or \
                any(p.dtypes[s] not in self.vector_types for s in slots) or \
                (ins.op == "reduce" and p.dtypes[ins.ins[0]] != self.real_dtype):
            raise _NotVector
        if pad:
            inside, at = pad_position(shape, self.plan.pads[id(ins)],
                                       tuple(ins.params.parts[0].shape), index, clamp=False)
            if inside != "1":
                raise _NotVector
            body.regs[(self.plan.r(ins.outs[0]), index)] = self._read(body, ins.ins[0], at)
            return None
        if ins.op != "map":     # through _read, _reduce and ptr
            return super()._emit(body, ins, shape, index)
        names, dtypes = ins.params.names, ins.params.dtypes
        mapping = {name: self._operand(body, i, shape, index)
                   for name, i in zip(names, ins.ins)}
        # a value a selection compares (or one it is computed from) calls each builtin
        # lane by lane, as the scalar rest does (``plan._selections``)
        exact = id(ins) in self.plan.exact_math
        for k, (o, dt) in enumerate(zip(ins.outs, dtypes)):
            tree = constant_strong_zeros(_expr.substitute(self.plan.map_tree(ins, k), mapping))
            tree = tree if exact else self._calls(body, tree)
            number = _expr.constant(tree)
            dt = np.dtype(dt)
            if number is not None and dt.kind == "f" and float(dt.type(number)) == number:
                # a literal for what reads it, as in the scalar loop
                body.regs[(self.plan.r(o), "i")] = self.inline(number)
                continue
            self._lanewise_now = exact
            text, kind = self._vector_expr(body, tree)
            self._lanewise_now = False
            reg = f"v{o}"
            if dt.kind != "f":
                vtype = "vbool_t"
                if kind == "m":       # kept as the mask too, for the conditions reading it
                    body.loop.append(f"        const vmask_t m{o} = {text};")
                    self._masks[reg] = f"m{o}"
                    value = f"EASYAD_TO_BOOL(-m{o})"
                elif kind == "s":
                    value = f"(vbool_t)((uchar)({text}))"
                else:
                    value = text if kind == "b" else f"EASYAD_TO_BOOL({text})"
            else:
                vtype, value = "vreal_t", self._as_real(text, kind)
            body.loop.append(f"        const {vtype} {reg} = {value};")
            body.regs[(self.plan.r(o), "i")] = reg
            body.ctypes[reg] = vtype

    def _read(self, body: Loop, slot: int, at: str) -> str:
        if not self._vector:
            return super()._read(body, slot, at)
        s = self.plan.r(slot)
        found = body.regs.get((s, at))
        if found is not None:
            return found
        dtype = self.p.dtypes[slot]
        if dtype not in self.vector_types:
            raise _NotVector
        if not self.in_memory(s):           # recomputed here, at the loop's own index
            if at != "i":
                raise _NotVector
            self._emit(body, self.plan.producer[s], self.p.shapes[s], "i")
            return body.regs[(s, "i")]
        shift = re.fullmatch(r"(?:(\d+) \+ )?i", at)
        if shift:                            # the loop's W elements, or W from a slice's
            ctype = self.vector_types[dtype]
            start = f" + {shift[1]}" if shift[1] else ""
            load = f"((__global const {self.dialect.memory[ctype]}*)({self.ptr(slot)}{start}))[i]"
        elif at.isdigit():                   # one element for every lane (broadcast)
            ctype = self.dialect.types[dtype]
            load = f"{self.ptr(slot)}[{at}]"
        else:                                # strided, shifted, gathered: scalar loops
            raise _NotVector
        found = body.loads.get(load)
        if found is None:
            found = body.loads[load] = f"l{len(body.loads)}"
            body.ctypes[found] = ctype
            body.loop.append(f"        const {ctype} {found} = {load};")
        return found

    def _vector_expr(self, body: Loop, node: _expr.Node) -> tuple[str, str]:
        """An expression on the vector loop's values, and its kind: "v" (vreal_t), "s" (a
        scalar: literals, broadcast numbers; OpenCL widens them beside a vector), "m"
        (vmask_t, a comparison's -1 or 0 a lane) or "b" (vbool_t, 0 or 1). Calls get
        vreal_t arguments, ?: a mask (a bool's 1 has no sign bit, which the vector ?:
        reads), arithmetic reals: as the scalar loop's C converts them."""
        if isinstance(node, _expr.Num):
            return _expr.render(node, self.dialect.target), "s"
        if isinstance(node, _expr.Var):
            kind = {"vreal_t": "v", "vbool_t": "b"}.get(body.ctypes.get(node.name, ""), "s")
            return node.name, kind
        if isinstance(node, _expr.Neg):
            text, kind = self._vector_expr(body, node.operand)
            return f"(-({self._as_real(text, kind) if kind in 'mb' else text}))", \
                "s" if kind == "s" else "v"
        if isinstance(node, _expr.Bin):
            (a, ka), (b, kb) = (self._vector_expr(body, node.left),
                                self._vector_expr(body, node.right))
            a = self._as_real(a, ka) if ka in "mb" else a
            b = self._as_real(b, kb) if kb in "mb" else b
            scalar = ka == "s" and kb == "s"
            kind = "s" if scalar else ("m" if node.op in _COMPARISONS else "v")
            return f"({a} {node.op} {b})", kind
        args = [self._vector_expr(body, a) for a in node.args]
        if all(kind == "s" for _, kind in args):
            return _expr.render(node, self.dialect.target), "s"      # the scalar call, once
        name = node.name
        if name == "choose":
            (c, kc), a, b = args
            condition = f"({c})" if kc == "s" else self._as_mask(c, kc)
            return f"({condition} ? {self._as_real(*a)} : {self._as_real(*b)})", "v"
        if name == "pow" and args[1][1] == "s":
            # the helper's exact cases for a constant exponent (x ** 2 above all)
            x = self._as_real(*args[0])
            exponent = self._number(node.args[1])
            if exponent == 2:
                return f"({x} * {x})", "v"
            if exponent == 1:
                return x, "v"
            if exponent == 0:
                return "((vreal_t)1)", "v"
        if name == "stop_gradient":          # its value is x (a macro, any type)
            return self._as_real(*args[0]), "v"
        if name in _VECTOR_HELPERS:
            function = "easyad_v_" + ("mul0" if name == "tmul" else name)
        elif name in VECTOR_MATH:
            function = f"easyad_lw_{name}" if name in self.lanewise or self._lanewise_now \
                else name
        else:
            raise _NotVector
        return f"{function}({', '.join(self._as_real(*a) for a in args)})", "v"

    def _as_real(self, text: str, kind: str) -> str:
        if kind == "v":
            return text
        if kind == "s":
            return f"((vreal_t)({text}))"
        return f"EASYAD_TO_REAL({text})" if kind == "b" else f"EASYAD_TO_REAL(-({text}))"

    def _as_mask(self, text: str, kind: str) -> str:
        if kind == "m":
            return text
        if kind == "b":
            return self._masks.get(text) or f"(EASYAD_TO_MASK({text}) != (vmask_t)0)"
        return f"({text} != (vreal_t)0)"

    def _number(self, node: _expr.Node) -> Any:
        """A tree of literals evaluated as real_t's arithmetic (as the compiler folds it),
        or None."""
        if isinstance(node, _expr.Num):
            return self.real_dtype.type(node.value)
        if isinstance(node, _expr.Neg):
            value = self._number(node.operand)
            return None if value is None else -value
        if isinstance(node, _expr.Bin) and node.op in ("+", "-", "*", "/"):
            a, b = self._number(node.left), self._number(node.right)
            if a is None or b is None:
                return None
            with np.errstate(all="ignore"):
                return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[node.op]
        return None

    # -- kernels --

    def render_group(self, shape: tuple[int, ...], members: list[Instruction],
                     index: int) -> tuple[str, Kernel]:
        name = f"easyad_group_{index}"
        self._sincos = {"sin", "cos"} <= {f for ins in members if ins.op == "map"
                                          for e in ins.params.exprs for f in _expr.calls(e)}
        if self.width and math.prod(shape) >= self.width:
            try:
                return self._render(name, shape, members, vector=True)
            except _NotVector:
                pass
        return self._render(name, shape, members, vector=False)

    def _render(self, name: str, shape: tuple[int, ...], members: list[Instruction],
                vector: bool) -> tuple[str, Kernel]:
        kernel = self.kernel = Kernel(name, math.prod(shape))
        self._written = {}
        if vector:
            kernel.width = self.width
            self._vector, self.types, self._masks = True, self.vector_types, {}
            try:
                vector_pre, vector_loop, _ = self._body([(shape, members)])
            finally:
                self._vector, self.types = False, self.dialect.types
            self._tail = True
            try:
                pre, loop, post = self._body([(shape, members)])
            finally:
                self._tail = False
            pre = vector_pre + [line for line in pre if line not in vector_pre]
        else:
            pre, loop, post = self._body([(shape, members)])
        slots = list(self._written)
        kernel.params = [("slot", s) for s in slots] + kernel.params
        params = []
        for kind, k in kernel.params:
            if kind == "slot":
                t = self.dialect.types[self.p.dtypes[k]]
                params.append(f"__global {t}* P{k}" if self._written[k]
                              else f"__global const {t}* restrict P{k}")
            elif kind == "aux":
                params.append(f"__global const long* restrict A{k}")
            else:
                params.append(f"__global real_t* Q{k}")
        params.append("const long N_")
        head = f"__kernel void {name}({', '.join(params)})\n{{\n"
        if self.points:
            head = self._over_points(kernel, head)
        head += "\n".join(pre) + ("\n" if pre else "")
        # On a GPU a work-item per element, or with reductions to one number, every
        # global-size'th element (neighbouring work-items read neighbouring elements),
        # adding up the work-item's partial. On a CPU one contiguous run per work-item, a
        # few work-groups per core: PoCL runs a work-group's items one after another, and a
        # work-item per element ran 3.5x slower on the arithmetic chain (the strided loop 5x)
        if self.gpu and not kernel.reductions:
            return (head + "    const long i = get_global_id(0);\n    if (i >= N_) return;\n"
                    + "\n".join(loop) + "\n}\n", kernel)
        body = "\n".join(loop)
        if self.gpu:
            return (head + "    const int U_ = 0;\n"
                    "    for (long i = get_global_id(0); i < N_; i += get_global_size(0)) {\n"
                    + body + "\n    }\n" + "\n".join(post) + "\n}\n", kernel)
        if vector:
            # runs of whole vectors (PoCL's vector sin, exp... are 7x its scalar ones on
            # float64), the last work-item's rest in the scalar loop
            w = self.width
            return (head + f"    const long c_ = ((N_ + get_global_size(0) - 1) / "
                    f"get_global_size(0) + {w - 1}) / {w} * {w};\n"
                    "    const long e_ = min(N_, (long)(get_global_id(0) + 1) * c_);\n"
                    "    const long b_ = get_global_id(0) * c_;\n"
                    f"    for (long i = b_ / {w}; i < e_ / {w}; i++) {{\n"
                    + "\n".join(vector_loop) + "\n    }\n"
                    + ("    const int U_ = 0;\n" if kernel.reductions else "")
                    + f"    for (long i = max(b_, e_ / {w} * {w}); i < e_; i++) {{\n"
                    + body + "\n    }\n" + "\n".join(post) + "\n}\n", kernel)
        head += ("    const long c_ = (N_ + get_global_size(0) - 1) / get_global_size(0);\n"
                 "    const long e_ = min(N_, (long)(get_global_id(0) + 1) * c_);\n"
                 "    long b_ = get_global_id(0) * c_;\n")
        if not kernel.reductions:
            return (head + "    for (long i = b_; i < e_; i++) {\n" + body + "\n    }\n}\n",
                    kernel)
        # reductions: lane U_ of _LANES running partials takes every _LANES'th element, so
        # the loop vectorizes (one partial would fix the order of the additions: a scalar
        # loop, 3x slower on the arithmetic chain's gradient); the rest goes to lane 0
        return (head + f"    for (; b_ + {_LANES} <= e_; b_ += {_LANES})\n"
                f"    for (int U_ = 0; U_ < {_LANES}; U_++) {{\n    const long i = b_ + U_;\n"
                + body + "\n    }\n    const int U_ = 0;\n"
                "    for (long i = b_; i < e_; i++) {\n" + body + "\n    }\n"
                + "\n".join(post) + "\n}\n", kernel)


    def _over_points(self, kernel: Kernel, head: str) -> str:
        """The kernel's head taking the batch's arguments and moving its pointers to
        point ``get_global_id(1)`` (see the class docstring)."""
        p = self.p
        moves = []
        for kind, key in kernel.params:
            if kind == "slot" and key in p.inputs:
                moves.append(f"    P{key} += B_ * S{key};")
                kernel.strides.append(key)
            elif kind == "slot" and key not in p.constants:
                moves.append(f"    P{key} += B_ * {math.prod(p.shapes[key])}L;")
            elif kind == "partial":
                moves.append(f"    Q{key} += B_ * (long)get_global_size(0);")
        strides = "".join(f", const long S{s}" for s in kernel.strides)
        return (head.replace("const long N_)\n", f"const long N_, const long NB_{strides})\n")
                + "    const long B_ = get_global_id(1);\n    if (B_ >= NB_) return;\n"
                + "".join(m + "\n" for m in moves))


def _fold(op: str, values: list[str]) -> str:
    """The values combined by op, pairwise."""
    while len(values) > 1:
        pairs = [COMBINE[op].format(a=a, b=b) for a, b in zip(values[::2], values[1::2])]
        values = pairs + values[len(pairs) * 2:]
    return values[0]



def render_kernels(plan: Plan, stored: set[int], be: OpenCLBackend, real: str, width: int,
                   points: bool = False) -> tuple[list[list[Kernel]], str]:
    """The plan's kernels, by segment, and their OpenCL source (with the vector helpers
    where a kernel has a vector loop); ``points``: each kernel over a batch of points
    (``OpenCLRenderer``), the same kernels otherwise."""
    lanewise = untrusted_vector_math(be, real, width) if width else frozenset()
    renderer = OpenCLRenderer(plan, stored, real, bool(be.device.is_gpu), width, lanewise,
                              points)
    kernels: list[list[Kernel]] = []
    texts = []
    for segment in (item for kind, item in plan.schedule if kind == "c"):
        kernels.append([])
        for shape, members in plan.groups(segment):
            if not renderer.live(members):
                continue          # its values are all recomputed where they are read
            text, k = renderer.render_group(shape, members, len(texts))
            texts.append(text)
            kernels[-1].append(k)
    finishing = sorted({(op, OpenCLDialect.types[plan.program.dtypes[o]]) for segment in kernels
                        for k in segment for o, op in k.reductions})
    texts += [_render_finish(op, ctype, finish_group_size(be)) for op, ctype in finishing]
    vector = any(k.width for segment in kernels for k in segment)
    if vector and plan.exact_math:       # maps of compared values call them lane by lane
        lanewise = VECTOR_MATH
    head = renderer.dialect.header(width if vector else 0, lanewise)
    return kernels, "\n".join([head] + texts)


def finish_group_size(be: OpenCLBackend) -> int:
    """The work-items of a finishing kernel: one work-group, a power of two (its tree)."""
    return 1 << (int(be.group).bit_length() - 1)


def finish_name(op: str, ctype: str) -> str:
    return f"easyad_finish_{op}_{ctype}"


def _render_finish(op: str, ctype: str, group: int) -> str:
    """A reduction's last step as one launch of one work-group: the n partials of the
    group kernel (real_t) combined, written as the slot's type (the cast included), where
    the backend's reduce took one to three launches, allocations and a cast kernel."""
    combine = COMBINE[op]
    return (f"__kernel void {finish_name(op, ctype)}(__global const real_t* restrict Q, "
            f"__global {ctype}* R, const long n)\n{{\n"
            f"    __local real_t T_[{group}];\n"
            "    const int l = get_local_id(0);\n"
            f"    real_t a = {INIT[op]};\n"
            f"    for (long i = l; i < n; i += {group}) a = {combine.format(a='a', b='Q[i]')};\n"
            "    T_[l] = a;\n"
            f"    for (int h = {group // 2}; h > 0; h >>= 1) {{\n"
            "        barrier(CLK_LOCAL_MEM_FENCE);\n"
            f"        if (l < h) T_[l] = {combine.format(a='T_[l]', b='T_[l + h]')};\n"
            "    }\n"
            f"    if (l == 0) R[0] = ({ctype})T_[0];\n}}\n")
