"""A sparse Jacobian's nonzeros as a program of their own (``jacobian_program``): forward
mode over the colours of the columns done once, symbolically, over the tape, written as
a new tape by the second-order builder's ``_Emitter`` (equal entries shared, constants
folded, every rewrite exact), which the VM replays or the C renderer compiles like any
other. A banded residual's Jacobian is then a straight-line program over its nonzeros,
as CasADi's sparse Jacobian is, instead of one sweep of the whole tape per colour."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _rules, _tapeview
from easyad.compiler.tape.opcodes import RULE_OF, RULE_OPCODE
from easyad.compiler.tape.optimiser import live_entries, rebuild_tape
from easyad.compiler.tape.second_order import (_Decline, _Emitter, _partial_tree,
                                                emit_values)

Ref = tuple[str, Any]


class _JacobianEmitter(_Emitter):
    """The second-order builder's emitter, with one more exact rewrite that forward
    tangents through subtractions meet at every step: -(u * c) = u * (-c), bit for bit
    (negation is exact and rounding symmetric), one entry instead of two."""

    def neg(self, a: Ref) -> Ref:
        if a[0] == "e" and self.ops[a[1]] == RULE_OPCODE["mul"] and self.args[1][a[1]] < 0:
            return self.rule("mul", ("e", self.args[0][a[1]]),
                             ("c", -self.partials[1][a[1]]))
        return super().neg(a)


def jacobian_program(tape: Any, inputs: tuple[int, ...], outputs: tuple[int, ...],
                     rows: np.ndarray, cols: np.ndarray, colour: np.ndarray
                     ) -> tuple[Any, list[int], list[int]] | None:
    """A WengertList whose outputs are J[rows[t], cols[t]] in the pattern's order, then
    the values of the entries with an error policy (log, pow...) that f reads and the
    nonzeros do not (so the program fails wherever f's replay would). Per colour k of
    the columns (no row has two columns of one colour) the tangent of every entry along
    the colour's seed, as a forward sweep would compute it: the partials are the rule
    table's expressions (``_expr``) over the recorded program's values, products with a
    zero tangent dropped. Every live entry depends on at most one column per colour (it
    feeds an output), so the tangent of an output along colour k is J[r, c] of its one
    column c in k. Results equal the reverse sweeps' to rounding (forward mode sums the
    paths in another order); a 0 * inf that the sweeps' strong zero makes 0 shows as NaN
    (the caller then runs the sweeps). Guards are kept, so a changed branch is flagged.
    None where the tape holds selects, comparisons feeding arithmetic, user primitives,
    tensor nodes or abs/maximum/minimum."""
    view = _tapeview.TapeView(tape)
    last = max(outputs) if outputs else -1
    ops = view.ops[:last + 1].tolist()
    kinds = [_tapeview.KINDS[op] for op in ops]
    if any(k in (_tapeview.CUSTOM, _tapeview.NODE, _tapeview.SELECT, _tapeview.COMPARE)
           for k in kinds):
        return None
    arg = (view.arg0[:last + 1].tolist(), view.arg1[:last + 1].tolist())
    recorded = view.values[:last + 1].tolist()
    partial = (view.partial0[:last + 1].tolist(), view.partial1[:last + 1].tolist())
    position = {e: j for j, e in enumerate(inputs)}
    colours = colour.tolist()
    E = _JacobianEmitter()
    tangent: list[dict[int, Ref]] = []
    ins = [0] * len(inputs)
    none: dict[int, Ref] = {}

    def tangents(e: int, rule: Any, refs: Any, z: Ref) -> None:
        # forward mode over the colours, entry by entry as the values are emitted (a
        # constant's tangent is none, so a rule of constants gets none below)
        if rule is None:
            tangent.append({colours[position[e]]: ("c", 1.0)} if e in position else none)
            return
        d = [tangent[arg[k][e]] if arg[k][e] >= 0 and k < rule.arity else none
             for k in (0, 1)]
        if not d[0] and not d[1]:
            tangent.append(none)
            return
        env = {"x": refs[0], "y": refs[1] if rule.arity > 1 else ("c", 0.0),
               "z": z}
        parts = [E.expression(_partial_tree(ops[e], k), env) if d[k] else None
                 for k in (0, 1)]
        mine: dict[int, Ref] = {}
        for k in (d[0].keys() | d[1].keys()):
            mine[k] = E.add(E.mul0(parts[0], d[0].get(k)) if parts[0] else None,
                            E.mul0(parts[1], d[1].get(k)) if parts[1] else None)
        tangent.append(mine)

    try:
        value = emit_values(E, ops, kinds, arg, recorded, partial, position, ins,
                            visit=tangents)
    except _Decline:
        return None
    outs: list[int] = []
    for r, c in zip(rows.tolist(), cols.tolist()):
        ref = tangent[outputs[r]].get(colours[c], ("c", 0.0))
        # a constant nonzero (a linear term): one fixed variable per value, shared
        outs.append(E.entry(ref)[1])
    n_nonzeros = len(outs)
    keep = live_entries(E.ops, E.args, outs, ins)
    read = bytearray(last + 1)        # the outputs' ancestors: what f's replay checks
    for o in outputs:
        read[o] = 1
    for e in range(last, -1, -1):
        if read[e]:
            for k in (0, 1):
                if arg[k][e] >= 0:
                    read[arg[k][e]] = 1
    for e in range(last + 1):
        if read[e] and kinds[e] == _tapeview.RULE and value[e][0] == "e" \
                and RULE_OF[ops[e]].errors != _rules.NO_CHECK and not keep[value[e][1]] \
                and not _never_fails(ops[e], arg[1][e], partial[1][e]):
            outs.append(value[e][1])
    if len(outs) > n_nonzeros:
        keep = live_entries(E.ops, E.args, outs, ins)
    return rebuild_tape(keep, E.ops, E.args, E.values, E.partials, ins, outs)



def _never_fails(op: int, arg1: int, constant1: float) -> bool:
    """A division by a non-zero constant (a grid's 1/h**2) raises nothing, ever: no need
    to compute its value to check it."""
    return RULE_OF[op].name == "div" and arg1 < 0 and constant1 != 0.0
