"""The replay VM's layout (``_Replayer._layout()``) as the C renderers read it, and the
pieces of C they share: slots as operands, statements cut into functions, pow's exponents
hidden from gcc."""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad import _tapeview
from easyad._csyntax import is_literal
from easyad.compiler.dialect import C
from easyad.compiler.tape.opcodes import RULE_OPCODE, SELECT_OP

CHUNK = 400         # statements per C function (compile time grows faster than linearly
                    # with a function's size)


class Layout:
    """The layout of a _Replayer with what rendering asks of it."""

    def __init__(self, layout: dict[str, Any]) -> None:
        self.__dict__.update(layout)
        self.L = int(self.length)
        self.input_set = set(self.inputs.tolist())
        self.decls: list[str] = []       # file-scope tables the statements read

    def __getattr__(self, name: str) -> Any:
        # the layout's arrays, set in __init__ (this tells type checkers they exist)
        raise AttributeError(f"the replay layout has no {name!r}")

    def operand(self, s: int) -> str:
        """The C expression of a slot: v[p] or a constant's literal."""
        return f"v[{s}]" if s < self.L else C.literal(float(self.constants[s - self.L]))

    def strided(self, base: int, stride: int, need: bool) -> str:
        if base < self.L:
            return f"v[{base} + j]" if stride else f"v[{base}]"
        if stride:
            return f"K[{base - self.L} + j]"
        return C.literal(float(self.constants[base - self.L]))


def gather(to: str, targets: list[int], frm: str, sources: list[int] | None = None
           ) -> list[str]:
    """to[targets[k]] = frm[sources[k]] (sources: 0, 1, ...), as one memcpy where both run
    in steps of one."""
    sources = list(range(len(targets))) if sources is None else sources
    if not targets:
        return []
    if targets == list(range(targets[0], targets[0] + len(targets))) and \
            sources == list(range(sources[0], sources[0] + len(sources))):
        return [f"    memcpy(&{to}[{targets[0]}], &{frm}[{sources[0]}], "
                f"{len(targets)} * sizeof(double));\n"]
    return [f"    {to}[{t}] = {frm}[{s}];\n" for t, s in zip(targets, sources)]


def chunks(lines: list[str]) -> list[str]:
    """Statements grouped into functions of at most CHUNK (one at least)."""
    return ["".join(lines[k:k + CHUNK]) for k in range(0, max(1, len(lines)), CHUNK)]


def output_ancestors(P: Layout, output: int) -> np.ndarray:
    """Positions the output reads (itself included): the reverse sweep visits only them."""
    live = np.zeros(P.L + 1, dtype=bool)
    if output < P.L:
        live[output] = True
    ops, a0, a1 = P.ops.tolist(), P.arg0.tolist(), P.arg1.tolist()
    for i in range(P.L - 1, -1, -1):
        if not live[i]:
            continue
        if a0[i] >= 0:
            live[a0[i]] = True
        if a1[i] >= 0:
            live[a1[i]] = True
        if ops[i] == SELECT_OP:
            live[_tapeview.select_condition(i)] = True
    return live


# an argument of the call it is passed to
KEEP_HELPER = """#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define EASYAD_KEEP_IN "+x"
#elif defined(__GNUC__) && defined(__aarch64__)
#define EASYAD_KEEP_IN "+w"
#endif
static inline double easyad_keep(double v) {
#ifdef EASYAD_KEEP_IN
    __asm__("" : EASYAD_KEEP_IN(v));
#else
    volatile double k = v; v = k;
#endif
    return v;
}
"""
_EXACT_EXPONENTS = frozenset(C.literal(c) for c in (0.0, 1.0, 2.0))


def pow_exponent(op: int, text: str) -> str:
    """pow's exponent as C: a constant other than 0, 1 and 2 (which the table's pow
    tests for and computes exactly) behind ``easyad_keep``, so gcc cannot rewrite the
    call (pow(x, 0.5) into sqrt(x), pow(x, -1) into 1 / x): those round differently
    from libm's pow, which the VM calls."""
    if op != RULE_OPCODE["pow"] or not constant_text(text) or text in _EXACT_EXPONENTS:
        return text
    return f"easyad_keep({text})"


def constant_text(text: str) -> bool:
    """Whether an operand's C is a constant: a literal or an entry of the constants
    table ``K[...]``."""
    return text.startswith("K[") or is_literal(text)
