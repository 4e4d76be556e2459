"""Symbolic tangents of the rule table's expressions, by the rule table itself.

The partial-derivative strings of ``_rules.py`` are expressions in ``x``, ``y`` and ``z``.
Second-order modes (Hessians by forward-over-reverse, replayed Hessian-vector products) need
their tangents: how a partial changes when the inputs move along ``(dx, dy)`` (and so the
output along ``dz``). This module parses an expression with Python's ``ast``, differentiates
it with the same table (the derivative of a call ``f(u)`` is ``f``'s own partial at ``u``
times ``du``), folds constants, and prints it back in the shared expression language.

Used by ``_codegen.py`` at build time; pure Python, no easyad imports beyond the table.
"""
from __future__ import annotations

import ast
import os
import sys

if __package__ in (None, ""):  # loaded by path from _codegen.py run as a script
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import _rules as rules  # type: ignore[no-redef, import-not-found, unused-ignore]
    finally:  # leave the path as it was (easyad/random.py would shadow the stdlib's)
        del sys.path[0]
else:
    from . import _rules as rules

# C function name in a value expression -> the rule that defines it
_CALLS = {r.value.split("(")[0]: r for r in rules.RULES if "(" in r.value.split(" ")[0]}
_CALLS["fabs"] = rules.RULES_BY_NAME["abs"]
_ZERO_DERIVATIVE = {"sign", "heaviside"}  # piecewise constant: derivative 0 almost everywhere


def _num(v: float) -> ast.expr:
    return ast.Constant(float(v))


def _is(node: ast.expr, v: float) -> bool:
    return isinstance(node, ast.Constant) and node.value == v


def _add(a: ast.expr, b: ast.expr) -> ast.expr:
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    return ast.BinOp(a, ast.Add(), b)


def _sub(a: ast.expr, b: ast.expr) -> ast.expr:
    if _is(b, 0):
        return a
    if _is(a, 0):
        return _neg(b)
    return ast.BinOp(a, ast.Sub(), b)


def _constant(node: ast.Constant) -> float:
    """The number a constant node holds (the table's expressions hold only numbers)."""
    value = node.value
    if not isinstance(value, (int, float)):
        raise ValueError(f"not a number in a rule expression: {value!r}")
    return float(value)


def _neg(a: ast.expr) -> ast.expr:
    if isinstance(a, ast.Constant):
        return _num(-_constant(a))
    if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.USub):
        return a.operand
    return ast.UnaryOp(ast.USub(), a)


def _fold_product(a: ast.expr, b: ast.expr) -> ast.expr | None:
    """a * b when a factor is 0 or +-1, else None."""
    if _is(a, 0) or _is(b, 0):
        return _num(0)
    for one, other in ((a, b), (b, a)):
        if _is(one, 1):
            return other
        if _is(one, -1):
            return _neg(other)
    return None


def _mul(a: ast.expr, b: ast.expr) -> ast.expr:
    folded = _fold_product(a, b)
    return folded if folded is not None else ast.BinOp(a, ast.Mult(), b)


def _tmul(t: ast.expr, a: ast.expr) -> ast.expr:
    """A tangent t times a factor a: a strong zero (0 * inf = 0), as first-order sweeps
    use, and lazy: the helper ``tmul`` skips computing a when t is 0 (a C macro), so the
    log(x) in the tangent of x ** c is never computed for a constant exponent."""
    folded = _fold_product(t, a)
    return folded if folded is not None else _call("tmul", t, a)


def _div(a: ast.expr, b: ast.expr) -> ast.expr:
    if _is(a, 0):
        return _num(0)
    if _is(b, 1):
        return a
    return ast.BinOp(a, ast.Div(), b)


def _call(name: str, *args: ast.expr) -> ast.expr:
    return ast.Call(ast.Name(name), list(args), [])


def _substitute(expression: str, mapping: dict[str, ast.expr]) -> ast.expr:
    """Parse a table expression with its variables x, y, z replaced by the given trees."""

    class Replace(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return mapping.get(node.id, node)

    result: ast.expr = Replace().visit(ast.parse(expression, mode="eval").body)
    return result


def tangent(node: ast.expr, tangents: dict[str, ast.expr]) -> ast.expr:
    """The directional derivative of ``node`` given the tangents of its variables."""
    if isinstance(node, ast.Constant):
        return _num(0)
    if isinstance(node, ast.Name):
        return tangents.get(node.id, _num(0))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _neg(tangent(node.operand, tangents))
    if isinstance(node, ast.BinOp):
        a, b = node.left, node.right
        da, db = tangent(a, tangents), tangent(b, tangents)
        if isinstance(node.op, ast.Add):
            return _add(da, db)
        if isinstance(node.op, ast.Sub):
            return _sub(da, db)
        if isinstance(node.op, ast.Mult):
            return _add(_tmul(da, b), _tmul(db, a))
        if isinstance(node.op, ast.Div):  # (da - (a/b) db) / b
            return _div(_sub(da, _tmul(db, _div(a, b))), b)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name, args = node.func.id, node.args
        if name in _ZERO_DERIVATIVE:
            return _num(0)
        if name in ("mul0", "tmul"):  # strong-zero product: its tangent keeps the strong zeros
            a, b = args
            return _add(_tmul(tangent(a, tangents), b), _tmul(tangent(b, tangents), a))
        if name == "div0":  # a/b with 0/0 = 0: the quotient rule, zero where a is 0
            a, b = args
            return _call("div0", _sub(tangent(a, tangents), _mul(_div(a, b), tangent(b, tangents))), b)
        rule = _CALLS.get(name)
        if rule is None:
            raise ValueError(f"no rule differentiates the call {name}() in an expression")
        if rule.name == "pow" and isinstance(args[1], ast.Constant):
            # d(u^c) = c u^(c-1) du: skips the log(u) term, which is NaN for negative u
            c = _constant(args[1])
            return _tmul(tangent(args[0], tangents), _mul(_num(c), _call("pow", args[0], _num(c - 1.0))))
        bound = {"x": args[0], "y": args[1] if len(args) > 1 else _num(0), "z": node}
        total: ast.expr = _num(0)
        for k, partial in enumerate(rule.partials):
            d_arg = tangent(args[k], tangents)
            if not _is(d_arg, 0):
                total = _add(total, _tmul(d_arg, _substitute(partial, bound)))
        return total
    raise ValueError(f"cannot differentiate {ast.unparse(node)!r}")


def render(node: ast.expr) -> str:
    """Print a tree in the shared expression language (floats always have a decimal point)."""

    class Floats(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.expr:
            return ast.Constant(float(node.value)) if isinstance(node.value, (int, float)) else node

    text = ast.unparse(Floats().visit(node))
    assert "**" not in text
    return text


def partial_tangent(rule: rules.Rule, k: int) -> str:
    """Tangent of ``rule.partials[k]`` along (dx, dy), with dz the output's tangent."""
    tree = ast.parse(rule.partials[k], mode="eval").body
    tangents: dict[str, ast.expr] = {"x": ast.Name("dx"), "z": ast.Name("dz")}
    if rule.arity == 2:
        tangents["y"] = ast.Name("dy")
    return render(tangent(tree, tangents))
