"""The one-point fast paths of a scalar Function (an ndarray x tested first, the C calls of
small programs that keep the GIL) give what the general paths give, and every argument they
skip still reaches its check.

References: the extended Rosenbrock function's gradient and tridiagonal Hessian derived by
hand; the general path (a list x, converted and run as a batch of one row) for bitwise
agreement.
"""
import threading
import warnings

import numpy as np
import pytest

import easyad as ad

N = 10


def rosenbrock(x):
    s = 0.0
    for i in range(len(x) - 1):
        s = s + 100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2
    return s


def gradient_by_hand(x):
    g = np.zeros_like(x)
    g[:-1] += -400 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
    g[1:] += 200 * (x[1:] - x[:-1] ** 2)
    return g


def hessian_by_hand(x):
    H = np.zeros((len(x), len(x)))
    i = np.arange(len(x) - 1)
    H[i, i] += 1200 * x[:-1] ** 2 - 400 * x[1:] + 2
    H[i + 1, i + 1] += 200
    H[i, i + 1] = H[i + 1, i] = -400 * x[:-1]
    return H


@pytest.fixture(params=["vm", "compiled"])
def F(request):
    F = ad.record(rosenbrock, np.ones(N))
    if request.param == "compiled":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ad.CompilerWarning)   # no compiler: the VM
            F.compile(hessian=True)
    return F


X = np.random.default_rng(3).uniform(0.5, 1.5, N)


def test_fast_paths_match_the_formulas_and_the_general_path_bit_for_bit(F):
    general = F.gradient(X.tolist())            # a list: converted, run as one row
    fast = F.gradient(X)
    np.testing.assert_array_equal(fast, general)
    np.testing.assert_allclose(fast, gradient_by_hand(X), rtol=1e-12, atol=1e-9)
    value, g = F.value_and_gradient(X)
    assert value == F(X.tolist()) == F(X)
    np.testing.assert_array_equal(g, general)
    out = np.empty(N)
    assert F.gradient(X, out=out) is out
    np.testing.assert_array_equal(out, general)
    for _ in range(3):      # the first call sweeps; later ones run the second-order program
        H = F.hessian(X)
        np.testing.assert_allclose(H, hessian_by_hand(X), rtol=1e-12, atol=1e-9)
        np.testing.assert_array_equal(H, F.hessian(X.tolist()))
    rows, cols = F.hessian_pattern()
    h = np.empty(len(rows))
    assert F.hessian(X, sparse=True, out=h) is h
    np.testing.assert_array_equal(h, H[rows, cols])


def test_arguments_the_fast_paths_skip_still_reach_their_checks(F):
    # an out the C gate declines (strided): checked, then written once complete
    strided = np.empty(2 * N)[::2]
    assert F.gradient(X, out=strided) is strided
    np.testing.assert_array_equal(strided, F.gradient(X.tolist()))
    with pytest.raises(TypeError, match="out must be a float64 array"):
        F.gradient(X, out=np.empty(N, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        F.gradient(X, out=np.empty(N + 1))
    # format= with an ndarray point: the formatted path, not the one-point program
    F.hessian(X)
    triplets = F.hessian(X, sparse=True, format="triplets")
    np.testing.assert_allclose(triplets[2], hessian_by_hand(X)[triplets[0], triplets[1]],
                               rtol=1e-12)
    with pytest.raises(ValueError, match="format= is for sparse results"):
        F.hessian(X, format="csr")
    # a branch policy per call: the general path, same numbers
    np.testing.assert_array_equal(F.gradient(X, on_branch_change="raise"), F.gradient(X))


def test_a_function_of_several_outputs_is_refused_for_an_ndarray_point():
    F = ad.record(lambda x: [x[0] * x[1], x[0] + x[1]], np.ones(2))
    for method in (F.gradient, F.hessian, F.value_and_gradient):
        with pytest.raises(ValueError, match="needs a scalar function; this one has 2"):
            method(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(F(np.array([2.0, 3.0])), [6.0, 5.0])


def test_mask_mode_takes_the_general_path_on_an_ndarray_point():
    F = ad.record(lambda x: x[0] ** 2 if x[0] > 0 else -x[0], [1.0], on_branch_change="mask")
    g, mask = F.gradient(np.array([3.0]))      # mask True: a row whose branch changed
    np.testing.assert_array_equal(g, [6.0])
    assert not bool(mask)
    g, mask = F.gradient(np.array([-3.0]))
    assert np.isnan(g).all() and bool(mask)


def test_one_point_calls_from_threads_agree():
    # small programs run without releasing the GIL: threads still get their own results
    F = ad.record(rosenbrock, np.ones(N))
    points = np.random.default_rng(4).uniform(0.5, 1.5, (8, N))
    results = [None] * len(points)

    def work(k):
        for _ in range(200):
            results[k] = F.gradient(points[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(points))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p, r in zip(points, results):
        np.testing.assert_allclose(r, gradient_by_hand(p), rtol=1e-12, atol=1e-9)
