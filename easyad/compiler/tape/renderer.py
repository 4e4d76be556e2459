"""The layout as C (``TapeRenderer``, ``render``): values run by run, then the adjoints
(``adjoints.py``), cut into functions; the Hessian's and HVP's functions appended by
``second_order_renderer``. A ``compiler.cstyle.CStyleRenderer``: constants, rule calls,
the strong zero, comparisons, selects, guards and index tables are written through it
and its dialect (``compiler.dialect.C``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _rules, _tapeview
from easyad.compiler.cstyle import CStyleRenderer
from easyad.compiler.dialect import C, Dialect
from easyad.compiler.tape.adjoints import Adjoints, reverse_run
from easyad.compiler.tape.fusion import Access, Piece, fuse
from easyad.compiler.tape.layout import (KEEP_HELPER, Layout, chunks, gather,
                                         output_ancestors, pow_exponent)
from easyad.compiler.tape.opcodes import (COMPARE_OPS, GUARD_OPS, RULE_OF, RULE_OPCODE,
                                          SELECT_OP)
from easyad.compiler.tape.prelude import prelude
from easyad.compiler.tape.second_order_renderer import SecondOrderRenderer

# What the C includes: the rule functions it calls and libm's declarations (``prelude``),
# no libc header beyond the smallest (gcc's builtins for memcpy and memset): a small
# program's compile time is mostly parsing
PRELUDE = """#include <stddef.h>
#include <stdint.h>
#if defined(__GNUC__)
#define memcpy __builtin_memcpy
#define memset __builtin_memset
#define EASYAD_CUT __attribute__((noinline))
#else
#include <string.h>
#define EASYAD_CUT
#endif
"""


def render(layout: dict[str, Any], origin: str, seeds: np.ndarray | None = None,
           gradient: bool = True, hvp: bool = False, dialect: Dialect = C) -> str:
    """``TapeRenderer(dialect).render``: see there."""
    return TapeRenderer(dialect).render(layout, origin, seeds, gradient, hvp)


# the program's entry points, after its sweeps (format: calls_f, get_out, gradient_body)
_ENTRY_POINTS = """
static inline int sweep(const double* restrict x, double* restrict v, int all) {{
    int flags = 0;
{calls_f}    return flags;
}}

static inline int forward(const double* restrict x, double* restrict v) {{
    return sweep(x, v, 1);
}}

int easyad_native_value(const double* restrict x, double* restrict out, double* g,
                        double* restrict work) {{
    double* v = work;
    int flags = forward(x, v);
    (void)g;
{get_out}    return flags;
}}

int easyad_native_gradient(const double* restrict x, double* restrict out,
                           double* restrict g, double* restrict work) {{
{gradient_body}}}

"""
_FREE = frozenset(RULE_OPCODE[k] for k in ("add", "sub", "neg"))
_INDEXED = 32     # entries from which a run that is not affine is a loop over index arrays


def _wrap(tag: str, text: str) -> str:
    """A forward loop of runs only the output's value reads (tag "all") inside ``if
    (all)``; any other as it is."""
    return f"    if (all) {{\n{text}    }}\n" if tag == "all" else text


def _dead_runs(P: Layout, runs: list[tuple[int, ...]]) -> list[bool]:
    """The VM's run_dead (``_dead_runs`` of layout.pxi): runs of sums, differences and
    negations whose values nothing reads but other such entries (no partial, guard,
    select or comparison): a gradient without its value needs none of them, and their
    rules raise no errors."""
    ops, a0, a1 = P.ops.tolist(), P.arg0.tolist(), P.arg1.tolist()
    wanted = [False] * (P.L + 1)
    for i in range(P.L - 1, int(P.first) - 1, -1):
        if wanted[i] or ops[i] not in _FREE:
            if a0[i] >= 0:
                wanted[a0[i]] = True
            if a1[i] >= 0:
                wanted[a1[i]] = True
            if ops[i] == SELECT_OP:
                wanted[_tapeview.select_condition(i)] = True
    return [run[2] != 0 and all(ops[i] in _FREE and not wanted[i]
                                for i in range(run[0], run[1])) for run in runs]


class TapeRenderer(CStyleRenderer):
    """A scalar tape laid out by the VM as straight-line C (see the module docstring)."""

    def render(self, layout: dict[str, Any], origin: str, seeds: np.ndarray | None = None,
               gradient: bool = True, hvp: bool = False) -> str:
        """C source of the program laid out by the VM (``_Replayer._layout()``); with seeds
        (n, K), the Hessian and HVP too (``render_second``); with gradient=False values only
        (the gradient function then flags every point, bit 2, for the VM: a shorter compile);
        hvp without seeds: the HVP alone (``render_second``)."""
        P = Layout(layout)
        L = P.L
        runs = list(zip(P.run_start[:-1].tolist(), P.run_start[1:].tolist(), P.run_op.tolist(),
                        P.run_need.tolist(), P.run_affine.tolist(), P.run_base0.tolist(),
                        P.run_base1.tolist()))
        dead = _dead_runs(P, runs)
        # the runs only the output's value reads (sums) are skipped by a gradient asked for
        # without its value (out NULL), as the VM skips its run_dead; in place (an entry
        # nothing wants of a run that is kept may still read them)
        items: list[str | Piece] = []
        for r, run in enumerate(runs):
            lines = self._forward_run(P, run, "all" if dead[r] else "")
            if isinstance(lines, Piece):
                items.append(lines)
            else:
                items += [f"    if (all) {{\n{''.join(lines)}    }}\n"] if dead[r] else lines
        forward = fuse(items, self._loop, self._single, _wrap)
        ancestors = output_ancestors(P, int(P.outputs[0]))
        adjoints = Adjoints(P, int(P.outputs[0]), self)
        if gradient:
            for run in reversed(runs):
                reverse_run(P, run, ancestors, adjoints)
            # read from memory after: the inputs' (the gradient), every one for second order
            adjoints.settle(sorted(adjoints.known) if seeds is not None or hvp else
                            [int(p) for p in P.inputs if int(p) in adjoints.known])
        else:
            adjoints.lines = []
        n = len(P.inputs)
        out = [f"/* GENERATED by easyad/compiler/tape/renderer.py from a recorded easyad.Function\n"
               f" * ({origin}; {L} entries laid out by the replay VM), do not edit.\n"
               " * Values, then adjoints, as straight-line C; the math is the rule table's, from\n"
               " * _rule_functions.h and _helpers.h, the functions the VM calls. */\n",
               PRELUDE, KEEP_HELPER]
        out.append(self.table("double", "K", (self.literal(float(c)) for c in P.constants),
                              "0.0"))
        out += P.decls
        inputs = [int(p) for p in P.inputs]
        taken = set(inputs)
        fixed = [p for p in range(int(P.first)) if p not in taken]
        setup = [f"    v[{p}] = {self.literal(float(P.values[p]))};\n" for p in fixed]
        setup += gather("v", inputs, "x")
        fparts = chunks(setup + forward)
        rparts = chunks(fuse(adjoints.lines, self._loop, self._single, _wrap))
        cut = "EASYAD_CUT " if len(fparts) + len(rparts) > 2 else ""
        for k, body in enumerate(fparts):
            out.append(f"static {cut}int fwd{k}(const double* restrict x, double* restrict v, "
                       f"int all) {{\n    int flags = 0; long j; (void)j; (void)x; (void)all;\n"
                       f"{body}    return flags;\n}}\n")
        for k, body in enumerate(rparts):
            out.append(f"static {cut}void rev{k}(const double* restrict v, double* restrict a) {{\n"
                       f"    long j; (void)j; (void)v;\n{body}}}\n")
        calls_f = "".join(f"    flags |= fwd{k}(x, v, all);\n" for k in range(len(fparts)))
        calls_r = "".join(f"    rev{k}(v, a);\n" for k in range(len(rparts)))
        get_out = "".join(f"    out[{k}] = v[{int(p)}];\n" for k, p in enumerate(P.outputs))
        first = inputs[0] if inputs else 0
        if inputs == list(range(first, first + n)) and adjoints.written[first:first + n].all():
            get_g = f"    {self.loop(n)} g[j] = 0.0 + a[{first} + j];\n"
        else:
            get_g = "".join(f"    g[{k}] = {f'0.0 + a[{p}]' if adjoints.written[p] else '0.0'};\n"
                            for k, p in enumerate(inputs))
        gradient_body = (f"    double* v = work;\n    double* a = work + {L};\n"
                         "    long j; (void)j;\n"
                         f"    int flags = sweep(x, v, out != NULL);\n"
                         f"    if (out != NULL) {{\n    {get_out.strip()}\n    }}\n"
                         f"    if (flags) return flags;\n"
                         f"    (void)a;\n{calls_r}{get_g}    return 0;\n")
        if not gradient:      # values only: a gradient is the VM's (flag 4, every point)
            gradient_body = "    (void)x; (void)out; (void)g; (void)work;\n    return 4;\n"
        out.append(_ENTRY_POINTS.format(calls_f=calls_f, get_out=get_out,
                                        gradient_body=gradient_body))
        if seeds is not None or hvp:
            out.append(SecondOrderRenderer(self.dialect).render_second(layout, seeds, len(rparts)))
        body = "".join(out[2:])
        return "".join(out[:2]) + prelude(body) + body

    def _loop(self, count: int, down: bool) -> str:
        return self.loop(count, down=down)

    def _single(self, piece: Piece) -> str:
        """A piece that joined no other: its loop as it was always written."""
        head = self.loop(piece.count, down=piece.down)
        if piece.down:
            return f"    {head} {piece.body}\n"
        text = f"{head} {piece.body}"
        if piece.checked:
            text = f"double bad = 0.0; {text} if (bad != 0.0) flags |= 2;"
        return _wrap(piece.tag, f"    {{ {text} }}\n")

    def _affine_piece(self, P: Layout, run: tuple[int, ...], tag: str, lo: int, hi: int
                      ) -> Piece:
        """The entries [lo, hi) of an affine run (the whole run, or a piece of it) as a
        loop body; ``split`` cuts it into shorter pieces."""
        start, _, op, need, affine, base0, base1 = run
        strides = ((affine >> 1) & 1, affine >> 2)
        bases = (base0 + (lo - start) * strides[0], base1 + (lo - start) * strides[1])
        x = P.strided(bases[0], strides[0], bool(need & 1))
        y = pow_exponent(op, P.strided(bases[1], strides[1], bool(need & 2)))
        checked = RULE_OF[op].errors != _rules.NO_CHECK
        check = " bad = (z - z == 0.0) ? bad : 1.0;" if checked else ""
        body = (f"{{ const double x = {x}, y = {y}; (void)y; const double z = "
                f"{self.rule_value(RULE_OF[op].name)}(x, y); v[{lo} + j] = z;{check} }}")
        reads = tuple(Access("v", b, s, False) for b, s in zip(bases, strides) if b < P.L)

        def split(count: int) -> list[Piece]:
            return [self._affine_piece(P, run, tag, k, k + count) for k in range(lo, hi, count)]
        return Piece(hi - lo, body, (*reads, Access("v", lo, 1, True)), checked=checked,
                     tag=tag, split=split)

    def _forward_run(self, P: Layout, run: tuple[int, ...], tag: str = ""
                     ) -> list[str] | Piece:
        lo, hi, op, need, affine, base0, base1 = run
        if op == 0:
            return [self._structural(P, i) for i in range(lo, hi)]
        if affine:
            return self._affine_piece(P, run, tag, lo, hi)
        rule = RULE_OF[op]
        name = rule.name
        # errors show as non-finite values; whether one is an error (or a value computed from
        # an inf or NaN operand) is the VM's to decide: the point is flagged and handed to it.
        # (A loop of easyad_rule_status checks here cost gcc ~10 ms per checked run.)
        checked = rule.errors != _rules.NO_CHECK
        indexed = None if hi - lo < _INDEXED else self._indexed(P, lo, hi)
        if indexed:
            x, y = indexed
            y = pow_exponent(op, y)
            fast, start, chain = [x, y], "", ""
            for k, slots in enumerate((P.slot0[lo:hi], P.slot1[lo:hi]) if indexed else ()):
                if (slots[1:] == np.arange(lo, hi - 1)).all():
                    # a chain (each entry reads the one before: s = s + t) keeps its running
                    # value in a register, not a store and a load per entry
                    start, chain = f"double run = {P.operand(int(slots[0]))}; ", " run = z;"
                    fast[k] = "run"
                    break
            check = " bad = (z - z == 0.0) ? bad : 1.0;" if checked else ""
            loop = (f"{start}{self.loop(hi - lo)} {{ const double x = {fast[0]}, "
                    f"y = {fast[1]}; (void)y; const double z = {self.rule_value(name)}(x, y); "
                    f"v[{lo} + j] = z;{chain}{check} }}")
            if not checked:
                return [f"    {{ {loop} }}\n"]
            return [f"    {{ double bad = 0.0; {loop} if (bad != 0.0) flags |= 2; }}\n"]
        lines = []
        for i in range(lo, hi):
            x = P.operand(int(P.slot0[i]))
            y = pow_exponent(op, P.operand(int(P.slot1[i])))
            line = f"    {{ const double x = {x}, y = {y}; (void)y; const double z = " \
                   f"{self.rule_value(name)}(x, y); v[{i}] = z;"
            if checked:
                line += " if (!isfinite(z)) flags |= 2;"
            lines.append(line + " }\n")
        return lines


    def _indexed(self, P: Layout, lo: int, hi: int) -> tuple[str, str] | None:
        """The operands of the entries [lo, hi) as C at ``j`` read through index arrays
        declared at file scope (``P.decls``), or None where an operand mixes entries and
        constants. A long run that is not affine (Rosenbrock's running sum) then compiles as
        one loop (its data a table) rather than a statement per entry: gcc's time grows with
        the statements, and the loop runs as fast (a chain waits on its sums either way)."""
        operands = []
        for slots in (P.slot0[lo:hi], P.slot1[lo:hi]):
            slots = [int(s) for s in slots]
            if all(s >= P.L for s in slots) and len(set(slots)) == 1:
                operands.append(self.literal(float(P.constants[slots[0] - P.L])))
                continue
            if all(s < P.L for s in slots):
                array, offset = "v", 0
            elif all(s >= P.L for s in slots):
                array, offset = "K", P.L
            else:
                return None
            name = f"I{len(P.decls)}"
            P.decls.append(self.table("int32_t", name, (s - offset for s in slots), sep=","))
            operands.append(f"{array}[{name}[j]]")
        return operands[0], operands[1]


    def _structural(self, P: Layout, i: int) -> str:
        op = int(P.ops[i])
        x = P.operand(int(P.slot0[i]))
        y = P.operand(int(P.slot1[i]))
        if op == SELECT_OP:
            c = _tapeview.select_condition(i)
            return f"    v[{i}] = {self.select(f'v[{c}]', x, y)};\n"
        if op in COMPARE_OPS:
            return f"    v[{i}] = {self.compare(x, COMPARE_OPS[op], y)};\n"
        if op in GUARD_OPS:
            return f"    {self.guard(f'v[{i}]', x, GUARD_OPS[op], y, P.values[i], 'flags |= 1;')}\n"
        raise ValueError(f"entry {i} ({_rules.OPCODE_NAMES[op]}) cannot be compiled")
