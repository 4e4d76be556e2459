"""Recorded tensor programs as fused OpenCL kernels: one kernel per group of elementwise
instructions.

``fused(program, outputs, be, on_guard)`` is ``_program_c.fused`` for an OpenCL device: the
same plan (``_program_c._Plan``: reshapes share memory, segments of fusable instructions
between backend steps, groups of one loop shape whose values stay in registers, an
instruction joining the last group of its shape once what it reads is made, and
``_program_c._stored``: what must be in memory, cheap values read by later groups
recomputed there instead) and the same loop body
(``_program_c._Renderer._body``: the rule table's expressions rendered by ``_expr`` over
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
  on a GPU), the backend's ``reduce`` adds the partials, on the device (a tree in local
  memory, with its barriers, ran 1.3x slower on PoCL). A kernel that calls both sin and
  cos takes them from one ``sincos`` per value (the sine's gradient is the cosine: on
  PoCL sincos costs what sin does; the chain's gradient ran 1.5x faster). Values are
  ``real_t`` (double, or float when the program has no float64 value, float literals
  then), each rounded to its own dtype when made, as the eager kernels do.
- **backend steps** (``_program.step``): matmul and ``linear``, reductions over some axes,
  cross-entropy, scatter-adds with repeated indices, assembles of several parts, host
  calls (array primitives) and the guards (the only reads on the host, besides what the
  backend itself does there).
- **buffers** are planned once: constants and index arrays uploaded once, values stored
  for later groups in device workspace kept between calls, results new buffers each call.
  The program's kernels are one OpenCL source, built once (the backend caches programs by
  source; PoCL and drivers also cache binaries on disk).

Sums add in another order than the eager kernels (partials per work-item), so they can
differ from eager execution in the last bits.
"""
from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from easyad import _expr
from easyad.errors import CompilerWarning, DeviceError
from easyad.tensor import _kernels
from easyad.tensor._program import Instruction, Program, live_instructions, step
from easyad.tensor._program_c import _Loop, _Plan, _Renderer, _results, _stored

_CL_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
             np.dtype(np.bool_): "uchar", np.dtype(np.uint8): "uchar"}  # OpenCL's bools
_INIT = {"sum": "(real_t)0", "max": "(-INFINITY)", "min": "INFINITY"}
_COMBINE = {"sum": "({a} + {b})", "max": "maximum({a}, {b})",   # NaN wins, as in numpy
            "min": "minimum({a}, {b})"}
_LANES = 8       # running partials per work-item of a reduction on a CPU device


class _CLPlan(_Plan):
    """``_Plan`` with what one OpenCL kernel can do (see the module docstring)."""

    types = _CL_TYPES

    def _renderable(self, ins: Instruction) -> bool:
        if not super()._renderable(ins):
            return False
        if ins.op == "reduce":
            return math.prod(self.program.shapes[ins.outs[0]]) == 1
        if ins.op == "assemble":
            return len(ins.params[2]) == 1
        if ins.op == "scatter_add":
            return bool(ins.params[3])          # unique indices: no two work-items add
        return True


class _Kernel:
    """One group's kernel: its name, parameters (("slot", root) or ("aux", k) or
    ("partial", slot)), elements, the slots zeroed before it and its reductions
    ((slot, op), each from a buffer of one partial per work-item)."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n
        self.params: list[tuple[str, int]] = []
        self.zero: list[int] = []
        self.reductions: list[tuple[int, str]] = []


class _CLRenderer(_Renderer):
    """A group as an OpenCL kernel (``_Renderer``'s loop body, the loop made work-items)."""

    types = _CL_TYPES
    real = "real_t"

    def __init__(self, plan: _Plan, needed_later: set[int], real: str, gpu: bool) -> None:
        super().__init__(plan, needed_later)
        self.target = "c" if real == "double" else "opencl-float"
        self.gpu = gpu
        self.kernel: _Kernel | None = None
        self._sincos = False      # the kernel calls both sin and cos
        self._written: dict[int, bool] = {}

    def ptr(self, slot: int, write: bool = False) -> str:
        s = self.plan.r(slot)
        self._written[s] = self._written.get(s, False) or write
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
        op = ins.params[0]
        o = ins.outs[0]
        assert self.kernel is not None
        self.kernel.reductions.append((o, op))
        self.kernel.params.append(("partial", o))
        lanes = 1 if self.gpu else _LANES
        pre.append(f"    real_t r{o}[{lanes}] = {{{', '.join([_INIT[op]] * lanes)}}};")
        loop.append(f"        r{o}[U_] = " + _COMBINE[op].format(a=f"r{o}[U_]", b=v) + ";")
        total = _fold(op, [f"r{o}[{k}]" for k in range(lanes)])
        post.append(f"    Q{o}[get_global_id(0)] = {total};")

    def _zero_outside(self, inside: str, value: str, ctype: str) -> str:
        return f"({inside} ? {value} : ({ctype})0)"

    def _calls(self, body: _Loop, tree: _expr.Node) -> _expr.Node:
        """sin(v) and cos(v), in a kernel that calls both, from one sincos(v) (PoCL takes
        the time of one of them for it: the sine's gradient needs the cosine)."""
        if not self._sincos:
            return tree
        if isinstance(tree, _expr.Call):
            v = tree.args[0]
            if tree.name in ("sin", "cos") and isinstance(v, _expr.Var):
                if v.name not in body.sincos:
                    body.sincos.add(v.name)
                    ctype = body.ctypes[v.name]
                    body.loop.append(f"        {ctype} cos_{v.name}; const {ctype} sin_{v.name} "
                                     f"= sincos({v.name}, &cos_{v.name});")
                return _expr.Var(f"{tree.name}_{v.name}")
            return _expr.Call(tree.name, tuple(self._calls(body, a) for a in tree.args))
        if isinstance(tree, _expr.Bin):
            return _expr.Bin(tree.op, self._calls(body, tree.left), self._calls(body, tree.right))
        if isinstance(tree, _expr.Neg):
            return _expr.Neg(self._calls(body, tree.operand))
        return tree

    def render_group(self, shape: tuple[int, ...], members: list[Instruction],
                     index: int) -> tuple[str, _Kernel]:
        name = f"easyad_group_{index}"
        kernel = self.kernel = _Kernel(name, math.prod(shape))
        self._written = {}
        self._sincos = {"sin", "cos"} <= {f for ins in members if ins.op == "map"
                                          for e in ins.params[1] for f in _expr.calls(e)}
        pre, loop, post = self._body([(shape, members)])
        slots = list(self._written)
        kernel.params = [("slot", s) for s in slots] + kernel.params
        params = []
        for kind, k in kernel.params:
            if kind == "slot":
                t = _CL_TYPES[self.p.dtypes[k]]
                params.append(f"__global {t}* P{k}" if self._written[k]
                              else f"__global const {t}* restrict P{k}")
            elif kind == "aux":
                params.append(f"__global const long* restrict A{k}")
            else:
                params.append(f"__global real_t* Q{k}")
        params.append("const long N_")
        head = (f"__kernel void {name}({', '.join(params)})\n{{\n" + "\n".join(pre)
                + ("\n" if pre else ""))
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


def _fold(op: str, values: list[str]) -> str:
    """The values combined by op, pairwise."""
    while len(values) > 1:
        pairs = [_COMBINE[op].format(a=a, b=b) for a, b in zip(values[::2], values[1::2])]
        values = pairs + values[len(pairs) * 2:]
    return values[0]


def _items(be: Any, n: int) -> int:
    """The work-items of a kernel that loops over n elements: whole work-groups, enough to
    fill the device (a few per compute unit on a CPU, many on a GPU)."""
    per_unit = 64 if be.device.is_gpu else 4
    groups = min(-(-n // be.group), be.device._handle.max_compute_units * per_unit)
    return int(max(groups, 1) * be.group)


class FusedCLProgram:
    """The plan's schedule on an OpenCL backend: group kernels and backend steps;
    ``run(inputs)`` as ``BoundProgram.run`` (device buffers in, new device buffers out)."""

    def __init__(self, plan: _Plan, be: Any, on_guard: Any, stored: set[int],
                 kernels: list[list[_Kernel]], source: str, real: str) -> None:
        p = plan.program
        self.plan, self.be, self.source = plan, be, source
        self.outputs = plan.outputs
        self.inputs = list(p.inputs)
        self._lock = threading.Lock()
        real_dtype = np.dtype(np.float64 if real == "double" else np.float32)
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
        self.steps: list[tuple[Any, ...]] = []
        segments = iter(kernels)
        for kind, item in plan.schedule:
            if kind == "c":
                for k in next(segments):
                    cl_kernel = be.kernel(source, k.name, [None] * len(k.params) + [np.int64])
                    loops = k.reductions or not be.device.is_gpu
                    items = _items(be, k.n) if loops else None
                    partials = {o: be.allocate((items,), real_dtype) for o, _ in k.reductions}
                    cast = {o: p.dtypes[o] != real_dtype for o, _ in k.reductions}
                    self.steps.append(("kernel", cl_kernel, k, partials, cast, items))
            else:
                aliases = tuple(i for i in item.ins if type(i) is int and plan.r(i) != i)
                self.steps.append(("py", step(item, be, on_guard), aliases, item.outs))

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        with self._lock:
            return self._run(inputs)

    def _run(self, inputs: Sequence[Any]) -> list[Any]:
        import pyopencl

        from easyad.tensor._opencl import _translate
        plan, p, be = self.plan, self.plan.program, self.be
        arrays = list(self.base)
        for s, a in zip(self.inputs, inputs):
            arrays[s] = a
        for s in self.fresh:
            arrays[s] = be.allocate(p.shapes[s], p.dtypes[s])
        try:
            for entry in self.steps:
                if entry[0] == "kernel":
                    self._launch(arrays, *entry[1:])
                    continue
                _, run, aliases, outs = entry
                for s in aliases:
                    arrays[s] = arrays[plan.r(s)].reshape(p.shapes[s])
                run(arrays)
                for s in outs:
                    a = arrays[s]
                    if getattr(a, "offset", 0):      # kernels take whole buffers
                        arrays[s] = a.copy()
        except pyopencl.Error as error:
            raise _translate(be, "replay of a recorded program", error) from None
        return _results(plan, arrays, set(self.fresh) | self.made_in_python,
                        lambda a: a.copy())

    def _launch(self, arrays: list[Any], cl_kernel: Any, k: _Kernel, partials: dict[int, Any],
                cast: dict[int, bool], items: int | None) -> None:
        p, be, r = self.plan.program, self.be, self.plan.r
        for s in k.zero:
            arrays[s].fill(0)
        if k.n:
            args = []
            for kind, key in k.params:
                if kind == "slot":
                    args.append(arrays[key].data)
                elif kind == "aux":
                    args.append(self.aux[key].data)
                else:
                    args.append(partials[key].data)
            if items is None:
                be.launch(cl_kernel, k.n, *args, k.n)     # a work-item per element
            else:
                cl_kernel(be.queue, (items,), (be.group,), *args, k.n)
        for o, op in k.reductions:
            total = be.reduce(op, partials[o] if k.n else partials[o][:0], (0,))
            if cast[o]:
                total = be.map("cast", ("x",), {"x": total.reshape(1)}, (1,),
                               (p.dtypes[o],))[0]
            arrays[r(o)] = total.reshape(p.shapes[o])


def fused(program: Program, outputs: Sequence[int], be: Any, on_guard: Any
          ) -> FusedCLProgram | None:
    """The fused program for ``outputs`` on the OpenCL backend ``be``; None when nothing
    would be fused (no instruction a kernel can do) or the kernels do not build (with a
    CompilerWarning: the instructions then run one kernel each)."""
    instructions = live_instructions(program, outputs)
    plan = _CLPlan(program, instructions, outputs)
    segments = [item for kind, item in plan.schedule if kind == "c"]
    if not segments:
        return None
    used = {program.dtypes[s] for ins in instructions if ins.op != "guard"
            for s in ins.outs + tuple(i for i in ins.ins if type(i) is int)
            if program.dtypes[s] is not None}
    # one real_t for the program's kernels: float when its values are float32 (and bools)
    real = "float" if used & {np.dtype(np.float64), np.dtype(np.float32)} == \
        {np.dtype(np.float32)} else "double"
    stored = _stored(plan, outputs)
    renderer = _CLRenderer(plan, stored, real, bool(be.device.is_gpu))
    kernels: list[list[_Kernel]] = []
    texts = [_kernels.preamble(real).replace(
        "//CL// easyad tensor kernels",
        "//CL// GENERATED by easyad/tensor/_program_cl.py from a recorded tensor program")]
    for segment in segments:
        kernels.append([])
        for shape, members in plan.groups(segment):
            if not renderer.live(members):
                continue          # its values are all recomputed where they are read
            text, k = renderer.render_group(shape, members, len(texts) - 1)
            texts.append(text)
            kernels[-1].append(k)
    source = "\n".join(texts)
    try:
        return FusedCLProgram(plan, be, on_guard, stored, kernels, source, real)
    except DeviceError as error:
        if "build" not in str(error):
            raise
        warnings.warn(f"the fused OpenCL kernels of a recorded program did not build; "
                      f"its instructions run one kernel each: {error}", CompilerWarning,
                      stacklevel=4)
        return None
