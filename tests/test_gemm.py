"""easyad's AVX-512 matrix products (easyad/_gemm.h, ``_core._gemm``) against numpy, and
the numpy device's choice between them and numpy's BLAS (easyad/tensor/_blas.py)."""
from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad import _core
from easyad.tensor import _blas

kernels = pytest.mark.skipif(not _core.GEMM_SUPPORTED,
                             reason="this CPU lacks AVX-512: the kernels are not used")


def _close(got, a, b):
    """Within rounding of the exact product: |error| <= c * eps * (|A| |B|)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64
    bound = np.abs(a64) @ np.abs(b64)
    eps = np.finfo(a.dtype).eps
    k = max(a.shape[-1], 1)
    assert got.shape == want.shape and got.dtype == a.dtype
    assert (np.abs(got - want) <= 4 * k * eps * bound + 1e-300).all()


SHAPES = [(1, 1, 1), (3, 5, 7), (4, 64, 32), (5, 65, 33), (8, 63, 64), (17, 3, 100),
          (64, 784, 128), (7, 130, 129), (0, 3, 4), (3, 0, 4), (3, 4, 0),
          (300, 70, 40), (513, 5, 65)]           # past one block of rows (MC = 256)


@kernels
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("mkn", SHAPES)
def test_products_match_numpy_for_every_layout(dtype, mkn):
    """Every edge of the blocking (rows past a multiple of 4, columns past a panel, K past
    a block, empty sides) with contiguous, transposed, sliced, reversed and broadcast
    operands."""
    m, k, n = mkn
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    layouts = [(a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)),
               (np.ascontiguousarray(a.T).T, np.ascontiguousarray(b.T).T)]
    if m and k and n:
        big_a = rng.standard_normal((2 * m, 3 * k)).astype(dtype)
        layouts.append((big_a[::2, ::3], b[::-1][::-1]))
        layouts.append((a[::-1], b[:, ::-1]))
        layouts.append((np.broadcast_to(a[:1], (m, k)), np.broadcast_to(b[:, :1], (k, n))))
    for x, y in layouts:
        got = _core._gemm(x, y)
        assert got.flags.c_contiguous
        _close(got, x, y)


@kernels
def test_non_finite_values_propagate_as_in_blas():
    """0 * inf is NaN in a product, as numpy's matmul has it (no strong zero here)."""
    a = np.array([[np.inf, 1.0], [0.0, 2.0]])
    b = np.array([[0.0, 1.0], [3.0, np.nan]])
    got = _core._gemm(a, b)
    want = np.matmul(a, b)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


@kernels
def test_bad_operands_are_refused_clearly():
    a = np.ones((2, 3))
    with pytest.raises(TypeError, match="two float64 or two float32"):
        _core._gemm(a, np.ones((3, 2), np.float32))
    with pytest.raises(TypeError, match="two float64 or two float32"):
        _core._gemm(np.ones((2, 3), np.int64), np.ones((3, 2), np.int64))
    with pytest.raises(ValueError, match=r"\(M, K\) by \(K, N\)"):
        _core._gemm(a, np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"\(M, K\) by \(K, N\)"):
        _core._gemm(np.ones(3), np.ones(3))
    with pytest.raises(TypeError, match="numpy arrays"):
        _core._gemm([[1.0]], [[1.0]])
    odd = np.ones(25, np.uint8)[1:].view(np.float64).reshape(1, 3)
    with pytest.raises(ValueError, match="whole elements"):
        _core._gemm(np.lib.stride_tricks.as_strided(odd, (1, 3), (24, 4)), np.ones((3, 1)))


@pytest.fixture
def mode(monkeypatch):
    def set_mode(value, threads=None):
        monkeypatch.setattr(_blas, "_MODE", value)
        monkeypatch.setattr(_blas, "_THREADS", None if threads is None else (lambda: threads))
    return set_mode


def _spy(monkeypatch):
    calls = []
    real = _core._gemm

    def gemm(a, b):
        calls.append(a.shape + b.shape[1:])
        return real(a, b)
    monkeypatch.setattr(_core, "_gemm", gemm)
    return calls


@kernels
def test_the_choice_follows_mode_threads_and_size(mode, monkeypatch):
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 100)), rng.standard_normal((100, 32))
    small_a, small_b = a[:4, :8], b[:8, :4]
    mode("blas")
    assert np.array_equal(_blas.matmul(a, b), np.matmul(a, b)) and not calls
    mode("auto", threads=4)          # a many-threaded BLAS keeps the product
    assert np.array_equal(_blas.matmul(a, b), np.matmul(a, b)) and not calls
    mode("auto", threads=None)       # not an OpenBLAS without AVX-512 kernels
    assert np.array_equal(_blas.matmul(a, b), np.matmul(a, b)) and not calls
    mode("auto", threads=1)
    _close(_blas.matmul(a, b), a, b)
    assert calls == [(64, 100, 32)]
    assert np.array_equal(_blas.matmul(small_a, small_b), np.matmul(small_a, small_b))
    assert len(calls) == 1           # too small: numpy's
    mode("easyad")
    got = _blas.matmul(a[None], b[None])        # a batch of one
    assert got.shape == (1, 64, 32) and len(calls) == 2
    _close(got[0], a, b)
    batch = _blas.matmul(np.stack([a, a]), np.stack([b, b]))      # batches: numpy's
    assert np.array_equal(batch, np.matmul(np.stack([a, a]), np.stack([b, b])))
    assert len(calls) == 2
    mixed = _blas.matmul(a.astype(np.float32), b)                   # mixed dtypes: numpy's
    assert mixed.dtype == np.float64 and len(calls) == 2


def test_a_bad_mode_is_named(monkeypatch):
    monkeypatch.setenv("EASYAD_MATMUL", "fastest")
    with pytest.raises(ValueError, match="EASYAD_MATMUL='fastest': use auto, blas or easyad"):
        _blas._mode()
    monkeypatch.setenv("EASYAD_MATMUL", " BLAS ")
    assert _blas._mode() == "blas"


def _mlp(p, x):
    h = ad.tanh(x @ p["W1"] + p["b1"])
    return ad.sum(ad.logsumexp(h @ p["W2"], axis=1)) / x.shape[0]


@kernels
def test_eager_fast_path_general_path_and_replay_agree_on_the_kernels(mode, monkeypatch):
    """With the kernels on: a tensor product's fast path and general path give the same
    bits (both run the kernels), its gradient matches the hand-derived one, and an MLP
    recorded once and replayed equals eager execution within 1e-12."""
    from easyad.tensor import _structural
    mode("easyad")
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(3)
    a0, b0, w = (rng.standard_normal(s) for s in ((40, 70), (70, 50), (40, 50)))

    def f(xy):
        return ad.sum((xy[0] @ xy[1]) * w)
    fast_value, fast_grads = ad.value_and_grad(f)((a0, b0))
    assert calls                     # the kernels ran
    with monkeypatch.context() as m:
        m.setattr(_structural, "_fast", lambda *args: False)
        value, grads = ad.value_and_grad(f)((a0, b0))
    assert value == fast_value
    for g, h in zip(grads, fast_grads):
        assert np.array_equal(g, h)
    np.testing.assert_allclose(grads[0], w @ b0.T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads[1], a0.T @ w, rtol=1e-12, atol=1e-12)

    params = {"W1": rng.standard_normal((60, 80)) / 8, "b1": rng.standard_normal(80),
              "W2": rng.standard_normal((80, 10)) / 9}
    x = rng.standard_normal((64, 60))
    F = ad.record(_mlp, params, x, tensor=True)
    eager = ad.value_and_grad(_mlp)
    for _ in range(2):
        x = rng.standard_normal((64, 60))
        value, g = F.value_and_gradient(params, x)
        ref_value, ref_g = eager(params, x)
        np.testing.assert_allclose(value, ref_value, rtol=1e-12)
        for a, b in zip(*(ad._trees.flatten(t)[0] for t in (g, ref_g))):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
