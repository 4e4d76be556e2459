"""The rule table's float32 forms (``Rule.float32``) in the fused C of float32 programs.

A float32 program's loops compute in double and round each value to float32 when stored
(``cstyle.CDialect``): exact enough for any row, but a libm call in double costs twice the
lanes of its float twin and a conversion each way. A row may give float32 forms, the same
function written to be accurate in float (tanh: ``tanhf``, and its slope from one
``expf``); here a map of a float32 program that is that row's own map (its value, or its
adjoint ``mul0(g, partial)`` as ``_expr.adjoint_map`` writes it: the expressions and
names the tensor layer records) and reads and writes float32 only has its expressions
replaced by the float32 forms (``rewrite``) and is rendered in float (``in_float``:
float literals, libm's f functions, libmvec's float variants where the loop
vectorises, ``header``).

float64 programs, maps of mixed dtypes and anything else keep their expressions and
their C to the byte. The error this allows is stated in float32 ulps in
docs/record-replay.md and checked by tests/test_float32_forms.py and the conformance
suite (every float32 engine against eager numpy).
"""
from __future__ import annotations

from collections.abc import Iterable
from itertools import combinations
from typing import Any

import numpy as np

from easyad import _expr, _rules
from easyad.compiler import libm
from easyad.compiler.program.plan import renamed

_FLOAT32 = np.dtype(np.float32)
_NUMPY_FORM = {"mul0": "easyad_f_mul0", "div0": "easyad_f_div0"}


def _forms(table: Iterable[_rules.Rule]) -> dict[tuple[tuple[str, ...], tuple[str, ...]],
                                                 tuple[str, ...]]:
    """(expressions, names) of each map a row with float32 forms records -> the same map's
    float32 expressions: its value map, and its adjoint map for each set of operands."""
    out = {}
    for rule in table:
        if not rule.float32:
            continue
        value32, partials32 = rule.float32[0], rule.float32[1:]
        if len(partials32) != rule.arity:
            raise ValueError(f"rule {rule.name!r}: float32 forms (value, partials) number "
                             f"{len(rule.float32)}, the row has 1 + {rule.arity}")
        names = ("x", "y")[:rule.arity]
        out[((rule.value,), names)] = (value32,)
        for n in range(1, rule.arity + 1):
            for wanted in combinations(range(rule.arity), n):
                exprs, saved = _expr.adjoint_map(rule.partials[k] for k in wanted)
                exprs32, saved32 = _expr.adjoint_map(partials32[k] for k in wanted)
                if not set(saved32) <= set(saved):
                    raise ValueError(
                        f"rule {rule.name!r}: a float32 partial reads {sorted(saved32)}, "
                        f"but the recording saves only {sorted(saved)} (what the row's own "
                        f"partials read): write it in those")
                out[(exprs, saved + ("g",))] = exprs32
    return out


FORMS = _forms(_rules.RULES)


def rewrite(program: Any, forms: dict[Any, tuple[str, ...]] | None = None) -> set[int]:
    """Replace, in ``program`` (an optimised copy: its instruction list is its own), each
    map that is a row's own map over float32 operands and results by its float32 forms;
    the ids of the new instructions (``Plan.in_float``)."""
    forms = FORMS if forms is None else forms
    if not forms:
        return set()
    rewritten: set[int] = set()
    instructions = list(program.instructions)
    for k, ins in enumerate(instructions):
        if ins.op != "map":
            continue
        found = forms.get((tuple(ins.params.exprs), tuple(ins.params.names)))
        if found is None or any(program.dtypes[o] != _FLOAT32 for o in ins.outs) or any(
                type(i) is int and program.dtypes[i] != _FLOAT32 for i in ins.ins):
            continue
        new = type(ins)(ins.op, ins.params._replace(exprs=found), ins.ins, ins.outs)
        instructions[k] = new
        rewritten.add(id(new))
    program.instructions = instructions
    return rewritten


def in_float(tree: _expr.Node) -> str:
    """A float32 form (names bound, numbers in place) as C computing in float: float
    literals, and each call by its float function (``header``)."""
    renames = {f: _NUMPY_FORM.get(f, f"easyad_f_{f}") for f in _expr.calls(tree)}
    return _expr.render(renamed(tree, renames), "opencl-float")


def functions() -> tuple[str, ...]:
    """The libm functions the float32 forms call (sorted)."""
    names = {f for form in FORMS.values() for e in form for f in _expr.calls(e)}
    return tuple(sorted(names - set(_NUMPY_FORM)))


def header() -> list[str]:
    """The C a file of float-rendered maps needs after ``cstyle.c_header``: the strong
    zeros over float (the same bit mask, 32 bits wide), and each libm function of the
    forms as ``easyad_f_<f>``: libmvec's float variant (``<f>f``, declared simd) where
    glibc has it and vector math is on, else libm's ``<f>f``."""
    lines = ["static inline float easyad_f_mask(float r, int keep) {",
             "    uint32_t bits;", "    memcpy(&bits, &r, sizeof bits);",
             "    bits &= (uint32_t)0 - (uint32_t)keep;", "    memcpy(&r, &bits, sizeof r);",
             "    return r;", "}",
             "static inline float easyad_f_mul0(float a, float b) {",
             "    return easyad_f_mask(a * b, !EASYAD_MUL0_ZERO(float, a, b));", "}",
             "static inline float easyad_f_div0(float a, float b) {",
             "    return easyad_f_mask(a / b, !EASYAD_DIV0_ZERO(float, a, b));", "}"]
    vector = set(libm.libmvec_functions())
    params = {fn.name: fn.params.replace("double", "float") for fn in libm.FUNCTIONS}
    for f in functions():
        if f not in params:
            raise ValueError(f"a float32 form calls {f}(), which compiler/libm.py does not "
                             f"list: add it there (its parameters, whether libm rounds it "
                             f"correctly)")
        declared = f'extern float easyad_f_{f}({params[f]}) __asm__("{f}f") __attribute__(('
        if f in vector:
            lines += ["#ifdef EASYAD_VECTOR_MATH",
                      declared + 'const, __simd__("notinbranch")));', "#else",
                      declared + "const));", "#endif"]
        elif libm.FUNCTIONS[[fn.name for fn in libm.FUNCTIONS].index(f)].exact:
            lines.append(f"#define easyad_f_{f} {f}f")    # a builtin, exact: fabsf, sqrtf
        else:
            lines.append(declared + "const));")
    return lines + [""]
