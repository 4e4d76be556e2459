"""The expression module (easyad/_expr.py): parsing, rendering, substitution and the
symbolic tangents, against Python's own evaluation of the same strings and math's values."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import scipy.special as special

import pytest

from easyad import _expr
from easyad._rules import RULES, RULES_BY_NAME, Rule

# tmul as the C macro means it: a lazy strong-zero product (for evaluating tangents)
PY = {name: getattr(math, name) for name in dir(math) if not name.startswith("_")}
PY.update(sign=lambda t: math.copysign(1.0, t) if t else t,
          heaviside=lambda t: 1.0 if t > 0 else (0.0 if t < 0 else 0.5),
          mul0=lambda a, b: 0.0 if a == 0.0 or b == 0.0 else a * b,
          tmul=lambda t, e: 0.0 if t == 0.0 or e == 0.0 else t * e,
          div0=lambda a, b: 0.0 if a == 0.0 else a / b, fabs=abs, pow=math.pow,
          maximum=max, minimum=min, stop_gradient=lambda t: t)   # (_helpers.h: x itself)
# the rows of scipy.special and numpy's float ufuncs, by scipy and numpy
PY.update({name: (lambda f: lambda *a: float(f(*a)))(f) for name, f in (
    ("expit", special.expit), ("logit", special.logit), ("gammaln", special.gammaln),
    ("digamma", special.psi), ("polygamma", lambda n, x: special.polygamma(round(n), x)),
    ("xlogy", special.xlogy), ("xlog1py", special.xlog1py), ("logaddexp", np.logaddexp),
    ("logaddexp2", np.logaddexp2), ("fmax", np.fmax), ("fmin", np.fmin))},
          pick=lambda a, b: 1.0 if a > b else (0.0 if a < b else 0.5))


def evaluate(text: str, **names: float) -> float:
    return eval(text, dict(PY), names)  # noqa: S307 (test expressions)


def outcome(text: str, point: dict[str, float]) -> object:
    """The value at the point, or the error it raises (a point outside acosh's domain)."""
    try:
        return evaluate(text, **point)
    except ValueError:
        return ValueError


TRICKY = ["x - (y - z)", "(x - y) - z", "x / (y * z)", "x / y / z", "-(x * y)", "-(-x)",
          "x * -1.0", "-x * y", "x - -y", "-(x - y) / z", "1e-08 * x", "pow(x, y - 1.0)",
          "hypot(x, 1.0) / (x + -2.5)"]


@pytest.mark.parametrize("text", TRICKY + [t for r in RULES for t in (r.value, *r.partials)])
def test_render_is_the_same_expression(text):
    point = {"x": 0.7, "y": 1.3, "z": -0.4}
    rendered = _expr.render(text)
    assert "--" not in rendered, "C would read -- as a decrement"
    assert _expr.parse(rendered) == _expr.parse(text)
    assert outcome(rendered, point) == outcome(text, point)


def test_table_strings_render_as_written():
    # the C the core is built from reads as the table does
    for rule in RULES:
        for text in (rule.value, *rule.partials):
            assert _expr.render(text, "c") == text


def test_float_kernels_get_float_literals():
    assert (_expr.render("1.0 / (x * 0.6931471805599453) + log2(x) - 1e-08", "opencl-float")
            == "1.0f / (x * 0.6931471805599453f) + log2(x) - 1e-08f")
    assert _expr.render("choose(x == m, g / n, 0.0)", "opencl-float") == \
        "choose(x == m, g / n, 0.0f)"


@pytest.mark.parametrize("text", ["x ** 2.0", "x if y else z", "x.real", "f(x=1.0)",
                                  "x < y < z", "'a'", "x +"])
def test_outside_the_language_is_rejected(text):
    with pytest.raises(ValueError):
        _expr.parse(text)


def test_variables_and_calls():
    assert _expr.variables("mul0(y, pow(x, y - 1.0))") == {"x", "y"}
    assert _expr.calls("mul0(y, pow(x, y - 1.0))") == {"mul0", "pow"}
    # a name inside a longer one (log2, expm1, dz) is not the variable
    assert _expr.variables("log2(dx) + expm1(zz)") == {"dx", "zz"}
    assert _expr.constant("-1.0") == -1.0 and _expr.constant("y") is None


def test_substitution_keeps_precedence():
    tree = _expr.substitute("1.0 / (3.0 * z * z)", {"z": "x + 1.0"})
    assert evaluate(_expr.render(tree), x=2.0) == 1.0 / (3.0 * 9.0)
    assert _expr.substitute("-z", {"z": "-x"}) == _expr.parse("x")


def test_helpers_used_come_from_the_expressions():
    used = {r.name: _expr.helpers_used(r) for r in RULES}
    assert used["pow"] == {"mul0"} and used["hypot"] == {"div0"} and used["abs"] == {"sign"}
    assert used["sin"] == frozenset()


@pytest.mark.parametrize("rule", [r for r in RULES if r.arity == 1], ids=lambda r: r.name)
def test_second_derivatives_of_unary_rules(rule):
    # the tangent of the partial along dx = 1 is f'': compare with a central difference of
    # the partial (itself checked against sympy in test_rules.py)
    x = {"asin": 0.3, "acos": 0.3, "atanh": 0.3, "acosh": 1.7}.get(rule.name, 0.7)
    z = evaluate(rule.value, x=x)
    second = evaluate(_expr.render(_expr.partial_tangent(rule, 0)), x=x, y=0.0, z=z,
                      dx=1.0, dy=0.0, dz=evaluate(rule.partials[0], x=x, z=z))
    h = 1e-5

    def partial(t):
        return evaluate(rule.partials[0], x=t, z=evaluate(rule.value, x=t))
    assert second == pytest.approx((partial(x + h) - partial(x - h)) / (2 * h), rel=1e-6,
                                   abs=1e-8)


def test_a_compound_row_does_not_rebind_a_call():
    # sinc's value starts with sin(: it must not become the rule that differentiates sin(),
    # or cos'' (the tangent of cos' = -sin(x)) silently uses sinc's partial
    sinc = Rule("sinc", "sin(x) / x", ("(cos(x) - z) / x",))
    table = RULES + (sinc,)
    calls = _expr.call_rules(table)
    assert calls["sin"] is RULES_BY_NAME["sin"] and "sinc" not in calls
    cos = RULES_BY_NAME["cos"]
    x = 0.7
    second = evaluate(_expr.render(_expr.partial_tangent(cos, 0, calls)),
                      x=x, y=0.0, z=math.cos(x), dx=1.0, dy=0.0, dz=-math.sin(x))
    assert second == pytest.approx(-math.cos(x), rel=1e-15)


def test_two_rows_defining_one_call_are_an_error():
    twin = dataclasses.replace(RULES_BY_NAME["sin"], name="sine")
    with pytest.raises(ValueError, match="both define sin"):
        _expr.call_rules(RULES + (twin,))
