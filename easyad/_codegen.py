"""Renders the rule table (easyad/_rules.py) into Cython source for the compiled core.

Called by setup.py before cythonize (and by ``python -m easyad._codegen``). Outputs, all
git-ignored and rebuilt from the table:

- ``_ops.h``: plain C, per rule a static inline function for the value and each partial
  (``easyad_<rule>_value``, ``easyad_<rule>_d0``/``_d1``) and the tangents of the partials
  (``_t0``/``_t1``, derived by ``_expr.py``); expressions are rendered to C99 by ``_expr``. Then the
  replay sweeps over runs of one opcode, one ``case`` per rule: values and partials
  (``easyad_rule_eval_run``, ``easyad_rule_eval_affine``), adjoints
  (``easyad_rule_reverse_run``, ``easyad_rule_reverse_affine``), tangents for Hessians
  (``easyad_rule_tangents_run``), and the error status of Python's policies;
- ``_ops.pxi``: the opcode enum, Cython declarations of _ops.h (``_<rule>_value``...) and
  per rule the error check ``_<rule>_check``;
- ``_trace.pxi``, ``_record.pxi``, ``_generic.pxi``: the Tempita templates ``*.pxi.in``
  expanded over the table (Trace/Record methods and operators, the generic ``ad.<rule>``).

Every function signature is uniform (``value(x, y)``, ``d(x, y, z)``, ``check(x, y, z,
operator)``) so templates need not care about arity; unary rules ignore ``y``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a script from setup.py: load the table by path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import _expr as expr  # type: ignore[no-redef, import-not-found, unused-ignore]
        import _rules as rules  # type: ignore[no-redef]
    finally:   # leave the path as it was: easyad/random.py must not shadow the stdlib's
        del sys.path[0]
else:
    from . import _expr as expr
    from . import _rules as rules

HERE = os.path.dirname(os.path.abspath(__file__))
BANNER = "# GENERATED from easyad/_rules.py by easyad/_codegen.py, do not edit\n"

_CHECKS = {
    rules.NO_CHECK: "return 0",
    rules.MATH: "return _check_math(x, y, z, False)",
    rules.MATH_OVERFLOW: "return _check_math(x, y, z, True)",
    rules.DIVISION: "return _check_division(y)",
    rules.POWER: "return _check_power(x, y, z, operator)",
}


@dataclass(frozen=True)
class View:
    """A rule as the templates see it."""

    rule: rules.Rule
    opcode: int

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def OP(self) -> str:
        return "OP_" + self.rule.name.upper()

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.rule.aliases

    @property
    def numpy_name(self) -> str:
        """numpy's ufunc for arrays passed to the generic function ("": none, elementwise)"""
        return self.rule.spelling("numpy") or ""

    @property
    def doc(self) -> str:
        return self.rule.doc

    @property
    def operator(self) -> str:
        return self.rule.operator

    @property
    def example(self) -> str:
        """Arguments at a point inside the rule's domain, for its docstring example."""
        points = []
        for k, (lo, hi) in enumerate(self.rule.domain[:self.rule.arity]):
            candidates = (0.5, 1.5) if k == 0 else (1.5, 0.5)
            points.append(next(v for v in candidates if lo < v < hi))
        return ", ".join(repr(v) for v in points)

    @property
    def checked(self) -> bool:
        return self.rule.errors != rules.NO_CHECK


def views() -> list[View]:
    return [View(r, rules.OPCODES[r.name]) for r in rules.RULES]


def _c_functions(r: rules.Rule) -> list[tuple[str, str, str]]:
    """(C name, parameters, expression) of a rule's value and partials."""
    out = [(f"easyad_{r.name}_value", "double x, double y", expr.render(r.value, "c"))]
    out += [(f"easyad_{r.name}_d{k}", "double x, double y, double z", expr.render(p, "c"))
            for k, p in enumerate(r.partials)]
    return out


_C_STATUS = {
    rules.NO_CHECK: "EASYAD_OK",
    rules.MATH: "easyad_status_math(x, y, z, 0)",
    rules.MATH_OVERFLOW: "easyad_status_math(x, y, z, 1)",
    rules.DIVISION: "easyad_status_division(y)",
    rules.POWER: "easyad_status_power(x, y, z)",
}


def _tangent_functions(r: rules.Rule) -> list[tuple[str, str]]:
    """(C name, expression) of the tangents of a rule's partials (second-order sweeps)."""
    return [(f"easyad_{r.name}_t{k}", expr.render(expr.partial_tangent(r, k), "c"))
            for k in range(r.arity)]


def _literal(expression: str) -> float | None:
    """The number a partial's expression is, if it is one ("1.0", "-1.0"), else None."""
    return expr.constant(expression)


def _partial_text(r: rules.Rule, k: int) -> str:
    """The table's expression of partial k ("0.0" for the absent operand of a unary rule)."""
    return r.partials[k] if k < r.arity else "0.0"


def render_ops_h() -> str:
    """Plain C99 (the table's expressions are C): one static inline function per formula,
    then the opcode dispatch that replay sweeps use (value and partials, tangents of the
    partials for forward-over-reverse, Python's error status)."""
    out = [BANNER.replace("# ", "/* ", 1).rstrip() + " */\n",
           "#ifndef EASYAD_OPS_H\n#define EASYAD_OPS_H\n#include <math.h>\n#include <stdint.h>\n"
           '#include "_helpers.h"\n#include "_status.h"\n\n']
    for name, code in rules.STRUCTURAL_OPCODES.items():
        out.append(f"#define EASYAD_OP_{name.upper()} {code}\n")
    for r in rules.RULES:
        out.append(f"#define EASYAD_OP_{r.name.upper()} {rules.OPCODES[r.name]}\n")
    out.append("\n")
    tangent_params = "double x, double y, double z, double dx, double dy, double dz"
    for r in rules.RULES:
        out.append(f"/* {r.name}: {r.doc} */\n")
        for cname, params, expression in _c_functions(r):
            out.append(f"static inline double {cname}({params}) {{ return {expression}; }}\n")
        for cname, expression in _tangent_functions(r):
            out.append(f"static inline double {cname}({tangent_params}) "
                       f"{{ (void)x; (void)y; (void)z; (void)dx; (void)dy; (void)dz; "
                       f"return {expression}; }}\n")

    def dispatch(signature: str, body, default: str) -> None:
        out.append(f"\n{signature} {{\n    switch (op) {{\n")
        for r in rules.RULES:
            out.append(f"    case EASYAD_OP_{r.name.upper()}: {body(r)}\n")
        out.append(f"    default: {default}\n    }}\n}}\n")

    def partial(r: rules.Rule, k: int) -> str:
        return f"easyad_{r.name}_d{k}(x, y, z)" if k < r.arity else "0.0"

    def tangent(r: rules.Rule, k: int) -> str:
        return f"easyad_{r.name}_t{k}(x, y, z, dx, dy, dz)" if k < r.arity else "0.0"

    out.append("\n/* ---- opcode dispatch for replay (rule opcodes only) ---- */\n"
               "/* inlined into the sweep loops: a call per entry would cost as much as the "
               "math */\n#if defined(__GNUC__)\n"
               "#define EASYAD_DISPATCH static inline __attribute__((always_inline))\n"
               "#else\n#define EASYAD_DISPATCH static inline\n#endif")
    # Runs: replay lays the list out in runs of entries lo..hi with one opcode; one switch
    # per run, then a tight loop per rule. Operands are slots a[i], b[i] of v (constants
    # have slots too); values go to v[i], partials to p0[i], p1[i], except partials that
    # are constants of the table (1.0 for add...): those are set once, when the work space
    # is (easyad_rule_fixed_partials), and the loops use the literal.
    def run_loop(r: rules.Rule) -> str:
        # need0/need1: whether that operand is recorded; a constant operand's partial is
        # never read, and skipping it saves e.g. the log(x) of x ** 2.0's exponent
        # partial. An operand computed by the previous entry of the run (s = s + t in a
        # loop) is taken from a register: a branch that predicts well instead of a
        # store-to-load round trip on the chain's critical path.
        stores = "".join(f"p{k}[i] = need{k} ? {partial(r, k)} : 0.0; "
                         for k in (0, 1) if _literal(_partial_text(r, k)) is None)
        return ("{ long last = -1; double zlast = 0.0; for (i = lo; i < hi; i++) { "
                "const long ia = a[i], ib = b[i]; "
                "double x, y; if (ia == last) x = zlast; else x = v[ia]; "
                "if (ib == last) y = zlast; else y = v[ib]; (void)y; "
                f"const double z = easyad_{r.name}_value(x, y); v[i] = z; last = i; zlast = z; "
                f"{stores}finite &= isfinite(z) != 0; }} }} break;")
    out.append("\n/* values and partials of a run; 1 if every value is finite (errors of the "
               "table's "
               "policies\n   all show as non-finite values), 0 if not */\n"
               "static int easyad_rule_eval_run(int op, long lo, long hi, "
               "const int32_t* a, const int32_t* b, double* v, double* p0, double* p1, "
               "int need0, int need1) {\n    long i;\n    int finite = 1;\n    switch (op) {\n")
    for r in rules.RULES:
        out.append(f"    case EASYAD_OP_{r.name.upper()}: {run_loop(r)}\n")
    out.append("    default: return -1;\n    }\n    return finite;\n}\n")

    def fixed(r: rules.Rule) -> str:
        c = [_literal(_partial_text(r, k)) for k in (0, 1)]
        mask = sum(1 << k for k in (0, 1) if c[k] is not None)
        return (f"*c0 = {c[0] if c[0] is not None else 0.0!r}; "
                f"*c1 = {c[1] if c[1] is not None else 0.0!r}; return {mask};")
    # Affine segments of a run: operand k of entry start + j is at xs[j * sx] (sx 1, or 0
    # for one slot, a constant's) and no operand lies inside the segment, so the loop has no
    # dependence between iterations (EASYAD_IVDEP tells the compiler) and vectorises where
    # the rule's math does (add, mul, sub, div...).
    def affine_loop(r: rules.Rule) -> str:
        stores = "".join(f"p{k}[j] = need{k} ? {partial(r, k)} : 0.0; "
                         for k in (0, 1) if _literal(_partial_text(r, k)) is None)
        return ("{ EASYAD_IVDEP for (j = 0; j < len; j++) { "
                "const double x = xs[j * sx], y = ys[j * sy]; (void)y; "
                f"const double z = easyad_{r.name}_value(x, y); out[j] = z; {stores}"
                "bad = (z - z == 0.0) ? bad : 1.0; } } break;")
    out.append("\n#if defined(__clang__)\n"
               "#define EASYAD_IVDEP _Pragma(\"clang loop vectorize(assume_safety)\")\n"
               "#elif defined(__GNUC__)\n#define EASYAD_IVDEP _Pragma(\"GCC ivdep\")\n"
               "#else\n#define EASYAD_IVDEP\n#endif\n"
               "/* an affine segment's values (out = v + start) and partials (p0, p1 = p + start); "
               "1 if\n   every value is finite, as easyad_rule_eval_run */\n"
               "static int easyad_rule_eval_affine(int op, long len, const double* xs, long sx, "
               "const double* ys, long sy, double* out, double* p0, double* p1, int need0, "
               "int need1) {\n    long j;\n    double bad = 0.0;\n    switch (op) {\n")
    for r in rules.RULES:
        out.append(f"    case EASYAD_OP_{r.name.upper()}: {affine_loop(r)}\n")
    out.append("    default: return -1;\n    }\n    return bad == 0.0;\n}\n")

    # ... and its reverse sweep: ao = adj + start; ax, ay: the operands' adjoints (stride
    # 1 where needed). Strong zero as selects (no branch), so this vectorises too.
    def affine_adjoint(k: int, expression: str) -> str:
        target = "ax" if k == 0 else "ay"
        c = _literal(expression)
        if c == 0.0:
            return ""
        if c is None:
            t = (f"const double q{k} = p{k}[j]; double t{k} = q{k} * g; "
                 f"t{k} = (q{k} == 0.0) ? 0.0 : t{k}; t{k} = (g == 0.0) ? 0.0 : t{k}; ")
        elif c == 1.0:
            t = f"const double t{k} = g; "
        elif c == -1.0:
            t = f"const double t{k} = -g; "
        else:
            t = f"const double t{k} = {c!r} * g; "
        return f"if (need{k}) {{ {t}{target}[j] += t{k}; }} "
    out.append("\nstatic void easyad_rule_reverse_affine(int op, long len, const double* p0, "
               "const double* p1, const double* ao, double* ax, double* ay, int need0, "
               "int need1) {\n    long j;\n    switch (op) {\n")
    for r in rules.RULES:
        body = affine_adjoint(0, _partial_text(r, 0)) + affine_adjoint(1, _partial_text(r, 1))
        out.append(f"    case EASYAD_OP_{r.name.upper()}: {{ EASYAD_IVDEP for (j = len - 1; "
                   f"j >= 0; j--) {{ const double g = ao[j]; {body}}} }} break;\n")
    out.append("    default: break;\n    }\n}\n")

    dispatch("static inline int easyad_rule_fixed_partials(int op, double* c0, double* c1)",
             fixed, "*c0 = 0.0; *c1 = 0.0; return 0;")

    # The reverse sweep over a run (last entry first): adj[a[i]] += p0 * adj[i], same for b.
    # A constant partial of the table is used as written (no load; none at all for 0),
    # any other is read from p0/p1 with mul0's strong zero (0 * inf contributes nothing).
    def adjoint(k: int, expression: str | None) -> str:
        side, last, total = ("ia", "la", "sa") if k == 0 else ("ib", "lb", "sb")
        c = _literal(expression) if expression is not None else None
        if expression is not None and c == 0.0:
            return ""
        if c is None:
            t = (f"double t{k} = p{k}[i] * g; if (t{k} != t{k} && p{k}[i] == 0.0) t{k} = 0.0; ")
        elif c == 1.0:
            t = f"const double t{k} = g; "
        elif c == -1.0:
            t = f"const double t{k} = -g; "
        else:
            t = f"const double t{k} = {c!r} * g; "
        # an operand not recorded (a constant's slot, shared by equal constants) gets
        # nothing: no sum through one slot for the whole run
        return (f"if (need{k}) {{ {t}{total} = adj[{side}] + t{k}; adj[{side}] = {total}; "
                f"{last} = {side}; }} ")

    def reverse_loop(body: str) -> str:
        # an adjoint the previous entry just updated (a chain s = s + t) comes from a
        # register (b first: if a == b, its sum is the later one)
        return ("{ long la = -1, lb = -1; double sa = 0.0, sb = 0.0; (void)sa; (void)sb; "
                "for (i = hi - 1; i >= lo; i--) { double g; "
                "if (i == lb) g = sb; else if (i == la) g = sa; else g = adj[i]; "
                "if (g == 0.0) continue; if (consume) adj[i] = 0.0; "
                "const long ia = a[i], ib = b[i]; (void)ia; (void)ib; "
                f"{body}}} }} break;")
    out.append("\n/* need0/need1: as for easyad_rule_eval_run; in structural runs, per entry, "
               "whether\n   the operand's slot is an entry's (< n_entries), not a constant's. "
               "consume: set each\n   adjoint read back to 0, so the next sweep needs no "
               "memset */\n"
               "static void easyad_rule_reverse_run(int op, long lo, long hi, "
               "const int32_t* a, const int32_t* b, const double* p0, const double* p1, "
               "double* adj, int need0, int need1, long n_entries, int consume) {\n    long i;\n"
               "    (void)n_entries;\n    switch (op) {\n")
    for r in rules.RULES:
        body = adjoint(0, _partial_text(r, 0)) + adjoint(1, _partial_text(r, 1))
        out.append(f"    case EASYAD_OP_{r.name.upper()}: {reverse_loop(body)}\n")
    generic = (adjoint(0, None) + adjoint(1, None)).replace(
        "if (need0)", "if (ia < n_entries)").replace("if (need1)", "if (ib < n_entries)")
    out.append(f"    default: {reverse_loop(generic)}\n    }}\n}}\n")
    # Tangents of an entry's value and partials in K directions at once (forward-over-
    # reverse). dxv/dyv: the operands' tangents (NULL for a constant operand), p0/p1 the
    # partials.
    def tangents_block(r: rules.Rule) -> str:
        return ("{ for (k = 0; k < K; k++) { double dx = dxv ? dxv[k] : 0.0; "
                "double dy = dyv ? dyv[k] : 0.0; double dz = mul0(p0, dx) + mul0(p1, dy); "
                f"dzv[k] = dz; dp0v[k] = dxv ? {tangent(r, 0)} : 0.0; "
                f"dp1v[k] = dyv ? {tangent(r, 1)} : 0.0; }} return; }}")
    # Over a run lo..hi of the replay layout: one switch per run, the entries and their K
    # directions inside. Operands are slots a[i], b[i]; an operand not recorded (need0/need1 0) has
    # no tangent. dv, dp0, dp1: K per entry (dp0/dp1: tangents of the partials pp0, pp1).
    out.append("\nstatic void easyad_rule_tangents_run(int op, long lo, long hi, const int32_t* a, "
               "const int32_t* b, const double* v, const double* pp0, const double* pp1, "
               "double* dv, double* dp0, double* dp1, long K, int need0, int need1) {\n"
               "    long i, k;\n    switch (op) {\n")
    for r in rules.RULES:
        out.append(f"    case EASYAD_OP_{r.name.upper()}: for (i = lo; i < hi; i++) {{ "
                   "const double x = v[a[i]], y = v[b[i]], z = v[i], p0 = pp0[i], p1 = pp1[i]; "
                   "(void)x; (void)y; (void)z; "
                   "const double* dxv = need0 ? dv + (long)a[i] * K : NULL; "
                   "const double* dyv = need1 ? dv + (long)b[i] * K : NULL; "
                   "double* dzv = dv + i * K; double* dp0v = dp0 + i * K; "
                   "double* dp1v = dp1 + i * K; "
                   + tangents_block(r).replace("return; }", "} ").rstrip() + " } break;\n")
    out.append("    default: break;\n    }\n}\n")
    dispatch("static inline int easyad_rule_arity(int op)",
             lambda r: f"return {r.arity};", "return 0;")
    dispatch("EASYAD_DISPATCH int easyad_rule_status(int op, double x, double y, double z)",
             lambda r: f"return {_C_STATUS[r.errors]};", "return EASYAD_OK;")
    out.append("\n#endif\n")
    return "".join(out)


def render_ops() -> str:
    """Cython view of _ops.h (as _<rule>_value, _<rule>_d<k>), opcodes and error checks."""
    out = [BANNER, "# Per-rule C functions (in _ops.h); opcodes follow the table's order.\n\n"]
    out.append("cdef enum:\n")
    for name, code in rules.STRUCTURAL_OPCODES.items():
        out.append(f"    OP_{name.upper()} = {code}\n")
    for v in views():
        out.append(f"    {v.OP} = {v.opcode}\n")
    out.append(f"    OP_FIRST_RULE = {rules.FIRST_RULE_OPCODE}\n")
    out.append(f"    OP_COUNT = {rules.FIRST_RULE_OPCODE + len(rules.RULES)}\n\n")
    out.append('cdef extern from "_ops.h" nogil:\n')
    out.append("    int easyad_rule_eval_run(int op, long lo, long hi, const int32_t* a,\n"
               "                             const int32_t* b, double* v,\n"
               "                             double* p0, double* p1, int need0, int need1)\n"
               "    int easyad_rule_status(int op, double x, double y, double z)\n"
               "    int easyad_rule_arity(int op)\n"
               "    int easyad_rule_fixed_partials(int op, double* c0, double* c1)\n"
               "    void easyad_rule_tangents_run(int op, long lo, long hi, const int32_t* a,\n"
               "                                  const int32_t* b, const double* v,\n"
               "                                  const double* pp0, const double* pp1,\n"
               "                                  double* dv,\n"
               "                                  double* dp0, double* dp1, long K, int need0,\n"
               "                                  int need1)\n"
               "    int easyad_rule_eval_affine(int op, long len, const double* xs, long sx,\n"
               "                                const double* ys, long sy, double* out,\n"
               "                                double* p0, double* p1, int need0, int need1)\n"
               "    void easyad_rule_reverse_affine(int op, long len, const double* p0,\n"
               "                                    const double* p1, const double* ao,\n"
               "                                    double* ax,\n"
               "                                    double* ay, int need0, int need1)\n"
               "    void easyad_rule_reverse_run(int op, long lo, long hi, const int32_t* a,\n"
               "                                 const int32_t* b, const double* p0,\n"
               "                                 const double* p1, double* adj, int need0,\n"
               "                                 int need1, long n_entries, int consume)\n")
    out.append("    double sign(double t)\n    double heaviside(double t)\n"
               "    double mul0(double a, double b)\n    double div0(double a, double b)\n")
    for r in rules.RULES:
        for cname, params, _ in _c_functions(r):
            pyname = cname.replace("easyad_", "_", 1)
            out.append(f'    double {pyname} "{cname}"({params})\n')
    out.append("\n")
    for r in rules.RULES:
        out.append(f"cdef inline int _{r.name}_check(double x, double y, double z, "
                   f"bint operator) except -1:\n    {_CHECKS[r.errors]}\n\n")
    # Opcode names, for introspection (repr, to_dot, error messages)
    names = ", ".join(repr(n) for n in rules.OPCODE_NAMES)
    out.append(f"OPCODE_NAMES = ({names},)\n")
    return "".join(out)


def _namespace() -> dict:
    vs = views()
    return dict(
        unary=[v for v in vs if v.rule.arity == 1],
        binary=[v for v in vs if v.rule.arity == 2],
        # what ad.<name> and the methods of Trace/Record expose
        unary_functions=[v for v in vs if v.rule.arity == 1 and v.rule.generic],
        binary_operators=[v for v in vs if v.rule.arity == 2 and v.operator],
        binary_functions=[v for v in vs if v.rule.arity == 2 and v.rule.generic],
        comparisons=rules.COMPARISONS,
        comparison_symbols=list(rules.COMPARISON_SYMBOLS.items()),
    )


def _expand(name: str, **extra) -> str:
    from Cython import Tempita

    with open(os.path.join(HERE, name + ".in"), encoding="utf-8") as f:
        template = Tempita.Template(f.read(), name=name + ".in")
    return template.substitute(**_namespace(), **extra)


def render_template(name: str) -> str:
    # _methods.pxi.in is the operator/method block shared by the Trace and Record classes
    def methods(cls: str, prefix: str) -> str:
        return _expand("_methods.pxi", cls=cls, p=prefix)

    return BANNER + _expand(name, methods=methods)


OUTPUTS = {
    "_ops.h": render_ops_h,
    "_ops.pxi": render_ops,
    "_trace.pxi": lambda: render_template("_trace.pxi"),
    "_record.pxi": lambda: render_template("_record.pxi"),
    "_generic.pxi": lambda: render_template("_generic.pxi"),
}


def generate(directory: str = HERE) -> list[str]:
    """Write every generated file whose text changed; return the paths written."""
    written = []
    for filename, render in OUTPUTS.items():
        path = os.path.join(directory, filename)
        text = render()
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    continue
        except FileNotFoundError:
            pass
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for p in generate():
        print("wrote", p)
