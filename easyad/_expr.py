"""The expression language of the rule table, parsed once into a small tree.

Every reader of ``_rules.py``'s strings goes through here: the code generator (C for the
core), the OpenCL kernels, the numpy and pure-Python compilers, the symbolic tangents for
second-order sweeps and the Hessian sparsity. The language is what C99, OpenCL C and
Python share: float literals, the variables (``x``, ``y`` inputs, ``z`` the output, plus
whatever names a caller binds), unary ``-``, ``+ - * /``, one comparison, and calls of
named functions. ``**``, ``?:``, attributes, keywords... are rejected when parsed.

Trees are immutable and hashable; ``parse`` caches by text, so each string is parsed once.
Rendering prints the fewest parentheses C and Python agree on (they share the precedence
of these operators), so the C the core is built from reads as the table does.

Build-time and runtime alike: pure Python, no easyad imports beyond the table and the
constant printer (``_csyntax``).
"""
from __future__ import annotations

import ast
import functools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from . import _rules as rules
from ._csyntax import literal


# ---- the tree ----

@dataclass(frozen=True)
class Num:
    value: float


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Neg:
    operand: Node


@dataclass(frozen=True)
class Bin:
    op: str  # + - * / or a comparison < <= > >= == !=
    left: Node
    right: Node


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Node, ...]


Node = Num | Var | Neg | Bin | Call

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
            ast.NotEq: "!="}
# binding strength, as C and Python both have it for these operators
_PRECEDENCE = {"<": 1, "<=": 1, ">": 1, ">=": 1, "==": 1, "!=": 1, "+": 2, "-": 2,
               "*": 3, "/": 3}
_UNARY = 4


def _from_ast(node: ast.expr, text: str) -> Node:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return Num(float(node.value))
    if isinstance(node, ast.Name):
        return Var(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        operand = _from_ast(node.operand, text)
        return Num(-operand.value) if isinstance(operand, Num) else Neg(operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return Bin(_BINARY[type(node.op)], _from_ast(node.left, text),
                   _from_ast(node.right, text))
    if (isinstance(node, ast.Compare) and len(node.ops) == 1
            and type(node.ops[0]) in _COMPARE):
        return Bin(_COMPARE[type(node.ops[0])], _from_ast(node.left, text),
                   _from_ast(node.comparators[0], text))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords
            and not any(isinstance(a, ast.Starred) for a in node.args)):
        return Call(node.func.id, tuple(_from_ast(a, text) for a in node.args))
    raise ValueError(f"not in the rule expression language: {ast.unparse(node)!r} "
                     f"in {text!r}")


@functools.lru_cache(maxsize=None)
def parse(text: str) -> Node:
    """The tree of an expression (cached: each table string is parsed once)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"cannot parse the expression {text!r}: {e.msg}") from None
    return _from_ast(tree, text)


def _as_node(e: Node | str) -> Node:
    return parse(e) if isinstance(e, str) else e


def walk(e: Node | str) -> Iterator[Node]:
    """Every node of the tree, parents first."""
    stack = [_as_node(e)]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Neg):
            stack.append(node.operand)
        elif isinstance(node, Bin):
            stack += [node.right, node.left]
        elif isinstance(node, Call):
            stack += reversed(node.args)


def variables(e: Node | str) -> frozenset[str]:
    """The free variables an expression reads (x, y, z, g, dx...)."""
    return frozenset(n.name for n in walk(e) if isinstance(n, Var))


def calls(e: Node | str) -> frozenset[str]:
    """The names of the functions an expression calls."""
    return frozenset(n.name for n in walk(e) if isinstance(n, Call))


def constant(e: Node | str) -> float | None:
    """The number an expression is, if it is a literal ("1.0", "-1.0"), else None."""
    node = _as_node(e)
    return node.value if isinstance(node, Num) else None


def substitute(e: Node | str, mapping: Mapping[str, Node | str]) -> Node:
    """The expression with the variables of ``mapping`` replaced by the given trees."""
    return _substitute(_as_node(e), {k: _as_node(v) for k, v in mapping.items()})


def _substitute(node: Node, trees: Mapping[str, Node]) -> Node:
    # module-level recursion, not a closure: a recursive closure is a reference cycle
    if isinstance(node, Var):
        return trees.get(node.name, node)
    if isinstance(node, Neg):
        return neg(_substitute(node.operand, trees))
    if isinstance(node, Bin):
        return Bin(node.op, _substitute(node.left, trees), _substitute(node.right, trees))
    if isinstance(node, Call):
        return Call(node.name, tuple(_substitute(a, trees) for a in node.args))
    return node


# the strong zero's masks of x * y and x / y (1 where the product or quotient counts as 0
# and IEEE would not give it: 0 * inf, 0 / 0, 0 / NaN), as recorded programs compute them
STRONG_MUL_MASK = ("choose(x == 0.0, choose(y - y == 0.0, 0.0, 1.0), "
                   "choose(y == 0.0, choose(x - x == 0.0, 0.0, 1.0), 0.0))")
STRONG_DIV_MASK = "choose(x == 0.0, choose(y == 0.0, 1.0, choose(y == y, 0.0, 1.0)), 0.0)"


# ---- rendering ----

def _literal(v: float, real: str) -> str:
    """A number >= 0: Python's text, or for a C-family ``real`` the one constant printer's
    (the same text for a finite double). The language has no inf or NaN (C would print a
    macro that Python reads back as a variable): callers bind such numbers to names."""
    if not math.isfinite(v):
        raise ValueError(f"no literal for {v} in the expression language")
    return literal(v, real) if real else repr(float(v))


TARGETS = ("c", "python", "numpy", "opencl-float")
# the type of a target's literals ("": Python's)
_REAL = {"c": "double", "python": "", "numpy": "", "opencl-float": "float"}


def render(e: Node | str, target: str = "c") -> str:
    """The expression as source text for ``target``:

    - ``"c"``, ``"python"``, ``"numpy"``: the same text (C99 and Python agree on this
      language; numpy and Python compile it against their namespaces; C's numbers are
      printed by ``_csyntax.literal``, which gives Python's text for a double);
    - ``"opencl-float"``: float literals get an ``f`` (``_csyntax.literal``'s float), so a
      float32 kernel never computes in double (OpenCL double kernels use ``"c"``).

    Cached: kernels are rendered on every tensor operation.
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}")
    return _render_cached(e, _REAL[target])


@functools.lru_cache(maxsize=4096)
def _render_cached(e: Node | str, real: str) -> str:
    return _render(_as_node(e), real, 0, False)


def _render(node: Node, real: str, outer: int, right: bool) -> str:
    if isinstance(node, Num):
        text = _literal(abs(node.value), real)
        if math.copysign(1.0, node.value) < 0:  # a negative literal reads as unary -
            return f"(-{text})" if outer > _UNARY else f"-{text}"
        return text
    if isinstance(node, Var):
        return node.name
    if isinstance(node, Call):
        return f"{node.name}({', '.join(_render(a, real, 0, False) for a in node.args)})"
    if isinstance(node, Neg):
        # never "--x" (C's decrement): a negated negation keeps its parentheses
        operand = _render(node.operand, real, _UNARY, False)
        if operand.startswith("-"):
            operand = f"({operand})"
        return f"(-{operand})" if outer > _UNARY else f"-{operand}"
    p = _PRECEDENCE[node.op]
    # left-associative: a right operand of equal strength keeps its parentheses
    text = (f"{_render(node.left, real, p, False)} {node.op} "
            f"{_render(node.right, real, p, True)}")
    return f"({text})" if outer > p or (right and outer == p) else text


# ---- rules as calls: which table row defines a function name ----

def defined_call(rule: rules.Rule) -> str | None:
    """The function a rule's value is a bare call of (``fabs`` for abs, ``pow`` for pow),
    or None: operators (``x + y``) and compound values (``sin(x) / x``) define no call."""
    node = parse(rule.value)
    params = tuple(Var(n) for n in "xy"[:rule.arity])
    if isinstance(node, Call) and node.args == params:
        return node.name
    return None


def call_rules(table: Iterable[rules.Rule] = rules.RULES) -> dict[str, rules.Rule]:
    """Function name -> the row whose value is that call, over a table. Two rows defining
    one name is an error (the derivative of that call would be ambiguous)."""
    out: dict[str, rules.Rule] = {}
    for rule in table:
        name = defined_call(rule)
        if name is None:
            continue
        if name in out:
            raise ValueError(f"rules {out[name].name!r} and {rule.name!r} both define "
                             f"{name}()")
        out[name] = rule
    return out


def adjoint_map(partials: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A rule's adjoint kernel for the given partials: its expressions ``mul0(g, partial)``
    (``g`` for a partial of 1) and the values of the forward step they read, of x, y, z
    in that order (the kernel's names are those and then ``g``). The tensor layer records
    these; the fused C finds a row's float32 forms by them."""
    partials = tuple(partials)
    exprs = tuple("g" if constant(p) == 1.0 else f"mul0(g, {p})" for p in partials)
    saved = tuple(n for n in ("x", "y", "z") if any(n in variables(p) for p in partials))
    return exprs, saved


def helpers_used(rule: rules.Rule) -> frozenset[str]:
    """The helpers of ``rules.HELPERS`` a rule's expressions call (read off its trees)."""
    used: set[str] = set()
    for text in (rule.value, *rule.partials, *rule.float32):
        used |= calls(text)
    return frozenset(used & set(rules.HELPERS))


# ---- symbolic tangents (second-order sweeps) ----

ZERO, ONE = Num(0.0), Num(1.0)
_PIECEWISE_CONSTANT = frozenset({"sign", "heaviside", "pick"})  # derivative 0 almost everywhere


def _is(node: Node, v: float) -> bool:
    return isinstance(node, Num) and node.value == v


def neg(a: Node) -> Node:
    if isinstance(a, Num):
        return Num(-a.value)
    if isinstance(a, Neg):
        return a.operand
    return Neg(a)


def add(a: Node, b: Node) -> Node:
    if _is(a, 0):
        return b
    if _is(b, 0):
        return a
    return Bin("+", a, b)


def sub(a: Node, b: Node) -> Node:
    if _is(b, 0):
        return a
    if _is(a, 0):
        return neg(b)
    return Bin("-", a, b)


def _fold_product(a: Node, b: Node) -> Node | None:
    """a * b when a factor is 0 or +-1, else None."""
    if _is(a, 0) or _is(b, 0):
        return ZERO
    for one, other in ((a, b), (b, a)):
        if _is(one, 1):
            return other
        if _is(one, -1):
            return neg(other)
    return None


def mul(a: Node, b: Node) -> Node:
    folded = _fold_product(a, b)
    return folded if folded is not None else Bin("*", a, b)


def tmul(t: Node, a: Node) -> Node:
    """A tangent t times a factor a: a strong zero (0 * inf = 0), as first-order sweeps
    use, and lazy: the helper ``tmul`` skips computing a when t is 0 (a C macro), so the
    log(x) in the tangent of x ** c is never computed for a constant exponent."""
    folded = _fold_product(t, a)
    return folded if folded is not None else Call("tmul", (t, a))


def div(a: Node, b: Node) -> Node:
    if _is(a, 0):
        return ZERO
    if _is(b, 1):
        return a
    return Bin("/", a, b)


def tangent(e: Node | str, tangents: Mapping[str, Node],
            calls_by_name: Mapping[str, rules.Rule] | None = None) -> Node:
    """The directional derivative of ``e`` given the tangents of its variables.

    A call ``f(u, v)`` is differentiated by the rule that defines ``f`` (``call_rules``
    of the table, or of the mapping given): its partials at ``(u, v)`` times ``du, dv``.
    """
    by_name = call_rules() if calls_by_name is None else calls_by_name
    return _tangent(_as_node(e), tangents, by_name)


def _tangent(node: Node, tangents: Mapping[str, Node],
             by_name: Mapping[str, rules.Rule]) -> Node:
    def go(n: Node) -> Node:
        return _tangent(n, tangents, by_name)

    if isinstance(node, Num):
        return ZERO
    if isinstance(node, Var):
        return tangents.get(node.name, ZERO)
    if isinstance(node, Neg):
        return neg(go(node.operand))
    if isinstance(node, Bin):
        a, b = node.left, node.right
        if node.op == "+":
            return add(go(a), go(b))
        if node.op == "-":
            return sub(go(a), go(b))
        if node.op == "*":
            return add(tmul(go(a), b), tmul(go(b), a))
        if node.op == "/":  # (da - (a/b) db) / b
            return div(sub(go(a), tmul(go(b), div(a, b))), b)
        raise ValueError(f"cannot differentiate the comparison {render(node)!r}")
    name, args = node.name, node.args
    if name in _PIECEWISE_CONSTANT:
        return ZERO
    if name in ("mul0", "tmul"):  # strong-zero product: its tangent keeps the zeros
        a, b = args
        return add(tmul(go(a), b), tmul(go(b), a))
    if name == "div0":  # a/b with 0/0 = 0: the quotient rule, zero where a is 0
        a, b = args
        return Call("div0", (sub(go(a), mul(div(a, b), go(b))), b))
    rule = by_name.get(name)
    if rule is None:
        raise ValueError(f"no rule differentiates the call {name}() in an expression")
    if rule.name == "pow" and isinstance(args[1], Num):
        # d(u^c) = c u^(c-1) du: skips the log(u) term, which is NaN for negative u
        c = args[1].value
        return tmul(go(args[0]), mul(Num(c), Call("pow", (args[0], Num(c - 1.0)))))
    bound = {"x": args[0], "y": args[1] if len(args) > 1 else ZERO, "z": node}
    total: Node = ZERO
    for k, partial in enumerate(rule.partials):
        d_arg = go(args[k])
        if not _is(d_arg, 0):
            total = add(total, tmul(d_arg, substitute(partial, bound)))
    return total


def partial_tangent(rule: rules.Rule, k: int,
                    calls_by_name: Mapping[str, rules.Rule] | None = None) -> Node:
    """Tangent of ``rule.partials[k]`` along (dx, dy), with dz the output's tangent."""
    tangents: dict[str, Node] = {"x": Var("dx"), "z": Var("dz")}
    if rule.arity == 2:
        tangents["y"] = Var("dy")
    return tangent(rule.partials[k], tangents, calls_by_name)
