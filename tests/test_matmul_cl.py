"""The OpenCL matmul kernels (issue 30): render_gemm, the GPU kernel that reads transposed
operands in place, checked on every OpenCL device (on PoCL it runs only when asked for:
``backend._gemm`` or ``backend.gemm = "new"``), against numpy on shapes that hit every
edge of its tiles; and matmul's choice of kernel (``EASYAD_OPENCL_GEMM``, gemm_plan)."""

from __future__ import annotations

import numpy as np
import pytest

import easyad as ad
from easyad.tensor import _kernels_matmul as kernels

TOL = {np.float32: 1e-4, np.float64: 1e-12}
OPENCL = [d.name for d in ad.devices() if d.kind == "opencl"]


def _first_device_only(backend, reason):
    """Each kernel costs PoCL seconds to build: a second OpenCL device (another PoCL,
    here) runs the cases that differ by device, not the whole matrix again."""
    if OPENCL and backend.device.name != OPENCL[0]:
        pytest.skip(f"checked on {OPENCL[0]}: {reason}")


@pytest.fixture
def backend(opencl_device):
    return ad.Tensor.constant(np.ones(1), device=opencl_device).device.backend


def _operands(backend, rng, dims, dtype, ta, tb, shared=(False, False)):
    """(a, b on the device as the kernel reads them, the numpy product)."""
    batch, M, N, K = dims
    A = rng.standard_normal((1 if shared[0] else batch, M, K)).astype(dtype)
    B = rng.standard_normal((1 if shared[1] else batch, K, N)).astype(dtype)
    a = np.ascontiguousarray(A.transpose(0, 2, 1)) if ta else A
    b = np.ascontiguousarray(B.transpose(0, 2, 1)) if tb else B
    return backend.asarray(a, dtype), backend.asarray(b, dtype), A @ B


def _check(backend, got, expected, dtype):
    got = backend.to_numpy(got)
    assert got.shape == expected.shape and got.dtype == dtype
    scale = max(np.abs(expected).max(), 1.0)
    err = np.abs(got - expected).max() / scale
    assert err <= TOL[dtype], err


def _gemm(backend, rng, dims, dtype, ta, tb, config=None, split=None, shared=(False, False)):
    a, b, expected = _operands(backend, rng, dims, dtype, ta, tb, shared)
    got = backend._gemm(a, b, ta, tb, dims, (not shared[0] and dims[0] > 1,
                                              not shared[1] and dims[0] > 1), config, split)
    _check(backend, got, expected, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_gemm_layouts_edges(backend, rng, dtype, ta, tb):
    """The big tile in each layout, on shapes below, across and on its tiles' edges."""
    if (ta, tb) not in [(False, True), (True, False)]:    # the MLP's layouts everywhere
        _first_device_only(backend, "the layouts an MLP does not use")
    for dims in [(1, 1, 1, 1), (1, 131, 137, 67), (1, 128, 128, 16), (2, 7, 129, 1),
                 (1, 257, 3, 9), (3, 64, 64, 8)]:
        _gemm(backend, rng, dims, dtype, ta, tb, "big", 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("config,ta,tb", [("tall", False, True), ("wide", True, False),
                                          ("mid", False, False)])
def test_gemm_thin_tiles_and_split_k(backend, rng, dtype, config, ta, tb):
    """The thin tiles of an MLP's 10-wide layer (its forward product reads W (10, H)
    transposed, its weight gradient g^T h), K split into slices and summed, a last slice
    shorter than the others, and a split asked for beyond K's slabs."""
    if config == "mid":
        _first_device_only(backend, "the mid tile")
    for dims, split in [((1, 300, 10, 1000), 4), ((1, 10, 300, 1000), 3), ((2, 65, 17, 61), 2),
                        ((1, 33, 31, 5), 7), ((1, 1, 1, 1), 2)]:
        _gemm(backend, rng, dims, dtype, ta, tb, config, split)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_shared_operands_and_large_k(backend, rng, dtype):
    """Batch entries sharing one operand (batch stride 0), either side, and a long K."""
    _gemm(backend, rng, (3, 70, 45, 23), dtype, False, False, "big", 1, shared=(True, False))
    _gemm(backend, rng, (3, 70, 45, 23), dtype, False, False, "big", 1, shared=(False, True))
    _gemm(backend, rng, (1, 19, 23, 4099), dtype, False, False, "big", 1)


@pytest.mark.parametrize("choice", ["new", "tiled", "nt"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_matmul_each_kernel(backend, rng, monkeypatch, choice, ta, tb):
    """matmul through each kernel (the environment variable picks it), in the layouts the
    linear layer's products use, with a shared operand; empty and K = 0 products."""
    monkeypatch.setenv("EASYAD_OPENCL_GEMM", choice)
    dtype = np.float32
    a, b, expected = _operands(backend, rng, (2, 67, 33, 41), dtype, ta, tb, (False, True))
    _check(backend, backend.matmul(a, b, ta, tb), expected, dtype)
    empty = backend.matmul(backend.asarray(np.ones((1, 0, 3)), dtype),
                           backend.asarray(np.ones((1, 3, 4)), dtype))
    assert empty.shape == (1, 0, 4)
    zero = backend.matmul(backend.asarray(np.ones((2, 3, 0)), dtype),
                          backend.asarray(np.ones((1, 0, 4)), dtype))
    np.testing.assert_array_equal(backend.to_numpy(zero), np.zeros((2, 3, 4), dtype))


def test_matmul_backend_choice_wins_and_bad_choice_raises(backend, rng, monkeypatch):
    monkeypatch.setenv("EASYAD_OPENCL_GEMM", "cublas")
    a, b, expected = _operands(backend, rng, (1, 5, 6, 7), np.float64, False, False)
    with pytest.raises(ValueError, match="EASYAD_OPENCL_GEMM"):
        backend.matmul(a, b)
    monkeypatch.setattr(backend, "gemm", "new")
    _check(backend, backend.matmul(a, b), expected, np.float64)


def test_linear_layer_gradients_through_new_kernel(backend, rng, monkeypatch):
    """A linear layer's value and gradients (forward x W^T, backward g W and g^T x: the
    MLP's three products) and a plain matmul's, with the GPU kernel, against numpy."""
    from easyad.nn.functional import linear
    monkeypatch.setattr(backend, "gemm", "new")
    # sides over 32: every product takes the layouts test's tiles (no more compiles)
    x0, w0, v0 = (rng.standard_normal(s) for s in [(40, 35), (33, 35), (33, 34)])
    dev = backend.device.name
    lst = ad.WengertList()
    x, w, v = (ad.Tensor.variable(a, lst, device=dev) for a in (x0, w0, v0))
    h = linear(x, w)
    loss = ad.sum((h @ v) ** 2)
    d = loss.derivatives()
    hv = x0 @ w0.T @ v0
    assert np.isclose(float(loss.number), np.sum(hv ** 2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(d[v]), (x0 @ w0.T).T @ (2 * hv), rtol=1e-10)
    g = 2 * hv @ v0.T
    np.testing.assert_allclose(np.asarray(d[w]), g.T @ x0, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(d[x]), g @ w0, rtol=1e-10)


@pytest.mark.parametrize("real", ["float", "double"])
def test_gemm_plan(real, monkeypatch):
    """The tile and K slices chosen for the MLP's products on a 132-unit GPU."""
    monkeypatch.delenv("EASYAD_OPENCL_GEMM_BIG", raising=False)
    def plan(*dims):
        return kernels.gemm_plan(real, *dims, 132)
    big = "big-1buf" if real == "float" else "big"     # the float default (GPU-measured)
    assert plan(1, 4096, 4096, 784) == (big, 1)         # 1024 tiles
    assert plan(1, 1024, 1024, 784)[0] == ("mid" if real == "float" else "big")
    assert plan(1, 4096, 10, 4096) == ("tall", 5)       # 64 tiles, K sliced
    assert plan(1, 10, 4096, 4096) == ("wide", 5)
    assert plan(1, 64, 10, 128) == ("tall", 1)          # K too short to slice
    assert plan(1, 16, 16, 16)[1] == 1
    for dims in [(1, 4096, 10, 4096), (1, 10, 4096, 4096), (3, 1, 1, 1)]:
        name, _ = plan(*dims)
        assert name in kernels.GEMM_CONFIGS[real]


@pytest.mark.parametrize("real", ["float", "double"])
def test_gemm_configs_render(real):
    """Every config renders in every layout (the renderer's asserts check each config's
    work-item count divides its slabs)."""
    for cfg in kernels.GEMM_CONFIGS[real].values():
        for ta in (False, True):
            for tb in (False, True):
                source = kernels.render_gemm(real, cfg, ta, tb, split=True)
                assert "easyad_gemm" in source


@pytest.mark.parametrize("variant", ["big-bk16", "big-1buf"])
def test_big_tile_variants_compute_and_are_chosen(backend, rng, monkeypatch, variant):
    """EASYAD_OPENCL_GEMM_BIG swaps the 128x128 tile gemm_plan picks (float only): the
    variant's product is numpy's across tile edges, and a name that is no variant raises."""
    monkeypatch.setenv("EASYAD_OPENCL_GEMM_BIG", variant)
    assert kernels.gemm_plan("float", 1, 4096, 4096, 784, 132) == (variant, 1)
    assert kernels.gemm_plan("double", 1, 4096, 4096, 784, 132) == ("big", 1)
    a = rng.standard_normal((1, 130, 37)).astype(np.float32)
    b = rng.standard_normal((1, 37, 129)).astype(np.float32)
    got = backend._gemm(backend.asarray(a, np.float32), backend.asarray(b, np.float32),
                        False, False, (1, 130, 129, 37), (False, False), variant, 1)
    np.testing.assert_allclose(backend.to_numpy(got), a @ b, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("EASYAD_OPENCL_GEMM_BIG", "huge")
    with pytest.raises(ValueError, match="EASYAD_OPENCL_GEMM_BIG is 'huge'"):
        kernels.gemm_plan("float", 1, 4096, 4096, 784, 132)
