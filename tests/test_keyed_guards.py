"""Guards on what a value decides, not on the value (issue 26): LU pivots, lstsq's rank
and argmax/argmin/argsort read their operand's numbers; in ``ad.record(tensor=True)``
replay is guarded on the pivots / indices they returned, so a new point that keeps them
replays and one where partial pivoting (or the order) would choose others raises
BranchChangedError, or records again with ``on_branch_change="retape"``, never reusing
the stale pivots."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import easyad as ad

from conftest import OPENCL

L = ad.linalg
B = np.array([[1.0, 2.0], [0.5, -1.0], [3.0, 0.25]])


def _a(x):
    # pivots of column 0: the largest |a_i0|; x[0] moves a_00 past a_10 = 2
    return x.reshape(3, 3) + np.array([[0.0, 0.0, 0.0], [2.0, 5.0, 0.0], [0.0, 0.0, 6.0]])


def _f(x):
    return ad.sum(ad.sin(L.lu_solve(L.lu_factor(_a(x)), B)))


def _reference(x):
    a = _a(x)
    return float(np.sum(np.sin(scipy.linalg.lu_solve(scipy.linalg.lu_factor(a), B))))


X0 = np.array([1.0, 0.3, -0.2, 0.1, 0.0, 0.4, 0.2, -0.3, 0.0])   # pivots: row 1 first
SAME = X0 + 0.05                                                    # the same pivots
OTHER = X0 + np.array([2.5, 0, 0, 0, 0, 0, 0, 0, 0])              # row 0 first


def test_the_points_choose_the_pivots_they_are_meant_to():
    piv = [scipy.linalg.lu_factor(_a(x))[1].tolist() for x in (X0, SAME, OTHER)]
    assert piv[0] == piv[1] and piv[0] != piv[2]


@pytest.mark.parametrize("device", ["numpy", *OPENCL[:1]])
def test_lu_replay_is_guarded_on_the_pivots(device):
    T = ad.record(_f, X0, tensor=True, device=device)
    assert abs(float(T(SAME)) - _reference(SAME)) < 1e-12       # same pivots: replays
    h = 1e-6
    fd = (_reference(SAME + h * np.eye(9)[4]) - _reference(SAME - h * np.eye(9)[4])) / (2 * h)
    assert abs(T.gradient(SAME)[4] - fd) < 1e-6
    with pytest.raises(ad.BranchChangedError):                   # stale pivots: refused
        T(OTHER)
    with pytest.raises(ad.BranchChangedError):
        T.gradient(OTHER)
    R = ad.record(_f, X0, tensor=True, device=device, on_branch_change="retape")
    assert abs(float(R(OTHER)) - _reference(OTHER)) < 1e-12     # recorded again there
    assert abs(float(R(SAME)) - _reference(SAME)) < 1e-12


def test_solve_refactors_at_every_replay():
    # np.linalg.solve is one op (LAPACK's gesv at each run): no pivots to go stale
    def f(x):
        return ad.sum(np.linalg.solve(_a(x), B))
    T = ad.record(f, X0, tensor=True)
    expected = float(np.sum(np.linalg.solve(_a(OTHER), B)))
    assert abs(float(T(OTHER)) - expected) < 1e-12


def test_argmax_replay_is_guarded_on_the_index_only():
    def f(x):
        return np.take(x, np.argmax(x)) * ad.sum(x)
    x0 = np.array([0.1, 2.0, 0.5])
    T = ad.record(f, x0, tensor=True)
    x1 = np.array([0.3, 1.5, 0.2])                  # other values, the same argmax
    assert abs(float(T(x1)) - 1.5 * 2.0) < 1e-14
    np.testing.assert_allclose(T.gradient(x1), [1.5, 2.0 + 1.5, 1.5], rtol=1e-14)
    with pytest.raises(ad.BranchChangedError):
        T(np.array([3.0, 1.5, 0.2]))                 # another argmax


def test_argsort_and_lstsq_rank_keyed():
    def f(x):
        order = np.argsort(x)
        return ad.sum(np.take(x, order) * np.array([1.0, 2.0, 3.0]))
    T = ad.record(f, np.array([3.0, 1.0, 2.0]), tensor=True)
    assert float(T(np.array([30.0, 10.0, 20.0]))) == 10.0 + 40.0 + 90.0
    with pytest.raises(ad.BranchChangedError):
        T(np.array([1.0, 3.0, 2.0]))

    def g(x):
        return ad.sum(np.linalg.lstsq(x.reshape(3, 2), B[:, :1], rcond=None)[0])
    x0 = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    G = ad.record(g, x0, tensor=True)
    x1 = x0 + 0.1
    expected = float(np.sum(np.linalg.lstsq(x1.reshape(3, 2), B[:, :1], rcond=None)[0]))
    assert abs(float(G(x1)) - expected) < 1e-12
    with pytest.raises(ad.BranchChangedError):        # rank 2 -> 1
        G(np.array([1.0, 1.0, 2.0, 2.0, 3.0, 3.0]))


def _scaled_by_argmax(x):
    return ad.sum(x * x) * float(1 + np.argmax(x))


@pytest.mark.skipif(not OPENCL, reason="no working OpenCL device")
def test_a_keyed_guard_in_a_batch_of_points_on_opencl():
    from easyad.compiler.program import batch_cl
    F = ad.record(_scaled_by_argmax, np.array([0.0, 1.0, 0.0, 0.5]), tensor=True,
                  device=OPENCL[0])
    X = np.random.default_rng(3).uniform(0.0, 1.0, size=(20, 4))
    X[:, 1] = 2.0                                   # the recorded argmax at every point
    values, grads = F.value_and_gradient(X)
    np.testing.assert_allclose(values, 2.0 * np.sum(X * X, axis=1), rtol=1e-12)
    np.testing.assert_allclose(grads, 4.0 * X, rtol=1e-12)
    assert batch_cl.batched(F._bound["gradient"]) is not None    # one launch per kernel
    X[5, 3] = 3.0                                   # one point with another argmax
    with pytest.raises(ad.BranchChangedError):
        F.value_and_gradient(X)
