"""The one renderer of C-family code: ``CStyleRenderer``, the statements and expressions
every generated program is made of, written through a dialect (``compiler.dialect``) and
nothing else of the target language. Its subclasses are the program forms:

- ``compiler.tape.renderer.TapeRenderer``: a scalar tape as straight-line C (values,
  adjoints; ``second_order_renderer.SecondOrderRenderer`` its Hessian and HVP);
- ``compiler.tape.render_cl.ReplayRenderer``: a scalar tape as one OpenCL kernel, a
  work-item per point;
- ``compiler.program.cstyle.Renderer``: a planned tensor program as C loops, and its
  subclass ``compiler.program.render_cl.OpenCLRenderer``: as OpenCL kernels.

What they write alike is written here once: constants (``literal``: the one constant
printer, exact for inf and NaN), the rule table's functions (``rule_value``,
``rule_partial``, ``rule_tangent``) and its expressions (``expression``: ``_expr.render``
for the dialect's target), the strong zero (``mul0``), comparisons, selects and guards
(``compare``, ``select``, ``guard``), and tables of constants or indices at file scope
(``table``). A new target is a dialect (see ``compiler.dialect``); a new program form a
subclass.

A light module (no tensor imports): the scalar renderer loads it on the first compile.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Iterable

from easyad import _expr
from easyad._csyntax import literal
from easyad.compiler.dialect import Dialect


class CStyleRenderer:
    """Statements and expressions through ``self.dialect`` (see the module docstring)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    # ---- expressions ----
    def literal(self, value: float) -> str:
        """A constant as the target reads it back exactly (inf and NaN included)."""
        return self.dialect.literal(value)

    def inline(self, value: float) -> str:
        """A number written into an expression of a loop, whatever its real type: the
        double constant (a float loop's arithmetic reads the text it always has; inf
        and NaN as their macros)."""
        return literal(value)

    def rule_value(self, rule: str) -> str:
        return self.dialect.rule_value(rule)

    def rule_partial(self, rule: str, k: int) -> str:
        return self.dialect.rule_partial(rule, k)

    def rule_tangent(self, rule: str, k: int) -> str:
        return self.dialect.rule_tangent(rule, k)

    def mul0(self, a: str, b: str) -> str:
        """``a * b`` with the strong zero (0 whatever the other factor)."""
        return self.dialect.mul0(a, b)

    def expression(self, e: _expr.Node | str,
                   mapping: dict[str, _expr.Node | str] | None = None) -> str:
        """An expression of the rule table's language (with ``mapping``'s names replaced)
        as the target's text."""
        return _expr.render(_expr.substitute(e, mapping) if mapping else e,
                            self.dialect.target)

    def compare(self, x: str, symbol: str, y: str) -> str:
        """A comparison's value as the VM keeps it: 1.0 or 0.0."""
        return f"({x} {symbol} {y}) ? 1.0 : 0.0"

    def select(self, condition: str, x: str, y: str) -> str:
        """x where the comparison's value ``condition`` is not 0, else y."""
        return f"({condition} != 0.0) ? {x} : {y}"

    # ---- statements ----
    def guard(self, target: str, x: str, symbol: str, y: str, recorded: float,
              flag: str) -> str:
        """A guard: the comparison again into ``target``, and ``flag`` (a statement)
        where its outcome is not the recorded one."""
        check = self.guard_check(target, recorded, flag)
        return f"{target} = {self.compare(x, symbol, y)}; {check}"

    def guard_check(self, target: str, recorded: float, flag: str) -> str:
        """``flag`` (a statement) where the comparison's value in ``target`` is not the
        recorded one."""
        return f"if ({target} != {'1.0' if recorded != 0.0 else '0.0'}) {flag}"

    def loop(self, count: int, var: str = "j", down: bool = False) -> str:
        """The head of a loop over ``var`` in [0, count) (``down``: from the top), the
        body to follow (a statement or a block): runs and tables of rows are run so."""
        if down:
            return f"for ({var} = {count - 1}; {var} >= 0; {var}--)"
        return f"for ({var} = 0; {var} < {count}; {var}++)"

    def table(self, ctype: str, name: str, values: Iterable[Any], empty: str = "0",
              sep: str = ", ") -> str:
        """A table at file scope (constants, indices, seeds), never of size 0."""
        items = [str(v) for v in values]
        return (f"{self.dialect.table_qualifier} {ctype} {name}[{max(1, len(items))}] = "
                f"{{{sep.join(items) or empty}}};\n")
