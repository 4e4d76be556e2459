"""The reverse sweep as C (``Adjoints``, ``reverse_run``): the adjoints in the VM's order, so
sums round alike, with the adjoints known when rendering written as literals; spelt
through the tape renderer (``compiler.cstyle.CStyleRenderer``) whose sweep it is."""
from __future__ import annotations

import functools
import struct

import numpy as np

from easyad import _expr, _rules, _tapeview
from easyad.compiler.cstyle import CStyleRenderer
from easyad.compiler.tape.fusion import Access, Piece
from easyad.compiler.tape.layout import Layout, pow_exponent
from easyad.compiler.tape.opcodes import RULE_OF, RULE_OPCODE, SELECT_OP


class Adjoints:
    """The reverse sweep's statements, in the VM's order (so sums round alike). An adjoint
    slot's first contribution is stored (``a[t] = t``), later ones added (``a[t] += t``),
    so no memset is needed; an entry nothing has written to has adjoint 0 and is skipped,
    as the VM skips it. The VM adds the first contribution to a zeroed slot, which turns a
    -0.0 into +0.0: here a zero adjoint may keep its sign, which only ever reaches the
    sign of a zero (adjoints are multiplied by partials, through mul0, and summed), and the
    gradient is read out as ``0.0 + a[p]``, the VM's +0.0.

    Adjoints known when rendering (the output's 1.0, sums' and differences' copies of it,
    products with constants: Rosenbrock's running total and its 100 * ...) are not stored
    but kept here (``known``, computed in Python as the C would: IEEE doubles, the same
    operations in the same order) and written into the code as literals; a slot is stored
    (``settle``) only where code reads it from memory."""

    def __init__(self, P: Layout, output: int, renderer: CStyleRenderer) -> None:
        self.r = renderer
        self.written = np.zeros(P.L + 1, dtype=bool)
        self.known: dict[int, float] = {output: 1.0}
        self.lines: list[str | Piece] = []     # statements, and loops that may fuse
        self.written[output] = True

    def g(self, i: int) -> str:
        """The adjoint of slot i as C: its literal where known."""
        return self.r.literal(self.known[i]) if i in self.known else f"a[{i}]"

    def add(self, target: int, term: str, value: float | None = None) -> str:
        """target's adjoint grows by term (value: the term's number, where known)."""
        if target in self.known:
            if value is not None:
                self.known[target] = self.known[target] + value
                return ""
            return f"a[{target}] = {self.r.literal(self.known.pop(target))} + {term};"
        if self.written[target]:
            return f"a[{target}] += {self.r.literal(value) if value is not None else term};"
        self.written[target] = True
        if value is not None:
            self.known[target] = value
            return ""
        return f"a[{target}] = {term};"

    def settle(self, targets: range | list[int]) -> None:
        """Slots code reads or adds to in memory: stored (0 where not written yet)."""
        for t in targets:
            if t in self.known:
                self.lines.append(f"    a[{t}] = {self.r.literal(self.known.pop(t))};\n")
            elif not self.written[t]:
                self.lines.append(f"    a[{t}] = 0.0;\n")
                self.written[t] = True

    zero = settle

    def segments(self, lo: int, hi: int, most: int = 8) -> list[tuple[int, int, float | None]]:
        """[lo, hi) cut into pieces, last first, of one known adjoint each (an unwritten
        slot's is 0) or none known (None: read from a[]); at most ``most`` pieces, else
        the whole span stored and read."""
        pieces: list[tuple[int, int, float | None]] = []
        for i in range(hi - 1, lo - 1, -1):
            c = self.known.get(i, None if self.written[i] else 0.0)
            bits = None if c is None else struct.pack("<d", c)
            if pieces and pieces[-1][2] == bits:
                pieces[-1] = (i, pieces[-1][1], bits)
            else:
                pieces.append((i, i + 1, bits))
        if len(pieces) > most:
            self.settle(range(lo, hi))
            return [(lo, hi, None)]
        self.settle([i for p in pieces if p[2] is None for i in range(p[0], p[1])])
        return [(s, e, None if b is None else struct.unpack("<d", b)[0]) for s, e, b in pieces]


def _contribution(r: CStyleRenderer, rule: _rules.Rule, k: int, call: str) -> str | None:
    """What operand k's adjoint grows by: the table's constant partial as written, any
    other through mul0 (the strong zero), None for a 0 partial."""
    c = _fixed_partial(rule.name, k)
    if c == 0.0:
        return None
    if c is None:
        return r.mul0(call, "g")
    if c == 1.0:
        return "g"
    if c == -1.0:
        return "-g"
    return f"{r.literal(c)} * g"


@functools.lru_cache(maxsize=None)
def _fixed_partial(name: str, k: int) -> float | None:
    """The table's partial k of a rule where it is a number (0 past its arity), else None."""
    rule = _rules.RULES_BY_NAME[name]
    return _expr.constant(rule.partials[k]) if k < rule.arity else 0.0


def _mul0(p: float, g: float) -> float:
    """mul0 of _helpers.h on numbers: C's double product, the strong zero first."""
    return 0.0 if p == 0.0 or g == 0.0 else p * g


def _known_term(rule: _rules.Rule, k: int, operands: tuple[float | None, float | None],
                g: float | None) -> float | None:
    """Operand k's contribution (``_contribution``) as a number, where the adjoint g is
    known and the partial is a constant of the table or an operand that is a constant
    (x * y's partials: y and x)."""
    if g is None or k >= rule.arity:
        return None
    c = _fixed_partial(rule.name, k)
    if c is not None:
        return g if c == 1.0 else -g if c == -1.0 else c * g
    name = rule.partials[k].strip()
    if name in ("x", "y") and operands["xy".index(name)] is not None:
        return _mul0(operands["xy".index(name)], g)   # type: ignore[arg-type]
    return None


def reverse_run(P: Layout, run: tuple[int, ...], ancestors: np.ndarray,
                 A: Adjoints) -> None:
    lo, hi, op, need, affine, base0, base1 = run
    if not ancestors[lo:hi].any() or not A.written[lo:hi].any():
        return
    if op == 0:
        for i in range(hi - 1, lo - 1, -1):
            if ancestors[i] and A.written[i] and int(P.ops[i]) == SELECT_OP:
                c = _tapeview.select_condition(i)
                a, b = int(P.arg0[i]), int(P.arg1[i])
                A.settle([i])
                A.settle(range(a, a + 1) if a >= 0 else range(0))
                A.settle(range(b, b + 1) if b >= 0 else range(0))
                take = [f"a[{a}] += a[{i}];" if a >= 0 else ";",
                        f"a[{b}] += a[{i}];" if b >= 0 else ";"]
                A.lines.append(f"    if (v[{c}] != 0.0) {{ {take[0]} }} else {{ {take[1]} }}\n")
        return
    rule = RULE_OF[op]
    name = rule.name
    if affine:
        strides = ((affine >> 1) & 1, affine >> 2)
        fixed = tuple(None if strides[k] or base < P.L else float(P.constants[base - P.L])
                      for k, base in ((0, base0), (1, base1)))
        for start, stop, known in A.segments(lo, hi):
            shifted = (base0 + (start - lo) * strides[0], base1 + (start - lo) * strides[1])
            _reverse_affine(P, rule, name, need, strides, shifted, start, stop, fixed, known, A)
        return
    for i in range(hi - 1, lo - 1, -1):
        if not (ancestors[i] and A.written[i]):
            continue
        args = (int(P.arg0[i]), int(P.arg1[i]))
        slots = (int(P.slot0[i]), int(P.slot1[i]))
        x = P.operand(slots[0])
        y = pow_exponent(op, P.operand(slots[1]))
        fixed = tuple(float(P.constants[s - P.L]) if s >= P.L else None for s in slots)
        g = A.known.get(i)
        body = []
        for k in (0, 1):
            if args[k] < 0:
                continue
            t = _contribution(A.r, rule, k, f"{A.r.rule_partial(name, k)}({x}, {y}, v[{i}])")
            if t is not None:
                body.append(A.add(args[k], t, _known_term(rule, k, fixed, g)))
        body = [b for b in body if b]
        if body:
            A.lines.append(f"    {{ const double g = {A.g(i)}; {' '.join(body)} }}\n")


def _reverse_affine(P: Layout, rule: _rules.Rule, name: str, need: int,
                    strides: tuple[int, int], bases: tuple[int, int], lo: int, hi: int,
                    fixed: tuple[float | None, ...], known: float | None,
                    A: Adjoints) -> None:
    """One piece [lo, hi) of an affine run's reverse loop, its adjoint read from a[] or
    (known) one literal; bases: the operands' first slots at this piece's start."""
    g = f"a[{lo} + j]" if known is None else A.r.literal(known)
    terms = {k: _contribution(A.r, rule, k, f"{A.r.rule_partial(name, k)}(x, y, z)")
             for k in (0, 1) if need >> k & 1}
    values = {k: _known_term(rule, k, fixed, known) for k in terms}
    spans = {k: range(bases[k], bases[k] + (hi - lo)) if strides[k] else
             range(bases[k], bases[k] + 1)
             for k in (0, 1) if terms.get(k) is not None}
    apart = len(spans) < 2 or spans[0].stop <= spans[1].start \
        or spans[1].stop <= spans[0].start
    body = []
    accesses = [Access("a", lo, 1, False)] if known is None else []
    for k in (0, 1):
        t = terms.get(k)
        if t is None:
            continue
        span = spans[k]
        fresh = not A.written[span.start:span.stop].any()
        if strides[k] and fresh and apart:
            if values[k] is not None:      # known: one number for the whole span
                for s in span:
                    A.add(s, t, values[k])
                continue
            body.append(f"a[{bases[k]} + j] = {t};")
            A.written[span.start:span.stop] = True
        else:
            A.settle(span)
            body.append(f"a[{bases[k]} + j] += {t};" if strides[k] else f"a[{bases[k]}] += {t};")
        accesses.append(Access("a", bases[k], strides[k], True))
    if not body:
        return
    xs = P.strided(bases[0], strides[0], True)
    ys = pow_exponent(RULE_OPCODE[name], P.strided(bases[1], strides[1], True))
    A.lines.append(Piece(hi - lo, f"{{ const double g = {g}, x = {xs}, y = {ys}, "
                                  f"z = v[{lo} + j]; (void)g; (void)x; (void)y; (void)z; "
                                  f"{' '.join(body)} }}", tuple(accesses), down=True))
