"""The one optimiser of the program compiler: passes over the IR (``compiler.ir``), the
same for scalar tapes and tensor programs, in one forward sweep and one backward one.

- **Constant folding**: a node whose operands are all constants is its value at the
  recording point (what the VM, or the unfused replay, computes from those constants,
  bit for bit): in place (a float) in a scalar graph, a constant slot in a tensor one
  (``host`` reads it to the host; without it tensor nodes are not folded), unless that
  would make an array of a number (a broadcast: a literal in a fused loop). A guard of
  constants never changes and goes; comparisons and selects stay (the VM reads them).
- **Exact identities**, only those that hold bit for bit for every operand, -0.0, inf and
  NaN included: ``x * 1``, ``1 * x``, ``x / 1``, ``x - 0``, ``x + -0``, ``-0 + x``,
  ``x ** 1``, ``-(-x)``, and a map that copies a slot (``"x"``) of its shape and dtype.
  Never ``x + 0`` (-0.0 + 0 is +0.0) or ``x * 0`` (inf * 0 is NaN, -1 * 0 is -0.0).
- **Masks that are never true** (tensor programs): a strong zero's mask (``_expr.
  STRONG_MUL_MASK``, ``STRONG_DIV_MASK``) that a constant operand makes 0 at every element,
  whatever the other, and the where that chooses by it: that where is its other operand.
- **Common subexpressions**: a pure node equal to an earlier one (same op, params up to
  the map's label, the same operands: constants compared by their bits) is that node.
- **Dead nodes**: only what an output or a guard reads stays (and a scalar's inputs).
- **Narrowed constants** (``narrow_constants``, the fused C programs only): a constant
  only maps read, stored without the axes it repeats along (maps broadcast), equal
  constants read from one slot.

Derivatives: a scalar graph's gradient is the VM's reverse sweep over the rewritten tape,
so it agrees to rounding (a shared node sums its adjoints before they are multiplied, and
another layout adds in another order); a tensor program is already its gradient program,
so its values are the unoptimised replay's bit for bit.
"""
from __future__ import annotations

import copy
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from easyad import _expr
from easyad.compiler.ir import Comparison, Graph, Map, Node, ScalarRule, is_guard

# tensor nodes that compute their outputs from their operands alone (no state, no host
# code): they fold and are shared
_PURE = frozenset({"map", "reduce", "reshape", "strided", "take", "assemble", "scatter_add",
                   "matmul", "linear"})


_bits = struct.Struct("<d").pack        # a float's 8 bytes


def _is(r: Any, v: float) -> bool:
    """Whether operand ``r`` (a slot's number is never a constant) is the constant ``v``,
    bit for bit (``v`` is not NaN: equal and of the same sign is then the same bits)."""
    return isinstance(r, float) and r == v and math.copysign(1.0, r) == math.copysign(1.0, v)


def key(v: Any) -> Any:
    """A hashable key of a param or operand that tells apart what computes apart: floats
    by their bits (0.0 from -0.0, every NaN), arrays by dtype, shape and bytes."""
    if type(v) is int or isinstance(v, (str, bool, type(None))):
        return v
    if isinstance(v, float):
        return ("f", _bits(v))
    if isinstance(v, np.floating):
        return ("f", v.tobytes(), v.dtype.str)
    if isinstance(v, np.ndarray):
        return ("a", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.dtype):
        return ("d", v.str)
    if isinstance(v, (tuple, list)):
        return tuple(key(x) for x in v)
    if isinstance(v, (np.integer, np.bool_)):
        return ("i", int(v))
    return ("o", id(v))


def _operand_key(r: Any) -> Any:
    return ("s", r) if type(r) is int else ("c", key(r))


def optimise(g: Graph, outputs: Sequence[Any], host: Callable[[Any], Any] | None = None
             ) -> tuple[Graph, list[Any]]:
    """The graph rewritten (see the module's docstring), as a shallow copy sharing its
    slots (no slot is renumbered), and ``outputs`` as operands of it (a slot, or a
    constant in place for a scalar graph)."""
    out = copy.copy(g)
    out.constants = dict(g.constants)
    sub: dict[int, Any] = {}             # slot -> what it equals (a slot or a constant)
    producer: dict[int, Node] = {}
    seen: dict[Any, Node] = {}
    kept: list[Node] = []
    never: set[int] = set()              # strong-zero masks 0 everywhere (_never_true)

    def r(x: Any) -> Any:
        return sub.get(x, x) if type(x) is int else x

    for node in g.instructions:
        ins = tuple([sub.get(x, x) if type(x) is int else x for x in node.ins])
        scalar = type(node.params) is ScalarRule
        if _folds(out, node, ins, scalar, host):
            if scalar or is_guard(node):
                for o in node.outs:
                    sub[o] = float(g.values[o])
            else:
                for o in node.outs:
                    out.constants[o] = np.asarray(host(g.values[o])).copy()  # type: ignore
            continue
        if not scalar and _never_true(out, node, ins):
            never.add(node.outs[0])
        same = _scalar_identity(node.op, ins, producer) if scalar else \
            _tensor_identity(g, node, ins, producer)
        if same is None and not scalar:
            same = _unmasked(g, node, ins, never)
        if same is not None:
            sub[node.outs[0]] = same
            continue
        shared = scalar or node.op in _PURE
        if shared:
            if scalar:          # its params follow from its op
                k: Any = (node.op, *[x if type(x) is int else _bits(x) for x in ins])
            else:
                params = node.params._replace(label="") if type(node.params) is Map \
                    else node.params
                k = (node.op, key(tuple(params)), tuple(_operand_key(x) for x in ins))
            earlier = seen.get(k)
            if earlier is not None:
                for o, e in zip(node.outs, earlier.outs):
                    sub[o] = e
                continue
        new = node if ins == node.ins and _same_objects(ins, node.ins) \
            else Node(node.op, node.params, ins, node.outs)
        if shared:
            seen[k] = new
        for o in new.outs:
            producer[o] = new
        kept.append(new)
    outs = [r(o) for o in outputs]
    out.instructions = live(kept, outs)
    return out, outs


def _same_objects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return all(x is y for x, y in zip(a, b))


def _folds(g: Graph, node: Node, ins: tuple[Any, ...], scalar: bool,
           host: Callable[[Any], Any] | None) -> bool:
    if scalar:
        return all(type(x) is not int for x in ins)
    if type(node.params) is Comparison:          # a scalar guard of constants
        return node.op.startswith("guard_") and all(type(x) is not int for x in ins)
    if node.op == "guard":                       # a tensor guard of a constant
        return all(type(x) is not int or x in g.constants for x in ins)
    if node.op not in _PURE or host is None:
        return False
    if not all(type(x) is not int or x in g.constants for x in ins) or \
            any(g.dtypes[o] is None or g.values[o] is None for o in node.outs):
        return False
    # never a broadcast: a number spread over an array is a literal in the fused loop,
    # an array of it would be read from memory
    biggest = max((math.prod(g.shapes[x]) for x in ins if type(x) is int), default=1)
    return all(math.prod(g.shapes[o]) <= biggest for o in node.outs)


def _scalar_identity(op: str, ins: tuple[Any, ...], producer: dict[int, Node]) -> Any:
    """The operand a scalar node equals bit for bit (value and derivative), or None."""
    a = ins[0]
    b = ins[1] if len(ins) > 1 else None
    if op == "mul":
        if _is(b, 1.0) and type(a) is int:
            return a
        if _is(a, 1.0) and type(b) is int:
            return b
    elif op in ("div", "pow") and _is(b, 1.0) or op == "sub" and _is(b, 0.0) \
            or op == "add" and _is(b, -0.0):
        return a if type(a) is int else None
    elif op == "add" and _is(a, -0.0):
        return b if type(b) is int else None
    elif op == "neg" and type(a) is int:
        inner = producer.get(a)
        if inner is not None and inner.op == "neg" and type(inner.ins[0]) is int:
            return inner.ins[0]
    return None


def _tensor_identity(g: Graph, node: Node, ins: tuple[Any, ...],
                     producer: dict[int, Node]) -> Any:
    """The slot a map's one output equals bit for bit, or None."""
    if node.op != "map" or len(node.outs) != 1 or len(node.params.exprs) != 1:
        return None
    operands = dict(zip(node.params.names, ins))
    tree = _expr.parse(node.params.exprs[0])
    same = _same_as(tree, operands, producer)
    if same is None or type(same) is not int:
        return None
    o = node.outs[0]
    if g.shapes[same] != g.shapes[o] or g.dtypes[same] != g.dtypes[o]:
        return None          # broadcast or cast: not the operand itself
    return same


def _same_as(tree: Any, operands: dict[str, Any], producer: dict[int, Node]) -> Any:
    def at(t: Any) -> Any:
        if isinstance(t, _expr.Var):
            return operands.get(t.name)
        if isinstance(t, _expr.Num):
            return float(t.value)
        return None

    if isinstance(tree, _expr.Var):
        return at(tree)
    if isinstance(tree, _expr.Neg):             # -(-x): the inner map a negation too
        x = at(tree.operand)
        inner = producer.get(x) if type(x) is int else None
        if inner is not None and inner.op == "map" and len(inner.outs) == 1 and \
                len(inner.params.exprs) == 1:
            t = _expr.parse(inner.params.exprs[0])
            if isinstance(t, _expr.Neg) and isinstance(t.operand, _expr.Var):
                return dict(zip(inner.params.names, inner.ins)).get(t.operand.name)
        return None
    if not isinstance(tree, _expr.Bin):
        return None
    a, b = at(tree.left), at(tree.right)
    op = {"*": "mul", "/": "div", "-": "sub", "+": "add"}.get(tree.op)
    if op is None or a is None or b is None:
        return None
    return _scalar_identity(op, (a, b), {})


_MASKS = {_expr.parse(_expr.STRONG_MUL_MASK): "mul", _expr.parse(_expr.STRONG_DIV_MASK): "div"}
_CHOOSE = _expr.parse("choose(c, x, y)")


def _never_true(g: Graph, node: Node, ins: tuple[Any, ...]) -> bool:
    """Whether ``node`` is a strong zero's mask that a constant operand makes 0 at every
    element, whatever the other: x * y's where x (or y) is finite and nonzero everywhere
    (a Jacobian's basis pushed through a matrix), x / y's where x is nonzero."""
    if node.op != "map" or len(node.outs) != 1 or len(node.params.exprs) != 1 or \
            node.params.dtypes[0] != np.bool_:
        return False
    kind = _MASKS.get(_expr.parse(node.params.exprs[0]))
    if kind is None:
        return False
    operands = dict(zip(node.params.names, ins))

    def never_zero(name: str, finite: bool) -> bool:
        v = operands.get(name)
        v = g.constants.get(v) if type(v) is int else v
        if v is None or isinstance(v, int):
            return False
        a = np.asarray(v)
        return a.dtype.kind == "f" and bool(np.all(a != 0) and
                                            (not finite or np.all(np.isfinite(a))))
    if kind == "mul":
        return never_zero("x", True) or never_zero("y", True)
    return never_zero("x", False)


def _unmasked(g: Graph, node: Node, ins: tuple[Any, ...], never: set[int]) -> Any:
    """``where(c, x, y)`` of a mask that is 0 everywhere: y, where y is a slot of the
    node's shape and dtype (bit for bit: the where takes y at every element)."""
    if not never or node.op != "map" or len(node.outs) != 1 or \
            len(node.params.exprs) != 1 or _expr.parse(node.params.exprs[0]) != _CHOOSE:
        return None
    operands = dict(zip(node.params.names, ins))
    c, y, o = operands.get("c"), operands.get("y"), node.outs[0]
    if type(c) is int and c in never and type(y) is int and \
            g.shapes[y] == g.shapes[o] and g.dtypes[y] == g.dtypes[o]:
        return y
    return None


def live(nodes: list[Node], outputs: Sequence[Any]) -> list[Node]:
    """The nodes an output or a guard reads (guards always run), inputs (``variable``
    nodes) kept, in order."""
    needed = {o for o in outputs if type(o) is int}
    keep: list[Node] = []
    for node in reversed(nodes):
        outs = node.outs
        if (outs[0] in needed if len(outs) == 1 else any(o in needed for o in outs)) \
                or is_guard(node) or node.op == "variable":
            keep.append(node)
            needed.update([i for i in node.ins if type(i) is int])
    keep.reverse()
    return keep


def optimise_program(program: Any, outputs: Sequence[int]) -> tuple[Any, list[int]]:
    """A recorded tensor program (``tensor._program.Program``) optimised before it is
    planned and rendered (``fused_c.fused``, ``fused_cl.fused``): constants read to the
    host through the backend it was recorded on."""
    recorder = getattr(program, "backend", None)
    real = getattr(recorder, "real", None)
    host = None if real is None else real.to_numpy
    return optimise(program, outputs, host)  # type: ignore[return-value]


def narrow_constants(program: Any, outputs: Sequence[int]) -> Any:
    """A tensor program whose constants that only maps read are stored without the axes
    along which they repeat (a Jacobian's basis, or a matrix pushed through it, broadcast
    over the batch: a map broadcasts its operands), and read once where two are equal bit
    for bit: the same elements at every index, so every value is the same to the bit,
    with less memory read per call. A shallow copy; new slots for the narrowed constants
    (an unchanged program when none narrows)."""
    readers: dict[int, list[str]] = {}
    for node in program.instructions:
        for i in node.ins:
            if type(i) is int:
                readers.setdefault(i, []).append(node.op)
    kept = set(outputs) | set(program.inputs) | set(program.in_place.values()) | \
        set(program.effect_slots)
    sub: dict[int, int] = {}
    made: dict[Any, int] = {}
    out = None
    for s, a in program.constants.items():
        if s in kept or not readers.get(s) or any(op != "map" for op in readers[s]) or \
                not isinstance(a, np.ndarray) or a.shape != tuple(program.shapes[s]):
            continue
        narrow = _without_repeats(a)
        k = ("a", narrow.dtype.str, narrow.shape, narrow.tobytes())
        if k in made:
            sub[s] = made[k]
            continue
        if narrow.shape == a.shape:
            made[k] = s
            continue
        if out is None:
            out = copy.copy(program)
            out.shapes, out.dtypes, out.values = list(out.shapes), list(out.dtypes), \
                list(out.values)
            out.constants = dict(out.constants)
        new = len(out.shapes)
        out.shapes.append(narrow.shape)
        out.dtypes.append(out.dtypes[s])
        out.values.append(narrow)
        out.constants[new] = narrow
        made[k] = sub[s] = new
    if not sub:
        return program
    if out is None:
        out = copy.copy(program)
        out.constants = dict(out.constants)
    out.instructions = [Node(n.op, n.params, tuple(sub.get(i, i) if type(i) is int else i
                                                   for i in n.ins), n.outs)
                        if any(type(i) is int and i in sub for i in n.ins) else n
                        for n in program.instructions]
    for s in sub:          # read by nothing now
        del out.constants[s]
    return out


def _without_repeats(a: np.ndarray) -> np.ndarray:
    """``a`` with each axis along which every slice equals the first (bit for bit: -0.0
    and 0.0 apart, NaN payloads too) kept at length 1."""
    for d in range(a.ndim):
        if a.shape[d] > 1:
            first = np.ascontiguousarray(a.take([0], axis=d))
            same = np.broadcast_to(first, a.shape)
            if np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(same).tobytes():
                a = first
    return a
