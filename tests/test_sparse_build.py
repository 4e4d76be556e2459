"""The sparse Jacobian's program built from arrays (C loops in _engine/sparsity.pxi) and
star-coloured Function Hessians (issue 27 item 2's misses): patterns and nonzeros against
the dense Jacobian/Hessian, finite differences and torch.func on banded, arrowhead,
random, empty-row/column and one-unknown problems; star recovery (every entry, exactly
symmetric); colour counts at their lower bounds on banded problems."""
import numpy as np
import pytest

import easyad as ad
from easyad import _sparsity

OPS = (ad.sin, ad.exp, ad.tanh, ad.log1p, ad.sqrt, lambda v: v * v,
       lambda v: 1.0 / (2.0 + v), lambda v: v ** 3, lambda v: 3.0 - 2.0 * v, ad.cos)


def _central(f, x, h=1e-6):
    """J by central differences, column by column."""
    cols = []
    for j in range(len(x)):
        e = np.zeros(len(x))
        e[j] = h
        cols.append((np.asarray(f(x + e), float) - np.asarray(f(x - e), float)) / (2 * h))
    return np.array(cols).T


def _problem(kind, n, seed):
    """Residuals with a known structural pattern; x0 inside every op's domain."""
    rng = np.random.default_rng(seed)
    if kind == "banded":
        reads = [list(range(max(0, i - 2), min(n, i + 2))) for i in range(n)]
    elif kind == "arrow":
        reads = [sorted({0, i}) for i in range(n)] + [list(range(n))]
    elif kind == "random":
        reads = [sorted(rng.choice(n, size=int(rng.integers(1, min(n, 4) + 1)),
                                   replace=False).tolist()) for _ in range(n + 2)]
    elif kind == "empty":    # a row that reads nothing, columns nobody reads
        reads = [[j for j in range(n) if j % 3 == 0 and j <= i] for i in range(n)]
    else:
        raise ValueError(kind)
    picks = [[int(rng.integers(len(OPS))) for _ in r] for r in reads]
    weights = [rng.uniform(0.5, 2.0, len(r)) for r in reads]

    def f(x):
        out = []
        for r, p, w in zip(reads, picks, weights):
            total = 0.25     # a constant output where r is empty
            for j, k, c in zip(r, p, w):
                total = total + c * OPS[k](x[j]) * (1.0 + 0.1 * x[r[-1]])
            out.append(total)
        return out
    pattern = {(i, j) for i, r in enumerate(reads) for j in r}
    return f, pattern, rng.uniform(0.2, 0.9, n)


@pytest.mark.parametrize("kind,n,seed", [("banded", 30, 0), ("arrow", 25, 1),
                                         ("random", 40, 2), ("random", 7, 3),
                                         ("empty", 20, 4), ("banded", 1, 5),
                                         ("random", 1, 6)])
def test_program_values_against_dense_jacobian_and_differences(kind, n, seed):
    f, pattern, x0 = _problem(kind, n, seed)
    F = ad.record(f, x0)
    rows, cols = F.jacobian_pattern()
    assert set(zip(rows.tolist(), cols.tolist())) == pattern
    program = F._jacobian_program()
    if len(rows):
        assert program is not None      # the program route, not the sweeps
    x = x0 + 0.05
    J = F.jacobian(x, sparse=True)
    dense = F.jacobian(x)
    assert J.shape == dense.shape
    np.testing.assert_allclose(J.toarray(), dense, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(J.toarray(), _central(f, x), rtol=1e-6, atol=1e-7)
    # the program itself, at a batch of points (VM), against the dense Jacobian
    if program is not None:
        X = x0 + np.random.default_rng(seed).uniform(-0.1, 0.1, (3, n))
        values = program(X)[:, :len(rows)]
        np.testing.assert_allclose(values, F.jacobian(X)[:, rows, cols], rtol=1e-13,
                                   atol=1e-13)


def test_linear_parts_fold_to_constants_and_shared_values():
    # a tridiagonal linear residual plus a cube: the off-diagonal nonzeros are constants
    # (one fixed variable per value), the diagonal one product of the program
    n = 50
    h2 = 1.0 / 51 ** 2

    def r(u):
        left = np.concatenate([[0.0], u[:-1]])
        right = np.concatenate([u[1:], [0.0]])
        return (left - 2 * u + right) / h2 + u ** 3
    x0 = np.linspace(0.1, 0.9, n)
    F = ad.record(r, x0)
    rows, cols = F.jacobian_pattern()
    values = F.jacobian(x0, sparse=True, format="values")
    want = np.where(rows == cols, -2 / h2 + 3 * x0[cols] ** 2, 1 / h2)
    np.testing.assert_allclose(values, want, rtol=1e-13)
    program = F._jacobian_program()
    ops = program.tape._arrays()["ops"]
    from easyad import _rules
    assert (ops == _rules.OP_VARIABLE).sum() == n + 1     # the inputs and 1/h2
    assert len(program) < len(F) + 2 * n


def test_program_declines_what_it_cannot_express():
    F = ad.record(lambda x: [ad.where(x[0] > 0, x[0] * x[1], x[1]), abs(x[1])], [1.0, 2.0])
    assert F._jacobian_program() is None
    np.testing.assert_allclose(F.jacobian([1.5, -2.0], sparse=True).toarray(),
                               [[-2.0, 1.5], [0.0, -1.0]])


def test_program_flags_a_changed_branch_and_checks_errors():
    def f(x):
        return [ad.log(x[0]) * x[1] if x[0] > 1 else x[1], x[1] * x[1]]
    F = ad.record(f, [2.0, 3.0])
    assert F._jacobian_program() is not None
    with pytest.raises(Exception, match="branch"):
        F.jacobian([0.5, 3.0], sparse=True)
    G = ad.record(lambda x: [x[1] + 0.0 * ad.log(x[0])], [2.0, 3.0])
    with pytest.raises(ValueError):
        G.jacobian([-1.0, 3.0], sparse=True)


def test_pattern_of_a_long_chain_and_unread_inputs():
    # operands far back, inputs after the last output, an output that is an input
    def f(x):
        s = x[0]
        for k in range(1, 30):
            s = s + ad.sin(x[k]) * s
        return [s, x[3], 2.0 * x[5]]
    x0 = np.linspace(0.1, 0.5, 40)
    F = ad.record(f, x0)
    rows, cols = F.jacobian_pattern()
    assert set(zip(rows.tolist(), cols.tolist())) == \
        {(0, j) for j in range(30)} | {(1, 3), (2, 5)}
    np.testing.assert_allclose(F.jacobian(x0 + 0.1, sparse=True).toarray(),
                               _central(f, x0 + 0.1), rtol=1e-6, atol=1e-8)


# ---- star-coloured Hessians ----

def _pentadiagonal(n):
    return lambda x: sum(ad.sin(x[i] * x[i + 1] + x[i + 2]) for i in range(n - 2)) \
        + sum(x[i] ** 4 for i in range(n))


def _arrowhead(n):
    return lambda x: x[0] * sum(ad.exp(x[i]) for i in range(1, n)) + sum(x ** 2)


def _bordered(n):
    # a tridiagonal coupling plus a parameter (the last unknown) that every term reads
    return lambda x: sum(ad.sin(x[i] * x[i + 1]) * x[-1] for i in range(n - 2)) \
        + sum(x ** 2)


def _tridiagonal(n):
    return lambda x: sum(ad.cos(x[i] - x[i + 1]) for i in range(n - 1)) + sum(x ** 3)


@pytest.mark.parametrize("make,n,columns,star", [(_tridiagonal, 12, 3, 3),
                                                 (_pentadiagonal, 14, 5, 5),
                                                 (_arrowhead, 10, 10, 2),
                                                 (_bordered, 16, 16, 4)])
def test_star_hessians_every_entry_symmetric_against_torch(make, n, columns, star):
    torch = pytest.importorskip("torch")
    f = make(n)
    x0 = np.linspace(0.1, 0.8, n)
    F = ad.record(f, x0)
    assert F.hessian_colouring() == (columns, star)
    # the lower bounds: a partition of columns needs the most nonzeros of a row; a star
    # colouring of a path of 4 vertices or more 3, of an arrowhead (a star) 2; of a band
    # of half-width 2 no periodic colouring with 4 (a search up to period 10 found none)
    rows, cols = F.hessian_pattern()
    assert columns == np.bincount(rows).max()
    used = min(columns, star)
    plan = F._hessian_plan()
    assert plan[0].shape[2] == used          # one forward-over-reverse sweep per colour
    x = x0 + 0.03
    H = F.hessian(x, sparse=True, format="csr").toarray()
    assert np.array_equal(H, H.T)            # one place for H[r, c] and H[c, r]

    def ft(z):
        if make is _pentadiagonal:
            return torch.sin(z[:-2] * z[1:-1] + z[2:]).sum() + (z ** 4).sum()
        if make is _arrowhead:
            return z[0] * torch.exp(z[1:]).sum() + (z ** 2).sum()
        if make is _bordered:
            return (torch.sin(z[:-2] * z[1:-1]) * z[-1]).sum() + (z ** 2).sum()
        return torch.cos(z[:-1] - z[1:]).sum() + (z ** 3).sum()
    want = torch.func.hessian(ft)(torch.tensor(x, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(H, want, rtol=1e-12, atol=1e-12)
    # every entry of the pattern recovered, nothing outside it
    assert np.all(H[want == 0] == 0)
    # the other routes: second call (the second-order program), batches, bind_hessian
    again = F.hessian(x, sparse=True)
    np.testing.assert_allclose(again, want[rows, cols], rtol=1e-12, atol=1e-12)
    batch = F.hessian(np.stack([x, x0]), sparse=True)
    np.testing.assert_allclose(batch[0], want[rows, cols], rtol=1e-12, atol=1e-12)
    h = np.empty(len(rows))
    F.bind_hessian(x, h)()
    np.testing.assert_allclose(h, want[rows, cols], rtol=1e-12, atol=1e-12)


def test_star_hessian_by_the_sweeps_equals_the_dense_hessian():
    # past the second-order program's size limit only the sweeps run: arrowhead of 400
    n = 400
    f = _arrowhead(n)
    x = np.linspace(0.1, 0.5, n)
    F = ad.record(f, x)
    assert F.hessian_colouring() == (n, 2)
    H = F.hessian(x, sparse=True, format="csr").toarray()
    want = np.diag(2.0 + np.concatenate([[0.0], x[0] * np.exp(x[1:])]))
    want[0, 1:] = want[1:, 0] = np.exp(x[1:])
    np.testing.assert_allclose(H, want, rtol=1e-13)


def test_symmetric_sources_read_each_pair_once_and_refuse_a_bad_colouring():
    n = 9
    rows, cols = np.nonzero(np.abs(np.subtract.outer(np.arange(n), np.arange(n))) <= 2)
    star = _sparsity.star_colouring(n, rows, cols)
    src_row, src_colour = _sparsity.symmetric_sources(n, rows, cols, star)
    K = int(star.max()) + 1
    # a random symmetric H with this pattern, compressed, recovered exactly
    H = np.zeros((n, n))
    H[rows, cols] = np.random.default_rng(0).uniform(1, 2, len(rows))
    H = H + H.T
    S = np.zeros((n, K))
    S[np.arange(n), star] = 1.0
    np.testing.assert_array_equal((H @ S)[src_row, src_colour], H[rows, cols])
    twin = {(r, c): (a, b) for r, c, a, b in zip(rows, cols, src_row, src_colour)}
    assert all(twin[r, c] == twin[c, r] for r, c in zip(rows, cols))
    with pytest.raises(ValueError, match="not a star colouring"):
        _sparsity.symmetric_sources(n, rows, cols, np.zeros(n, dtype=np.intp))


def test_partition_limit_and_empty_patterns():
    rows, cols = np.array([0, 0, 0]), np.array([0, 1, 2])
    assert _sparsity.colour_partition(rows, cols, (1, 3), limit=2) is None
    assert _sparsity.colour_partition(rows, cols, (1, 3)).tolist() == [0, 1, 2]
    empty = np.zeros(0, dtype=np.intp)
    assert _sparsity.colour_partition(empty, empty, (3, 4)).tolist() == [0, 0, 0, 0]
    assert _sparsity.star_colouring(3, empty, empty).tolist() == [0, 0, 0]


def test_hessian_pattern_of_a_long_sum_of_squares():
    # half the sum of squares of a tridiagonal residual: pentadiagonal, found without the
    # partial sums' sets; values against the dense Hessian and differences of gradients
    n = 300

    def f(u):
        left = np.concatenate([[0.0], u[:-1]])
        right = np.concatenate([u[1:], [0.0]])
        r = left - 2 * u + right + u ** 3
        return 0.5 * np.sum(r * r)
    x = np.linspace(-0.5, 0.5, n)
    F = ad.record(f, x)
    rows, cols = F.hessian_pattern()
    assert set(zip(rows.tolist(), cols.tolist())) == \
        {(i, j) for i in range(n) for j in range(n) if abs(i - j) <= 2}
    H = F.hessian(x + 0.01, sparse=True, format="csr").toarray()
    np.testing.assert_allclose(H, F.hessian(x + 0.01), rtol=1e-12, atol=1e-12)
    h, e = 1e-6, np.eye(n)
    idx = [0, 1, 150, n - 1]
    fd = np.array([(F.gradient(x + 0.01 + h * e[j]) - F.gradient(x + 0.01 - h * e[j]))
                   / (2 * h) for j in idx]).T
    np.testing.assert_allclose(H[:, idx], fd, rtol=1e-6, atol=1e-6)
