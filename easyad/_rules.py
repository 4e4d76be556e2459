"""THE table of derivative rules: every elementary operation of easyad, once, as data.

Nothing else in easyad restates a formula, or any other per-function fact: a row also
carries the function's spellings in numpy, torch and sympy. ``_expr.py`` parses the strings
(once); the build-time generator ``codegen/`` renders the table into the Cython core
(Trace arithmetic, Record recording, the tape's opcodes), ``_expressions.py`` compiles the
same strings against Python and numpy namespaces, the tensor kernels render them to OpenCL
C; the stubs, docs lists and tests are rendered from or checked against it. Adding a
function is one row here (plus one helper in ``_helpers.h`` if C lacks the function): see
docs/internals.md.

Expression language (shared by C99, OpenCL C, Cython and Python/numpy): ``+ - * /``,
parentheses, float literals and calls of functions every target defines under one name.
``x`` and ``y`` are the inputs, ``z`` the op's output (so ``exp`` reuses its value).
Piecewise conventions go through helpers defined by every target (see ``HELPERS``).

This module is pure data: it imports nothing from easyad.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import inf

# Error policies: how a value is checked so every mode raises what Python's floats raise.
NO_CHECK = "none"        # + - * and friends: IEEE results, no exception (like float)
MATH = "math"            # like the math module: NaN from non-NaN input -> ValueError,
                         # inf from finite input -> ValueError ("math domain error")
MATH_OVERFLOW = "math_overflow"  # same, but inf from finite input -> OverflowError
DIVISION = "division"    # division by zero -> ZeroDivisionError
POWER = "power"          # float ** / math.pow rules (zero base, negative base, overflow)

# Helpers the expressions may call besides math.h: name -> meaning (every target defines them).
HELPERS = {
    "sign": "sign(t): -1, 0 or 1; sign(0) = 0 (the subgradient chosen for abs at 0)",
    "heaviside": "heaviside(t): 0 for t < 0, 1/2 at t = 0, 1 for t > 0 (ties split evenly)",
    "mul0": "mul0(a, b): a*b, but 0 when either is 0, even against inf or NaN (strong zero)",
    "div0": "div0(a, b): a/b, but 0 when a is 0 (0/0 counts as 0)",
    "maximum": "maximum(a, b): the larger, NaN if either is NaN (numpy's rule)",
    "minimum": "minimum(a, b): the smaller, NaN if either is NaN",
    "pick": "pick(a, b): the share of a in fmax(a, b): 1 where a > b or only b is NaN, 0 "
            "where a < b or only a is NaN, 1/2 at a tie, NaN where both are NaN",
}


# A spelling field left at SAME means: the library calls the function by the rule's name.
SAME = ""


@dataclass(frozen=True)
class Rule:
    """One elementary operation: its value and its partial derivatives, as expressions.

    Spellings: ``numpy`` is the name of numpy's ufunc computing exactly this value (None:
    numpy has none, arrays go elementwise through easyad); ``torch`` and ``sympy`` are the
    library's function name, or the value as an expression in ``x``, ``y`` over that
    library's namespace (None: the library has no such function). The tests check every
    spelling against the value on sample points, so a wrong or forgotten one fails loudly
    (numpy's ``sinc`` is the normalised sin(pi x)/(pi x): a ``sinc`` row needs numpy=None).
    """

    name: str                      # Python math name; the generic function ad.<name>
    value: str                     # value expression in x (and y)
    partials: tuple[str, ...]      # d value / d x (, d value / d y); may use z
    errors: str = MATH             # error policy (see above)
    domain: tuple[tuple[float, float], ...] = ((-inf, inf),)  # open interval per input
    aliases: tuple[str, ...] = ()  # other spellings (numpy's), same function
    operator: str = ""             # the Python operator dunder base it serves, if any
    doc: str = ""                  # one line for docstrings
    generic: bool = True           # ad.<name> exists (False: served by an operator only)
    numpy: str | None = SAME       # numpy's ufunc (see above)
    torch: str | None = SAME       # torch's function or expression
    sympy: str | None = SAME       # sympy's function or expression
    # True for a row whose partials are deliberately not its value's derivative
    # (stop_gradient): references that differentiate the value (finite differences,
    # sympy, torch's autograd of the value) do not apply to it
    stops_gradient: bool = False
    # True for a row whose first input is an integer order (polygamma's n): rounded to the
    # nearest integer, so the value is flat in it (partial 0); references that
    # differentiate the value in it do not apply
    integer_order: bool = False
    # The row's forms for float32 programs, (value, partial, ...): the same function in
    # exact math (tests/test_float32_forms.py checks it numerically against the row's own),
    # written to be accurate when evaluated in float, which the fused C then does (float
    # arithmetic, libm's and libmvec's f functions) instead of computing the row's own forms
    # in double and rounding. A partial may read only what the row's own partial reads (the
    # recording saves that). docs/record-replay.md states the error in float32 ulps.
    # Empty: float32 programs compute the row's own forms in double.
    float32: tuple[str, ...] = ()

    @property
    def arity(self) -> int:
        return len(self.partials)

    def spelling(self, library: str) -> str | None:
        """The rule's spelling in "numpy", "torch" or "sympy" (its name where the row
        leaves it at SAME), or None where the library lacks the function."""
        given = getattr(self, library)
        return self.name if given == SAME else given


REAL = (-inf, inf)
POSITIVE = (0.0, inf)
OPEN_UNIT = (-1.0, 1.0)

_LN2 = "0.6931471805599453"
_LN10 = "2.302585092994046"
_TWO_OVER_SQRT_PI = "1.1283791670955126"

UNARY_RULES: tuple[Rule, ...] = (
    Rule("neg", "-x", ("-1.0",), NO_CHECK, generic=False, operator="neg", doc="negation -x",
         numpy="negative", sympy="-x"),
    Rule("sin", "sin(x)", ("cos(x)",), doc="sine"),
    Rule("cos", "cos(x)", ("-sin(x)",), doc="cosine"),
    Rule("tan", "tan(x)", ("1.0 + z * z",), doc="tangent"),
    Rule("asin", "asin(x)", ("1.0 / sqrt(1.0 - x * x)",), domain=(OPEN_UNIT,),
         aliases=("arcsin",), doc="inverse sine", numpy="arcsin"),
    Rule("acos", "acos(x)", ("-1.0 / sqrt(1.0 - x * x)",), domain=(OPEN_UNIT,),
         aliases=("arccos",), doc="inverse cosine", numpy="arccos"),
    Rule("atan", "atan(x)", ("1.0 / (1.0 + x * x)",), aliases=("arctan",), doc="inverse tangent",
         numpy="arctan"),
    Rule("sinh", "sinh(x)", ("cosh(x)",), MATH_OVERFLOW, doc="hyperbolic sine"),
    Rule("cosh", "cosh(x)", ("sinh(x)",), MATH_OVERFLOW, doc="hyperbolic cosine"),
    # 1/cosh^2 rather than 1 - z*z, which cancels to nothing as |x| grows (tanh'(20) ~ 2e-17).
    # float32: tanhf (libmvec's where the loop vectorises), and the slope as 4e/(1+e)^2 with
    # e = exp(-2|x|) (= 1/cosh^2 x exactly; -2|x| is exact, e in (0, 1] never overflows):
    # one expf, a few ulps everywhere, where 1 - z*z in float is 0 past |x| ~ 9
    Rule("tanh", "tanh(x)", ("1.0 / (cosh(x) * cosh(x))",), doc="hyperbolic tangent",
         float32=("tanh(x)", "4.0 * exp(-2.0 * fabs(x)) / ((1.0 + exp(-2.0 * fabs(x)))"
                             " * (1.0 + exp(-2.0 * fabs(x))))")),
    # hypot(x, 1) = sqrt(x*x + 1) without overflow for large x
    Rule("asinh", "asinh(x)", ("1.0 / hypot(x, 1.0)",), aliases=("arcsinh",),
         doc="inverse hyperbolic sine", numpy="arcsinh"),
    # sqrt(x-1)*sqrt(x+1) keeps accuracy near x = 1, where x*x - 1 cancels
    Rule("acosh", "acosh(x)", ("1.0 / (sqrt(x - 1.0) * sqrt(x + 1.0))",), domain=((1.0, inf),),
         aliases=("arccosh",), doc="inverse hyperbolic cosine", numpy="arccosh"),
    Rule("atanh", "atanh(x)", ("1.0 / ((1.0 - x) * (1.0 + x))",), domain=(OPEN_UNIT,),
         aliases=("arctanh",), doc="inverse hyperbolic tangent", numpy="arctanh"),
    Rule("exp", "exp(x)", ("z",), MATH_OVERFLOW, doc="exponential (the partial reuses z)"),
    Rule("expm1", "expm1(x)", ("exp(x)",), MATH_OVERFLOW, doc="exp(x) - 1, accurate near 0",
         sympy="exp(x) - 1"),
    Rule("log", "log(x)", ("1.0 / x",), domain=(POSITIVE,), aliases=("ln",),
         doc="natural logarithm"),
    Rule("log2", "log2(x)", (f"1.0 / (x * {_LN2})",), domain=(POSITIVE,), doc="base-2 logarithm",
         sympy="log(x) / log(2)"),
    Rule("log10", "log10(x)", (f"1.0 / (x * {_LN10})",), domain=(POSITIVE,),
         doc="base-10 logarithm", sympy="log(x) / log(10)"),
    Rule("log1p", "log1p(x)", ("1.0 / (1.0 + x)",), domain=((-1.0, inf),),
         doc="log(1 + x), accurate near 0", sympy="log(1 + x)"),
    # sqrt'(0) = +inf, the one-sided limit, at -0.0 too (sqrt(-0.0) is -0.0, and z + 0.0
    # is +0.0); mul0 keeps it out of unselected where() branches
    Rule("sqrt", "sqrt(x)", ("0.5 / (z + 0.0)",), domain=(POSITIVE,), doc="square root"),
    # torch has no cube root: the sign-aware power (differentiable away from 0); sympy's
    # cbrt is the principal (complex) root for x < 0, so the real root piecewise
    Rule("cbrt", "cbrt(x)", ("1.0 / (3.0 * z * z)",), doc="cube root",
         torch="sign(x) * pow(abs(x), 1.0 / 3.0)",
         sympy="Piecewise((x ** Rational(1, 3), x >= 0), (-((-x) ** Rational(1, 3)), True))"),
    Rule("abs", "fabs(x)", ("sign(x)",), NO_CHECK, aliases=("absolute",),
         operator="abs", doc="absolute value; abs'(0) = 0", numpy="absolute",
         sympy="Abs"),
    # numpy has no erf ufunc: arrays go elementwise through easyad
    Rule("erf", "erf(x)", (f"{_TWO_OVER_SQRT_PI} * exp(-x * x)",), doc="error function",
         numpy=None),
)

BINARY_RULES: tuple[Rule, ...] = (
    Rule("add", "x + y", ("1.0", "1.0"), NO_CHECK, (REAL, REAL), generic=False,
         operator="add", doc="x + y", sympy="x + y"),
    Rule("sub", "x - y", ("1.0", "-1.0"), NO_CHECK, (REAL, REAL), generic=False,
         operator="sub", doc="x - y", numpy="subtract", sympy="x - y"),
    Rule("mul", "x * y", ("y", "x"), NO_CHECK, (REAL, REAL), generic=False,
         operator="mul", doc="x * y", numpy="multiply", sympy="x * y"),
    Rule("div", "x / y", ("1.0 / y", "-z / y"), DIVISION, (REAL, REAL), generic=False,
         operator="truediv", doc="x / y", numpy="divide", sympy="x / y"),
    # Zero base: d/dx is 0 when y = 0 (0**0 = 1 is flat in x); d/dy is 0 at x = 0, y > 0.
    # Negative base: d/dy is NaN (x**y is not real-differentiable in y there).
    Rule("pow", "pow(x, y)", ("mul0(y, pow(x, y - 1.0))", "mul0(z, log(x))"), POWER,
         (POSITIVE, REAL), aliases=("power",), operator="pow", doc="x ** y", numpy="power",
         sympy="Pow"),
    # over hypot twice, not x*x + y*y, which underflows (inf at 1e-300) or overflows (0)
    Rule("atan2", "atan2(x, y)", ("y / hypot(x, y) / hypot(x, y)",
                                  "-x / hypot(x, y) / hypot(x, y)"), NO_CHECK,
         (REAL, REAL), aliases=("arctan2",),
         doc="angle of the point (y, x): atan2(x, y) = atan(x/y)", numpy="arctan2"),
    # hypot'(0, 0) = (0, 0), the subgradient, as for abs
    Rule("hypot", "hypot(x, y)", ("div0(x, z)", "div0(y, z)"), MATH_OVERFLOW, (REAL, REAL),
         doc="sqrt(x*x + y*y) without overflow", sympy="sqrt(x * x + y * y)"),
    Rule("maximum", "maximum(x, y)", ("heaviside(x - y)", "heaviside(y - x)"), NO_CHECK,
         (REAL, REAL), doc="larger of x and y; ties split the derivative", sympy="Max"),
    Rule("minimum", "minimum(x, y)", ("heaviside(y - x)", "heaviside(x - y)"), NO_CHECK,
         (REAL, REAL), doc="smaller of x and y; ties split the derivative", sympy="Min"),
)

# The value as a constant: derivative 0 in every mode and every order, so replay and
# compiled code treat it as a constant of the point replayed at, not a baked-in number
# (JAX's stop_gradient, torch's detach). Its value calls itself (a macro for x in
# _helpers.h) so that on a Trace of Traces or Records the inner levels stop too. Last in
# the table: the opcodes of the rows above (in saved files) keep their numbers.
STOP_GRADIENT = Rule("stop_gradient", "stop_gradient(x)", ("0.0",), NO_CHECK,
                     aliases=("detach",), doc="x as a constant: no derivative flows through it",
                     numpy="positive", torch="detach", sympy=None, stops_gradient=True)

# ---- SciPy's special functions and numpy's other float ufuncs (issue 26) ----
# After stop_gradient, so the opcodes above keep their numbers. scipy.special's names are
# the rows' names or aliases, so scipy's ufuncs on easyad numbers dispatch to them
# (``__array_ufunc__``); their C is in _helpers.h where math.h lacks the function.
# Errors: erfc (a math-module name) raises as math does (never); scipy's and numpy's
# functions give IEEE values (inf, NaN) as scipy and numpy do (NO_CHECK).
SPECIAL_UNARY_RULES: tuple[Rule, ...] = (
    Rule("erfc", "erfc(x)", (f"-{_TWO_OVER_SQRT_PI} * exp(-x * x)",),
         doc="complementary error function 1 - erf(x), accurate for large x", numpy=None),
    # expit(x) expit(-x), not z (1 - z): 1 - z is 0 for x > 37 while the slope is e^-x
    Rule("expit", "expit(x)", ("expit(x) * expit(-x)",), NO_CHECK,
         doc="the logistic function 1 / (1 + exp(-x)), without overflow", numpy=None,
         torch="sigmoid", sympy="1 / (1 + exp(-x))"),
    Rule("logit", "logit(x)", ("1.0 / (x * (1.0 - x))",), NO_CHECK, ((0.0, 1.0),),
         doc="log(x / (1 - x)), the inverse of expit; -inf at 0, inf at 1", numpy=None,
         sympy="log(x / (1 - x))"),
    # log|gamma(x)|, C's lgamma (not named lgamma: Python's math.lgamma is CPython's own
    # algorithm, an ulp apart, and raises at the poles where scipy gives inf)
    Rule("gammaln", "gammaln(x)", ("digamma(x)",), NO_CHECK, (POSITIVE,),
         doc="log of the absolute value of the gamma function; inf at the poles",
         numpy=None, torch="lgamma", sympy="loggamma"),
    # every derivative through polygamma: digamma' = polygamma(1, x), polygamma's own
    # x-partial is polygamma(n + 1, x), so any order (Taylor mode too) is one more call
    # torch=None: torch's digamma' (its trigamma) is good to ~1e-9 only; sympy checks it
    Rule("digamma", "digamma(x)", ("polygamma(1.0, x)",), NO_CHECK, (POSITIVE,),
         aliases=("psi",), doc="the digamma function gamma'(x) / gamma(x)", numpy=None,
         torch=None),
)
SPECIAL_BINARY_RULES: tuple[Rule, ...] = (
    # n is an integer order: rounded to the nearest (floor(n + 1/2)), so the value is
    # flat in n (partial 0); ad.scipy.special.polygamma refuses a non-integer n
    Rule("polygamma", "polygamma(x, y)", ("0.0", "polygamma(x + 1.0, y)"), NO_CHECK,
         ((0.6, 4.4), POSITIVE), integer_order=True,
         doc="the n-th derivative of digamma, polygamma(n, x) (n rounded to an integer)",
         numpy=None, torch=None, sympy="polygamma(floor(x + 0.5), y)"),
    # 0 where x == 0 (y not NaN), as scipy; d/dx = log(y) there too (the limit from
    # either side), d/dy = x / y with 0/0 = 0 (div0: flat in y along x = 0)
    Rule("xlogy", "xlogy(x, y)", ("log(y)", "div0(x, y)"), NO_CHECK, (REAL, POSITIVE),
         doc="x * log(y), 0 where x == 0", numpy=None, sympy="x * log(y)"),
    Rule("xlog1py", "xlog1py(x, y)", ("log1p(y)", "div0(x, 1.0 + y)"), NO_CHECK,
         (REAL, (-1.0, inf)), doc="x * log1p(y), 0 where x == 0", numpy=None,
         torch="special.xlog1py(x, y)", sympy="x * log(1 + y)"),
    # the partials are softmax weights: 1/2 each at a tie, never overflowing
    Rule("logaddexp", "logaddexp(x, y)", ("expit(x - y)", "expit(y - x)"), NO_CHECK,
         (REAL, REAL), doc="log(exp(x) + exp(y)) without overflow",
         sympy="log(exp(x) + exp(y))"),
    Rule("logaddexp2", "logaddexp2(x, y)", (f"expit((x - y) * {_LN2})",
                                            f"expit((y - x) * {_LN2})"), NO_CHECK,
         (REAL, REAL), doc="log2(2**x + 2**y) without overflow",
         sympy="log(2**x + 2**y) / log(2)"),
    # |x| with y's sign bit: d/dx = sign(x) times y's sign (0 at x = 0, abs's subgradient);
    # d/dy = 0 (flat but for the jump at y = 0)
    Rule("copysign", "copysign(x, y)", ("sign(x) * copysign(1.0, y)", "0.0"),
         NO_CHECK, (REAL, REAL), doc="abs(x) with the sign of y",
         sympy="Piecewise((Abs(x), y >= 0), (-Abs(x), True))"),
    # numpy's fmax/fmin: a NaN operand is ignored; at a tie the first operand (its sign of
    # zero) and the derivative split 1/2 each, as maximum's (docs/conventions.md)
    Rule("fmax", "fmax(x, y)", ("pick(x, y)", "pick(y, x)"), NO_CHECK, (REAL, REAL),
         doc="larger of x and y, ignoring a NaN; ties split the derivative", sympy="Max"),
    Rule("fmin", "fmin(x, y)", ("pick(-x, -y)", "pick(-y, -x)"), NO_CHECK, (REAL, REAL),
         doc="smaller of x and y, ignoring a NaN; ties split the derivative", sympy="Min"),
)

RULES: tuple[Rule, ...] = (UNARY_RULES + BINARY_RULES + (STOP_GRADIENT,)
                           + SPECIAL_UNARY_RULES + SPECIAL_BINARY_RULES)
RULES_BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}
# The rows whose partials are their value's derivatives in every input (all but
# stop_gradient and polygamma): the ones references that differentiate the value (finite
# differences, sympy, torch) can check.
DIFFERENTIATED_RULES: tuple[Rule, ...] = tuple(
    r for r in RULES if not r.stops_gradient and not r.integer_order)

# Structural opcodes: tape entries that are not a rule row. Then the rules, in table order.
# A comparison is recorded with its outcome as the entry's value; it becomes a guard when
# Python branched on it (bool()), so replay at a new point can see the branch change.
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
COMPARISON_SYMBOLS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
STRUCTURAL = (
    "variable",   # an input: its value is set, not computed
    "constant",   # reserved: a value only
    "node",       # a Python node (a tensor operation): backward through node.vjp()
    "custom",     # a user-defined scalar primitive (ad.primitive): partials cached, replay calls it
    "select",     # where(cond, a, b): its condition is the comparison entry just before it
    *(f"compare_{c}" for c in COMPARISONS),  # evaluated on replay, used by a select
    *(f"guard_{c}" for c in COMPARISONS),    # a Python branch: replay checks its outcome
)
STRUCTURAL_OPCODES: dict[str, int] = {name: code for code, name in enumerate(STRUCTURAL)}
OP_VARIABLE = STRUCTURAL_OPCODES["variable"]
OP_CONSTANT = STRUCTURAL_OPCODES["constant"]
FIRST_RULE_OPCODE = len(STRUCTURAL)
OPCODES: dict[str, int] = {r.name: FIRST_RULE_OPCODE + i for i, r in enumerate(RULES)}
OPCODE_NAMES: tuple[str, ...] = STRUCTURAL + tuple(r.name for r in RULES)
assert len(OPCODE_NAMES) <= 256, "opcodes are stored in one byte"
