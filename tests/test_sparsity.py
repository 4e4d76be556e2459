"""easyad/_sparsity.py directly: the Hessian sparsity pattern of a recorded tape and the
column colouring that compresses it, against dense references on random programs
(mpmath's high-precision Hessians, the inputs each term reads) and hand-derived patterns.
"""
import itertools

import numpy as np
import pytest

import easyad as ad
from _programs import Program
from easyad import _sparsity


def pattern_of(F):
    """_sparsity.hessian_pattern on F's tape, as a set of (row, col), or None (dense)."""
    found = _sparsity.hessian_pattern(F.tape._arrays(), F.inputs, F.outputs[0])
    return None if found is None else set(zip(found[0].tolist(), found[1].tolist()))


def assert_valid_colouring(n, rows, cols, colour):
    """No row has non-zeros in two columns of one colour (so one sweep per colour
    recovers every entry directly)."""
    assert colour.shape == (n,) and colour.min(initial=0) >= 0
    seen = {}
    for r, c in zip(rows.tolist(), cols.tolist()):
        key = (r, int(colour[c]))
        assert seen.setdefault(key, c) == c, (
            f"row {r}: columns {seen[key]} and {c} share colour {colour[c]}")


@pytest.mark.parametrize("seed", range(10))
def test_random_programs_pattern_between_numeric_and_structural_bounds(seed):
    program = Program(seed, n=7, terms=4, width=2, steps=6)
    rng = np.random.default_rng(seed)
    F = ad.record(program, rng.uniform(-1, 1, program.n))
    pattern = pattern_of(F)
    assert pattern is not None           # 4 terms of 2 inputs: sparse
    # sound: every entry non-zero at random points is in the pattern
    nonzero = set()
    for x in rng.uniform(-1.5, 1.5, (2, program.n)):
        H = program.mp_derivatives(x)[2]
        nonzero |= {(p, q) for p, q in zip(*np.nonzero(np.abs(H) > 1e-9))}
    assert nonzero <= pattern, sorted(nonzero - pattern)
    # structural: only inputs that meet in one term are coupled
    assert pattern <= program.coupled(), sorted(pattern - program.coupled())
    # and on these smooth programs (no cancellation) the pattern is exact
    assert pattern == nonzero, sorted(pattern ^ nonzero)
    # symmetric, and F.hessian_pattern() is the same set, row by row
    assert pattern == {(q, p) for p, q in pattern}
    rows, cols = F.hessian_pattern()
    assert list(zip(rows.tolist(), cols.tolist())) == sorted(pattern)


@pytest.mark.parametrize("seed", range(6))
def test_coloured_hessians_equal_dense_references(seed):
    program = Program(100 + seed, n=8, terms=5, width=2, steps=5)
    rng = np.random.default_rng(seed)
    F = ad.record(program, rng.uniform(-1, 1, program.n))
    rows, cols = F.hessian_pattern()
    colour = _sparsity.colour_columns(program.n, rows, cols)
    assert_valid_colouring(program.n, rows, cols, colour)
    x = rng.uniform(-1.5, 1.5, program.n)
    H = program.mp_derivatives(x)[2]
    np.testing.assert_allclose(F.hessian(x), H, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(F.hessian(x, sparse=True), H[rows, cols], rtol=1e-11,
                               atol=1e-11)


def test_hand_derived_patterns():
    def record(f, n):
        return ad.record(f, np.full(n, 0.7))
    n = 6
    rosenbrock = record(lambda x: sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2
                                      for i in range(n - 1)), n)
    tridiagonal = {(p, q) for p in range(n) for q in range(n) if abs(p - q) <= 1}
    assert pattern_of(rosenbrock) == tridiagonal
    # a product couples its two operands only: d2(x0 x1)/dx0^2 = 0
    assert pattern_of(record(lambda x: x[0] * x[1] + x[2], 3)) == {(0, 1), (1, 0)}
    assert pattern_of(record(lambda x: sum(ad.sin(v) for v in x), 4)) == {(i, i) for i in range(4)}
    assert pattern_of(record(lambda x: 3 * x[0] - x[1] / 2 + 1.0, 2)) == set()   # linear
    # x1 / x2: d2/dx1^2 = 0, the others not; x0 is only compared: no coupling
    select = record(lambda x: ad.where(x[0] > 0, x[1] / x[2], x[3] ** 2), 4)
    assert pattern_of(select) == {(1, 2), (2, 1), (2, 2), (3, 3)}
    # work the output does not read adds nothing (it used to: a false entry, a colour)
    def dead_work(x):
        ad.sin(x[1]) * x[2]
        return x[0] * 2 + x[1]
    assert pattern_of(record(dead_work, 3)) == set()
    # a dense pattern (more than half the entries) is reported as None: computed densely
    dense = record(lambda x: sum(x) ** 2, 5)
    assert pattern_of(dense) is None
    rows, cols = dense.hessian_pattern()
    assert list(zip(rows.tolist(), cols.tolist())) == list(itertools.product(range(5), repeat=2))


def test_colouring_of_known_patterns():
    n = 9
    diagonal = np.arange(n)
    assert set(_sparsity.colour_columns(n, diagonal, diagonal).tolist()) == {0}
    tri = [(p, q) for p in range(n) for q in range(n) if abs(p - q) <= 1]
    rows, cols = (np.array(v, dtype=np.intp) for v in zip(*tri))
    colour = _sparsity.colour_columns(n, rows, cols)
    assert_valid_colouring(n, rows, cols, colour)
    assert len(set(colour.tolist())) == 3          # a tridiagonal Hessian: 3 sweeps
    empty = np.zeros(0, dtype=np.intp)
    assert _sparsity.colour_columns(4, empty, empty).tolist() == [0, 0, 0, 0]
    # an arrow (one dense row and column, and the diagonal): every column meets the dense
    # row, so no two may share a colour
    arrow = {(0, q) for q in range(n)} | {(q, 0) for q in range(n)} | {(q, q) for q in range(n)}
    rows, cols = (np.array(v, dtype=np.intp) for v in zip(*sorted(arrow)))
    colour = _sparsity.colour_columns(n, rows, cols)
    assert_valid_colouring(n, rows, cols, colour)
    assert sorted(colour.tolist()) == list(range(n))
    # two separate tridiagonal blocks colour like one
    block = {(p, q) for p in range(4) for q in range(4) if abs(p - q) <= 1}
    blocks = block | {(p + 4, q + 4) for p, q in block}
    rows, cols = (np.array(v, dtype=np.intp) for v in zip(*sorted(blocks)))
    colour = _sparsity.colour_columns(8, rows, cols)
    assert_valid_colouring(8, rows, cols, colour)
    assert len(set(colour.tolist())) == 3


@pytest.mark.parametrize("seed", range(20))
def test_random_symmetric_patterns_are_coloured_validly_and_greedily(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 25))
    mask = rng.random((n, n)) < rng.uniform(0.02, 0.4)
    mask = mask | mask.T
    rows, cols = (a.astype(np.intp) for a in np.nonzero(mask))
    colour = _sparsity.colour_columns(n, rows, cols)
    assert_valid_colouring(n, rows, cols, colour)
    # greedy bound: a column conflicts with the columns sharing one of its rows; it never
    # needs more colours than it has conflicts, plus one
    shares = (mask.T.astype(int) @ mask.astype(int)) > 0
    np.fill_diagonal(shares, False)
    assert len(set(colour.tolist())) <= shares.sum(axis=1).max(initial=0) + 1
