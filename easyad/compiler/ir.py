"""The one program format of the compiler: scalar tapes and tensor programs alike.

A program is a list of **nodes** over numbered **slots** (values):

- ``Node(op, params, ins, outs)``: ``op`` names what the node does (a Backend Protocol
  method of a tensor program, ``"map"``, ``"reduce"``...; a rule of ``easyad._rules`` or
  ``compare_*``/``guard_*``/``select`` of a scalar tape), ``params`` its static
  parameters as a typed record of that kind (``PARAMS[op]``: fields by name, never by
  position), ``ins`` the operands (a slot's number, an ``int``; anything else is a
  constant in place: a float, None, an array) and ``outs`` the slots it writes.
- ``Graph``: the nodes, and per slot its ``shapes``, ``dtypes`` and ``values`` (at the
  recording point); ``inputs``, ``constants`` (slot -> host value, filled before a run)
  and the guards (nodes whose ``op`` is ``"guard"`` or ``guard_*``: checked at every run,
  never dropped). A scalar tape's slots are shape ``()`` float64; its graph also keeps
  each rule entry's recorded partials (``partials``), which the tape it is written back
  to carries.

``from_tape(tape, inputs, outputs)`` reads a WengertList into a graph (a variable that is
not an input is a constant, in place), ``to_tape(graph, outputs)`` writes one back as the
WengertList the VM and the C renderer read. The tensor recorder (``tensor._program``)
records into a ``Graph`` directly (``Program`` is one). ``compiler.optimise`` rewrites
either kind.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from easyad import _core, _rules, _tapeview

# ---- params: one record per kind of node ----


class Map(NamedTuple):
    """Elementwise expressions (``_expr`` strings over ``names``) over ``shape``."""
    label: str
    exprs: tuple[str, ...]
    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtypes: tuple[Any, ...]


class Reduce(NamedTuple):
    op: str                      # "sum", "max", "min"
    axes: tuple[int, ...]


class Reshape(NamedTuple):
    shape: tuple[int, ...]


class Matmul(NamedTuple):
    transpose_a: bool
    transpose_b: bool


class Strided(NamedTuple):
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


class Part(NamedTuple):
    """One operand of an assemble: written at ``offset`` with ``strides``."""
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


class Assemble(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any
    parts: tuple[Part, ...]


class Take(NamedTuple):
    index: np.ndarray


class ScatterAdd(NamedTuple):
    shape: tuple[int, ...]
    dtype: Any
    index: np.ndarray
    unique: bool


class Guard(NamedTuple):
    recorded: np.ndarray         # the host value read while recording (or key's of it)
    # None: the value itself is checked; else a function of it (LU pivots, an argmax),
    # and only its result is: a new point keeping the result replays
    key: Any = None


class TableOp(NamedTuple):
    """An op of the op table (``easyad.ops``) with its bound params."""
    op: Any
    params: Any
    shape: tuple[int, ...]
    dtype: Any


class HostCall(NamedTuple):
    label: str
    fn: Any
    template: tuple[tuple[str, Any], ...]   # per argument ("slot", None) or ("const", v)
    dtypes: tuple[Any, ...]


class Linear(NamedTuple):
    pass


class LinearVjp(NamedTuple):
    needs: tuple[bool, bool, bool]


class CrossEntropy(NamedTuple):
    target: np.ndarray
    divisor: float


class CrossEntropyVjp(NamedTuple):
    target: np.ndarray


# scalar tapes' nodes
class Variable(NamedTuple):
    pass


class ScalarRule(NamedTuple):
    arity: int


class Comparison(NamedTuple):
    symbol: str                  # the C operator


class Select(NamedTuple):
    pass


_NODES: dict[str, type] = {
    "map": Map, "reduce": Reduce, "reshape": Reshape, "matmul": Matmul,
    "strided": Strided, "assemble": Assemble, "take": Take, "scatter_add": ScatterAdd,
    "guard": Guard, "op": TableOp, "host": HostCall, "linear": Linear,
    "linear_vjp": LinearVjp, "cross_entropy": CrossEntropy,
    "cross_entropy_vjp": CrossEntropyVjp, "variable": Variable, "select": Select,
    **{f"{kind}_{c}": Comparison for kind in ("compare", "guard") for c in _rules.COMPARISONS},
}
if _NODES.keys() & _rules.OPCODES.keys():      # a rule's node would read as another op
    raise RuntimeError(f"rules named as program ops: {sorted(_NODES.keys() & _rules.OPCODES)}"
                       "; rename the rule in easyad/_rules.py")
PARAMS: dict[str, type] = {**_NODES, **{name: ScalarRule for name in _rules.OPCODES}}


class Node:
    """One node (see the module's docstring). Its params must be the record ``PARAMS``
    names for its op: a program is never built from positional tuples."""

    __slots__ = ("op", "params", "ins", "outs")

    def __init__(self, op: str, params: Any, ins: tuple[Any, ...],
                 outs: tuple[int, ...]) -> None:
        kind = PARAMS.get(op)
        if kind is None:
            raise ValueError(f"a program node of an unknown op {op!r}: add its params "
                             f"record to easyad.compiler.ir.PARAMS")
        if type(params) is not kind:
            raise TypeError(f"a {op!r} node takes its params as ir.{kind.__name__}, "
                            f"not {type(params).__name__}")
        self.op, self.params, self.ins, self.outs = op, params, ins, outs

    @classmethod
    def trusted(cls, op: str, params: Any, ins: tuple[Any, ...], outs: tuple[int, ...]
                ) -> Node:
        """A node whose params are known to fit (a front end's own tables): unchecked."""
        node = cls.__new__(cls)
        node.op, node.params, node.ins, node.outs = op, params, ins, outs
        return node

    def __repr__(self) -> str:
        return f"{self.outs} = {self.op}{self.ins!r:.60} {self.params!r:.60}"


def is_guard(node: Node) -> bool:
    return node.op == "guard" or node.op.startswith("guard_")


class Graph:
    """Nodes over slots (see the module's docstring)."""

    def __init__(self) -> None:
        self.instructions: list[Node] = []
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: list[Any] = []
        self.values: list[Any] = []              # at the recording point (None: opaque)
        self.inputs: list[int] = []
        self.constants: dict[int, Any] = {}      # slot -> host value
        self.partials: dict[int, tuple[float, float]] = {}   # scalar rule entries only

    @property
    def nodes(self) -> list[Node]:
        return self.instructions

    def guards(self) -> list[Node]:
        return [n for n in self.instructions if is_guard(n)]


# ---- scalar tapes: front end and back end ----

_F64 = np.dtype(np.float64)


def from_tape(tape: Any, inputs: Sequence[int], outputs: Sequence[int]
              ) -> tuple[Graph, list[Any]] | None:
    """The tape as a graph (one node of shape () per computed entry, slot = entry
    index) and its outputs as operands (an entry's slot, or a constant); None where it
    holds user primitives or tensor nodes. A variable that is not in ``inputs`` is a
    constant: its readers read its recorded value in place."""
    view = _tapeview.TapeView(tape)
    ops = view.ops.tolist()
    if any(_tapeview.KINDS[op] in (_tapeview.CUSTOM, _tapeview.NODE) for op in set(ops)):
        return None
    arg = (view.arg0.tolist(), view.arg1.tolist())
    partial = (view.partial0.tolist(), view.partial1.tolist())
    g = Graph()
    g.values = view.values.tolist()
    g.shapes = [()] * len(ops)
    g.dtypes = [_F64] * len(ops)
    input_set = set(inputs)
    ref: list[Any] = []                  # per entry: its slot, or its value in place
    nodes, partials, values = g.instructions, g.partials, g.values
    made = Node.trusted
    a0, a1 = arg
    p0, p1 = partial
    for e, op in enumerate(ops):
        entry = _ENTRY[op]
        if entry is None:                # a variable: an input, or a constant
            if e in input_set:
                nodes.append(made("variable", _VARIABLE, (), (e,)))
                ref.append(e)
            else:
                ref.append(values[e])
            continue
        name, params, arity = entry
        i, j = a0[e], a1[e]
        x = ref[i] if i >= 0 else p0[e]
        if arity == 1:
            ins: tuple[Any, ...] = (x,)
        else:
            ins = (x, ref[j] if j >= 0 else p1[e])
            if params is _SELECT:
                ins = (*ins, ref[_tapeview.select_condition(e)])
        partials[e] = (p0[e], p1[e])
        nodes.append(made(name, params, ins, (e,)))
        ref.append(e)
    g.inputs = list(inputs)
    return g, [ref[o] for o in outputs]


_OPCODE = {name: code for code, name in enumerate(_rules.OPCODE_NAMES)}
_VARIABLE, _SELECT = Variable(), Select()


def _entry(code: int) -> tuple[str, Any, int] | None:
    """Per opcode: the node's op, params and arity (None: a variable or constant)."""
    kind, name = _tapeview.KINDS[code], _rules.OPCODE_NAMES[code]
    if kind == _tapeview.RULE:
        arity = _rules.RULES_BY_NAME[name].arity
        return name, ScalarRule(arity), arity
    if kind == _tapeview.SELECT:
        return name, _SELECT, 2
    if kind in (_tapeview.COMPARE, _tapeview.GUARD):
        return name, Comparison(_tapeview.SYMBOLS[code]), 2
    return None


_ENTRY = [_entry(code) for code in range(len(_rules.OPCODE_NAMES))]


def to_tape(g: Graph, outputs: Sequence[Any]) -> tuple[Any, list[int], list[int]]:
    """The scalar graph as a new WengertList (entries in node order, renumbered), with
    its inputs' and outputs' entry indices. An output that is a constant, and a constant
    a comparison reads first (the VM compares an entry), become variable entries."""
    ops: list[int] = []
    a0: list[int] = []
    a1: list[int] = []
    values: list[float] = []
    p0: list[float] = []
    p1: list[float] = []
    at: dict[int, int] = {}
    recorded, partials = g.values, g.partials
    variable = _rules.OP_VARIABLE

    def emit(op: int, x: Any, y: Any, value: float, p: tuple[float, float]) -> int:
        """An entry of operands x, y: a node's slot, a constant, or None (none)."""
        if type(x) is int:
            a0.append(at[x])
            p0.append(p[0])
        else:
            a0.append(-1)
            p0.append(0.0 if x is None else float(x))
        if type(y) is int:
            a1.append(at[y])
            p1.append(p[1])
        else:
            a1.append(-1)
            p1.append(0.0 if y is None else float(y))
        ops.append(op)
        values.append(value)
        return len(ops) - 1

    for n in g.instructions:
        out = n.outs[0]
        ins = n.ins
        x = ins[0] if ins else None
        y = ins[1] if len(ins) > 1 else None
        if n.op == "variable":
            at[out] = emit(variable, None, None, recorded[out], (0.0, 0.0))
            continue
        if n.op == "select":
            if not ops or type(ins[2]) is not int or at.get(ins[2]) != len(ops) - 1:
                raise ValueError("a select's condition must be the node just before it")
        elif type(x) is not int and type(n.params) is Comparison:
            # the VM compares an entry: the constant as a variable entry of its own
            at[-1] = emit(variable, None, None, float(x), (0.0, 0.0))
            x = -1
        at[out] = emit(_OPCODE[n.op], x, y, recorded[out], partials.get(out, (0.0, 0.0)))
    outs = [at[o] if type(o) is int else emit(variable, None, None, float(o), (0.0, 0.0))
            for o in outputs]
    return rebuild_tape(ops, (a0, a1), values, (p0, p1), [at[i] for i in g.inputs], outs)


def rebuild_tape(ops: list[int], args: tuple[list[int], list[int]], values: list[float],
                 partials: tuple[list[float], list[float]], ins: list[int], outs: list[int]
                 ) -> tuple[Any, list[int], list[int]]:
    """A WengertList of these parallel arrays (entries as they are), inputs, outputs."""
    parts = (np.asarray(values, dtype="<f8").tobytes(),
             np.asarray(partials[0], dtype="<f8").tobytes(),
             np.asarray(partials[1], dtype="<f8").tobytes(),
             np.asarray(args[0], dtype="<i4").tobytes(),
             np.asarray(args[1], dtype="<i4").tobytes(),
             np.asarray(ops, dtype=np.uint8).tobytes())
    tape = _core._rebuild_wengert_list(len(ops), parts, {}, None, None, None,
                                       source="optimised program")
    return tape, list(ins), list(outs)
