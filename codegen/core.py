"""Renders the rule table (easyad/_rules.py) into C and Cython source for the compiled core.

Called through ``codegen.generate()`` (setup.py, ``python -m codegen``). Outputs, in
easyad/_generated/, git-ignored and rebuilt from the table:

- ``_rule_functions.h``: plain C, the opcodes, per rule a static inline function for the
  value and each partial (``easyad_<rule>_value``, ``easyad_<rule>_d0``/``_d1``) and the
  tangents of the partials (``_t0``/``_t1``, derived by ``_expr.py``), expressions rendered
  to C99 by ``_expr``, and the error status of Python's policies (``easyad_rule_status``):
  all that the C of ``Function.compile`` includes;
- ``_ops.h``: includes it, then the replay sweeps over runs of one opcode, one ``case`` per
  rule: values and partials (``easyad_rule_eval_run``, ``easyad_rule_eval_affine``),
  adjoints (``easyad_rule_reverse_run``, ``easyad_rule_reverse_affine``), tangents for
  Hessians (``easyad_rule_tangents_run``);
- ``_ops.pxi``: the opcode enum, Cython declarations of _ops.h (``_<rule>_value``...) and
  per rule the error check ``_<rule>_check``;
- ``_trace.pxi``, ``_record.pxi``, ``_nested.pxi``, ``_generic.pxi``: the Tempita
  templates ``*.pxi.in`` (codegen/templates) expanded over the table (Trace/Record methods
  and operators, the NestedTrace of Traces or Records, the generic ``ad.<rule>``).

Every function signature is uniform (``value(x, y)``, ``d(x, y, z)``, ``check(x, y, z,
operator)``) so templates need not care about arity; unary rules ignore ``y``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .table import ROOT, load

rules, expr = load()
TEMPLATES = ROOT / "codegen" / "templates"
BANNER = "# GENERATED from easyad/_rules.py by codegen/core.py, do not edit\n"

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
    def names(self) -> tuple[str, ...]:
        """The rule's name and its aliases (each a method and an ad.<name>)."""
        return (self.rule.name, *self.rule.aliases)

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

    # -- for the C of _ops.h --
    @property
    def arity(self) -> int:
        return self.rule.arity

    @property
    def c_functions(self) -> list[tuple[str, str, str]]:
        return _c_functions(self.rule)

    @property
    def tangent_functions(self) -> list[tuple[str, str]]:
        return _tangent_functions(self.rule)

    @property
    def stored(self) -> list[int]:
        """Operands whose partial the sweeps store per entry: not a constant of the table."""
        return [k for k in (0, 1) if _literal(_partial_text(self.rule, k)) is None]

    @property
    def fixed(self) -> tuple[str, str, int]:
        """(c0, c1, mask): the partials that are constants of the table, set once per work
        buffer (0.0 where not), and which of them are (bit k)."""
        c = [_literal(_partial_text(self.rule, k)) for k in (0, 1)]
        mask = sum(1 << k for k in (0, 1) if c[k] is not None)
        return repr(c[0] if c[0] is not None else 0.0), repr(c[1] if c[1] is not None else 0.0), \
            mask

    @property
    def adjoints(self) -> list[tuple[int, str, float | None]]:
        """(k, kind, constant) per operand whose partial is not 0: kind "stored" (read
        from p_k), "one", "minus" or "scale" (a constant of the table times g)."""
        out = []
        for k in (0, 1):
            c = _literal(_partial_text(self.rule, k))
            if c == 0.0:
                continue
            kind = ("stored" if c is None else "one" if c == 1.0 else "minus" if c == -1.0
                    else "scale")
            out.append((k, kind, c))
        return out

    @property
    def status(self) -> str:
        return _C_STATUS[self.rule.errors]

    def tangent_call(self, k: int) -> str:
        if k >= self.rule.arity:
            return "0.0"
        return f"easyad_{self.name}_t{k}(x, y, z, dx, dy, dz)"


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


def _scaled(kind: str, c: float | None) -> str:
    """An adjoint contribution g times a constant partial of the table."""
    return {"one": "g", "minus": "-g"}.get(kind) or f"{c!r} * g"


def render_rule_functions_h() -> str:
    """_rule_functions.h: the template codegen/templates/_rule_functions.h.in over the table
    (C99: the table's expressions are C); all that the C of Function.compile includes."""
    body = _expand("_rule_functions.h", rules=views(),
                   structural=list(rules.STRUCTURAL_OPCODES.items()))
    return BANNER.replace("# ", "/* ", 1).rstrip() + " */\n" + body


def render_ops_h() -> str:
    """_ops.h: the template codegen/templates/_ops.h.in over the table: the replay sweeps'
    dispatch, over _rule_functions.h."""
    vs = views()
    stored_both = [(0, "stored", None), (1, "stored", None)]
    reverse_cases = ([(f"case EASYAD_OP_{v.name.upper()}", v.adjoints, False) for v in vs]
                     + [("default", stored_both, True)])
    body = _expand("_ops.h", rules=vs, scaled=_scaled, reverse_cases=reverse_cases)
    return BANNER.replace("# ", "/* ", 1).rstrip() + " */\n" + body


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

    path = TEMPLATES / (name + ".in")
    template = Tempita.Template(path.read_text(encoding="utf-8"), name=str(path))
    return template.substitute(**_namespace(), **extra)


def render_template(name: str) -> str:
    # _methods.pxi.in is the operator/method block shared by the Trace and Record classes
    def methods(cls: str, prefix: str) -> str:
        return _expand("_methods.pxi", cls=cls, p=prefix)

    return BANNER + _expand(name, methods=methods)


def render_stub() -> str:
    """easyad/_core.pyi: the hand-written stub template with the per-rule parts expanded."""
    return BANNER + _expand("_core.pyi")


OUTPUTS = {
    "_rule_functions.h": render_rule_functions_h,
    "_ops.h": render_ops_h,
    "_ops.pxi": render_ops,
    "_trace.pxi": lambda: render_template("_trace.pxi"),
    "_record.pxi": lambda: render_template("_record.pxi"),
    "_generic.pxi": lambda: render_template("_generic.pxi"),
    "_nested.pxi": lambda: render_template("_nested.pxi"),
}
