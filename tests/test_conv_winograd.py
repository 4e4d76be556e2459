"""Winograd F(2x2, 3x3) (easyad/ops/_conv_winograd.py, easyad/_winograd.h) against a
float64 direct convolution written here: the result, the weight's gradient, and the
input's gradient (a convolution with the flipped kernel), over odd and even sizes,
asymmetric, zero and negative padding, groups, several chunks with a remainder, float32
and float64; then which convolutions take it, and the transforms' refusals."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from easyad import _core
from easyad.ops import _conv, _conv_cpu, _conv_winograd


def _params(padding, groups=1, size=()):
    return _conv.ConvParams(stride=(1, 1), padding=padding, dilation=(1, 1), groups=groups,
                            size=size)


def _cut_pad(x, padding):
    """x (N, C, H, W) padded by (lo_h, lo_w, hi_h, hi_w); a negative entry cuts."""
    lo, hi = padding[:2], padding[2:]
    x = x[:, :, max(-lo[0], 0):x.shape[2] - max(-hi[0], 0),
          max(-lo[1], 0):x.shape[3] - max(-hi[1], 0)]
    return np.pad(x, ((0, 0), (0, 0), (max(lo[0], 0), max(hi[0], 0)),
                      (max(lo[1], 0), max(hi[1], 0))))


def _direct(x, w, padding, groups):
    """float64 cross-correlation, one einsum over every window."""
    xp = _cut_pad(x.astype(np.float64), padding)
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    n, c, oh, ow = win.shape[:4]
    win = win.reshape(n, groups, c // groups, oh, ow, 3, 3)
    wg = w.astype(np.float64).reshape(groups, -1, c // groups, 3, 3)
    return np.einsum("ngchwrs,gocrs->ngohw", win, wg).reshape(n, -1, oh, ow)


def _direct_weight(x, g, padding, groups):
    xp = _cut_pad(x.astype(np.float64), padding)
    n, c = x.shape[:2]
    oh, ow = g.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, :oh, :ow]
    win = win.reshape(n, groups, c // groups, oh, ow, 3, 3)
    gg = g.astype(np.float64).reshape(n, groups, -1, oh, ow)
    return np.einsum("ngchwrs,ngohw->gocrs", win, gg).reshape(g.shape[1], c // groups, 3, 3)


# (n, c in, c out, H, W, padding (lo_h, lo_w, hi_h, hi_w), groups)
CASES = {
    "same, even": (3, 4, 5, 8, 6, (1, 1, 1, 1), 1),
    "odd sizes": (2, 5, 4, 7, 9, (1, 1, 1, 1), 1),
    "no padding": (2, 6, 4, 9, 10, (0, 0, 0, 0), 1),
    "asymmetric": (3, 4, 6, 6, 5, (0, 2, 1, 0), 1),
    "negative": (2, 4, 4, 9, 8, (-1, 2, 1, -2), 1),
    "groups": (2, 8, 12, 6, 7, (1, 1, 1, 1), 2),
    "one output": (1, 4, 4, 3, 3, (0, 0, 0, 0), 1),
    # channels in eights, one group: the weight's gradient takes the tile-major V
    "eights": (2, 8, 4, 7, 9, (1, 1, 1, 1), 1),
    "eights, negative": (3, 16, 8, 9, 8, (-1, 2, 1, -2), 1),
}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("chunk_bytes", [1 << 20, 1])
def test_float64_matches_the_direct_sums(name, chunk_bytes, monkeypatch):
    monkeypatch.setattr(_conv_winograd, "CHUNK_BYTES", chunk_bytes)
    n, c, cout, h, w_, padding, groups = CASES[name]
    rng = np.random.default_rng(len(name))
    x = rng.normal(size=(n, c, h, w_))
    w = rng.normal(size=(cout, c // groups, 3, 3))
    want = _direct(x, w, padding, groups)
    p = _params(padding, groups)
    y = np.full(want.shape, np.nan)
    _conv_winograd.convolve(y, x, w, p)
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-13 * np.abs(want).max())
    g = rng.normal(size=want.shape)
    dw = _conv_winograd.weight(p, x, g)
    ref = _direct_weight(x, g, padding, groups)
    np.testing.assert_allclose(dw, ref, rtol=0, atol=1e-13 * np.abs(ref).max())
    # the input's gradient: <conv(x, w), g> = <x, conv_transpose(g, w)>, by the identity
    # on a second x (conv_transpose's stride-1 route is this module's convolution)
    if all(a >= 0 for a in padding):
        q = dataclasses.replace(p, size=(h, w_))
        dx = _conv_cpu.conv_transpose(q, g, w)
        x2 = rng.normal(size=x.shape)
        assert np.isclose(np.vdot(dx, x2), np.vdot(_direct(x2, w, padding, groups), g),
                          rtol=1e-12)


def test_float32_within_rounding_of_float64():
    """The benchmark's layer (smaller batch): float32 Winograd within 2e-6 of the result's
    largest entry from the float64 direct sums (measured: 3.0e-7, torch's float32 3.3e-7;
    the weight's gradient 5.5e-7 since its product takes a tile-major V (2.4e-7 before),
    torch's 1.2e-6)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 32, 28, 28)).astype(np.float32)
    w = (rng.normal(size=(32, 32, 3, 3)) / 17).astype(np.float32)
    p = _params((1, 1, 1, 1))
    y = np.empty((4, 32, 28, 28), dtype=np.float32)
    _conv_winograd.convolve(y, x, w, p)
    want = _direct(x, w, (1, 1, 1, 1), 1)
    assert np.abs(y - want).max() < 2e-6 * np.abs(want).max()
    g = rng.normal(size=y.shape).astype(np.float32)
    dw = _conv_winograd.weight(p, x, g)
    ref = _direct_weight(x, g, (1, 1, 1, 1), 1)
    assert dw.dtype == np.float32 and np.abs(dw - ref).max() < 2e-6 * np.abs(ref).max()


def test_what_is_cut_off_is_never_read():
    """A negative padding cuts rows and columns: NaN there must not reach any result."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, 8, 9))
    w = rng.normal(size=(4, 4, 3, 3))
    padding = (0, 0, -1, -2)
    poisoned = x.copy()
    poisoned[:, :, -1:, :] = np.nan
    poisoned[:, :, :, -2:] = np.nan
    p = _params(padding)
    y = np.empty((2, 4, 5, 5))
    _conv_winograd.convolve(y, poisoned, w, p)
    np.testing.assert_allclose(y, _direct(x, w, padding, 1), atol=1e-12)
    g = rng.normal(size=y.shape)
    np.testing.assert_allclose(_conv_winograd.weight(p, poisoned, g),
                               _direct_weight(x, g, padding, 1), atol=1e-12)


def test_which_convolutions_take_it():
    p = _params((1, 1, 1, 1))
    o = (8, 9)
    assert _conv_winograd.takes(p, (8, 8, 3, 3), o)
    assert not _conv_winograd.takes(p, (8, 8, 3, 3), (7, 9))                # small result
    assert not _conv_winograd.takes(p, (8, 8, 3, 2), o)                     # kernel
    assert not _conv_winograd.takes(p, (8, 3, 3, 3), o)                     # thin
    assert not _conv_winograd.takes(_params((1, 1, 1, 1), groups=8), (8, 1, 3, 3), o)
    assert not _conv_winograd.takes(dataclasses.replace(p, stride=(2, 1)), (8, 8, 3, 3), o)
    assert not _conv_winograd.takes(dataclasses.replace(p, dilation=(1, 2)), (8, 8, 3, 3), o)
    assert not _conv_winograd.takes(p, (8, 8, 3), o)                        # 1-d


def test_the_lowering_routes_here_and_matches_torch(monkeypatch):
    """Through _conv_cpu (one BLAS thread): the forward, the input's gradient and the
    weight's of a 9x10 float64 convolution take Winograd and give torch's values."""
    torch = pytest.importorskip("torch")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    taken = []
    for name in ("convolve", "weight"):
        real = getattr(_conv_winograd, name)
        monkeypatch.setattr(_conv_winograd, name,
                            lambda *a, real=real, name=name: taken.append(name) or real(*a))
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(3, 6, 9, 10)), rng.normal(size=(5, 6, 3, 3))
    g = rng.normal(size=(3, 5, 9, 10))
    p = _params((1, 1, 1, 1))
    with threadpoolctl.threadpool_limits(1):
        if not _conv_cpu.takes(x, w):
            pytest.skip("numpy's BLAS is not an OpenBLAS: the whole-batch form runs")
        y = _conv_cpu.conv(p, x, w, (9, 10))
        dx = _conv_cpu.conv_transpose(dataclasses.replace(p, size=(9, 10)), g, w)
        dw = _conv_cpu.conv_weight(dataclasses.replace(p, size=(3, 3)), x, g)
    assert taken == ["convolve", "convolve", "weight"]
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, padding=1)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=0, atol=1e-12)


def test_an_all_zero_input_gives_exact_zeros():
    """Tiles of zeros transform to zeros: exact zeros survive where a whole tile is zero
    (a partly zero tile leaves rounding residue: the module's docstring)."""
    x = np.zeros((2, 4, 8, 8), dtype=np.float32)
    x[1] = 1.0
    w = np.random.default_rng(4).normal(size=(4, 4, 3, 3)).astype(np.float32)
    y = np.empty((2, 4, 8, 8), dtype=np.float32)
    _conv_winograd.convolve(y, x, w, _params((1, 1, 1, 1)))
    assert (y[0] == 0).all() and (y[1] != 0).any()


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_infinities_and_nans_give_the_direct_sums_values(bad, monkeypatch):
    """Winograd's differences make inf - inf = NaN where the direct sums give inf: a
    result not finite sends the op to im2col (NaN in, NaN out there too), with no warning
    from the Winograd attempt."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(2, 4, 8, 8)), rng.normal(size=(4, 4, 3, 3))
    g = rng.normal(size=(2, 4, 8, 8))
    x[1, 2, 3, 4] = bad
    p = _params((1, 1, 1, 1))
    pw = dataclasses.replace(p, size=(3, 3))
    with threadpoolctl.threadpool_limits(1), np.errstate(all="ignore"):
        if not _conv_cpu.takes(x, w):
            pytest.skip("numpy's BLAS is not an OpenBLAS: the whole-batch form runs")
        ours = _conv_cpu.conv(p, x, w, (8, 8)), _conv_cpu.conv_weight(pw, x, g)
        monkeypatch.setattr(_conv_winograd, "MIN_CHANNELS", 10**9)       # im2col only
        direct = _conv_cpu.conv(p, x, w, (8, 8)), _conv_cpu.conv_weight(pw, x, g)
    for a, b in zip(ours, direct):
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_array_equal(np.isinf(a), np.isinf(b))
        np.testing.assert_allclose(np.nan_to_num(a), np.nan_to_num(b), rtol=1e-12)


def test_the_transforms_refuse_bad_arrays():
    x = np.zeros((1, 2, 4, 4), dtype=np.float32)
    v = np.zeros((16, 2, 6), dtype=np.float32)      # 2x2 tiles: 2 rows of 2 + 1
    with pytest.raises(TypeError, match="float32 or two float64"):
        _core._wino_in(x, v.astype(np.float64), 4, 4, 0, 0, 2, 2)
    with pytest.raises(TypeError, match="C-contiguous"):
        _core._wino_in(x[:, :, :, ::-1], v, 4, 4, 0, 0, 2, 2)
    with pytest.raises(ValueError, match="do not fit"):
        _core._wino_in(x, v[:, :, :4].copy(), 4, 4, 0, 0, 2, 2)
    with pytest.raises(ValueError, match="rows 5 and columns 4 read of 4x4"):
        _core._wino_in(x, v, 5, 4, 0, 0, 2, 2)
    with pytest.raises(ValueError, match="do not make"):
        _core._wino_out(v, np.zeros((1, 2, 5, 4), dtype=np.float32), 2, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("padding", [(1, 1), (0, 2), (2, 0)])
def test_the_tile_major_transform_is_the_transposed_one(dtype, padding):
    """_wino_in_t's V (16, T, C) is _wino_in's (16, C, T) transposed, bit for bit (the
    same sums in the same order), odd sizes and the padding's zeros included."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 16, 7, 9)).astype(dtype)
    th, tw = 4, 5
    v = np.full((16, 16, 2 * th * (tw + 1)), np.nan, dtype=dtype)
    vt = np.full((16, 2 * th * (tw + 1), 16), np.nan, dtype=dtype)
    _core._wino_in(x, v, 7, 9, *padding, th, tw)
    _core._wino_in_t(x, vt, 7, 9, *padding, th, tw)
    np.testing.assert_array_equal(vt, v.swapaxes(1, 2))
    assert np.isfinite(vt).all()
    with pytest.raises(ValueError, match="a multiple of 8 needed"):
        _core._wino_in_t(x[:, :12].copy(), vt[:, :, :12].copy(), 7, 9, *padding, th, tw)


def test_the_output_transform_reports_what_is_not_finite():
    """_wino_out returns False where a tile came out inf or NaN (the convolution then
    takes the direct sums), True otherwise; y is written either way."""
    rng = np.random.default_rng(4)
    m = rng.normal(size=(16, 2, 2 * 3 * 4)).astype(np.float32)     # 2 images, 3x3 tiles
    y = np.zeros((2, 2, 6, 6), dtype=np.float32)
    assert _core._wino_out(m, y, 3, 3) is True
    assert np.isfinite(y).all() and np.abs(y).max() > 0
    for bad in (np.nan, np.inf, -np.inf):
        poisoned = m.copy()
        poisoned[7, 1, 13] = bad           # plane 7, channel 1, image 1's second tile
        assert _core._wino_out(poisoned, y, 3, 3) is False
    big = m.copy()
    big[0, 0, 0] = big[4, 0, 0] = 3e38     # finite entries whose sum overflows
    assert _core._wino_out(big, y, 3, 3) is False


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_c_loop_and_the_python_loop_agree(dtype, monkeypatch):
    """One group goes image by image in C (_core._wino_conv, OpenBLAS's gemm called from
    there); without that gemm the chunk loop in Python runs: the same products, so the
    two agree to rounding, and both with the float64 direct sums."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 8, 9, 7)).astype(dtype)
    w = rng.normal(size=(6, 8, 3, 3)).astype(dtype)
    p = _params((1, 2, 0, 1))
    want = _direct(x, w, p.padding, 1)
    assert _conv_winograd._gemm_address(np.dtype(dtype)) is not None
    y_c = np.full(want.shape, np.nan, dtype=dtype)
    assert _conv_winograd.convolve(y_c, x, w, p) is True
    monkeypatch.setattr(_conv_winograd, "_gemm_address", lambda dtype: None)
    y_py = np.full(want.shape, np.nan, dtype=dtype)
    assert _conv_winograd.convolve(y_py, x, w, p) is True
    tol = (2e-6 if dtype == np.float32 else 1e-13) * np.abs(want).max()
    np.testing.assert_allclose(y_c, want, rtol=0, atol=tol)
    np.testing.assert_allclose(y_py, y_c, rtol=0, atol=tol)
    # the weight's gradient (channels in eights: _core._wino_wgrad in C) likewise
    g = rng.normal(size=want.shape).astype(dtype)
    ref = _direct_weight(x, g, p.padding, 1)
    wtol = (2e-6 if dtype == np.float32 else 1e-13) * np.abs(ref).max()
    dw_py = _conv_winograd.weight(p, x, g)
    monkeypatch.undo()
    dw_c = _conv_winograd.weight(p, x, g)
    np.testing.assert_allclose(dw_c, ref, rtol=0, atol=wtol)
    np.testing.assert_allclose(dw_py, dw_c, rtol=0, atol=wtol)
    monkeypatch.setattr(_conv_winograd, "_gemm_address", lambda dtype: None)
    x[1, 3, 4, 4] = np.inf          # both report what is not finite
    assert _conv_winograd.convolve(y_py, x, w, p) is False
    monkeypatch.undo()
    assert _conv_winograd.convolve(y_c, x, w, p) is False


def test_the_c_loop_refuses_bad_arguments():
    x = np.zeros((1, 8, 6, 6), dtype=np.float32)
    u = np.zeros((16, 4, 8), dtype=np.float32)
    y = np.zeros((1, 4, 6, 6), dtype=np.float32)
    with pytest.raises(ValueError, match="address of a cblas gemm"):
        _core._wino_conv(x, u, y, 6, 6, 1, 1, 3, 3, 0, True)
    with pytest.raises(ValueError, match="do not fit"):
        _core._wino_conv(x, u[:, :3].copy(), y, 6, 6, 1, 1, 3, 3, 1, True)
    with pytest.raises(ValueError, match="3x3 tiles"):
        _core._wino_conv(x, u, y[:, :, :3].copy(), 6, 6, 1, 1, 3, 3, 1, True)
    total = np.zeros((16, 4, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="address of a cblas gemm"):
        _core._wino_wgrad(x, y, total, 6, 6, 1, 1, 3, 3, 0, True)
    with pytest.raises(ValueError, match="channels in eights"):
        _core._wino_wgrad(x[:, :4].copy(), y, total[:, :, :4].copy(), 6, 6, 1, 1, 3, 3, 1,
                          True)
