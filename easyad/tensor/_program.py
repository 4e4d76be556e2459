"""Tensor programs: a tensor function recorded once as data, replayed at new inputs.

``capture`` runs ``f`` on Tensors whose backend is a ``ProgramBackend``: a wrapper of a
real backend that computes every kernel (so the recording sees real values, at ``x0``)
and appends it to a ``Program`` as an ``Instruction``: the Backend Protocol's method, its
static parameters (expressions, shapes, axes, strides, index arrays) and the slots it
reads and writes. The tensor operations do not know: they call the Backend Protocol as
always. The backward sweep runs the same way (each node's vjp calls the backend; the
sweep's sums of adjoints are ``Slot.__add__``), so the gradient program is the forward
program followed by the sweep's kernels: a source transformation of the tape for free,
with no Python closure left in it. A Hessian-vector product is recorded the same way,
reverse over reverse (the sweep with ``create_graph`` records tensor operations too).

While capturing, single numbers stay 0-d tensors (no Records: their values would be
floats baked into later kernels), and reading a value on the host (``bool(t)``,
``float(t)``, ``t.value``) records a *guard*: replay checks that the value read there is
the same at the new input (a branch taken the same way) and raises
``ad.BranchChangedError`` (or records again) otherwise.

``Program.bind(backend)`` prepares the instructions for one backend (numpy, OpenCL) as a
list of steps; ``compiler.program.fused_c`` fuses runs of them into generated C for the
numpy device, ``compiler.program.fused_cl`` into generated OpenCL kernels for an OpenCL device.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from easyad import _core
from easyad.compiler import ir, optimiser
from easyad.tensor._backend import Backend
from easyad.tensor._interpreters import Interpreter

class Slot:
    """A buffer of a program being recorded: its slot number, shape, dtype and its value at
    the recording point (the real backend's buffer). Arithmetic on slots (the backward
    sweep adds adjoints with ``+``) records elementwise instructions."""

    __slots__ = ("program", "index", "shape", "dtype", "value")

    def __init__(self, program: Program, index: int, shape: tuple[int, ...], dtype: Any,
                 value: Any) -> None:
        self.program, self.index, self.shape, self.dtype, self.value = \
            program, index, tuple(shape), np.dtype(dtype), value

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def _recorder(self) -> Backend:
        """The recording backend of its program (set when the ProgramBackend was made)."""
        be = self.program.backend
        if be is None:
            raise RuntimeError("a slot of a program that no ProgramBackend records")
        return be

    def _arith(self, expr: str, other: Any, swap: bool = False) -> Slot:
        be = self._recorder
        if isinstance(other, Slot):
            from easyad.tensor import _shapes
            shape = _shapes.broadcast("+", self.shape, other.shape)
            dtype = np.result_type(self.dtype, other.dtype)
        elif isinstance(other, (int, float, np.number)):
            other, shape, dtype = float(other), self.shape, self.dtype
        else:
            return NotImplemented
        a, b = (other, self) if swap else (self, other)
        (out,) = be.map("slot_arith", (expr,), {"x": a, "y": b}, shape, (dtype,))
        return out   # type: ignore[no-any-return]

    def __add__(self, other: Any) -> Slot:
        return self._arith("x + y", other)

    def __radd__(self, other: Any) -> Slot:
        return self._arith("x + y", other, True)

    def __sub__(self, other: Any) -> Slot:
        return self._arith("x - y", other)

    def __rsub__(self, other: Any) -> Slot:
        return self._arith("x - y", other, True)

    def __mul__(self, other: Any) -> Slot:
        return self._arith("x * y", other)

    def __rmul__(self, other: Any) -> Slot:
        return self._arith("x * y", other, True)

    def __truediv__(self, other: Any) -> Slot:
        return self._arith("x / y", other)

    def __neg__(self) -> Slot:
        return self._arith("x * y", -1.0)

    def __float__(self) -> float:
        return float(np.asarray(self._recorder.to_numpy(self)).reshape(()))

    def __repr__(self) -> str:
        return f"<slot {self.index} {self.shape} {self.dtype}>"


class Opaque:
    """A slot holding a kernel's private state (``cross_entropy``'s saved softmax parts)."""

    __slots__ = ("index", "value")

    def __init__(self, index: int, value: Any) -> None:
        self.index, self.value = index, value


# one instruction: a node of the compiler's IR (``compiler.ir``): op, named params, operands
Instruction = ir.Node


class Program(ir.Graph):
    """The recorded instructions over numbered slots (a graph of the compiler's IR):
    inputs, constants (values kept: slot -> host array, or opaque state), and what each
    instruction writes. ``shapes``/``dtypes``/``values`` per slot; guards are
    instructions (``"guard"``: the slot read, the host value it had)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: list[tuple[int, Any, tuple[int, ...], Any]] = []   # read at each replay
        # slot -> the input slot it is the next value of (a parameter after a descent
        # step): replay may write it into that input's memory (see ``compiler.program.fused_c``)
        self.in_place: dict[int, int] = {}
        self.backend: Backend | None = None
        # host effects of every replay at one point (BatchNorm's running statistics):
        # (apply, slots): replay keeps the slots as hidden outputs and calls apply(*their
        # host values) after the run (``Program.effect``)
        self.effects: list[tuple[Any, tuple[int, ...]]] = []

    def effect(self, apply: Any, slots: Sequence[Slot]) -> None:
        """Register a host effect: after each replay at one point, ``apply`` gets the
        host values of ``slots`` at that point (never at the recording itself)."""
        self.effects.append((apply, tuple(int(s.index) for s in slots)))

    @property
    def effect_slots(self) -> list[int]:
        return [i for _, slots in self.effects for i in slots]

    def _new(self, shape: tuple[int, ...], dtype: Any, value: Any) -> Slot:
        s = Slot(self, len(self.shapes), shape, dtype, value)
        self.shapes.append(s.shape)
        self.dtypes.append(s.dtype)
        self.values.append(value)
        return s

    def _opaque(self, value: Any) -> Opaque:
        o = Opaque(len(self.shapes), value)
        self.shapes.append(())
        self.dtypes.append(None)
        self.values.append(value)
        return o

    def emit(self, op: str, params: Any, ins: tuple[Any, ...],
             outs: Sequence[Any]) -> None:
        self.instructions.append(Instruction(op, params, ins, tuple(o.index for o in outs)))

    def __repr__(self) -> str:
        return "\n".join(repr(i) for i in self.instructions)


def _ref(v: Any) -> Any:
    """An operand of an instruction: a slot's number, or the constant itself."""
    if isinstance(v, (Slot, Opaque)):
        return v.index
    return v


def _real(v: Any) -> Any:
    if isinstance(v, (Slot, Opaque)):
        return v.value
    return v


class Recording(Interpreter):
    """``ad.record(..., tensor=True)``'s interpreter: every operation computes at the
    recording point and is appended to a program that replays at other points
    (``ProgramBackend``)."""

    name = "ad.record"
    # numbers stay 0-d tensors: a float would be baked into later kernels
    numbers_stay_tensors = True
    replays = True
    # the recording is the saved computation: f runs as it is
    checkpoints = False

    def adopt(self, backend: Backend, tensor: Any) -> Any:
        raise ValueError("ad.record of tensor code: a tensor made outside f (a module's "
                         "parameter, a constant) is used inside it, and replay would not "
                         "see its later values; pass it to f as an argument "
                         "(ad.nn.functional_call(model, params, x) for a module's "
                         "parameters)")

    def number(self, cls: type, label: str, backend: Backend, value: Any, tape: Any,
               inputs: tuple[int, ...], vjp: Any, graph: Any) -> Any:
        return _core.record(cls, label, backend, value, (), value.dtype, tape, inputs, vjp,
                            graph)

    def primitive(self, prim: Any, args: tuple[Any, ...], ops: list[Any], dtype: Any,
                  cls: type, kwargs: dict[str, Any], backend: Backend) -> Any:
        # f and its vjp become host calls of the program, run again at every replay
        return prim._program(args, ops, dtype, cls, kwargs, backend)


RECORDING = Recording()


class ProgramBackend:
    """The Backend Protocol recording every call into a ``Program`` (see the module's
    docstring); the kernels themselves run on ``real``."""

    kind = "program"
    interpreter = RECORDING
    lazy_numbers = False
    live_buffers = 0

    def __init__(self, real: Any, program: Program) -> None:
        self.real, self.program = real, program
        program.backend = self
        self.guards: list[tuple[int, np.ndarray]] = []
        # the list the recording differentiates on (TensorFunction's sweeps): derivative
        # transforms called in f record on it too, so f's closures meet their inputs
        self.tape: Any = None

    @property
    def device(self) -> Any:
        return self.real.device

    # -- slots --
    def _out(self, value: Any) -> Slot:
        return self.program._new(tuple(value.shape), value.dtype, value)

    def input(self, array: np.ndarray, dtype: Any) -> Slot:
        value = self.real.asarray(array, dtype)
        s = self._out(value)
        self.program.inputs.append(s.index)
        return s

    def live_input(self, read: Any) -> Slot:
        """An input read again at every replay by ``read()`` (a module parameter's data:
        replay sees its current values, e.g. after an optimizer step)."""
        array = np.asarray(read())
        s = self.input(array, array.dtype)
        self.program.live.append((s.index, read, array.shape, array.dtype))
        return s

    def _constant(self, value: Any) -> Slot:
        s = self._out(value)
        self.program.constants[s.index] = self.real.to_numpy(value)
        return s

    # -- buffers --
    def asarray(self, array: Any, dtype: Any) -> Slot:
        return self._constant(self.real.asarray(array, dtype))

    def to_numpy(self, buf: Any) -> np.ndarray:
        """A value read on the host: a guard (replay checks it reads the same)."""
        if not isinstance(buf, Slot):
            return np.asarray(self.real.to_numpy(buf))
        value = np.asarray(self.real.to_numpy(buf.value))
        self.program.emit("guard", ir.Guard(value.copy()), (buf.index,), ())
        return value

    host_array = to_numpy

    def guarded_read(self, buf: Any, key: Any) -> Any:
        """``key`` of a value read on the host, guarded on ``key``'s result only (the
        pivots of an LU factorisation, an argmax): replay at a point where it is the same
        runs; elsewhere the guard fails (BranchChangedError, or a new recording)."""
        if not isinstance(buf, Slot):
            return key(np.asarray(self.real.to_numpy(buf)))
        result = key(np.asarray(self.real.to_numpy(buf.value)))
        self.program.emit("guard", ir.Guard(np.array(result, copy=True), key),
                          (buf.index,), ())
        return result

    def full(self, shape: tuple[int, ...], value: Any, dtype: Any) -> Slot:
        if isinstance(value, Slot):      # a 0-d slot broadcast (a scalar node's adjoint)
            (out,) = self.map("full", ("x",), {"x": value}, shape, (dtype,))
            return out   # type: ignore[no-any-return]
        return self._constant(self.real.full(shape, value, dtype))

    def reshape(self, buf: Slot, shape: tuple[int, ...]) -> Slot:
        shape = tuple(shape)
        if shape == buf.shape:
            return buf
        out = self._out(self.real.reshape(buf.value, shape))
        self.program.emit("reshape", ir.Reshape(shape), (buf.index,), (out,))
        return out

    # -- kernels --
    def map(self, label: str, exprs: tuple[str, ...], operands: Mapping[str, Any],
            shape: tuple[int, ...], dtypes: tuple[Any, ...]) -> list[Slot]:
        names = tuple(operands)
        args = tuple(self._operand(v) for v in operands.values())
        values = self.real.map(label, exprs, dict(zip(names, (_real(a) for a in args))),
                               shape, dtypes)
        outs = [self._out(v) for v in values]
        self.program.emit("map", ir.Map(label, tuple(exprs), names, tuple(shape), tuple(dtypes)),
                          tuple(_ref(a) for a in args), outs)
        return outs

    def _operand(self, v: Any) -> Any:
        """A kernel's operand as the program holds it: a slot, or a float constant; a
        buffer made elsewhere (a host array) becomes a constant slot."""
        if isinstance(v, Slot) or type(v) is float:
            return v
        if isinstance(v, (int, np.floating, np.integer)):
            return float(v)
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            host = v if isinstance(v, np.ndarray) else np.asarray(self.real.to_numpy(v))
            return self._constant(self.real.asarray(host, host.dtype))
        raise TypeError(f"a recorded kernel got an operand of type {type(v).__name__}")

    def prepared_map(self, label: str, exprs: tuple[str, ...], names: tuple[str, ...]
                     ) -> Any:
        def run(args: tuple[Any, ...], shape: tuple[int, ...],
                dtypes: tuple[Any, ...]) -> list[Slot]:
            return self.map(label, exprs, dict(zip(names, args)), shape, dtypes)
        return run

    def reduce(self, op: str, buf: Slot, axes: tuple[int, ...]) -> Slot:
        out = self._out(self.real.reduce(op, buf.value, tuple(axes)))
        self.program.emit("reduce", ir.Reduce(op, tuple(axes)), (buf.index,), (out,))
        return out

    def matmul(self, a: Slot, b: Slot, transpose_a: bool = False,
               transpose_b: bool = False) -> Slot:
        a, b = self._operand(a), self._operand(b)
        out = self._out(self.real.matmul(a.value, b.value, transpose_a, transpose_b))
        self.program.emit("matmul", ir.Matmul(transpose_a, transpose_b), (a.index, b.index), (out,))
        return out

    def strided(self, buf: Slot, offset: int, shape: tuple[int, ...],
                strides: tuple[int, ...]) -> Slot:
        out = self._out(self.real.strided(buf.value, offset, shape, strides))
        self.program.emit("strided", ir.Strided(offset, tuple(shape), tuple(strides)), (buf.index,),
                          (out,))
        return out

    def assemble(self, shape: tuple[int, ...], dtype: Any,
                 parts: Sequence[tuple[int, tuple[int, ...], tuple[int, ...], Any]]) -> Slot:
        parts = [(o, ps, st, self._operand(b)) for o, ps, st, b in parts]
        out = self._out(self.real.assemble(shape, dtype,
                                           [(o, ps, st, b.value) for o, ps, st, b in parts]))
        self.program.emit("assemble", ir.Assemble(tuple(shape), np.dtype(dtype), tuple(
            ir.Part(o, tuple(ps), tuple(st)) for o, ps, st, _ in parts)),
                          tuple(b.index for *_, b in parts), (out,))
        return out

    def take(self, buf: Slot, index: np.ndarray) -> Slot:
        index = np.array(index, dtype=np.int64)
        out = self._out(self.real.take(buf.value, index))
        self.program.emit("take", ir.Take(index), (buf.index,), (out,))
        return out

    def scatter_add(self, shape: tuple[int, ...], dtype: Any, index: np.ndarray, g: Any,
                    unique: bool = False) -> Slot:
        index = np.array(index, dtype=np.int64)
        g = self._operand(g)
        out = self._out(self.real.scatter_add(shape, dtype, index, g.value, unique))
        self.program.emit("scatter_add", ir.ScatterAdd(tuple(shape), np.dtype(dtype), index,
                                                          unique),
                          (g.index,), (out,))
        return out

    # -- the op table's ops --
    def op(self, op: Any, params: Any, bufs: list[Any], shape: tuple[int, ...],
           dtype: Any) -> Any:
        """An op of the op table (``easyad.ops``): its composite recorded as the primitives
        it calls (they fuse), unless the device has a lowering of its own; else one ``op``
        instruction, which replay runs through the backend's ``op``."""
        own = self.real.kind == "opencl" and op.opencl is not None
        if op.composite is not None and not own:
            return op.composite(self, params, *bufs)
        args = [self._operand(b) for b in bufs]
        out = self._out(self.real.op(op, params, [a.value for a in args], shape, dtype))
        self.program.emit("op", ir.TableOp(op, params, tuple(shape), np.dtype(dtype)),
                          tuple(a.index for a in args), (out,))
        return out

    # -- host code (user array primitives): a Python call of host arrays --
    def host_call(self, label: str, fn: Any, args: Sequence[Any]) -> list[Slot]:
        """``fn(*host values of args)`` -> a list of host arrays, as one instruction that
        replay calls again with the new values (slots read to the host, the results put
        on the device). Arguments that are not slots are passed as they are."""
        hosts = [np.asarray(self.real.to_numpy(a.value)) if isinstance(a, Slot) else a
                 for a in args]
        results = [np.asarray(r) for r in fn(*hosts)]
        outs = [self._out(self.real.asarray(r, r.dtype)) for r in results]
        template = tuple(("slot", None) if isinstance(a, Slot) else ("const", a)
                         for a in args)
        self.program.emit("host", ir.HostCall(label, fn, template,
                                                  tuple(r.dtype for r in results)),
                          tuple(a.index for a in args if isinstance(a, Slot)), outs)
        return outs

    # -- fused kernels --
    def linear(self, x: Slot, w: Slot, b: Any) -> Slot:
        x, w = self._operand(x), self._operand(w)
        b = None if b is None else self._operand(b)
        out = self._out(self.real.linear(x.value, w.value, _real(b)))
        self.program.emit("linear", ir.Linear(), (x.index, w.index, _ref(b)), (out,))
        return out

    def linear_vjp(self, g: Slot, x: Any, w: Any, needs: tuple[bool, bool, bool]
                   ) -> tuple[Any, Any, Any]:
        g = self._operand(g)
        x = None if x is None else self._operand(x)
        w = None if w is None else self._operand(w)
        found = self.real.linear_vjp(g.value, _real(x), _real(w), needs)
        outs = [None if v is None else self._out(v) for v in found]
        self.program.emit("linear_vjp", ir.LinearVjp(tuple(needs)), (g.index, _ref(x), _ref(w)),
                          [o for o in outs if o is not None])
        return outs[0], outs[1], outs[2]

    def cross_entropy(self, z: Slot, target: np.ndarray, divisor: float) -> tuple[Slot, Any]:
        target = np.array(target, dtype=np.int64)
        loss, saved = self.real.cross_entropy(z.value, target, divisor)
        out = self._out(loss)
        state = self.program._opaque(saved)
        self.program.emit("cross_entropy", ir.CrossEntropy(target, float(divisor)), (z.index,),
                          (out, state))
        return out, state

    def cross_entropy_vjp(self, saved: Opaque, target: np.ndarray, scale: Any) -> Slot:
        target = np.array(target, dtype=np.int64)
        scale = self._operand(scale)
        value = self.real.cross_entropy_vjp(saved.value, target, float(np.asarray(
            self.real.to_numpy(scale.value)).reshape(())) if isinstance(scale, Slot)
            else scale)
        out = self._out(value)
        self.program.emit("cross_entropy_vjp", ir.CrossEntropyVjp(target),
                          (saved.index, _ref(scale)), (out,))
        return out


# ---- replay: the instructions bound to one backend, run in order ----

def live_instructions(program: Program, outputs: Sequence[int]) -> list[Instruction]:
    """The instructions ``outputs`` need (and every guard, with what it reads), in order:
    the value alone skips the backward sweep's kernels (the optimiser's dead-node pass,
    ``compiler.optimiser.live``)."""
    return optimiser.live(program.instructions, outputs)


def _last_uses(instructions: list[Instruction], program: Program,
               keep: set[int]) -> list[list[int]]:
    """For each instruction, the slots read for the last time there (freed after it)."""
    last: dict[int, int] = {}
    for k, ins in enumerate(instructions):
        for i in ins.ins:
            if type(i) is int:
                last[i] = k
        for i in ins.outs:
            last.setdefault(i, k)
    free: list[list[int]] = [[] for _ in instructions]
    for slot, k in last.items():
        if slot not in keep and slot not in program.constants:
            free[k].append(slot)
    return free


class BoundProgram:
    """A Program's instructions prepared for one backend: each a Python call of the
    backend's kernel (one per instruction, no tape, no Tensor objects); slots freed after
    their last reader. ``run(inputs)`` returns the ``outputs`` slots' buffers."""

    def __init__(self, program: Program, be: Backend, outputs: Sequence[int],
                 on_guard: Any) -> None:
        self.program, self.be, self.outputs = program, be, tuple(outputs)
        self.constants = {i: (v if program.dtypes[i] is None else be.asarray(v, v.dtype))
                          for i, v in program.constants.items()}
        self.instructions = live_instructions(program, self.outputs)
        self.steps = [step(ins, be, on_guard) for ins in self.instructions]
        self.free = _last_uses(self.instructions, program,
                               set(self.outputs) | set(program.inputs))
        self.size = len(program.shapes)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        slots: list[Any] = [None] * self.size
        for i, v in self.constants.items():
            slots[i] = v
        for i, v in zip(self.program.inputs, inputs):
            slots[i] = v
        for step, free in zip(self.steps, self.free):
            step(slots)
            for i in free:
                slots[i] = None
        return [slots[i] for i in self.outputs]


def _arg(slots: list[Any], i: Any) -> Any:
    return slots[i] if type(i) is int else i


def step(ins: Instruction, be: Backend, on_guard: Any) -> Any:
    """One instruction as a function of the slot list, on backend ``be``."""
    op, p, a, o = ins.op, ins.params, ins.ins, ins.outs
    if op == "map":
        kernel = be.prepared_map(p.label, p.exprs, p.names)
        shape, dtypes = p.shape, p.dtypes

        def run_map(s: list[Any]) -> None:
            outs = kernel(tuple(s[i] if type(i) is int else i for i in a), shape, dtypes)
            for k, v in zip(o, outs):
                s[k] = v
        return run_map
    if op == "guard":
        recorded, key = p.recorded, p.key

        def run_guard(s: list[Any]) -> None:
            value = np.asarray(be.to_numpy(s[a[0]]))
            if key is not None:
                value = np.asarray(key(value))
            if not np.array_equal(value, recorded, equal_nan=True):
                on_guard(value, recorded)
        return run_guard
    if op == "cross_entropy":
        target, divisor = p.target, p.divisor

        def run_ce(s: list[Any]) -> None:
            s[o[0]], s[o[1]] = be.cross_entropy(s[a[0]], target, divisor)
        return run_ce
    if op == "cross_entropy_vjp":
        target = p.target

        def run_ce_vjp(s: list[Any]) -> None:
            scale = s[a[1]] if type(a[1]) is int else a[1]
            if not isinstance(scale, float):
                scale = float(np.asarray(be.to_numpy(scale)).reshape(()))
            s[o[0]] = be.cross_entropy_vjp(s[a[0]], target, scale)
        return run_ce_vjp
    if op == "host":
        fn, template, dtypes = p.fn, p.template, p.dtypes

        # a function marked ``borrows`` only reads its arguments and returns new arrays
        # (easyad's own kernels, attention's): the numpy device lends it the slots and
        # takes its results, no copies (tens of MB a call for attention)
        borrows = getattr(fn, "borrows", False) and hasattr(be, "adopt")

        def run_host(s: list[Any]) -> None:
            slots = iter(a)
            hosts = [(be.host_array(s[next(slots)]) if borrows else
                      np.asarray(be.to_numpy(s[next(slots)]))) if kind == "slot" else value
                     for kind, value in template]
            for k, r, dt in zip(o, fn(*hosts), dtypes):
                s[k] = be.adopt(r) if borrows and r.dtype == dt and r.flags.c_contiguous \
                    and not any(isinstance(h, np.ndarray) and np.may_share_memory(r, h)
                                for h in hosts) else be.asarray(np.asarray(r, dtype=dt), dt)
        return run_host
    if op == "linear_vjp":
        needs = p.needs

        def run_linear_vjp(s: list[Any]) -> None:
            found = be.linear_vjp(s[a[0]], _arg(s, a[1]), _arg(s, a[2]), needs)
            for k, v in zip(o, (v for v in found if v is not None)):
                s[k] = v
        return run_linear_vjp
    call = _SIMPLE[op]

    def run(s: list[Any]) -> None:
        s[o[0]] = call(be, p, [s[i] if type(i) is int else i for i in a])
    return run


_SIMPLE: dict[str, Any] = {
    "reshape": lambda be, p, a: be.reshape(a[0], p.shape),
    "reduce": lambda be, p, a: be.reduce(p.op, a[0], p.axes),
    "matmul": lambda be, p, a: be.matmul(a[0], a[1], p.transpose_a, p.transpose_b),
    "strided": lambda be, p, a: be.strided(a[0], p.offset, p.shape, p.strides),
    "assemble": lambda be, p, a: be.assemble(p.shape, p.dtype, [
        (part.offset, part.shape, part.strides, b) for part, b in zip(p.parts, a)]),
    "take": lambda be, p, a: be.take(a[0], p.index),
    "scatter_add": lambda be, p, a: be.scatter_add(p.shape, p.dtype, p.index, a[0], p.unique),
    "linear": lambda be, p, a: be.linear(a[0], a[1], a[2]),
    "op": lambda be, p, a: be.op(p.op, p.params, a, p.shape, p.dtype),
}
