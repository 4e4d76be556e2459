"""The tape rewritten once (``F.compile(optimise=True)``, and the OpenCL replay's program):
constants folded to their recorded values, common subexpressions shared, identities that
hold bit for bit (``x * 1``, ``x / 1``, ``x - 0``, ``x + -0``, ``x ** 1``, ``--x``), dead
entries dropped (guards and what they read kept). The result is an ordinary WengertList,
laid out by the VM's scheduler: its values are the recorded program's bit for bit, its
gradients to rounding (a shared entry sums its adjoints before they are multiplied by its
partials, and another layout adds contributions in another order)."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _core, _rules, _tapeview
from easyad.compiler.tape.opcodes import GUARD_OPS, RULE_OF, RULE_OPCODE, SELECT_OP


def optimise(tape: Any, inputs: tuple[int, ...], outputs: tuple[int, ...]
             ) -> tuple[Any, list[int], list[int]] | None:
    """The tape rewritten (see the module's docstring) as a new WengertList with its
    inputs and outputs, or None where it holds user primitives or tensor nodes. Replaying
    it gives the same values, bit for bit, and the same derivatives to rounding, at every
    point where the original raises nothing (errors and changed branches are the VM's to
    report, on the original tape)."""
    view = _tapeview.TapeView(tape)
    ops = view.ops.tolist()
    if any(_tapeview.KINDS[op] in (_tapeview.CUSTOM, _tapeview.NODE) for op in ops):
        return None
    arg = (view.arg0.tolist(), view.arg1.tolist())
    recorded = view.values.tolist()
    partial = (view.partial0.tolist(), view.partial1.tolist())
    input_set = set(inputs)
    # rep[e]: ("e", new index) or ("c", value)
    rep: list[tuple[str, Any]] = []
    new_ops: list[int] = []
    new_arg: tuple[list[int], list[int]] = ([], [])
    new_values: list[float] = []
    new_partial: tuple[list[float], list[float]] = ([], [])
    seen: dict[tuple[Any, ...], int] = {}
    neg, mul, div, sub, add, pow_ = (RULE_OPCODE[k]
                                     for k in ("neg", "mul", "div", "sub", "add", "pow"))

    def emit(op: int, a: tuple[str, Any], b: tuple[str, Any], value: float,
             p: tuple[float, float]) -> int:
        for k, (kind, x) in enumerate((a, b)):
            new_arg[k].append(x if kind == "e" else -1)
            new_partial[k].append(p[k] if kind == "e" else x)
        new_ops.append(op)
        new_values.append(value)
        return len(new_ops) - 1

    def key(r: tuple[str, Any]) -> tuple[str, Any]:
        return r if r[0] == "e" else ("c", np.float64(r[1]).tobytes())

    none = ("c", 0.0)
    for e, op in enumerate(ops):
        kind = _tapeview.KINDS[op]
        if kind in (_tapeview.VARIABLE, _tapeview.CONSTANT):
            if e in input_set:
                rep.append(("e", emit(op, none, none, recorded[e], (0.0, 0.0))))
            else:
                rep.append(("c", recorded[e]))
            continue
        arity = RULE_OF[op].arity if kind == _tapeview.RULE else 2
        operands = []
        for k in range(2):
            if k >= arity:
                operands.append(none)
            elif arg[k][e] >= 0:
                operands.append(rep[arg[k][e]])
            else:
                operands.append(("c", partial[k][e]))
        a, b = operands
        p = (partial[0][e], partial[1][e])
        if kind != _tapeview.RULE:     # comparisons, guards and selects stay as they are
            if kind == _tapeview.GUARD and a[0] == "c" and b[0] == "c":
                rep.append(("c", recorded[e]))     # of constants: it never changes
                continue
            if kind in (_tapeview.GUARD, _tapeview.COMPARE) and a[0] == "c":
                # a comparison reads an entry first: the constant as a fixed variable
                a = ("e", emit(_rules.OP_VARIABLE, none, none, a[1], (0.0, 0.0)))
            rep.append(("e", emit(op, a, b, recorded[e], p)))
            continue
        if all(r[0] == "c" for r in operands[:arity]):
            rep.append(("c", recorded[e]))      # constant: the value it was recorded with
            continue
        same = _identity(op, a, b, neg, mul, div, sub, add, pow_, new_ops, new_arg)
        if same is not None:
            rep.append(same)
            continue
        k2 = (op, key(a), key(b))
        if k2 in seen:
            rep.append(("e", seen[k2]))
            continue
        seen[k2] = emit(op, a, b, recorded[e], p)
        rep.append(("e", seen[k2]))
    outs = []
    for o in outputs:
        r = rep[o]
        outs.append(r[1] if r[0] == "e" else
                    emit(_rules.OP_VARIABLE, none, none, r[1], (0.0, 0.0)))
    ins = [rep[i][1] for i in inputs]
    keep = live_entries(new_ops, new_arg, outs, ins)
    return rebuild_tape(keep, new_ops, new_arg, new_values, new_partial, ins, outs)


def _identity(op: int, a: tuple[str, Any], b: tuple[str, Any], neg: int, mul: int, div: int,
              sub: int, add: int, pow_: int, ops: list[int],
              args: tuple[list[int], list[int]]) -> tuple[str, Any] | None:
    """The operand an entry equals bit for bit (value and derivative), or None."""
    def const(r: tuple[str, Any], v: float) -> bool:
        return r[0] == "c" and np.float64(r[1]).tobytes() == np.float64(v).tobytes()

    if op == mul:
        if const(b, 1.0) and a[0] == "e":
            return a
        if const(a, 1.0) and b[0] == "e":
            return b
    elif (op == div and const(b, 1.0)) or (op == sub and const(b, 0.0)) \
            or (op == add and const(b, -0.0)) or (op == pow_ and const(b, 1.0)):
        return a if a[0] == "e" else None
    elif op == add and const(a, -0.0):
        return b if b[0] == "e" else None
    elif op == neg and a[0] == "e" and ops[a[1]] == neg and args[0][a[1]] >= 0:
        return ("e", args[0][a[1]])
    return None


def live_entries(ops: list[int], args: tuple[list[int], list[int]], outs: list[int],
          ins: list[int]) -> list[bool]:
    """Entries an output or a guard reads (guards are always checked), and the inputs."""
    live = [False] * len(ops)
    for i in (*outs, *ins):
        live[i] = True
    for i, op in enumerate(ops):
        if op in GUARD_OPS:
            live[i] = True
    for i in range(len(ops) - 1, -1, -1):
        if not live[i]:
            continue
        for k in (0, 1):
            if args[k][i] >= 0:
                live[args[k][i]] = True
        if ops[i] == SELECT_OP:
            live[_tapeview.select_condition(i)] = True
    return live


def rebuild_tape(keep: list[bool], ops: list[int], args: tuple[list[int], list[int]],
             values: list[float], partials: tuple[list[float], list[float]], ins: list[int],
             outs: list[int]) -> tuple[Any, list[int], list[int]]:
    index = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    a0, a1 = (np.asarray(args[k], dtype=np.int64)[kept] for k in (0, 1))
    a0 = np.where(a0 >= 0, index[np.maximum(a0, 0)], -1)
    a1 = np.where(a1 >= 0, index[np.maximum(a1, 0)], -1)
    parts = (np.asarray(values)[kept].astype("<f8").tobytes(),
             np.asarray(partials[0])[kept].astype("<f8").tobytes(),
             np.asarray(partials[1])[kept].astype("<f8").tobytes(),
             a0.astype("<i4").tobytes(), a1.astype("<i4").tobytes(),
             np.asarray(ops, dtype=np.uint8)[kept].tobytes())
    tape = _core._rebuild_wengert_list(len(kept), parts, {}, None, None, None,
                                       source="optimised program")
    return tape, [int(index[i]) for i in ins], [int(index[o]) for o in outs]
