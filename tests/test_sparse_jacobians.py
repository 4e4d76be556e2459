"""Sparse Jacobians and Hessians (issue 27 item 2): exact patterns from the tape, the
partitions and star colourings, the compressed program and sweeps, the formats, the
functional API and least_squares; against the dense paths, torch.func and hand-derived
patterns."""
import numpy as np
import pytest
import scipy.sparse

import easyad as ad
from easyad import _sparsity

FUNCS = (ad.sin, ad.exp, ad.tanh, lambda v: v * v, lambda v: 1.0 / (2.0 + v * v))


def _random_problem(seed, m, n, per_row):
    """Residuals each reading a random set of inputs through a random nonlinear chain;
    the structural pattern is known by construction (no cancellation: every input
    enters through its own nonlinear term with a non-zero weight)."""
    rng = np.random.default_rng(seed)
    sets = [sorted(rng.choice(n, size=rng.integers(1, per_row + 1), replace=False))
            for _ in range(m)]
    picks = [[int(rng.integers(len(FUNCS))) for _ in s] for s in sets]
    weights = [rng.uniform(0.5, 2.0, len(s)) for s in sets]

    def f(x):
        out = []
        for s, p, w in zip(sets, picks, weights):
            total = 0.0
            for j, k, c in zip(s, p, w):
                total = total + c * FUNCS[k](x[j]) * (1.0 + 0.1 * x[s[0]] ** 2)
            out.append(total)
        return out
    rows = np.concatenate([[r] * len(s) for r, s in enumerate(sets)]).astype(int)
    cols = np.concatenate(sets).astype(int)
    return f, rows, cols, rng.uniform(-1, 1, n)


def _banded(n, bw):
    return lambda x: [sum(ad.sin(x[j] * x[i]) for j in range(max(0, i - bw),
                                                            min(n, i + bw + 1)))
                      for i in range(n)]


def _arrowhead(n):
    return lambda x: [x[0] * ad.exp(x[i]) + x[i] ** 2 for i in range(n)] + \
        [sum(x[i] for i in range(n)) * x[0]]


def _blocks(n, b):
    return lambda x: [ad.tanh(sum(x[j] * (i + 1) for j in range(i - i % b, i - i % b + b)))
                      for i in range(n)]


def _check_partition(rows, cols, colour, by_columns=True):
    """No row (column) holds two columns (rows) of one colour, and J is recovered from
    the compressed J S (S^T J) of a random J with that pattern."""
    a, b = (rows, cols) if by_columns else (cols, rows)
    key = a * (int(colour.max()) + 1) + colour[b]
    assert len(np.unique(key)) == len(key), "two of one colour share a row"
    values = np.random.default_rng(0).uniform(1, 2, len(rows))
    m, n = int(rows.max()) + 1, int(cols.max()) + 1
    J = np.zeros((m, n))
    J[rows, cols] = values
    if by_columns:
        S = np.zeros((n, int(colour.max()) + 1))
        S[np.arange(n), colour] = 1.0
        assert np.array_equal((J @ S)[rows, colour[cols]], values)
    else:
        S = np.zeros((m, int(colour.max()) + 1))
        S[np.arange(m), colour] = 1.0
        assert np.array_equal((S.T @ J)[colour[rows], cols], values)


@pytest.mark.parametrize("seed", range(4))
def test_random_sparse_problems_against_the_dense_jacobian(seed):
    f, rows, cols, x = _random_problem(seed, 25, 30, 4)
    F = ad.record(f, x)
    got_rows, got_cols = F.jacobian_pattern()
    order = np.lexsort((cols, rows))
    assert np.array_equal(got_rows, rows[order]) and np.array_equal(got_cols, cols[order])
    x2 = x[::-1].copy()
    J = F.jacobian(x2, sparse=True)
    assert scipy.sparse.issparse(J) and J.format == "csr"
    np.testing.assert_allclose(J.toarray(), F.jacobian(x2), rtol=1e-13, atol=1e-14)
    c = F.jacobian_colouring()
    _check_partition(got_rows, got_cols, c.colour, c.mode == "forward")
    assert c.colours >= c.lower_bound
    # the sweeps (fallback path) agree too, both sides
    swept = F._swept(np.stack([x2, x]), None)
    dense = F.jacobian(np.stack([x2, x]))
    np.testing.assert_allclose(swept, dense[:, got_rows, got_cols], rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("name, make, n, colours", [
    ("tridiagonal", lambda: _banded(40, 1), 40, 3),
    ("pentadiagonal", lambda: _banded(40, 2), 40, 5),
    ("block diagonal", lambda: _blocks(40, 4), 40, 4),
])
def test_banded_and_block_patterns_need_their_bandwidth_in_colours(name, make, n, colours):
    f = make()
    x = np.linspace(-0.5, 0.7, n)
    F = ad.record(f, x)
    rows, cols = F.jacobian_pattern()
    width = colours // 2 if name != "block diagonal" else None
    if width is not None:
        expected = {(i, j) for i in range(n) for j in range(n) if abs(i - j) <= width}
    else:
        expected = {(i, j) for i in range(n) for j in range(n) if i // 4 == j // 4}
    assert set(zip(rows.tolist(), cols.tolist())) == expected
    c = F.jacobian_colouring()
    assert c.colours == colours == c.lower_bound
    np.testing.assert_allclose(F.jacobian(x + 0.1, sparse=True).toarray(),
                               F.jacobian(x + 0.1), rtol=1e-13, atol=1e-14)


def test_an_arrowhead_takes_the_side_with_fewer_colours():
    n = 30
    F = ad.record(_arrowhead(n), np.linspace(0.1, 0.5, n))
    c = F.jacobian_colouring()
    # a dense last row: columns would need n colours; rows need 2 (the dense row alone)
    # plus the dense column 0 makes every row touch it: rows need n + 1, columns n
    assert c.columns == n and c.mode == "forward"
    x = np.linspace(0.2, 0.9, n)
    np.testing.assert_allclose(F.jacobian(x, sparse=True).toarray(), F.jacobian(x),
                               rtol=1e-13)


def test_reverse_partition_is_chosen_for_a_dense_column_free_wide_problem():
    # each output reads many inputs, each input few outputs: rows compress better
    n = 60
    F = ad.record(lambda x: [sum(ad.sin(x[j]) for j in range(k, n, 3)) for k in range(3)],
                  np.linspace(0, 1, n))
    c = F.jacobian_colouring()
    assert c.mode == "reverse" and c.colours == 1 and c.columns == 20
    x = np.linspace(-1, 1, n)
    np.testing.assert_allclose(F.jacobian(x, sparse=True).toarray(), F.jacobian(x),
                               rtol=1e-13)
    swept = F._swept(x[None], None)[0]
    r, cc = F.jacobian_pattern()
    np.testing.assert_allclose(swept, F.jacobian(x)[r, cc], rtol=1e-13)


def test_against_torch_func_jacrev():
    torch = pytest.importorskip("torch")
    n = 24
    h = 1.0 / (n + 1)

    def residual(u, lib):
        left = lib.cat([lib.zeros(1, dtype=u.dtype), u[:-1]]) if lib is torch \
            else np.concatenate([[0.0], u[:-1]])
        right = lib.cat([u[1:], lib.zeros(1, dtype=u.dtype)]) if lib is torch \
            else np.concatenate([u[1:], [0.0]])
        exp = torch.exp if lib is torch else ad.exp
        return (left - 2 * u + right) / (h * h) + u * u * (1 - u) + exp(-u)
    x = np.linspace(0.1, 0.9, n)
    F = ad.record(lambda u: residual(u, np), x)
    want = torch.func.jacrev(lambda u: residual(u, torch))(torch.tensor(x + 0.05)).numpy()
    got = F.jacobian(x + 0.05, sparse=True).toarray()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    assert F.jacobian_colouring().colours == 3


def test_formats_batches_and_binding():
    f, rows, cols, x = _random_problem(7, 10, 12, 3)
    F = ad.record(f, x)
    dense = F.jacobian(x)
    r, c = F.jacobian_pattern()
    for fmt in ("csr", "csc", "coo"):
        J = F.jacobian(x, sparse=True, format=fmt)
        assert J.format == fmt and J.shape == (10, 12)
        np.testing.assert_allclose(J.toarray(), dense, rtol=1e-13)
    rr, cc, vv = F.jacobian(x, sparse=True, format="triplets")
    assert np.array_equal(rr, r) and np.array_equal(cc, c)
    np.testing.assert_allclose(vv, dense[r, c], rtol=1e-13)
    np.testing.assert_allclose(F.jacobian(x, sparse=True, format="values"), dense[r, c],
                               rtol=1e-13)
    X = np.stack([x, x * 0.5, -x])
    batch = F.jacobian(X, sparse=True, format="values")
    assert batch.shape == (3, len(r))
    np.testing.assert_allclose(batch, F.jacobian(X)[:, r, c], rtol=1e-13)
    mats = F.jacobian(X, sparse=True)
    assert len(mats) == 3 and np.allclose(mats[2].toarray(), F.jacobian(-x))
    pat = F.jacobian_pattern("csc")
    assert pat.format == "csc" and pat.nnz == len(r)
    # bound arrays: written in place at x's current contents
    xb, values = x.copy(), np.empty(len(r))
    call = F.bind_jacobian(xb, values)
    call()
    np.testing.assert_allclose(values, dense[r, c], rtol=1e-13)
    xb[:] = -x
    call()
    np.testing.assert_allclose(values, F.jacobian(-x)[r, c], rtol=1e-13)


def test_selects_count_both_sides_and_guards_follow_on_branch_change():
    def f(x):
        a = ad.where(x[0] > 0, x[1] * x[2], ad.sin(x[3]))
        return [a, x[4] ** 2]
    F = ad.record(f, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    rows, cols = F.jacobian_pattern()
    assert set(zip(rows.tolist(), cols.tolist())) == {(0, 1), (0, 2), (0, 3), (1, 4)}
    for x in ([1.0, 2.0, 3.0, 4.0, 5.0], [-1.0, 2.0, 3.0, 4.0, 5.0]):
        np.testing.assert_allclose(F.jacobian(np.array(x), sparse=True).toarray(),
                                   F.jacobian(np.array(x)), rtol=1e-14)
    assert F._jacobian_program() is None        # a select: the sweeps answer

    def g(x):                                    # a Python branch: a guard
        return [x[0] * x[1] if x[0] > 0 else x[1] ** 3, ad.exp(x[2])]
    G = ad.record(g, np.array([1.0, 2.0, 3.0]))
    assert G._jacobian_program() is not None
    with pytest.raises(ad.BranchChangedError):
        G.jacobian(np.array([-1.0, 2.0, 3.0]), sparse=True)
    values, mask = G.jacobian(np.array([[-1.0, 2.0, 3.0], [1.0, 1.0, 1.0]]), sparse=True,
                              format="values", on_branch_change="mask")
    assert mask.tolist() == [True, False] and np.isnan(values[0]).all()
    np.testing.assert_allclose(values[1], [1.0, 1.0, np.e])
    H = ad.record(g, np.array([1.0, 2.0, 3.0]), on_branch_change="retape")
    got = H.jacobian(np.array([-1.0, 2.0, 3.0]), sparse=True).toarray()
    np.testing.assert_allclose(got, [[0.0, 12.0, 0.0], [0.0, 0.0, np.exp(3.0)]])


def test_errors_in_f_raise_as_the_dense_jacobian_does():
    F = ad.record(lambda x: [ad.log(x[0]) * x[1], x[1]], [1.0, 2.0])
    with pytest.raises(ValueError, match="math domain error"):
        F.jacobian(np.array([-1.0, 2.0]), sparse=True)


def test_compiled_program_gives_the_same_numbers():
    f, rows, cols, x = _random_problem(3, 12, 12, 3)
    F = ad.record(f, x)
    want = F.jacobian(x, sparse=True, format="values")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ad.CompilerWarning)
        F.compile()
    program = F._jacobian_program()
    if program._native is None:
        pytest.skip("no C compiler")
    np.testing.assert_array_equal(F.jacobian(x, sparse=True, format="values"), want)


def test_star_colouring_of_an_arrowhead_hessian_needs_two_colours():
    n = 12
    F = ad.record(lambda x: sum(x[0] * x[i] ** 2 for i in range(1, n)), np.ones(n))
    columns, star = F.hessian_colouring()
    assert columns == n and star == 2
    rows, cols = F.hessian_pattern()
    colour = _sparsity.star_colouring(n, rows, cols)
    src_row, src_colour = _sparsity.star_sources(n, rows, cols, colour)
    x = np.linspace(0.5, 1.5, n)
    H = F.hessian(x)
    S = np.zeros((n, star))
    S[np.arange(n), colour] = 1.0
    np.testing.assert_allclose((H @ S)[src_row, src_colour], H[rows, cols], rtol=1e-14)


@pytest.mark.parametrize("seed", range(3))
def test_star_colourings_have_no_two_coloured_path_of_four(seed):
    rng = np.random.default_rng(seed)
    n = 25
    A = rng.random((n, n)) < 0.12
    A = A | A.T | np.eye(n, dtype=bool)
    rows, cols = np.nonzero(A)
    colour = _sparsity.star_colouring(n, rows, cols)
    off = rows != cols
    assert np.all(colour[rows[off]] != colour[cols[off]])
    adj = [set(np.flatnonzero(A[i]).tolist()) - {i} for i in range(n)]
    for a in range(n):
        for b in adj[a]:
            for c in adj[b] - {a}:
                for d in adj[c] - {a, b}:
                    assert len({colour[a], colour[b], colour[c], colour[d]}) > 2
    _sparsity.star_sources(n, rows, cols, colour)          # raises if not recoverable


def test_hessian_formats_and_the_functional_api_against_torch():
    torch = pytest.importorskip("torch")

    def f(x, lib=np):
        sin = torch.sin if lib is torch else ad.sin
        return sum(sin(x[i] * x[i + 1]) + x[i] ** 3 for i in range(len(x) - 1))
    x = np.linspace(0.1, 1.0, 10)
    want = torch.func.hessian(lambda t: f(t, torch))(torch.tensor(x)).numpy()
    H = ad.hessian(f, sparse=True)(x)
    assert H.format == "csr"
    np.testing.assert_allclose(H.toarray(), want, rtol=1e-12, atol=1e-12)
    F = ad.record(f, x)
    r, c, v = F.hessian(x, sparse=True, format="triplets")
    np.testing.assert_allclose(v, want[r, c], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F.hessian(x, sparse=True), v)        # values by default
    J = ad.jacobian(lambda u: [u[0] * u[1], ad.sin(u[2])], sparse=True, format="coo")
    np.testing.assert_allclose(J(np.array([2.0, 3.0, 0.0])).toarray(),
                               [[3.0, 2.0, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(J(np.array([1.0, 1.0, 0.0])).toarray(),
                               [[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def test_bad_input_raises_clearly():
    F = ad.record(lambda x: [x[0] * x[1], x[1]], [1.0, 2.0])
    with pytest.raises(ValueError, match="format must be one of"):
        F.jacobian(np.ones(2), sparse=True, format="dense")
    with pytest.raises(ValueError, match="pass sparse=True"):
        F.jacobian(np.ones(2), format="csr")
    with pytest.raises(ValueError, match=r"x must have shape \(2,\)"):
        F.jacobian(np.ones(3), sparse=True)
    with pytest.raises(ValueError, match="a pattern's format"):
        F.jacobian_pattern("values")
    with pytest.raises(ValueError, match="pass jacobian\\(f, sparse=True"):
        ad.jacobian(lambda x: x, format="csr")
    with pytest.raises(ValueError, match="argnums and has_aux"):
        ad.jacobian(lambda x, y: x, argnums=1, sparse=True)
    with pytest.raises(ValueError, match="pass sparse=True and no out"):
        ad.record(lambda x: x[0] * x[1], [1.0, 2.0]).hessian(np.ones(2), format="csr")
    with pytest.raises(TypeError, match="uses tensor operations"):
        ad.jacobian(lambda x: ad.Tensor.constant(np.ones(3)) * x, sparse=True)(np.ones(3))


def test_least_squares_with_a_sparse_jacobian():
    n = 60

    def r(u):
        left = np.concatenate([[0.0], u[:-1]])
        right = np.concatenate([u[1:], [1.0]])
        return 4.0 * u - left - right + 0.1 * u ** 3 - 1.0
    sparse = ad.scipy.least_squares(r, np.zeros(n), sparse=True, xtol=1e-12, ftol=1e-12,
                                    gtol=1e-12)
    dense = ad.scipy.least_squares(r, np.zeros(n), sparse=False)
    assert scipy.sparse.issparse(sparse.jac) and isinstance(dense.jac, np.ndarray)
    np.testing.assert_allclose(sparse.x, dense.x, atol=1e-8)
    assert np.abs(r(sparse.x)).max() < 1e-8
    with pytest.raises(TypeError, match="jac_sparsity"):
        ad.scipy.least_squares(r, np.zeros(n), jac_sparsity=np.ones((n, n)))
    with pytest.raises(ValueError, match="sparse=True needs"):
        ad.scipy.least_squares(r, np.zeros(n), sparse=True, method="lm")


# ---- TensorFunction: patterns of tensor programs, compressed VJP / HVP batches ----

def test_tensor_function_jacobian_pattern_is_exact_and_compressed_values_match():
    A = np.diag(np.arange(1.0, 7.0)) + np.diag(np.ones(5), 1)     # a constant, bidiagonal

    def f(x):
        y = ad.sin(x[1:]) * x[:-1]
        z = A @ x
        return ad.concatenate([y, z[:3], ad.sum(x * x, keepdims=True),
                               x.reshape(2, 3).T.reshape(-1)])
    x0 = np.arange(1.0, 7.0)
    F = ad.record(f, x0, tensor=True)
    rows, cols = F.jacobian_pattern()
    want = {(i, j) for i in range(5) for j in (i, i + 1)}            # y
    want |= {(5 + i, j) for i in range(3) for j in (i, i + 1)}        # A @ x: A's zeros kept
    want |= {(8, j) for j in range(6)}                                # the sum
    want |= {(9 + i, j) for i, j in enumerate([0, 3, 1, 4, 2, 5])}    # the transpose
    assert set(zip(rows.tolist(), cols.tolist())) == want
    x = x0 * 0.3 + 0.1
    J = F.jacobian(x, sparse=True)
    dense = F.jacobian(x)
    np.testing.assert_allclose(J.toarray(), dense, rtol=1e-14)
    c = F.jacobian_colouring()
    _check_partition(rows, cols, c.colour, by_columns=False)
    assert c.colours < F.jacobian_pattern("csr").shape[0]


def test_tensor_function_sparse_hessian_against_torch():
    torch = pytest.importorskip("torch")
    n = 12
    A = np.diag(np.full(n, 2.0)) + np.diag(np.ones(n - 1), 1)

    def f(x, lib=ad):
        s = lib.sin(x[1:] * x[:-1]).sum()
        Ax = (torch.tensor(A) if lib is torch else A) @ x
        return s + (Ax ** 2).sum() + (x[0] * x).sum()       # an arrowhead through x[0]
    x0 = np.linspace(0.2, 1.1, n)
    F = ad.record(f, x0, tensor=True)
    H = F.hessian(x0, sparse=True)
    want = torch.func.hessian(lambda t: f(t, torch))(torch.tensor(x0)).numpy()
    np.testing.assert_allclose(H.toarray(), want, rtol=1e-12, atol=1e-12)
    rows, cols = F.hessian_pattern()
    assert set(zip(rows.tolist(), cols.tolist())) == \
        {(i, j) for i in range(n) for j in range(n) if abs(i - j) <= 1 or 0 in (i, j)}
    columns, star = F.hessian_colouring()
    assert star < columns == n          # the arrowhead: star colouring wins
    r, c, v = F.hessian(x0, sparse=True, format="triplets")
    np.testing.assert_allclose(v, want[r, c], rtol=1e-12, atol=1e-12)


def test_tensor_function_sparse_bad_input():
    F = ad.record(lambda x: x * 2.0, np.ones(3), tensor=True)
    with pytest.raises(ValueError, match="pass sparse=True"):
        F.jacobian(np.ones(3), format="csr")
    with pytest.raises(ValueError, match="one point"):
        F.jacobian(np.ones((2, 3)), sparse=True)
    with pytest.raises(ValueError, match="one number"):
        F.hessian(np.ones(3), sparse=True)
    J = F.jacobian(np.ones(3), sparse=True, format="values")
    np.testing.assert_allclose(J, [2.0, 2.0, 2.0])


def test_user_primitives_take_the_dense_route_with_the_same_pattern():
    sq = ad.define("sq_sparse_test", lambda x: x * x, lambda x: 2 * x)
    F = ad.record(lambda x: [sq(x[0]) * x[1], ad.sin(x[2])], [1.0, 2.0, 3.0])
    rows, cols = F.jacobian_pattern()
    assert set(zip(rows.tolist(), cols.tolist())) == {(0, 0), (0, 1), (1, 2)}
    assert F._jacobian_program() is None and F._jacobian_sweeps() is None
    x = np.array([2.0, 3.0, 4.0])
    np.testing.assert_allclose(F.jacobian(x, sparse=True).toarray(),
                               [[12.0, 4.0, 0.0], [0.0, 0.0, np.cos(4.0)]])
