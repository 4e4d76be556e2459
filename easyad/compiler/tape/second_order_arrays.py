"""The Hessian's second-order program built in C (``program``): the same program as
``second_order.second_order_program`` (forward over reverse done once, symbolically, the
rule table's partials and their tangents, equal entries shared, constants folded), written
by one C loop (``_core._second_order_arrays``) over the tape instead of a Python object per
entry, so a Hessian of 10^4 unknowns and 10 colours (a million candidate entries) is
built in a fraction of a second and no size cap is needed.

The rule table's expressions reach C as node arrays (``_trees``): per opcode and operand,
the root of its partial and of that partial's tangent. The C emitter evaluates them as
``_Emitter.expression`` does (the strong zeros of ``mul0``/``tmul``/``div0``, folding of
arithmetic on constants, ``x + 0``, ``x * 1``, ``--x``), so every route keeps the sweeps'
numbers bit for bit; it leaves out only the Python emitter's optional rewrites that save
entries without changing a value."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from easyad import _core, _expr, _rules, _tapeview
from easyad.compiler.tape.opcodes import RULE_OF, RULE_OPCODE
from easyad.compiler.tape.sparse_jacobian import _rebuild

# node kinds, as _engine/second_order.pxi numbers them
_NUM, _VAR, _NEG, _BIN, _MUL0, _DIV0, _RULE, _DECLINE = range(8)
_VARS = {"x": 0, "y": 1, "z": 2, "dx": 3, "dy": 4, "dz": 5}
_BINS = {"+": 0, "-": 1, "*": 2, "/": 3}
_UNSUPPORTED = frozenset({"sign", "heaviside"})   # helpers with no tape op
_N_OPS = len(_rules.OPCODE_NAMES)
_KIND = np.zeros(_N_OPS, dtype=np.uint8)     # 1 variable/constant, 2 guard, 3 rule, 0 refused
for _op, _k in enumerate(_tapeview.KINDS):
    _KIND[_op] = {_tapeview.VARIABLE: 1, _tapeview.CONSTANT: 1, _tapeview.GUARD: 2,
                  _tapeview.RULE: 3}.get(_k, 0)
    if _k == _tapeview.RULE and _rules.OPCODE_NAMES[_op] in ("abs", "maximum", "minimum"):
        _KIND[_op] = 0        # piecewise partials
_CHECKED = np.array([_KIND[op] == 3 and RULE_OF[op].errors != _rules.NO_CHECK
                     for op in range(_N_OPS)])


class _Nodes:
    def __init__(self) -> None:
        self.kind: list[int] = []
        self.arg: list[int] = []
        self.left: list[int] = []
        self.right: list[int] = []
        self.num: list[float] = []

    def add(self, kind: int, arg: int = 0, left: int = -1, right: int = -1,
            num: float = 0.0) -> int:
        for field, v in ((self.kind, kind), (self.arg, arg), (self.left, left),
                         (self.right, right), (self.num, num)):
            field.append(v)
        return len(self.kind) - 1

    def tree(self, node: Any) -> int:
        """The tree as nodes (children first), its root's index."""
        if isinstance(node, _expr.Num):
            return self.add(_NUM, num=float(node.value))
        if isinstance(node, _expr.Var):
            if node.name not in _VARS:
                return self.add(_DECLINE)
            return self.add(_VAR, _VARS[node.name])
        if isinstance(node, _expr.Neg):
            return self.add(_NEG, left=self.tree(node.operand))
        if isinstance(node, _expr.Bin):
            if node.op not in _BINS:
                return self.add(_DECLINE)
            return self.add(_BIN, _BINS[node.op], self.tree(node.left), self.tree(node.right))
        name, args = node.name, node.args
        if name in ("mul0", "tmul", "div0"):
            return self.add(_DIV0 if name == "div0" else _MUL0, 0, self.tree(args[0]),
                            self.tree(args[1]))
        if name in _UNSUPPORTED or name not in _rules.RULES_BY_NAME or len(args) > 2:
            return self.add(_DECLINE)
        refs = [self.tree(a) for a in args]
        return self.add(_RULE, RULE_OPCODE[name], refs[0], refs[1] if len(refs) > 1 else -1)


@functools.lru_cache(maxsize=1)
def _trees() -> tuple[Any, ...]:
    """(arity per opcode, partial roots (ops, 2), tangent roots (ops, 2), node arrays)."""
    nodes = _Nodes()
    decline = nodes.add(_DECLINE)
    partial = np.full((_N_OPS, 2), decline, dtype=np.int32)
    tangent = np.full((_N_OPS, 2), decline, dtype=np.int32)
    arity = np.zeros(_N_OPS, dtype=np.int8)
    for op in range(_N_OPS):
        if _tapeview.KINDS[op] != _tapeview.RULE:
            continue
        rule = RULE_OF[op]
        arity[op] = rule.arity
        for k in range(rule.arity):
            try:
                partial[op, k] = nodes.tree(_expr.parse(rule.partials[k]))
                tangent[op, k] = nodes.tree(_expr.partial_tangent(rule, k))
            except Exception:       # a rule the symbolic tangents cannot differentiate
                partial[op, k] = tangent[op, k] = decline
    return (arity, partial, tangent, np.array(nodes.kind, dtype=np.int32),
            np.array(nodes.arg, dtype=np.int32), np.array(nodes.left, dtype=np.int32),
            np.array(nodes.right, dtype=np.int32), np.array(nodes.num, dtype=np.float64))


def program(tape: Any, inputs: tuple[int, ...], output: int, rows: np.ndarray,
            cols: np.ndarray, colour: np.ndarray, order: Any = None, sources: Any = None
            ) -> tuple[Any, list[int], list[int]] | None:
    """``second_order.second_order_program``'s result (its docstring says what the
    program computes and when it is None), built in C, without a size limit."""
    a = tape._arrays()
    ops = np.ascontiguousarray(a["ops"])
    size = len(ops)
    if not size or output >= size:
        return None
    kind = _KIND[ops]
    if not kind.all():       # selects, comparisons, user primitives, nodes, abs/max/min
        return None
    arg0 = np.ascontiguousarray(a["arg0"], dtype=np.int32)
    arg1 = np.ascontiguousarray(a["arg1"], dtype=np.int32)
    ins = np.asarray(inputs, dtype=np.int64)
    position = np.full(size, -1, dtype=np.int64)
    position[ins] = np.arange(len(ins))
    K = int(colour.max()) + 1 if len(colour) else 1
    # the output's ancestors that are rules, in the sweeps' reverse order (the VM's
    # layout, ``order``; the tape's where it is not given or misses one)
    live = _core._sparse_live(arg0, arg1, np.zeros(size, dtype=np.uint8),
                              np.array([output], dtype=np.int64), size)
    ruled = np.flatnonzero(live.astype(bool) & (kind == 3))
    backward = ruled[::-1]
    if order is not None:
        rank = np.full(size, -1, dtype=np.int64)
        order = np.asarray(order, dtype=np.int64)
        rank[order] = np.arange(len(order))
        if (rank[ruled] >= 0).all():
            backward = ruled[np.argsort(-rank[ruled], kind="stable")]
    arity, p_root, t_root, n_kind, n_arg, n_left, n_right, n_num = _trees()
    made = _core._second_order_arrays(
        ops, kind, arg0, arg1, np.ascontiguousarray(a["partial0"], dtype=np.float64),
        np.ascontiguousarray(a["partial1"], dtype=np.float64),
        np.ascontiguousarray(a["values"], dtype=np.float64), position, output, ins,
        np.ascontiguousarray(colour, dtype=np.int64), K,
        np.ascontiguousarray(backward, dtype=np.int64), arity, p_root, t_root,
        n_kind, n_arg, n_left, n_right, n_num,
        (RULE_OPCODE["add"], RULE_OPCODE["sub"], RULE_OPCODE["mul"], RULE_OPCODE["div"],
         RULE_OPCODE["neg"], RULE_OPCODE["pow"], _rules.OP_VARIABLE))
    if made is None:
        return None
    P_ops, P_a0, P_a1, P_c0, P_c1, P_v, P_ins, r_id, r_c, value_id, live_rule = made
    # where each nonzero is read: (input, colour) (a star colouring's sources), else the
    # row along its column's colour; the program computes the upper triangle
    src_row, src_colour = sources if sources is not None else (rows, colour[cols])
    upper = np.asarray(rows) <= np.asarray(cols)
    if not upper.any():
        return None      # a linear function: the sweeps' zeros (and checks) are cheap
    out_id = r_id[np.asarray(src_colour)[upper], np.asarray(src_row)[upper]]
    out_c = r_c[np.asarray(src_colour)[upper], np.asarray(src_row)[upper]]
    fixed = out_id < 0
    fields = [(P_ops, P_a0, P_a1, P_c0, P_c1, P_v)]
    if fixed.any():         # a constant nonzero: one fixed variable per value
        values, inverse = np.unique(out_c[fixed], return_inverse=True)
        made_ids = np.arange(len(P_ops), len(P_ops) + len(values), dtype=np.int64)
        out_id = out_id.copy()
        out_id[fixed] = made_ids[inverse.reshape(-1)]
        count = len(values)
        fields.append((np.full(count, _rules.OP_VARIABLE, dtype=np.uint8),
                       np.full(count, -1, dtype=np.int64), np.full(count, -1, dtype=np.int64),
                       np.zeros(count), np.zeros(count), values.astype(np.float64)))
    ops_all, a0_all, a1_all, c0_all, c1_all, v_all = (np.concatenate([f[j] for f in fields])
                                                      for j in range(6))
    a0_32, a1_32 = a0_all.astype(np.int32), a1_all.astype(np.int32)
    guards = np.flatnonzero(_KIND[ops_all] == 2)
    select = np.zeros(len(ops_all), dtype=np.uint8)

    def kept(outs: np.ndarray) -> np.ndarray:
        roots = np.concatenate([outs, P_ins, guards]).astype(np.int64)
        return _core._sparse_live(a0_32, a1_32, select, roots, len(ops_all)).astype(bool)

    outs = out_id
    keep = kept(outs)
    # entries with an error policy that f reads and the nonzeros do not: outputs too, so
    # the program fails (and hands the point to the sweeps) wherever f's replay would
    ruled_values = value_id[:len(live_rule)][live_rule.astype(bool)]
    ruled_ops = ops[:len(live_rule)][live_rule.astype(bool)]
    checked = ruled_values[(ruled_values >= 0) & _CHECKED[ruled_ops]]
    checked = checked[~keep[checked]]
    if len(checked):
        outs = np.concatenate([outs, checked])
        keep = kept(outs)
    tape_out, ins_out, outs_out = _rebuild(keep, ops_all, a0_32, a1_32, v_all, c0_all,
                                           c1_all, P_ins, outs)
    return tape_out, ins_out.tolist(), outs_out.tolist()
