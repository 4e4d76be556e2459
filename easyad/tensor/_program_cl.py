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
  value ran 6x faster, value and gradient 5x. The body is ``_Renderer._body`` with this
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
  in vectors (``_check_vector_math``; its finding is kept in the verdict and read by
  ``untrusted_vector_math``); those that differ by more than a few units in the last
  place are called lane by lane (``_kernels.lanewise_math``). So are all the builtins of
  the values a selection compares and of what they are made of
  (``_program_c._selections``), so those are one function of their input in the vector
  loop and its scalar rest alike.
- **backend steps** (``_program.step``): matmul and ``linear``, reductions over some axes,
  cross-entropy, scatter-adds with repeated indices, assembles of several parts, host
  calls (array primitives) and the guards (the only reads on the host, besides what the
  backend itself does there).
- **buffers** are planned once: constants and index arrays uploaded once, values stored
  for later groups in device workspace kept between calls (and the totals only kernels
  read), results new buffers each call. Each group kernel's launch is prepared once
  (``_Launch``: the fixed buffers' handles and the sizes), so a call sets only the
  buffers that change (inputs, results, backend steps' results); ``linear`` and
  ``linear_vjp`` steps make their 3-d views with pyopencl's fast constructor.
  The program's kernels are one OpenCL source, built once (the backend caches programs by
  source; PoCL and drivers also cache binaries on disk).

Sums add in another order than the eager kernels (partials per work-item and lane), so
they can differ from eager execution in the last bits.
"""
from __future__ import annotations

import inspect
import math
import os
import re
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from easyad import _expr
from easyad.errors import CompilerWarning, DeviceError, KernelFallbackWarning
from easyad.tensor import _kernels
from easyad.tensor._program import Instruction, Program, live_instructions, step
from easyad.tensor._program_c import _Loop, _offset, _pad_position, _Plan, _Renderer, _stored
from easyad.tensor._shapes import contiguous_strides
from easyad.tensor._zero_signs import constant_strong_zeros

_CL_TYPES = {np.dtype(np.float64): "double", np.dtype(np.float32): "float",
             np.dtype(np.bool_): "uchar", np.dtype(np.uint8): "uchar"}  # OpenCL's bools
_INIT = {"sum": "(real_t)0", "max": "(-INFINITY)", "min": "INFINITY"}
_COMBINE = {"sum": "({a} + {b})", "max": "maximum({a}, {b})",   # NaN wins, as in numpy
            "min": "minimum({a}, {b})"}
# pyopencl's Array constructor with the private keywords that skip its checks (as the
# backend's _new_array uses them): views for _view
try:
    import pyopencl.array as _cl_array
    _FAST_VIEW = all(k in inspect.signature(_cl_array.Array.__init__).parameters
                     for k in ("_fast", "_size", "_context", "_queue"))
except ImportError:     # (no OpenCL here: nothing of this module runs)
    _FAST_VIEW = False
_LANES = 8       # running partials per work-item of a reduction on a CPU device

# the vector loops (CPU devices): see vector_width and _CLRenderer._vector_expr
VECTOR_ENV = "EASYAD_OPENCL_VECTOR"     # "0": scalar kernels only; 2, 4, 8, 16: that width
_VECTOR_COMBINE = {"sum": "({a} + {b})", "max": "easyad_v_maximum({a}, {b})",
                   "min": "easyad_v_minimum({a}, {b})"}
# OpenCL builtins the rule table's expressions call, each defined on vectors too
_VECTOR_MATH = frozenset({"sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                          "asinh", "acosh", "atanh", "exp", "exp2", "expm1", "log", "log2",
                          "log10", "log1p", "sqrt", "cbrt", "fabs", "erf", "atan2", "hypot"})
# helpers of _helpers.h, as easyad_v_* of _kernels.vector_helpers (tmul: mul0's value)
_VECTOR_HELPERS = frozenset({"sign", "heaviside", "mul0", "div0", "maximum", "minimum", "pow",
                             "tmul"})
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
_LANE_NAMES = "0123456789abcdef"
_MEMORY = {"vreal_t": "vreal_mem", "vbool_t": "vbool_mem"}   # the same, aligned as elements


def untrusted_vector_math(be: Any, real: str, width: int) -> frozenset[str]:
    """The math builtins whose vector versions (``width`` lanes of ``real``) give other
    values than the scalar ones on this device, lane by lane, at zeros, infinities, NaN,
    subnormal, huge and ordinary values mixed in one vector (PoCL 3.1's double8 pow got
    lanes wrong next to a zero: other drivers and CPUs may have other such bugs). Found by
    ``_check_vector_math`` in the child process that proves the width (``_proofs``: the
    check is a kernel too, never built here first), kept per backend; those found are
    computed lane by lane (``_kernels.lanewise_math``). A width not proven: all of them."""
    kept = be.__dict__.setdefault("_untrusted_vector_math", {})
    key = (real, width)
    if key not in kept:
        from easyad.tensor import _proofs
        verdict = _proofs.verdicts(be.device._handle, [f"fused:{real}:{width}"])
        found = next(iter(verdict.values())).get("lanewise")
        ok = isinstance(found, list) and all(name in _VECTOR_MATH for name in found)
        kept[key] = frozenset(found) if ok else _VECTOR_MATH
    return kept[key]


# tiny values share vectors with huge ones: PoCL's (3.0 and 3.1) float8/float16 sin, cos
# and tan reduce every lane the slow way when one lane is huge, and give sin(1e-8) =
# sin(1e-8 * 2**20) there (tests/test_conformance.py found it; the lanes alone are right)
_CHECK_VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 0.75, 1e-310, -1e-310, 1e300, -1e300,
                 np.inf, -np.inf, np.nan, 710.0, -750.0, 2.0, 1e-5, -0.3, 100.0, 7.25, -9.5,
                 0.1, 1e-8, -3e-7, 1e30, 1e-20, -2e-38, 1e-40, -3e38, 1e-30]


def _check_vector_math(be: Any, real: str, width: int) -> frozenset[str]:
    # each check: (the builtin it vouches for, the vector result, the scalar builtin); the
    # fused kernels also take sin and cos from one vector sincos (used only where both
    # are trusted, so a wrong sincos makes both untrusted)
    checks = [(name, f"{name}(vx, vy)" if name in _kernels.BINARY_MATH else f"{name}(vx)",
               name) for name in sorted(_VECTOR_MATH)]
    checks += [("sin", "sincos(vx, &c)", "sin"), ("cos", "c", "cos")]
    dtype = np.float64 if real == "double" else np.float32
    with np.errstate(over="ignore"):      # 1e300 is inf in float32: also a value to try
        values = np.array(_CHECK_VALUES, dtype=dtype)
    x = np.concatenate([values, values[::-1], np.roll(values, 5)])
    x = x[:len(x) // width * width]
    y = np.roll(x, 3)
    n = len(x)
    lanes = _LANE_NAMES[:width]

    def vector(p: str) -> str:
        return "(vreal_t)(" + ", ".join(f"{p}[i + {k}]" for k in range(width)) + ")"
    lines = []
    for k, (_, expr, name) in enumerate(checks):
        scalar = "X[i + {j}], Y[i + {j}]" if name in _kernels.BINARY_MATH else "X[i + {j}]"
        lines.append(f"        {{ const vreal_t r = {expr};")
        lines += [f"          V[{k * n} + i + {j}] = r.s{lane}; "
                  f"S[{k * n} + i + {j}] = {name}({scalar.format(j=j)});"
                  for j, lane in enumerate(lanes)]
        lines.append("        }")
    source = (_kernels.preamble(real, width) + "__kernel void easyad_vector_check("
              "__global const real_t* X, __global const real_t* Y, __global real_t* V, "
              "__global real_t* S, const long n) {\n"
              f"    for (long i = 0; i < n; i += {width}) {{\n"
              f"        const vreal_t vx = {vector('X')}, vy = {vector('Y')};\n"
              "        vreal_t c;\n"
              + "\n".join(lines) + "\n    }\n}\n")
    kernel = be.kernel(source, "easyad_vector_check", [None, None, None, None, np.int64])
    bx, by = be.asarray(x, dtype), be.asarray(y, dtype)
    bv, bs = be.allocate((len(checks) * n,), dtype), be.allocate((len(checks) * n,), dtype)
    kernel(be.queue, (1,), (1,), bx.data, by.data, bv.data, bs.data, n)
    v = be.to_numpy(bv).reshape(len(checks), n)
    s = be.to_numpy(bs).reshape(len(checks), n)
    # the same to a few units in the last place (subnormal results: to the smallest normal)
    info = np.finfo(dtype)
    with np.errstate(all="ignore"):
        same = (v == s) | (np.isnan(v) & np.isnan(s)) | \
            (np.abs(v - s) <= 4 * info.eps * np.abs(s) + info.tiny)
    return frozenset(name for (name, _, _), row in zip(checks, same) if not row.all())


class _NotVector(Exception):
    """A group the vector loop does not express: its kernel is the scalar one."""


def vector_width(be: Any, real: str) -> int:
    """The lanes asked for the vector loops of fused kernels on ``be``'s device: the
    width EASYAD_OPENCL_VECTOR gives (0: scalar kernels), on any device; unset, 0 on a
    GPU (a work-item per element: its lanes are the vectors) and on a device that prefers
    no vectors, else the device's preferred vector width of ``real`` (PoCL: its target's
    vector register, 8 doubles with AVX-512, 4 with AVX2). What is built is
    ``fused_width``: the widest of these that passed its proof."""
    setting = os.environ.get(VECTOR_ENV, "").strip()
    if be.device.is_gpu and not setting:
        return 0
    try:
        width = int(setting) if setting else int(
            getattr(be.device._handle, f"preferred_vector_width_{real}"))
    except Exception:       # a driver that does not answer: scalar kernels
        return 0
    return width if width in (2, 4, 8, 16) else 0


# set only in a proof's child (_proofs): the width being proven there, and its lanewise math
_forced: dict[str, tuple[int, frozenset[str]]] = {}


def fused_width(be: Any, real: str) -> int | None:
    """The vector width the fused kernels of ``real`` are built with on ``be``'s device:
    the widest of ``vector_width``'s and the narrower ones (halving to 2), then 0 (scalar
    kernels), whose kind passed its proof in a child process (``_proofs``: a driver that
    crashes on a kind crashes there, not here); None when no kind passed (no fused
    kernels: one kernel per instruction). A width other than the one asked for comes with
    one ``KernelFallbackWarning`` per device and precision in a process."""
    if real in _forced:
        width, lanewise = _forced[real]
        be.__dict__.setdefault("_untrusted_vector_math", {})[(real, width)] = lanewise
        return width
    asked = vector_width(be, real)
    chosen = be.__dict__.setdefault("_fused_width", {})
    if (real, asked) in chosen:
        return chosen[real, asked]
    from easyad.tensor import _proofs
    widths = [w for w in (16, 8, 4, 2) if w <= asked] + [0]
    failed: list[str] = []
    width = None
    for w in widths:
        v = _proofs.verdicts(be.device._handle, [f"fused:{real}:{w}"])[f"fused:{real}:{w}"]
        if v["ok"]:
            width = w
            break
        failed.append(f"{_width_name(w)} ({v['problem']})")
    if failed:
        instead = ("no fused kernels: each instruction runs as its own kernel" if width is None
                   else f"{_width_name(width)} instead")
        warnings.warn(
            f"OpenCL device {be.device.name} ({be.device.description}): fused "
            f"{_proofs.REALS[real]} kernels failed their proof with {'; '.join(failed)}; "
            f"recorded programs use {instead} (every kind of kernel is built and run in a "
            f"child process first, so a driver that crashes takes only that one down). "
            f"Override: {VECTOR_ENV}=N picks the widest width to try (0: scalar kernels); a "
            f"driver that builds them all: {_PROOF_FIX}; verdicts are kept in "
            f"{_proofs.cache_path()} (delete it to prove again)",
            KernelFallbackWarning, stacklevel=_proofs.caller_stacklevel())
    chosen[real, asked] = width
    return width


_PROOF_FIX = ("on Debian/Ubuntu `sudo apt-get install pocl-opencl-icd` (the system's PoCL; "
              "PyPI's PoCL 3.0 crashes on its widest vectors on some AVX-512 AMD CPUs)")


def _proven(be: Any, real: str, width: int) -> bool:
    if real in _forced:
        return _forced[real][0] == width
    from easyad.tensor import _proofs
    return bool(_proofs.verdicts(be.device._handle, [f"fused:{real}:{width}"])
                [f"fused:{real}:{width}"]["ok"])


def _width_name(width: int) -> str:
    return f"{width}-lane vectors" if width else "scalar loops"


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
    ("partial", slot)), elements, the slots zeroed before it, its reductions ((slot,
    op), each from a buffer of one partial per work-item) and its vector width."""

    def __init__(self, name: str, n: int) -> None:
        self.name, self.n = name, n
        self.width = 0            # lanes of its vector loop (0: scalar loops only)
        self.params: list[tuple[str, int]] = []
        self.zero: list[int] = []
        self.reductions: list[tuple[int, str]] = []


class _CLRenderer(_Renderer):
    """A group as an OpenCL kernel (``_Renderer``'s loop body, the loop made work-items;
    on a CPU device with ``width`` lanes, the body on vectors first where it can be)."""

    types = _CL_TYPES
    real = "real_t"

    def __init__(self, plan: _Plan, needed_later: set[int], real: str, gpu: bool,
                 width: int = 0, lanewise: frozenset[str] = frozenset()) -> None:
        super().__init__(plan, needed_later)
        self.target = "c" if real == "double" else "opencl-float"
        self.gpu = gpu
        self.width = width
        self.lanewise = lanewise      # math builtins whose vector versions disagree here
        self.real_dtype = np.dtype(np.float64 if real == "double" else np.float32)
        self.vector_types = {self.real_dtype: "vreal_t", np.dtype(np.bool_): "vbool_t",
                             np.dtype(np.uint8): "vbool_t"}      # bools, as stored
        self.kernel: _Kernel | None = None
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
            return f"((__global {_MEMORY[self.vector_types[self.p.dtypes[slot]]]}*)P{s})"
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
        if (o, op) not in self.kernel.reductions:     # once for a vector loop and its rest
            self.kernel.reductions.append((o, op))
            self.kernel.params.append(("partial", o))
        if self._vector:
            # one running partial a lane; added up after the scalar rest (below)
            pre.append(f"    vreal_t w{o} = (vreal_t)({_INIT[op]});")
            loop.append(f"        w{o} = "
                        + _VECTOR_COMBINE[op].format(a=f"w{o}", b=f"(vreal_t)({v})") + ";")
            return
        lanes = 1 if self.gpu or self._tail else _LANES
        pre.append(f"    real_t r{o}[{lanes}] = {{{', '.join([_INIT[op]] * lanes)}}};")
        loop.append(f"        r{o}[U_] = " + _COMBINE[op].format(a=f"r{o}[U_]", b=v) + ";")
        total = _fold(op, [f"r{o}[{k}]" for k in range(lanes)])
        if self._tail:
            lanes_total = _fold(op, [f"w{o}.s{_LANE_NAMES[k]}" for k in range(self.width)])
            total = _COMBINE[op].format(a=lanes_total, b=total)
        post.append(f"    Q{o}[get_global_id(0)] = {total};")

    def _zero_outside(self, inside: str, value: str, ctype: str) -> str:
        return f"({inside} ? {value} : ({ctype})0)"

    def _scalar_calls(self, tree: _expr.Node) -> _expr.Node:
        # a scalar loop's builtins are one function of their input already (no sincos)
        return tree

    def _calls(self, body: _Loop, tree: _expr.Node) -> _expr.Node:
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
                    ctype = body.ctypes.get(v.name, self.real)
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

    def _emit(self, body: _Loop, ins: Instruction, shape: Any, index: str) -> None:
        if not self._vector:
            return super()._emit(body, ins, shape, index)
        p = self.p
        # maps, contiguous reads and reductions to one number, over real_t and bools
        # (and a slice's adjoint written, or read as a pad, at the loop's own index)
        slots = ins.outs + tuple(i for i in ins.ins if type(i) is int)
        pad = ins.op == "assemble" and self.plan.is_pad(ins)
        in_order = ins.op == "assemble" and not pad and \
            _offset(shape, ins.params[2][0][2], ins.params[2][0][0], index) == index
        if index != "i" or not (pad or in_order or ins.op in ("map", "strided", "reduce")) or \
                any(p.dtypes[s] not in self.vector_types for s in slots) or \
                (ins.op == "reduce" and p.dtypes[ins.ins[0]] != self.real_dtype):
            raise _NotVector
        if pad:
            inside, at = _pad_position(shape, self.plan.pads[id(ins)],
                                       tuple(ins.params[2][0][1]), index, clamp=False)
            if inside != "1":
                raise _NotVector
            body.regs[(self.plan.r(ins.outs[0]), index)] = self._read(body, ins.ins[0], at)
            return None
        if ins.op != "map":     # through _read, _reduce and ptr
            return super()._emit(body, ins, shape, index)
        _, _, names, _, dtypes = ins.params
        mapping = {name: self._operand(body, i, shape, index)
                   for name, i in zip(names, ins.ins)}
        # a value a selection compares (or one it is computed from) calls each builtin
        # lane by lane, as the scalar rest does (``_program_c._selections``)
        exact = id(ins) in self.plan.exact_math
        for k, (o, dt) in enumerate(zip(ins.outs, dtypes)):
            tree = constant_strong_zeros(_expr.substitute(self.plan.map_tree(ins, k), mapping))
            tree = tree if exact else self._calls(body, tree)
            number = _expr.constant(tree)
            dt = np.dtype(dt)
            if number is not None and dt.kind == "f" and float(dt.type(number)) == number:
                # a literal for what reads it, as in the scalar loop
                body.regs[(self.plan.r(o), "i")] = repr(number) if number >= 0 \
                    else f"({number!r})"
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

    def _read(self, body: _Loop, slot: int, at: str) -> str:
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
            load = f"((__global const {_MEMORY[ctype]}*)({self.ptr(slot)}{start}))[i]"
        elif at.isdigit():                   # one element for every lane (broadcast)
            ctype = _CL_TYPES[dtype]
            load = f"{self.ptr(slot)}[{at}]"
        else:                                # strided, shifted, gathered: scalar loops
            raise _NotVector
        found = body.loads.get(load)
        if found is None:
            found = body.loads[load] = f"l{len(body.loads)}"
            body.ctypes[found] = ctype
            body.loop.append(f"        const {ctype} {found} = {load};")
        return found

    def _vector_expr(self, body: _Loop, node: _expr.Node) -> tuple[str, str]:
        """An expression on the vector loop's values, and its kind: "v" (vreal_t), "s" (a
        scalar: literals, broadcast numbers; OpenCL widens them beside a vector), "m"
        (vmask_t, a comparison's -1 or 0 a lane) or "b" (vbool_t, 0 or 1). Calls get
        vreal_t arguments, ?: a mask (a bool's 1 has no sign bit, which the vector ?:
        reads), arithmetic reals: as the scalar loop's C converts them."""
        if isinstance(node, _expr.Num):
            return _expr.render(node, self.target), "s"
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
            return _expr.render(node, self.target), "s"      # the scalar call, once
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
        if name in _VECTOR_HELPERS:
            function = "easyad_v_" + ("mul0" if name == "tmul" else name)
        elif name in _VECTOR_MATH:
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
                     index: int) -> tuple[str, _Kernel]:
        name = f"easyad_group_{index}"
        self._sincos = {"sin", "cos"} <= {f for ins in members if ins.op == "map"
                                          for e in ins.params[1] for f in _expr.calls(e)}
        if self.width and math.prod(shape) >= self.width:
            try:
                return self._render(name, shape, members, vector=True)
            except _NotVector:
                pass
        return self._render(name, shape, members, vector=False)

    def _render(self, name: str, shape: tuple[int, ...], members: list[Instruction],
                vector: bool) -> tuple[str, _Kernel]:
        kernel = self.kernel = _Kernel(name, math.prod(shape))
        self._written = {}
        if vector:
            kernel.width = self.width
            self._vector, self.types, self._masks = True, self.vector_types, {}
            try:
                vector_pre, vector_loop, _ = self._body([(shape, members)])
            finally:
                self._vector = False
                del self.types
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


class _Launch:
    """A group kernel's launch, prepared once (``FusedCLProgram``): its argument list with
    the buffers that stay the same across calls (aux arrays, partials, workspace,
    constants, finished reductions kept there) in place and, at ``slots``, the positions
    filled at each call (inputs, new results, backend steps' results); its sizes; the
    slots zeroed before it; and its reductions' finishing launches."""

    __slots__ = ("kernel", "n", "global_size", "local_size", "args", "slots", "zero",
                 "finish")

    def __init__(self, kernel: Any, n: int, global_size: tuple[int, ...],
                 local_size: tuple[int, ...], args: list[Any], slots: list[tuple[int, int]],
                 zero: list[int], finish: list[tuple[Any, ...]]) -> None:
        self.kernel, self.n, self.global_size, self.local_size = \
            kernel, n, global_size, local_size
        self.args, self.slots, self.zero, self.finish = args, slots, zero, finish


class FusedCLProgram:
    """The plan's schedule on an OpenCL backend: group kernels and backend steps;
    ``run(inputs)`` as ``BoundProgram.run`` (device buffers in, new device buffers out).

    A call costs the host little beyond the backend steps: each group kernel's launch is
    prepared once (``_Launch``: its fixed buffers' handles, sizes), a reduction to one
    number is finished by one launch of a generated kernel (``_render_finish``) into a
    buffer kept between calls where no backend step or output sees it, and nothing is read
    back (the guards and backend steps that read values aside)."""

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
        # a reduction's total kept in one buffer across calls, where only kernels read it
        # (a backend step's result or an output may be handed on: those are new each call)
        read_in_python = {plan.r(i) for kind, item in plan.schedule if kind == "py"
                          for i in item.ins if type(i) is int}
        kept = {s for s in reduced if s not in fresh and s not in read_in_python}
        varying = set(p.inputs) | set(self.fresh) | (made_in_python - kept)
        self._fresh_results = set(self.fresh) | made_in_python
        self._results = [(plan.r(s), p.shapes[s]) for s in plan.outputs]
        group = be.group
        finish_group = _finish_group(be)
        self.steps: list[tuple[Any, ...]] = []
        self._launches: list[_Launch | None] = []     # each kernel step's, prepared
        self._finish_group = (finish_group,)
        segments = iter(kernels)
        for kind, item in plan.schedule:
            if kind == "c":
                for k in next(segments):
                    cl_kernel = be.kernel(source, k.name, [None] * len(k.params) + [np.int64])
                    loops = k.reductions or not be.device.is_gpu
                    items = _items(be, k.n) if loops else None
                    partials = {o: be.allocate((items,), real_dtype) for o, _ in k.reductions}
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
                        ctype = _CL_TYPES[p.dtypes[o]]
                        finisher = be.kernel(source, _finish_name(op, ctype),
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
                    cast = {o: p.dtypes[o] != real_dtype for o, _ in k.reductions}
                    # (the entry as before, which other modules read: _batch_cl)
                    self.steps.append(("kernel", cl_kernel, k, partials, cast, items))
                    self._launches.append(_Launch(cl_kernel, k.n, (size,), (group,), args,
                                                  slots, list(k.zero), finish))
            else:
                aliases = tuple((i, plan.r(i), p.shapes[i]) for i in item.ins
                                if type(i) is int and plan.r(i) != i)
                run = _linear_step(item, be, p) or step(item, be, on_guard)
                self.steps.append(("py", run, aliases, item.outs))
                self._launches.append(None)

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
            for entry, launch in zip(self.steps, self._launches):
                if launch is not None:
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
                _, run, aliases, outs = entry
                for s, root, shape in aliases:
                    arrays[s] = arrays[root].reshape(shape)
                run(arrays)
                for s in outs:
                    a = arrays[s]
                    if getattr(a, "offset", 0):      # kernels take whole buffers
                        arrays[s] = a.copy()
        except pyopencl.Error as error:
            raise _translate(be, "replay of a recorded program", error) from None
        out = []
        fresh = set(self._fresh_results)
        for root, shape in self._results:      # as _program_c._results, no needless views
            a = arrays[root]
            if root not in fresh:        # workspace, an input, a constant: a copy
                a = arrays[root] = a.copy()
                fresh.add(root)
            out.append(a if a.shape == shape else a.reshape(shape))
        return out


def _view(be: Any, buf: Any, shape: tuple[int, ...]) -> Any:
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


def _linear_step(ins: Instruction, be: Any, p: Program) -> Any:
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
        (needs,) = ins.params
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


def fused(program: Program, outputs: Sequence[int], be: Any, on_guard: Any
          ) -> FusedCLProgram | None:
    """The fused program for ``outputs`` on the OpenCL backend ``be``; None when nothing
    would be fused (no instruction a kernel can do) or the kernels do not build (with a
    CompilerWarning: the instructions then run one kernel each). Where kernels with vector
    loops do not build, the scalar kernels (no warning)."""
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
    width = fused_width(be, real)
    if width is None:         # not even the scalar kernels passed their proof (warned)
        return None
    while True:
        stored = _stored(plan, outputs)
        kernels, source = _render(plan, stored, be, real, width)
        vector = any(k.width for segment in kernels for k in segment)
        try:
            return FusedCLProgram(plan, be, on_guard, stored, kernels, source, real)
        except (DeviceError, AttributeError) as error:
            # a kernel missing from a built program is an AttributeError of pyopencl
            # the vector loops do not build here: the scalar kernels, if proven
            if vector and _proven(be, real, 0):
                width, plan = 0, _CLPlan(program, instructions, outputs)
                continue
            if not isinstance(error, DeviceError) or "build" not in str(error):
                raise
            warnings.warn(f"the fused OpenCL kernels of a recorded program did not build; "
                          f"its instructions run one kernel each: {error}", CompilerWarning,
                          stacklevel=4)
            return None


def _render(plan: _Plan, stored: set[int], be: Any, real: str, width: int
            ) -> tuple[list[list[_Kernel]], str]:
    """The plan's kernels, by segment, and their OpenCL source (with the vector helpers
    where a kernel has a vector loop)."""
    lanewise = untrusted_vector_math(be, real, width) if width else frozenset()
    renderer = _CLRenderer(plan, stored, real, bool(be.device.is_gpu), width, lanewise)
    kernels: list[list[_Kernel]] = []
    texts = []
    for segment in (item for kind, item in plan.schedule if kind == "c"):
        kernels.append([])
        for shape, members in plan.groups(segment):
            if not renderer.live(members):
                continue          # its values are all recomputed where they are read
            text, k = renderer.render_group(shape, members, len(texts))
            texts.append(text)
            kernels[-1].append(k)
    finishing = sorted({(op, _CL_TYPES[plan.program.dtypes[o]]) for segment in kernels
                        for k in segment for o, op in k.reductions})
    texts += [_render_finish(op, ctype, _finish_group(be)) for op, ctype in finishing]
    vector = any(k.width for segment in kernels for k in segment)
    if vector and plan.exact_math:       # maps of compared values call them lane by lane
        lanewise = _VECTOR_MATH
    head = _kernels.preamble(real, width if vector else 0, lanewise).replace(
        "//CL// easyad tensor kernels",
        "//CL// GENERATED by easyad/tensor/_program_cl.py from a recorded tensor program")
    return kernels, "\n".join([head] + texts)


def _finish_group(be: Any) -> int:
    """The work-items of a finishing kernel: one work-group, a power of two (its tree)."""
    return 1 << (int(be.group).bit_length() - 1)


def _finish_name(op: str, ctype: str) -> str:
    return f"easyad_finish_{op}_{ctype}"


def _render_finish(op: str, ctype: str, group: int) -> str:
    """A reduction's last step as one launch of one work-group: the n partials of the
    group kernel (real_t) combined, written as the slot's type (the cast included), where
    the backend's reduce took one to three launches, allocations and a cast kernel."""
    combine = _COMBINE[op]
    return (f"__kernel void {_finish_name(op, ctype)}(__global const real_t* restrict Q, "
            f"__global {ctype}* R, const long n)\n{{\n"
            f"    __local real_t T_[{group}];\n"
            "    const int l = get_local_id(0);\n"
            f"    real_t a = {_INIT[op]};\n"
            f"    for (long i = l; i < n; i += {group}) a = {combine.format(a='a', b='Q[i]')};\n"
            "    T_[l] = a;\n"
            f"    for (int h = {group // 2}; h > 0; h >>= 1) {{\n"
            "        barrier(CLK_LOCAL_MEM_FENCE);\n"
            f"        if (l < h) T_[l] = {combine.format(a='T_[l]', b='T_[l + h]')};\n"
            "    }\n"
            f"    if (l == 0) R[0] = ({ctype})T_[0];\n}}\n")
