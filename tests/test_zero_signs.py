"""The ``+ 0.0`` the generated loops leave out (easyad/tensor/_zero_signs.py) change no bit
of any value a reader can see: checked on random expressions over signed zeros,
subnormals, infinities and NaN, and on recorded programs replayed with and without it."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

import easyad as ad
from easyad import _expr
from easyad.tensor import _zero_signs

SPECIAL = [0.0, -0.0, 5e-324, -5e-324, 1e-300, -1e-300, 1.0, -2.5, 3.0, 1e300, -1e300,
           np.inf, -np.inf, np.nan]


def _c_like() -> dict:
    """The helpers as _helpers.h computes them, signed zeros included (numpy's sign gives
    +0 for -0, C's gives the argument back)."""
    def mul0(a, b):
        return np.where((a == 0) | (b == 0), 0.0, a * b)

    def div0(a, b):
        return np.where(a == 0, 0.0, a / b)

    def sign(t):
        return np.where(t > 0, 1.0, np.where(t < 0, -1.0, t))

    def heaviside(t):
        return np.where(t > 0, 1.0, np.where(t < 0, 0.0, np.where(t == 0, 0.5, t)))

    def choose(c, a, b):
        return np.where(c, a, b)
    return {"mul0": mul0, "div0": div0, "sign": sign, "heaviside": heaviside,
            "choose": choose, "sin": np.sin, "exp": np.exp, "sqrt": np.sqrt}


NS = _c_like()


def _random_tree(rng: random.Random, depth: int) -> _expr.Node:
    if depth == 0 or rng.random() < 0.2:
        if rng.random() < 0.7:
            return _expr.Var(rng.choice("xy"))
        return _expr.Num(rng.choice([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 100.0]))
    kind = rng.randrange(9)
    sub = lambda: _random_tree(rng, depth - 1)  # noqa: E731
    if kind == 0:
        return _expr.Bin("+", sub(), _expr.Num(0.0))            # a sign fix
    if kind == 1:
        return _expr.Neg(sub())
    if kind == 2:
        return _expr.Bin(rng.choice("+-*/"), sub(), sub())
    if kind == 3:
        return _expr.Call("mul0", (sub(), sub()))
    if kind == 4:
        return _expr.Call("div0", (sub(), sub()))
    if kind == 5:
        return _expr.Call(rng.choice(["sign", "heaviside", "sin", "exp", "sqrt"]), (sub(),))
    if kind == 6:
        return _expr.Call("choose", (_expr.Bin(rng.choice(["<", ">="]), sub(), sub()),
                                     sub(), sub()))
    if kind == 7:
        return _expr.Bin("+", sub(), _expr.Bin("+", sub(), _expr.Num(0.0)))
    return _expr.Bin("+", _expr.Bin("*", _expr.Num(rng.choice([2.0, -1.0, 100.0])), sub()),
                     _expr.Num(0.0))


def _numbers_as_names(node: _expr.Node, names: dict) -> _expr.Node:
    """Numbers as variables bound to numpy scalars (Python floats raise on 1.0 / 0.0)."""
    if isinstance(node, _expr.Num):
        name = f"c{len(names)}"
        names[name] = np.float64(node.value)
        return _expr.Var(name)
    if isinstance(node, _expr.Neg):
        return _expr.Neg(_numbers_as_names(node.operand, names))
    if isinstance(node, _expr.Bin):
        return _expr.Bin(node.op, _numbers_as_names(node.left, names),
                         _numbers_as_names(node.right, names))
    if isinstance(node, _expr.Call):
        return _expr.Call(node.name, tuple(_numbers_as_names(a, names) for a in node.args))
    return node


def _eval(tree: _expr.Node, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    names: dict = {"x": x, "y": y}
    text = _expr.render(_numbers_as_names(tree, names), "python")
    with np.errstate(all="ignore"):
        out = eval(text, dict(NS), names)
    return np.broadcast_to(np.asarray(out, dtype=np.float64), x.shape)


def _bits(a: np.ndarray) -> np.ndarray:
    """The bits, every NaN alike (leaving out + 0.0 moves no NaN, but the comparison
    should not hinge on payloads)."""
    a = np.where(np.isnan(a), np.nan, a)
    return a.view(np.uint64)


def _grid(y_fixed: bool) -> tuple[np.ndarray, np.ndarray]:
    x, y = (a.ravel() for a in np.meshgrid(SPECIAL, SPECIAL))
    if y_fixed:
        y = y + 0.0          # y is never -0 (as a register ending in + 0.0 is)
    return x, y


@pytest.mark.parametrize("seed", range(40))
def test_stripped_expressions_keep_every_visible_bit(seed):
    """For random expressions: the stripped tree, read exactly, has the original's bits;
    read absorbed, the same up to the sign of zero; and a variable the strip says is
    absorbed can have its zero's sign flipped without changing a bit."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(60):
        tree = _random_tree(rng, 4)
        for y_fixed in (False, True):
            fixed = {"y": True} if y_fixed else {}
            x, y = _grid(y_fixed)
            want = _eval(tree, x, y)
            reads: dict[str, bool] = {}
            exact = _zero_signs.strip(tree, False, fixed, reads)
            assert (_bits(_eval(exact, x, y)) == _bits(want)).all(), (tree, exact)
            absorbed = _zero_signs.strip(tree, True, fixed, {})
            assert (_bits(_eval(absorbed, x, y) + 0.0) == _bits(want + 0.0)).all(), tree
            for name, free in reads.items():
                if not free:
                    continue
                flipped = {"x": x, "y": y}
                v = flipped[name]
                flipped[name] = np.where(v == 0, np.copysign(0.0, -np.copysign(1.0, v)), v)
                if name == "y" and y_fixed:
                    continue          # y's value must stay never -0
                got = _eval(exact, flipped["x"], flipped["y"])
                assert (_bits(got) == _bits(want)).all(), (tree, exact, name)
                checked += 1
    assert checked > 20            # the flips were tried


def test_a_sign_fix_is_left_out_where_nothing_reads_it():
    """mul0 and a sum with + 0.0 absorb; a denominator and a call do not."""
    x = _expr.Var("x")
    fix = _expr.Bin("+", _expr.Bin("*", _expr.Num(2.0), x), _expr.Num(0.0))
    assert _zero_signs.strip(_expr.Call("mul0", (fix, x)), False, {}, {}) == \
        _expr.Call("mul0", (_expr.Bin("*", _expr.Num(2.0), x), x))
    kept = _expr.Bin("/", _expr.Num(1.0), fix)
    assert _zero_signs.strip(kept, False, {}, {}) == kept
    called = _expr.Call("sin", (fix,))
    assert _zero_signs.strip(called, True, {}, {}) == called


def _rosen(x):
    return (100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2).sum()


def _mixed(x):
    y = ad.where(x > 0.0, x * 3.0, -x) * ad.maximum(x, 0.5) / (1.0 + x * x)
    return y.sum() + (x[1:] * x[:-1]).mean() + (2.0 * x - x * x * x).sum() \
        + (abs(x) * ad.sin(x)).sum()


def _replayed(f, x0, points, strip):
    old = _zero_signs.STRIP
    _zero_signs.STRIP = strip
    try:
        F = ad.record(f, x0, tensor=True)
        out = [(F(x), F.gradient(x)) for x in points]
        return out, F._bound["gradient"].source
    finally:
        _zero_signs.STRIP = old


@pytest.mark.parametrize("f", [_rosen, _mixed])
def test_replayed_programs_are_bit_identical_with_and_without_the_fixes(f):
    """Values and gradients of recorded programs at points full of signed zeros,
    subnormals and huge values: the same bits with every + 0.0 kept and with the
    invisible ones left out; and fewer are left in the loop."""
    rng = np.random.default_rng(7)
    x0 = rng.uniform(-1.0, 1.5, 33)
    points = [x0]
    for _ in range(4):
        x = rng.choice(np.array(SPECIAL[:11] + [0.25, -0.75]), 33)
        points.append(x)
    points.append(-np.zeros(33))
    points.append(np.zeros(33))
    stripped, lean = _replayed(f, x0, points, True)
    kept, full = _replayed(f, x0, points, False)
    for (v1, g1), (v2, g2) in zip(stripped, kept):
        assert _bits(np.asarray(v1, dtype=np.float64)) == _bits(np.asarray(v2, np.float64))
        assert (_bits(np.asarray(g1)) == _bits(np.asarray(g2))).all()
    assert lean.count("+ 0.0") < full.count("+ 0.0")


def test_rosenbrock_keeps_one_sign_fix_per_gradient_element():
    """Rosenbrock's gradient loop: one + 0.0 per element of the main run (was six)."""
    x0 = np.linspace(-1.0, 1.5, 50)
    _, source = _replayed(_rosen, x0, [x0], True)
    # loops over i, or over blocks of 8 lanes (a loop with a sum to one number)
    body = source[source.index("void easyad_segment_0"):]
    loops = re.split(r"for \(long (?:i|block) = ", body)[1:]
    main = max(loops, key=len)
    assert "p0[i - 1]" in main or "j0" in main      # reads both neighbours
    assert main.count("+ 0.0") == 1, main
