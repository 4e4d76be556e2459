"""Renders the rule table (easyad/_rules.py) into Cython source for the compiled core.

Called by setup.py before cythonize (and by ``python -m easyad._codegen``). Outputs, all
git-ignored and rebuilt from the table:

- ``_ops.h``: plain C, per rule a static inline function for the value and each partial
  (``easyad_<rule>_value``, ``easyad_<rule>_d0``/``_d1``); the expressions are C99 as written;
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
        import _rules as rules  # type: ignore[no-redef]
        import _symbolic as symbolic  # type: ignore[no-redef, import-not-found, unused-ignore]
    finally:   # leave the path as it was: easyad/random.py must not shadow the stdlib's
        del sys.path[0]
else:
    from . import _rules as rules
    from . import _symbolic as symbolic

HERE = os.path.dirname(os.path.abspath(__file__))
BANNER = "# GENERATED from easyad/_rules.py by easyad/_codegen.py, do not edit\n"

# numpy's spelling of each rule, for arrays passed to the generic functions (None: no ufunc)
NUMPY_NAMES = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
               "acosh": "arccosh", "atanh": "arctanh", "abs": "absolute", "pow": "power",
               "atan2": "arctan2", "erf": None, "neg": "negative", "div": "true_divide",
               "sub": "subtract", "mul": "multiply"}

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
        return NUMPY_NAMES.get(self.rule.name, self.rule.name) or ""

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
    out = [(f"easyad_{r.name}_value", "double x, double y", r.value)]
    out += [(f"easyad_{r.name}_d{k}", "double x, double y, double z", p)
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
    return [(f"easyad_{r.name}_t{k}", symbolic.partial_tangent(r, k)) for k in range(r.arity)]


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
               "/* inlined into the sweep loops: a call per entry would cost as much as the math */\n"
               "#if defined(__GNUC__)\n#define EASYAD_DISPATCH static inline __attribute__((always_inline))\n"
               "#else\n#define EASYAD_DISPATCH static inline\n#endif")
    dispatch("EASYAD_DISPATCH double easyad_rule_value(int op, double x, double y)",
             lambda r: f"return easyad_{r.name}_value(x, y);", "return NAN;")
    # A run of entries with one opcode (replay schedules the tape into such runs): one
    # switch per run, then a tight loop per rule. Operands are slots of v (constants have
    # slots too); values go to v[dst[k]], partials to p0/p1[dst[k]]. need0/need1: whether
    # that operand is recorded; a constant operand's partial is never read, and skipping
    # it saves e.g. the log(x) of x ** 2.0's exponent partial. Returns 1 if every value is
    # finite (errors of the table's policies all show as non-finite values), 0 if not.
    def run_loop(r: rules.Rule) -> str:
        # an operand computed by the previous entry of the run (s = s + t in a loop) is
        # taken from a register: a branch that predicts well instead of a store-to-load
        # round trip on the chain's critical path
        return ("{ long last = -1; double zlast = 0.0; for (k = lo; k < hi; k++) { "
                "const long ia = a[k], ib = b[k], i = dst[k]; "
                "double x, y; if (ia == last) x = zlast; else x = v[ia]; "
                "if (ib == last) y = zlast; else y = v[ib]; (void)y; "
                f"const double z = easyad_{r.name}_value(x, y); v[i] = z; last = i; zlast = z; "
                f"p0[i] = need0 ? {partial(r, 0)} : 0.0; "
                f"p1[i] = need1 ? {partial(r, 1)} : 0.0; finite &= isfinite(z) != 0; }} }} break;")
    out.append("\nstatic int easyad_rule_eval_run(int op, long lo, long hi, const int32_t* dst, "
               "const int32_t* a, const int32_t* b, double* v, double* p0, double* p1, "
               "int need0, int need1) {\n    long k;\n    int finite = 1;\n    switch (op) {\n")
    for r in rules.RULES:
        out.append(f"    case EASYAD_OP_{r.name.upper()}: {run_loop(r)}\n")
    out.append("    default: return -1;\n    }\n    return finite;\n}\n")
    dispatch(f"EASYAD_DISPATCH void easyad_rule_tangents(int op, {tangent_params}, "
             "double* dp0, double* dp1, int need0, int need1)",
             lambda r: (f"*dp0 = need0 ? {tangent(r, 0)} : 0.0; "
                        f"*dp1 = need1 ? {tangent(r, 1)} : 0.0; return;"),
             "*dp0 = NAN; *dp1 = NAN; return;")
    # K directions at once: one switch per entry, the directions in the inner loop.
    # dxv/dyv: the operands' tangents (NULL for a constant operand), p0/p1 the partials.
    def tangents_block(r: rules.Rule) -> str:
        return ("{ for (k = 0; k < K; k++) { double dx = dxv ? dxv[k] : 0.0; "
                "double dy = dyv ? dyv[k] : 0.0; double dz = mul0(p0, dx) + mul0(p1, dy); "
                f"dzv[k] = dz; dp0v[k] = dxv ? {tangent(r, 0)} : 0.0; "
                f"dp1v[k] = dyv ? {tangent(r, 1)} : 0.0; }} return; }}")
    out.append("\nEASYAD_DISPATCH void easyad_rule_tangents_block(int op, double x, double y, "
               "double z, double p0, double p1, const double* dxv, const double* dyv, "
               "long K, double* dzv, double* dp0v, double* dp1v) {\n    long k;\n"
               "    switch (op) {\n")
    for r in rules.RULES:
        out.append(f"    case EASYAD_OP_{r.name.upper()}: {tangents_block(r)}\n")
    out.append("    default: for (k = 0; k < K; k++) { dzv[k] = NAN; dp0v[k] = NAN; "
               "dp1v[k] = NAN; } return;\n    }\n}\n")
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
    out.append("    double easyad_rule_value(int op, double x, double y)\n"
               "    int easyad_rule_eval_run(int op, long lo, long hi, const int32_t* dst,\n"
               "                             const int32_t* a, const int32_t* b, double* v,\n"
               "                             double* p0, double* p1, int need0, int need1)\n"
               "    void easyad_rule_tangents(int op, double x, double y, double z, double dx,\n"
               "                              double dy, double dz, double* dp0, double* dp1,\n"
               "                              int need0, int need1)\n"
               "    int easyad_rule_status(int op, double x, double y, double z)\n"
               "    int easyad_rule_arity(int op)\n"
               "    void easyad_rule_tangents_block(int op, double x, double y, double z, double p0,\n"
               "                                    double p1, const double* dxv, const double* dyv,\n"
               "                                    long K, double* dzv, double* dp0v, double* dp1v)\n")
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
        unary_functions=[v for v in vs if v.rule.arity == 1 and v.name != "neg"],
        binary_operators=[v for v in vs if v.rule.arity == 2 and v.operator],
        binary_functions=[v for v in vs if v.rule.arity == 2
                          and (not v.operator or v.name == "pow")],
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
