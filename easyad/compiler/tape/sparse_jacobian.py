"""A sparse Jacobian's nonzeros as a program of their own (``jacobian_program``): forward
mode over the columns each entry depends on, done once, symbolically, over the tape, and
written as a new tape which the VM replays or the C renderer compiles like any other. A
banded residual's Jacobian is then a straight-line program over its nonzeros, as
CasADi's sparse Jacobian is, instead of one sweep of the whole tape per colour.

Built from arrays, not an object per entry (issue 27: 10^5 unknowns took a minute in
Python): the recorded program is the new one's first part, verbatim; the partials that
are not an operand, the entry itself or a constant (sin's cos(x)...) are emitted per
(opcode, operand, constant operands) group from one template (``_Emitter`` on
placeholders) stamped out with numpy; the tangents, along the sorted column sets of
``_sparsity.dependencies``, by one C loop (``_core._sparse_tangents``) that keeps each
tangent as scale * entry, so the linear parts of a residual fold to constants."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _core, _expr, _rules, _sparsity, _tapeview
from easyad.compiler.tape.opcodes import GUARD_OPS, RULE_OF, RULE_OPCODE
from easyad.compiler.tape.second_order import _Decline, _Emitter, _partial_tree

_VARIABLE = _rules.OP_VARIABLE
_N_OPS = len(_rules.OPCODE_NAMES)
# opcodes the program cannot express: piecewise partials, branches inside arithmetic,
# user primitives and tensor nodes (the caller then runs the sweeps)
_DECLINE = np.array([_tapeview.KINDS[op] in (_tapeview.CUSTOM, _tapeview.NODE,
                                             _tapeview.SELECT, _tapeview.COMPARE)
                     or _rules.OPCODE_NAMES[op] in ("abs", "maximum", "minimum")
                     for op in range(_N_OPS)])
_RULE = np.array([_tapeview.KINDS[op] == _tapeview.RULE for op in range(_N_OPS)])
_CHECKED = np.array([_RULE[op] and RULE_OF[op].errors != _rules.NO_CHECK
                     for op in range(_N_OPS)])
_ARITY = np.array([RULE_OF[op].arity if _RULE[op] else 0 for op in range(_N_OPS)])
_GUARD = np.zeros(_N_OPS, dtype=bool)
_GUARD[list(GUARD_OPS)] = True


class _Parts:
    """The program's entries after its first part, as lists of arrays."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.fields: list[tuple[np.ndarray, ...]] = []

    def add(self, ops: Any, a0: Any, a1: Any, c0: Any, c1: Any, values: Any = 0.0
            ) -> np.ndarray:
        """Entries (broadcast to one length), their ids."""
        ops, a0, a1, c0, c1, values = np.broadcast_arrays(ops, a0, a1, c0, c1, values)
        ids = np.arange(self.base, self.base + len(ops), dtype=np.int64)
        self.base += len(ops)
        self.fields.append((ops.astype(np.uint8), a0.astype(np.int32), a1.astype(np.int32),
                            c0.astype(float), c1.astype(float), values.astype(float)))
        return ids


def _partials(parts: _Parts, entries: np.ndarray, ops: np.ndarray, k: int,
              arg: tuple[np.ndarray, np.ndarray], const: tuple[np.ndarray, np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray] | None:
    """Partial k of each entry (all of one opcode) as (entry id or -1, constant): an
    operand, the entry, a constant, or entries stamped from the rule's expression (one
    template per distinct set of constant operands). None: an expression with no entry
    (sign, heaviside)."""
    op = int(ops[entries[0]])
    tree = _partial_tree(op, k)
    arity = RULE_OF[op].arity
    pid = np.full(len(entries), -1, dtype=np.int64)
    pc = np.zeros(len(entries))
    a = [arg[j][entries] for j in (0, 1)]
    c = [const[j][entries] for j in (0, 1)]
    if isinstance(tree, _expr.Num):
        pc[:] = tree.value
        return pid, pc
    if isinstance(tree, _expr.Var):
        if tree.name == "z":
            return entries.astype(np.int64), pc
        j = "xy".index(tree.name)
        return np.where(a[j] >= 0, a[j], -1), np.where(a[j] >= 0, 0.0, c[j])
    # one group per pattern of constant operands (and their values: a template folds them)
    keys = np.stack([a[j] < 0 if j < arity else np.ones(len(entries), bool)
                     for j in (0, 1)] + [np.where(a[j] < 0, c[j], 0.0) for j in (0, 1)],
                    axis=1)
    if np.all(keys == keys[0]):       # the common case: one group, no sort
        groups, which = keys[:1], np.zeros(len(keys), dtype=np.intp)
    else:
        groups, which = np.unique(keys, axis=0, return_inverse=True)
    for g, key in enumerate(groups):
        rows = np.flatnonzero(which.reshape(-1) == g)
        E = _Emitter()
        refs, placeholder = {}, {}
        for j, name in enumerate("xy"):
            if j >= arity:
                refs[name] = ("c", 0.0)
            elif key[j]:
                refs[name] = ("c", float(key[2 + j]))
            else:
                refs[name] = ("e", E.raw(_VARIABLE, ("c", 0.0), ("c", 0.0)))
                placeholder[refs[name][1]] = a[j][rows]
        refs["z"] = ("e", E.raw(_VARIABLE, ("c", 0.0), ("c", 0.0)))
        placeholder[refs["z"][1]] = entries[rows]
        try:
            ref = E.expression(tree, refs)
        except _Decline:
            return None
        if ref[0] == "c":
            pc[rows] = ref[1]
            continue
        if ref[1] in placeholder:
            pid[rows] = placeholder[ref[1]]
            continue
        stamped: dict[int, np.ndarray] = dict(placeholder)
        for t in range(len(placeholder), len(E.ops)):
            operands = [stamped[E.args[j][t]] if E.args[j][t] >= 0 else -1 for j in (0, 1)]
            stamped[t] = parts.add(E.ops[t], operands[0], operands[1], E.partials[0][t],
                                   E.partials[1][t], E.values[t] + np.zeros(len(rows)))
        pid[rows] = stamped[ref[1]]
    return pid, pc


def jacobian_program(tape: Any, inputs: tuple[int, ...], outputs: tuple[int, ...],
                     rows: np.ndarray, cols: np.ndarray, colour: Any = None,
                     found: Any = None) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """A WengertList whose outputs are J[rows[t], cols[t]] in the pattern's order, then
    the values of the entries with an error policy (log, pow...) that f reads and the
    nonzeros do not (so the program fails wherever f's replay would). The tangent of
    every entry along each column it depends on, as a forward sweep along that column's
    seed would compute it (a colour's sweep computes the same numbers: no entry that
    feeds an output depends on two columns of one colour): the partials are the rule
    table's expressions (``_expr``) over the recorded program's values, products with a
    zero tangent dropped, constant factors folded (so results equal the sweeps' to
    rounding; a 0 * inf that the sweeps' strong zero makes 0 shows as NaN, and the
    caller then runs the sweeps). Guards are kept, so a changed branch is flagged. None
    where the tape holds selects, comparisons, user primitives, tensor nodes or
    abs/maximum/minimum. ``colour`` is not needed (kept for callers); ``found``:
    ``_sparsity.dependencies`` of this tape, where the caller has them."""
    if not outputs:
        return None
    a = tape._arrays()
    size = max(outputs) + 1
    ops = a["ops"][:size]
    if _DECLINE[ops].any():
        return None
    if found is None:     # (the pattern's, where the caller has them)
        found = _sparsity.dependencies(a, inputs, outputs)
    if found is None:
        return None
    read, start, length, pool = found
    arg = (a["arg0"][:size].astype(np.int64), a["arg1"][:size].astype(np.int64))
    const = (a["partial0"][:size], a["partial1"][:size])
    parts = _Parts(size)
    ins = [int(e) if e < size else -1 for e in inputs]
    missing = [j for j, e in enumerate(ins) if e < 0]
    if missing:       # inputs f does not read, after the recorded part
        made = parts.add(_VARIABLE, -1, -1, 0.0, 0.0, a["values"][[inputs[j] for j in missing]])
        for j, e in zip(missing, made.tolist()):
            ins[j] = e
    # which entries carry tangents: inputs (1) and rules that depend on one (2)
    kind = np.where(_RULE[ops] & (length > 0) & (read > 0), 2, 0).astype(np.uint8)
    is_input = np.zeros(size, dtype=bool)
    is_input[[e for e in inputs if e < size]] = True
    kind[is_input & (length > 0)] = 1
    pid = [np.full(size, -1, dtype=np.int64) for _ in (0, 1)]
    pc = [np.zeros(size) for _ in (0, 1)]
    ruled = np.flatnonzero(kind == 2)
    for k in (0, 1):
        operand = arg[k][ruled]
        need = ruled[(k < _ARITY[ops[ruled]]) & (operand >= 0)
                     & (length[np.maximum(operand, 0)] > 0)]
        if not len(need):
            continue
        their = ops[need]
        for op in np.flatnonzero(np.bincount(their, minlength=_N_OPS)):
            group = need[their == op]
            got = _partials(parts, group, ops, k, arg, const)
            if got is None:
                return None
            pid[k][group], pc[k][group] = got
    pairs = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(np.where(kind > 0, length, 0), out=pairs[1:])
    tid, ts, t_ops, t_a0, t_a1, t_c0, t_c1 = _core._sparse_tangents(
        kind, np.ascontiguousarray(arg[0], dtype=np.int32),
        np.ascontiguousarray(arg[1], dtype=np.int32), start, length, pool, pairs,
        pid[0], pid[1], pc[0], pc[1], parts.base, RULE_OPCODE["mul"], RULE_OPCODE["add"],
        RULE_OPCODE["sub"])
    parts.add(t_ops, t_a0, t_a1, t_c0, t_c1)
    # each nonzero's tangent: pair pairs[o] + the place of its column in o's sorted set
    outs_at = np.asarray(outputs, dtype=np.int64)
    n = len(inputs)
    o_rows, o_cols = _sparsity.runs(start[outs_at], length[outs_at], pool)
    keys, wanted = o_rows * n + o_cols, np.asarray(rows) * n + np.asarray(cols)
    place = np.minimum(np.searchsorted(keys, wanted), max(len(keys) - 1, 0))
    ref = np.full(len(wanted), -1, dtype=np.int64)
    scale = np.zeros(len(wanted))
    if len(keys):
        hit = keys[place] == wanted
        first = np.cumsum(length[outs_at]) - length[outs_at]
        pair = (pairs[outs_at[rows]] + place - first[rows])[hit]
        ref[hit], scale[hit] = tid[pair], ts[pair]
    out = ref.copy()
    scaled = (ref >= 0) & (scale != 1.0)
    if scaled.any():
        out[scaled] = parts.add(RULE_OPCODE["mul"], ref[scaled], -1, 0.0, scale[scaled])
    fixed = ref < 0
    if fixed.any():       # a constant nonzero (a linear term): one fixed variable per value
        values, inverse = np.unique(scale[fixed], return_inverse=True)
        out[fixed] = parts.add(_VARIABLE, -1, -1, 0.0, 0.0, values)[inverse.reshape(-1)]
    # the whole program
    fields = [(ops, a["arg0"][:size], a["arg1"][:size], a["partial0"][:size],
               a["partial1"][:size], a["values"][:size]), *parts.fields]
    P_ops, P_a0, P_a1, P_c0, P_c1, P_v = (np.concatenate([f[j] for f in fields])
                                          for j in range(6))
    P_a0 = P_a0.astype(np.int32)
    P_a1 = P_a1.astype(np.int32)
    select = np.zeros(len(P_ops), dtype=np.uint8)
    fixed_roots = np.concatenate([np.asarray(ins, dtype=np.int64),
                                  np.flatnonzero(_GUARD[P_ops])])

    def live(roots: np.ndarray) -> np.ndarray:
        return _core._sparse_live(P_a0, P_a1, select, np.concatenate([roots, fixed_roots]),
                                  len(P_ops))

    outs = out.astype(np.int64)
    keep = live(outs)
    # the entries f reads whose error policy the nonzeros would not check
    never_fails = (ops == RULE_OPCODE["div"]) & (a["arg1"][:size] < 0) \
        & (a["partial1"][:size] != 0.0)
    checked = np.flatnonzero((read > 0) & _CHECKED[ops] & (keep[:size] == 0) & ~never_fails)
    if len(checked):
        outs = np.concatenate([outs, checked])
        keep = live(outs)
    return _rebuild(keep.astype(bool), P_ops, P_a0, P_a1, P_v, P_c0, P_c1,
                    np.asarray(ins, dtype=np.int64), outs)


def _rebuild(keep: np.ndarray, ops: np.ndarray, a0: np.ndarray, a1: np.ndarray,
             values: np.ndarray, c0: np.ndarray, c1: np.ndarray, ins: np.ndarray,
             outs: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
    """The kept entries as a WengertList, renumbered; inputs and outputs as index arrays
    (``rebuild_tape``'s work without a Python int per entry)."""
    index = np.cumsum(keep) - 1
    kept = np.flatnonzero(keep)
    a0, a1 = (np.where(a[kept] >= 0, index[np.maximum(a[kept], 0)], -1) for a in (a0, a1))
    parts = (values[kept].astype("<f8").tobytes(), c0[kept].astype("<f8").tobytes(),
             c1[kept].astype("<f8").tobytes(), a0.astype("<i4").tobytes(),
             a1.astype("<i4").tobytes(), ops[kept].astype(np.uint8).tobytes())
    tape = _core._rebuild_wengert_list(len(kept), parts, {}, None, None, None,
                                       source="sparse Jacobian program")
    return tape, index[ins], index[outs]
