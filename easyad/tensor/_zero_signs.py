"""Signs of zero in generated loops: the ``+ 0.0`` that no reader can tell from its absence.

The rule table keeps eager execution's zeros exact: ``mul0(c, y)`` (the strong zero) is +0
where y is -0, and the generated code writes it ``c * y + 0.0`` when c is a number
(``constant_strong_zeros``). That addition costs a vector operation per element, and a
backward sweep makes many: in Rosenbrock's gradient loop six of its 27 additions. Most
are invisible: ``x + 0.0`` differs from ``x`` only where x is -0, and most readers cannot
tell -0 from +0. ``map_trees`` finds them and drops their ``+ 0.0``, so every value the
program returns or hands to a Python step keeps exactly the bits it had.

A value's zero sign does not matter (it is *absorbed*) where it is read

- by ``x + 0.0`` (the result is +0 either way), by ``mul0`` (0 either way) or by a
  comparison (-0 == +0);
- as an operand of ``+``, ``-``, ``*`` or a numerator, of a value that is itself
  absorbed: the sign then changes the result's zero sign only (or nothing: 0 * inf is NaN
  either way);
- as one term of a sum whose other term keeps its ``+ 0.0`` (a sum with a term that is
  never -0 is never -0);
- by a sum reduction or a copy (slice, gather, a slice's adjoint) in generated code whose
  own result is absorbed (the loops' sums start at +0.0).

Everything else reads the exact value: program outputs, Python steps, guards, calls of
libm (1/x, atan2, log...), denominators. The analysis runs backwards over the program
(readers before the values they read), so a value is absorbed only when all its readers
absorb it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from easyad import _expr

STRIP = True         # False: keep every + 0.0 (the tests compare both)
_COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!=", "&", "|"})
_COPIES = frozenset({"strided", "take", "assemble"})


def constant_strong_zeros(tree: _expr.Node) -> _expr.Node:
    """The expression with each ``mul0(c, y)`` (or ``mul0(y, c)``) of a number c, finite
    and |c| >= 1, written ``c * y + 0.0`` (``y + 0.0`` for c = 1): the same number in
    every case (c * y is 0 only where y is, and + 0.0 makes that +0 as mul0 does; NaN
    and infinities pass), with no comparison (the seed 1.0 makes many such)."""
    if isinstance(tree, _expr.Call):
        args = tuple(constant_strong_zeros(a) for a in tree.args)
        if tree.name == "mul0":
            for c, y in (args, args[::-1]):
                if not (isinstance(c, _expr.Num) and math.isfinite(c.value)):
                    continue
                if isinstance(y, _expr.Num) and math.isfinite(y.value):
                    return _expr.Num(c.value * y.value if c.value and y.value else 0.0)
                if abs(c.value) < 1:
                    continue
                if c.value == 1 and never_minus_zero(y):
                    return y
                product = y if c.value == 1 else _expr.Bin("*", c, y)
                return _expr.Bin("+", product, _expr.Num(0.0))
        return _expr.Call(tree.name, args)
    if isinstance(tree, _expr.Bin):
        return _expr.Bin(tree.op, constant_strong_zeros(tree.left),
                         constant_strong_zeros(tree.right))
    if isinstance(tree, _expr.Neg):
        return _expr.Neg(constant_strong_zeros(tree.operand))
    return tree


def _plus_zero(node: _expr.Node) -> bool:
    return isinstance(node, _expr.Num) and node.value == 0.0 and \
        math.copysign(1.0, node.value) > 0


def never_minus_zero(tree: _expr.Node) -> bool:
    """Whether the expression is one that cannot be -0.0 (a sum with +0.0)."""
    return isinstance(tree, _expr.Bin) and tree.op == "+" and _plus_zero(tree.right)


def _fixed_sign(node: _expr.Node, fixed: Mapping[str, bool]) -> bool:
    """Whether ``node``, read exactly, is never -0: a sum with +0.0, a number other than
    -0.0, or a variable whose value is such (``fixed``)."""
    if isinstance(node, _expr.Num):
        return not (node.value == 0.0 and math.copysign(1.0, node.value) < 0)
    if isinstance(node, _expr.Var):
        return fixed.get(node.name, False)
    return never_minus_zero(node)


def strip(node: _expr.Node, absorbed: bool, fixed: Mapping[str, bool],
          reads: dict[str, bool]) -> _expr.Node:
    """``node`` without the ``+ 0.0`` its reader cannot see (``absorbed``: the node's zero
    sign does not matter); ``reads[name]`` becomes False where a variable is read
    exactly. ``fixed``: the variables whose values are never -0 when read exactly."""
    if isinstance(node, _expr.Var):
        reads[node.name] = reads.get(node.name, True) and absorbed
        return node
    if isinstance(node, _expr.Neg):
        return _expr.Neg(strip(node.operand, absorbed, fixed, reads))
    if isinstance(node, _expr.Bin):
        left, right, op = node.left, node.right, node.op
        if op == "+" and _plus_zero(right):
            inner = strip(left, True, fixed, reads)
            return inner if absorbed else _expr.Bin("+", inner, right)
        if op in _COMPARISONS:
            sides = (True, True)
        elif op == "/":
            sides = (absorbed, False)
        elif absorbed or op != "+":
            sides = (absorbed, absorbed)
        elif _fixed_sign(left, {}):     # left is never -0: right's sign cannot show
            sides = (False, True)
        elif _fixed_sign(right, {}):
            sides = (True, False)
        elif _fixed_sign(left, fixed) or _fixed_sign(right, fixed):
            # a term is a register that is never -0: one + 0.0 here, the same number,
            # instead of keeping that register's (made once per position it is read at)
            return _expr.Bin("+", _expr.Bin("+", strip(left, True, fixed, reads),
                                            strip(right, True, fixed, reads)),
                             _expr.Num(0.0))
        else:
            sides = (False, False)
        return _expr.Bin(op, strip(left, sides[0], fixed, reads),
                         strip(right, sides[1], fixed, reads))
    if isinstance(node, _expr.Call):
        if node.name == "mul0":
            sides = (True, True)
        elif node.name == "div0":
            sides = (True, False)
        elif node.name == "heaviside":
            sides = (True,)
        elif node.name == "sign":
            sides = (absorbed,)
        elif node.name == "choose":        # choose(c, a, b): c ? a : b
            sides = (True, absorbed, absorbed)
        else:
            sides = (False,) * len(node.args)
        return _expr.Call(node.name, tuple(strip(a, side, fixed, reads)
                                           for side, a in zip(sides, node.args)))
    return node


def map_trees(plan: Any) -> dict[tuple[int, int], _expr.Node]:
    """For each output k of each map instruction the generated code runs (by
    ``(id(instruction), k)``): its expression as the loop computes it, with the recorded
    numbers in place (operands that are numbers, one-element constants such as the seed,
    and values that are numbers) and the strong zeros of numbers written out, less the
    ``+ 0.0`` no reader can see (all of them kept where ``STRIP`` is False)."""
    p = plan.program
    r = plan.r
    in_c = [(kind == "c", ins) for kind, item in plan.schedule
            for ins in (item if kind == "c" else [item])]
    numbers: dict[int, float] = {}     # root -> the number a value (or constant) is
    for slot, value in p.constants.items():
        if value.size == 1 and value.dtype.kind == "f":
            numbers[r(slot)] = float(value.reshape(-1)[0])
    fixed_slots: dict[int, bool] = {}  # root -> never -0 when computed exactly
    trees: dict[tuple[int, int], _expr.Node] = {}
    for c, ins in in_c:
        if not c:
            continue
        if ins.op in _COPIES:
            fixed_slots[r(ins.outs[0])] = all(
                type(i) is int and fixed_slots.get(r(i), False) for i in ins.ins)
        if ins.op != "map":
            continue
        exprs, names, dtypes = ins.params.exprs, ins.params.names, ins.params.dtypes
        mapping: dict[str, _expr.Node] = {}
        for name, i in zip(names, ins.ins):
            number = float(i) if type(i) is float else (
                numbers.get(r(i)) if type(i) is int else None)
            if number is not None and math.isfinite(number):
                mapping[name] = _expr.Num(number)
        for k, (o, expr, dt) in enumerate(zip(ins.outs, exprs, dtypes)):
            tree = constant_strong_zeros(_expr.substitute(expr, mapping))
            trees[(id(ins), k)] = tree
            number = _expr.constant(tree)
            if number is not None and np.dtype(dt).kind == "f" and \
                    float(np.dtype(dt).type(number)) == number:
                numbers[r(o)] = number
            fixed_slots[r(o)] = _fixed_sign(tree, {
                name: fixed_slots.get(r(i), False) for name, i in zip(names, ins.ins)
                if type(i) is int})
    if not STRIP:
        return trees
    # backwards: absorbed[root] stays True while every reader so far absorbs its sign
    absorbed: dict[int, bool] = {r(o): False for o in plan.outputs}
    for c, ins in reversed(in_c):
        slots = [i for i in ins.ins if type(i) is int]
        if not c:
            for i in slots:
                absorbed[r(i)] = False
            continue
        if ins.op == "map":
            exprs, names, dtypes = ins.params.exprs, ins.params.names, ins.params.dtypes
            fixed = {name: fixed_slots.get(r(i), False) for name, i in zip(names, ins.ins)
                     if type(i) is int}
            reads: dict[str, bool] = {}
            for k, (o, dt) in enumerate(zip(ins.outs, dtypes)):
                # an integer or bool result has no zero sign to keep
                root = absorbed.get(r(o), True) or np.dtype(dt).kind != "f"
                trees[(id(ins), k)] = strip(trees[(id(ins), k)], root, fixed, reads)
            for name, i in zip(names, ins.ins):
                if type(i) is int:
                    absorbed[r(i)] = absorbed.get(r(i), True) and reads.get(name, True)
            continue
        if ins.op == "reduce" and ins.params.op == "sum":
            continue                   # the loop's sum starts at +0.0: absorbs
        keep = absorbed.get(r(ins.outs[0]), True) if ins.op in _COPIES else False
        for i in slots:
            absorbed[r(i)] = absorbed.get(r(i), True) and keep
    return trees
