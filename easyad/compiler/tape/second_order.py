"""The Hessian's nonzeros as a program of their own (``second_order_program``): forward over
reverse done once, symbolically, over the tape, and written as a new tape by ``_Emitter``
(equal entries shared, constants folded, every rewrite exact), which the VM replays or the
C renderer compiles like any other."""
from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from easyad import _expr, _rules, _tapeview
from easyad.compiler.tape.opcodes import RULE_OF, RULE_OPCODE
from easyad.compiler.tape.optimiser import live_entries, rebuild_tape

_SECOND_LIMIT = 60_000     # colours x entries above which no second-order program is built
_UNSUPPORTED = frozenset({"sign", "heaviside"})   # helpers with no tape op (abs, max, min)


@functools.lru_cache(maxsize=None)
def _partial_tree(op: int, k: int) -> Any:
    return _expr.parse(RULE_OF[op].partials[k])


@functools.lru_cache(maxsize=None)
def _tangent_tree(op: int, k: int) -> Any:
    return _expr.partial_tangent(RULE_OF[op], k)


class _Emitter:
    """A tape written entry by entry, operands as refs: ("e", index) or ("c", value).
    Equal entries are shared (common subexpressions), constants folded, and the products
    of derivative code (``mul0``) keep the strong zero: a factor 0 gives 0 whatever the
    other is. Values of the emitted entries are not known (0.0), except for guards."""

    def __init__(self) -> None:
        self.ops: list[int] = []
        self.args: tuple[list[int], list[int]] = ([], [])
        self.values: list[float] = []
        self.partials: tuple[list[float], list[float]] = ([], [])
        self.seen: dict[tuple[Any, ...], tuple[str, Any]] = {}

    def raw(self, op: int, a: tuple[str, Any], b: tuple[str, Any], value: float = 0.0) -> int:
        for k, (kind, x) in enumerate((a, b)):
            self.args[k].append(x if kind == "e" else -1)
            self.partials[k].append(0.0 if kind == "e" else x)
        self.ops.append(op)
        self.values.append(value)
        return len(self.ops) - 1

    @staticmethod
    def key(r: tuple[str, Any]) -> tuple[str, Any]:
        return r if r[0] == "e" else ("c", np.float64(r[1]).tobytes())

    def entry(self, r: tuple[str, Any]) -> tuple[str, Any]:
        """r as an entry: a constant becomes a fixed variable (not an input) holding it,
        for the places a tape needs an entry (a unary rule's or a comparison's first
        operand, a rule that has one operand at least)."""
        if r[0] == "e":
            return r
        k = (_rules.OP_VARIABLE, self.key(r))
        if k not in self.seen:
            self.seen[k] = ("e", self.raw(_rules.OP_VARIABLE, ("c", 0.0), ("c", 0.0), r[1]))
        return self.seen[k]

    def rule(self, name: str, a: tuple[str, Any], b: tuple[str, Any] = ("c", 0.0), *,
             exact: bool = False) -> tuple[str, Any]:
        """The rule ``name`` of a (and b): folded on constants, shared when seen before.
        Every rewrite keeps the value bit for bit (so the program rounds and overflows
        where the sweeps do); ``exact``: the sign of a zero too (values, which a later
        atan2 or 1/x may read; derivative code drops ``+ 0``)."""
        rule = _rules.RULES_BY_NAME[name]
        if rule.arity == 1:
            b = ("c", 0.0)
        if a[0] == "c" and b[0] == "c":
            folded = _fold(name, a[1], b[1])
            if folded is not None:
                return ("c", folded)
            a = self.entry(a)         # computed at run time, by the VM's function
        if not exact:
            if name in ("add", "sub") and b[0] == "c" and b[1] == 0.0:
                return a            # u + 0 = u - 0 = u (but for the sign of a zero)
            if name == "add" and a[0] == "c" and a[1] == 0.0:
                return b
            if name == "sub" and a[0] == "c" and a[1] == 0.0 and b[0] == "e":
                return self.neg(b)
        if name == "pow" and b[0] == "c" and a[0] == "e":
            if b[1] == 1.0:     # the table's pow: x for the exponent 1, 1 for 0, exactly
                return a
            if b[1] == 0.0:
                return ("c", 1.0)
        if name in ("add", "mul") and b[0] == "e" and (a[0] == "c" or b[1] < a[1]):
            a, b = b, a     # commutative: one order, so equal sums are shared
        if name == "mul" and a[0] == "e" and b[0] == "c":
            if b[1] == 1.0:
                return a
            if b[1] == -1.0:
                return self.neg(a)
            inner = self._negated(a)
            if inner is not None:              # (-u) * c = u * (-c), exactly
                return self.rule("mul", inner, ("c", -b[1]), exact=exact)
            inner_constant = self.partials[1][a[1]]
            if self.ops[a[1]] == RULE_OPCODE["mul"] and self.args[1][a[1]] < 0 \
                    and _rescales_exactly(inner_constant, b[1]):
                # (u * c1) * c2 = u * (c1 * c2), here bit for bit (Rosenbrock's 100 * 2u)
                return self.rule("mul", ("e", self.args[0][a[1]]),
                                 ("c", inner_constant * b[1]), exact=exact)
        if name == "add" and a[0] == "e" and b[0] == "e":
            for u, w in ((a, b), (b, a)):
                inner = self._negated(w)
                if inner is not None:          # u + (-w) = u - w, exactly
                    return self.rule("sub", u, inner, exact=exact)
        if name == "sub" and b[0] == "e":
            inner = self._negated(b)
            if inner is not None:              # u - (-w) = u + w, exactly
                return self.rule("add", a, inner, exact=exact)
        op = RULE_OPCODE[name]
        k = (op, self.key(a), self.key(b))
        if k not in self.seen:
            self.seen[k] = ("e", self.raw(op, a, b))
        return self.seen[k]

    def _negated(self, r: tuple[str, Any]) -> tuple[str, Any] | None:
        """u where r is the entry -u, else None."""
        if r[0] == "e" and self.ops[r[1]] == RULE_OPCODE["neg"] and self.args[0][r[1]] >= 0:
            return ("e", self.args[0][r[1]])
        return None

    @staticmethod
    def zero(r: tuple[str, Any] | None) -> bool:
        return r is None or (r[0] == "c" and r[1] == 0.0)

    def add(self, a: tuple[str, Any] | None, b: tuple[str, Any] | None) -> tuple[str, Any]:
        if self.zero(a):
            return ("c", 0.0) if b is None else b
        if self.zero(b):
            return a  # type: ignore[return-value]
        return self.rule("add", a, b)   # type: ignore[arg-type]

    def mul0(self, a: tuple[str, Any] | None, b: tuple[str, Any] | None) -> tuple[str, Any]:
        """A product of derivative code: the strong zero (0 * inf = 0) folded here; at run
        time a plain product (0 * inf = NaN there, which the caller treats as a point to
        hand to the sweeps)."""
        if self.zero(a) or self.zero(b):
            return ("c", 0.0)
        assert a is not None and b is not None
        for one, other in ((a, b), (b, a)):
            if one[0] == "c" and one[1] == 1.0:
                return other
            if one[0] == "c" and one[1] == -1.0:
                return self.neg(other)
        return self.rule("mul", a, b)

    def neg(self, a: tuple[str, Any]) -> tuple[str, Any]:
        if a[0] == "c":
            return ("c", -a[1])
        if self.ops[a[1]] == RULE_OPCODE["neg"] and self.args[0][a[1]] >= 0:
            return ("e", self.args[0][a[1]])
        return self.rule("neg", a)

    def expression(self, node: Any, env: dict[str, tuple[str, Any] | None]) -> tuple[str, Any]:
        """An expression tree of the rule table (``_expr``) over refs: the table's
        helpers as entries (``mul0``, ``tmul`` with their zeros, ``div0`` as a quotient);
        raises _Decline on a helper that has no entry (sign, heaviside)."""
        if isinstance(node, _expr.Num):
            return ("c", float(node.value))
        if isinstance(node, _expr.Var):
            r = env[node.name]
            return ("c", 0.0) if r is None else r
        if isinstance(node, _expr.Neg):
            return self.neg(self.expression(node.operand, env))
        if isinstance(node, _expr.Bin):
            a = self.expression(node.left, env)
            b = self.expression(node.right, env)
            if node.op == "+":
                if a[0] == "c" and b[0] == "c":
                    return ("c", a[1] + b[1])
                return self.rule("add", a, b)
            if node.op == "-":
                if a[0] == "c" and b[0] == "c":
                    return ("c", a[1] - b[1])
                return self.rule("sub", a, b)
            if node.op == "*":
                if a[0] == "c" and b[0] == "c":
                    return ("c", a[1] * b[1])
                return self.rule("mul", a, b)
            if node.op == "/":
                return self.rule("div", a, b)
            raise _Decline(node.op)
        name, args = node.name, node.args
        if name in ("mul0", "tmul"):
            t = self.expression(args[0], env)
            if self.zero(t):        # lazy, as the C macro: the factor is not computed
                return ("c", 0.0)
            return self.mul0(t, self.expression(args[1], env))
        if name == "div0":
            a = self.expression(args[0], env)
            if self.zero(a):
                return ("c", 0.0)
            return self.rule("div", a, self.expression(args[1], env))
        if name in _UNSUPPORTED or name not in _rules.RULES_BY_NAME:
            raise _Decline(name)
        refs = [self.expression(arg, env) for arg in args]
        return self.rule(name, *refs)


def _fold(name: str, x: float, y: float) -> float | None:
    """A rule on constants, as the VM computes it (None: left to the VM, which also flags
    an error there)."""
    import operator

    arithmetic = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                  "div": operator.truediv,
                  "neg": lambda a, _: -a}
    function = arithmetic.get(name) or getattr(math, name, None)   # the C library's
    if function is None or name == "pow":
        return None
    arity = 2 if name in arithmetic else _rules.RULES_BY_NAME[name].arity
    try:
        return float(function(x) if arity == 1 else function(x, y))
    except (ArithmeticError, ValueError):
        # outside the domain, or overflow: Python raises where C returns NaN or an
        # infinity, which is what the derivative code (never checked) computes there
        numpy_function = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                          "div": np.divide, "neg": np.negative}.get(name) \
            or getattr(np, name, None)
        if numpy_function is None:
            return None
        with np.errstate(all="ignore"):
            result = float(numpy_function(x) if _rules.RULES_BY_NAME[name].arity == 1
                           else numpy_function(x, y))
        return None if math.isfinite(result) else result


def _rescales_exactly(c1: float, c2: float) -> bool:
    """Whether (u * c1) * c2 is u * (c1 * c2) bit for bit at every u: c1 a power of two
    of magnitude 1 at least (u * c1 exact, or an overflow that u * (c1 * c2) has too)
    and |c2| >= 1 (so no overflow of u * c1 that the other form escapes). Otherwise the
    two round, and overflow, at other points, and the program would not be the sweeps'."""
    mantissa, _ = math.frexp(c1)
    return abs(mantissa) == 0.5 and abs(c1) >= 1.0 and abs(c2) >= 1.0 \
        and math.isfinite(c1 * c2)


class _Decline(Exception):
    """The program holds something the second-order program does not express."""


def emit_values(E: _Emitter, ops: list[int], kinds: list[int], arg: tuple[list[int], ...],
                recorded: list[float], partial: tuple[list[float], ...],
                position: dict[int, int], ins: list[int]) -> list[tuple[str, Any]]:
    """The recorded program's values as E's references (``("e", entry)`` or a constant
    ``("c", v)``), the guards kept wherever recorded; fills ``ins`` with the inputs'
    entries. Raises _Decline for abs/maximum/minimum (piecewise partials)."""
    value: list[tuple[str, Any]] = []
    for e, op in enumerate(ops):
        kind = kinds[e]
        rule, refs = None, None
        if kind in (_tapeview.VARIABLE, _tapeview.CONSTANT):
            if e in position:
                value.append(("e", E.raw(op, ("c", 0.0), ("c", 0.0), recorded[e])))
                ins[position[e]] = value[-1][1]
            else:
                value.append(("c", recorded[e]))
        else:
            refs = [value[arg[k][e]] if arg[k][e] >= 0 else ("c", partial[k][e])
                    for k in (0, 1)]
            if kind == _tapeview.GUARD:
                if refs[0][0] == "e" or refs[1][0] == "e":    # else it never changes
                    E.raw(op, E.entry(refs[0]), refs[1], recorded[e])
                value.append(("c", recorded[e]))     # a guard's value feeds nothing
            else:
                rule = RULE_OF[op]
                if rule.name in ("abs", "maximum", "minimum"):
                    raise _Decline(rule.name)
                value.append(("c", recorded[e]) if all(r[0] == "c" for r in refs[:rule.arity])
                             else E.rule(rule.name, refs[0], refs[1], exact=True))
    return value


def second_order_program(tape: Any, inputs: tuple[int, ...], output: int,
                         rows: np.ndarray, cols: np.ndarray, colour: np.ndarray,
                         order: Any = None, sources: Any = None
                         ) -> tuple[Any, list[int], list[int]] | None:
    """The Hessian's nonzeros as a program of their own, built once: a WengertList whose outputs
    are H[rows[t], cols[t]] for each t with rows[t] <= cols[t] (the upper triangle in the
    pattern's order: the Hessian is symmetric), then the values of the entries with an error
    policy (log, pow...) that f reads but the nonzeros do not. It is forward-over-reverse
    done symbolically, over the tape: the adjoints of the reverse sweep and, per colour k
    (``colour``: a partition of the columns, where no row has two columns of one colour, or
    a star colouring with ``sources``), the tangents of values, partials and adjoints along
    the colour's seed (the sum of its unit vectors); entries are shared when equal,
    constants folded (the adjoints of sums are 1 and vanish from the program), products with
    a zero tangent dropped, and only what the nonzeros read kept. The partials and their
    tangents are the rule table's expressions (``_expr``), as the sweeps compute them, and
    every rewrite keeps values bit for bit; ``order`` (the tape's entries in the VM's layout
    order, ``_Replayer._layout()["original"]``) makes the adjoints and their tangents summed
    in the sweeps' order. So, replayed by the VM (values only) or compiled, it gives the
    sweeps' numbers for H[r, c], r <= c (the sweeps mirror that triangle too) wherever its
    outputs are finite, but for the sign of a zero (at run time its products are plain ones:
    a 0 * inf the sweeps' strong zero makes 0 shows as NaN here, and the caller then runs
    the sweeps). Guards are kept, so a changed branch is flagged. None where the Hessian has
    no nonzero, or the tape holds selects, comparisons feeding arithmetic, user primitives,
    tensor nodes, abs/maximum/minimum (whose partials are piecewise helpers), or is too
    large (``_SECOND_LIMIT``)."""
    view = _tapeview.TapeView(tape)
    ops = view.ops.tolist()
    K = int(colour.max()) + 1 if len(colour) else 1
    if (output + 1) * K > _SECOND_LIMIT:
        return None
    kinds = [_tapeview.KINDS[op] for op in ops]
    if any(k in (_tapeview.CUSTOM, _tapeview.NODE, _tapeview.SELECT, _tapeview.COMPARE)
           for k in kinds):
        return None
    arg = (view.arg0.tolist(), view.arg1.tolist())
    recorded = view.values.tolist()
    partial = (view.partial0.tolist(), view.partial1.tolist())
    E = _Emitter()
    position = {e: j for j, e in enumerate(inputs)}
    ins = [0] * len(inputs)
    try:
        value = emit_values(E, ops, kinds, arg, recorded, partial, position, ins)
        # partials of the output's ancestors, and the adjoints
        live = [False] * (output + 1)
        live[output] = True
        for e in range(output, -1, -1):
            if live[e] and kinds[e] == _tapeview.RULE:
                for k in (0, 1):
                    if arg[k][e] >= 0:
                        live[arg[k][e]] = True
        parts: dict[int, list[tuple[str, Any] | None]] = {}
        env_of: dict[int, dict[str, tuple[str, Any] | None]] = {}
        for e in range(output + 1):
            if not (live[e] and kinds[e] == _tapeview.RULE):
                continue
            rule = RULE_OF[ops[e]]
            env = {"x": value[arg[0][e]] if arg[0][e] >= 0 else ("c", partial[0][e]),
                   "y": (value[arg[1][e]] if arg[1][e] >= 0 else ("c", partial[1][e]))
                   if rule.arity > 1 else ("c", 0.0),
                   "z": value[e]}
            env_of[e] = env
            parts[e] = [E.expression(_partial_tree(ops[e], k), env)
                        if k < rule.arity and arg[k][e] >= 0 else None for k in (0, 1)]
        # the sweeps' order: reverse layout position (the tape's where no layout is given)
        rank = {} if order is None else {int(e): p for p, e in enumerate(order)}
        backward = sorted(parts, key=rank.__getitem__, reverse=True) \
            if all(e in rank for e in parts) else sorted(parts, reverse=True)
        adjoint: list[tuple[str, Any] | None] = [None] * (output + 1)
        adjoint[output] = ("c", 1.0)
        for e in backward:
            g = adjoint[e]
            if E.zero(g):
                continue
            for k in (0, 1):
                if parts[e][k] is not None:
                    a = arg[k][e]
                    adjoint[a] = E.add(adjoint[a], E.mul0(parts[e][k], g))
        # per colour: tangents forward, then the adjoints' tangents
        n = len(inputs)
        result: list[list[tuple[str, Any]]] = []
        for c in range(K):
            tangent: list[tuple[str, Any] | None] = [None] * (output + 1)
            for j, e in enumerate(inputs):
                if e <= output and colour[j] == c:
                    tangent[e] = ("c", 1.0)
            dparts: dict[int, list[tuple[str, Any] | None]] = {}
            for e in range(output + 1):
                if e not in parts:
                    continue
                d = [tangent[arg[k][e]] if arg[k][e] >= 0 else None for k in (0, 1)]
                if E.zero(d[0]) and E.zero(d[1]):
                    continue
                dz = E.add(E.mul0(parts[e][0], d[0]), E.mul0(parts[e][1], d[1]))
                tangent[e] = dz
                env = dict(env_of[e], dx=d[0], dy=d[1], dz=dz)
                dparts[e] = [E.expression(_tangent_tree(ops[e], k), env)
                             if parts[e][k] is not None else None for k in (0, 1)]
            dadj: list[tuple[str, Any] | None] = [None] * (output + 1)
            for e in backward:
                g, q = adjoint[e], dadj[e]
                if E.zero(q) and e not in dparts:
                    continue
                for k in (0, 1):
                    if parts[e][k] is None:
                        continue
                    term = E.add(E.mul0(dparts[e][k], g) if e in dparts else None,
                                 E.mul0(parts[e][k], q))
                    a = arg[k][e]
                    dadj[a] = E.add(dadj[a], term)
            result.append([dadj[e] if e <= output and dadj[e] is not None else ("c", 0.0)
                           for e in inputs])
    except _Decline:
        return None
    outs = []
    # where each is read: (input, colour) per entry (a star colouring's
    # ``_sparsity.symmetric_sources``), else the row along its column's colour
    src_row, src_colour = sources if sources is not None else (rows, colour[cols])
    upper = [result[int(k)][int(r)] for rr, cc, r, k in
             zip(rows.tolist(), cols.tolist(), src_row.tolist(), src_colour.tolist())
             if rr <= cc]
    if not upper:
        return None      # a linear function: the sweeps' zeros (and checks) are cheap
    for r in upper:
        outs.append(r[1] if r[0] == "e" else E.raw(_rules.OP_VARIABLE, ("c", 0.0), ("c", 0.0),
                                                   r[1]))
    assert len(ins) == n
    keep = live_entries(E.ops, E.args, outs, ins)
    # entries with an error policy that f reads and the nonzeros do not: outputs too, so
    # the program fails (and hands the point to the sweeps) wherever f's replay would
    for e in range(output + 1):
        if live[e] and kinds[e] == _tapeview.RULE and value[e][0] == "e" \
                and RULE_OF[ops[e]].errors != _rules.NO_CHECK and not keep[value[e][1]]:
            outs.append(value[e][1])
    if len(outs) > len(upper):
        keep = live_entries(E.ops, E.args, outs, ins)
    return rebuild_tape(keep, E.ops, E.args, E.values, E.partials, ins, outs)
