"""The replayed batched Jacobian's per-call work (issue 27): a strong zero's mask that a
constant operand makes 0 everywhere is dropped by the optimiser (with its where), masks
are int registers in the generated C (gcc 12 vectorises no loop computing an unsigned
char from a double), and a slice of an input is planned first so the loops of one shape
after it join; values bit for bit the unoptimised replay's, and the hand-derived
Jacobian's."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import easyad as ad
from easyad import _expr
from easyad.compiler import ir
from easyad.compiler import optimiser as passes
from easyad.tensor._program import BoundProgram


def _recorded(A, c, batch, rng):
    def f(v):
        return ad.tanh(A @ v + c) * v[0]
    x = rng.normal(size=(batch, A.shape[1]))
    return ad.record(ad.vmap(ad.jacobian(f, mode="forward")), x, tensor=True), x


def _by_hand(A, c, x):
    """J[b] = diag(1 - tanh(z)^2) A x0 + tanh(z) e_0^T, z = A x_b + c."""
    t = np.tanh(x @ A.T + c)
    J = (1.0 - t * t)[:, :, None] * A[None] * x[:, :1, None]
    J[:, :, 0] += t
    return J


def _masks(program):
    return [i for i in program.instructions
            if i.op == "map" and _expr.STRONG_MUL_MASK in i.params.exprs]


def _unoptimised(F):
    rec = F._recordings["first"]

    def run(program, outs, x):
        def on_guard(value, recorded):
            raise AssertionError("no guard here")
        bound = BoundProgram(program, F._backend, outs, on_guard)
        extra = [np.zeros(())] * (len(program.inputs) - 1)
        return np.asarray(bound.run([x, *extra])[0])
    return rec.program, list(rec.outputs), run


def _same_bits(a, b):
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # (inf - inf in the products)
@pytest.mark.parametrize("zero_column", [False, True])
def test_masks_of_nonzero_constants_go_bit_for_bit(zero_column):
    rng = np.random.default_rng(3)
    n, batch = 5, 4
    A, c = rng.normal(size=(n, n)) / 2.0, rng.normal(size=n)
    if zero_column:           # A e_2 = 0: its products keep their strong zeros
        A[:, 2] = 0.0
    F, x = _recorded(A, c, batch, rng)
    program, outputs, run = _unoptimised(F)
    optimised, outs = passes.optimise_program(program, outputs)
    dropped = len(_masks(program)) - len(_masks(optimised))
    assert dropped == (0 if zero_column else 1), (len(_masks(program)),
                                                  len(_masks(optimised)))
    # where the strong zero decides: z = inf - inf is NaN, 0 * NaN counts as 0
    special = x.copy()
    special[0, :] = np.inf
    special[1, 1:] = -np.inf
    special[2, 3] = np.nan
    for point in (x, special):
        want = run(program, outputs, point)
        assert _same_bits(run(optimised, outs, point), want)
        # the fused C: libm's vector tanh/cosh round apart from numpy's, not the zeros
        got = np.asarray(F(point))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
        zeros = (got == 0) & (want == 0)
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(want[zeros]))
    np.testing.assert_allclose(F(x), _by_hand(A, c, x), rtol=1e-12, atol=1e-14)
    if zero_column:           # column 2 of every finite row: 0, not NaN, at the NaN rows
        got = F(special)
        assert np.all(got[:, :, 2][np.isfinite(got[:, :, 2])] == 0.0)
        assert np.isnan(run(optimised, outs, special)).any()   # (elsewhere NaN stays)


def test_generated_loops_join_and_masks_are_int_registers():
    rng = np.random.default_rng(4)
    n, batch = 6, 5
    A, c = rng.normal(size=(n, n)), rng.normal(size=n)
    F, x = _recorded(A, c, batch, rng)
    np.testing.assert_allclose(F(x), _by_hand(A, c, x), rtol=1e-12, atol=1e-14)
    source = F._bound["value"].source
    assert "(unsigned char)(choose(" not in source
    assert "const int v" in source            # the mask of x[0]'s products
    # the Jacobian's products: one loop over all its elements (the slice x[0] planned
    # first lets the products after it join the loop before it); its layout (the basis
    # axis last) is a view of what that loop wrote, not a second loop (final_views)
    assert source.count(f"i < {batch * n * n}L;") == 1
    assert F._bound["value"].views == {0: ((n, batch, n), (1, 2, 0))}


def _mask_node(expr, x, y):
    return ir.Node("map", ir.Map("strong_zero", (expr,), ("x", "y"), (3,), (np.dtype(bool),)),
                   (x, y), (9,))


@pytest.mark.parametrize("kind, x, y, never", [
    ("mul", np.array([1.0, -2.0, 1e-300]), 5, True),
    ("mul", 5, np.array([1.0, -2.0, 3.0]), True),
    ("mul", np.array([1.0, 0.0, 3.0]), 5, False),      # 0 * inf counts as 0
    ("mul", np.array([1.0, -0.0, 3.0]), 5, False),
    ("mul", np.array([1.0, np.inf, 3.0]), 5, False),   # inf * 0 counts as 0
    ("mul", np.array([1.0, np.nan, 3.0]), 5, False),
    ("mul", 2.5, 5, True),                              # a number in place
    ("mul", 5, 6, False),                               # no constant
    ("div", np.array([1.0, np.nan, np.inf]), 5, True),  # x / y counts as 0 only at x = 0
    ("div", np.array([1.0, 0.0, 2.0]), 5, False),
    ("div", 5, np.array([1.0, 2.0, 3.0]), False),       # y decides nothing alone
])
def test_which_masks_are_never_true(kind, x, y, never):
    expr = _expr.STRONG_MUL_MASK if kind == "mul" else _expr.STRONG_DIV_MASK
    # an array: a constant slot (1 or 2); an int: a slot computed at replay; a float: in place
    constants = {s: v for s, v in ((1, x), (2, y)) if isinstance(v, np.ndarray)}
    ins = tuple(s if isinstance(v, np.ndarray) else v for s, v in ((1, x), (2, y)))
    g = SimpleNamespace(constants=constants)
    assert passes._never_true(g, _mask_node(expr, *ins), ins) is never
    # the masks' meaning, checked on the special values: never true is 0 at all of them
    if never:
        others = np.array([0.0, -0.0, 1.0, np.inf, -np.inf, np.nan])
        xs, ys = (others.reshape(1, -1) if isinstance(v, int)
                  else np.asarray(v, dtype=float).reshape(-1, 1) for v in (x, y))
        namespace = {"choose": np.where}
        with np.errstate(invalid="ignore"):
            value = eval(_expr.render(expr, "numpy"), namespace, {"x": xs, "y": ys})
        assert not np.any(value)


def _branchy(x):
    if ad.sum(x) > 0:                 # a guard of the recording
        return ad.sum(x ** 2)
    return ad.sum(ad.sin(x))


@pytest.mark.parametrize("on_branch_change", ["raise", "retape"])
def test_calls_straight_to_the_bound_program_keep_guards(on_branch_change):
    F = ad.record(_branchy, np.ones(4), tensor=True, on_branch_change=on_branch_change)
    x = np.array([0.5, 1.0, -0.2, 0.25])
    for _ in range(2):                # the first binds the value program, then straight
        assert F(x) == np.sum(x ** 2)
    wide = np.zeros(8)
    wide[::2] = x
    assert F(wide[::2]) == np.sum(x ** 2)     # not contiguous: the same value
    if on_branch_change == "raise":
        with pytest.raises(ad.BranchChangedError, match="record again"):
            F(-x)
        assert F(x) == np.sum(x ** 2)
    else:
        for _ in range(2):
            assert F(-x) == pytest.approx(np.sum(np.sin(-x)), rel=1e-15)
    batch = np.stack([x, 2 * x])      # one more axis: a batch, not the straight path
    np.testing.assert_allclose(F(batch), [np.sum(x ** 2), np.sum((2 * x) ** 2)], rtol=1e-15)
