"""The convolutions' chunked numpy lowering for float arrays (easyad/ops/_conv_cpu.py)
against torch's autograd in float64: the result, the input's gradient (conv_transpose, by
both of its routes) and the weight's (conv_weight), over strides, asymmetric and
over-wide padding, dilation, groups, 1-3 spatial axes, leading axes, several chunks with
a remainder; then the kept per-thread buffer (growth, no aliasing, threads), and which
operands and BLAS thread counts take it."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from easyad.ops import _conv, _conv_cpu
from easyad.tensor import _blas

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@pytest.fixture(autouse=True)
def one_blas_thread():
    """The chunked lowering runs where numpy's BLAS runs one thread (``takes``)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if _blas.blas_threads() is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS: the whole-batch form runs")
    with threadpoolctl.threadpool_limits(1):
        assert _conv_cpu.takes(np.zeros(1), np.zeros(1))
        yield


def test_a_many_threaded_blas_takes_the_whole_batch_form():
    import threadpoolctl
    a = np.zeros((1, 1, 3, 3), dtype=np.float32)
    with threadpoolctl.threadpool_limits(2):
        if _blas.blas_threads() != 2:
            pytest.skip("this OpenBLAS was built for one thread")
        assert not _conv_cpu.takes(a, a)
    assert _conv_cpu.takes(a, a)          # (the fixture's one thread again)
    assert not _conv_cpu.takes(a.astype(object), a.astype(object))
    assert not _conv_cpu.takes(a, a.astype(np.float64))

# (x shape, w shape, stride, padding (low sides, then high sides), dilation, groups)
CASES = {
    "3x3 same": ((3, 4, 7, 6), (5, 4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    "stride dilation groups": ((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), (1, 0, 2, 1), (1, 2), 2),
    "over-wide padding": ((2, 3, 5, 5), (4, 3, 2, 3), (1, 1), (3, 0, 1, 4), (1, 1), 1),
    "depthwise": ((3, 6, 6, 7), (6, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6),
    "col2im route": ((2, 2, 6, 6), (7, 2, 3, 3), (1, 1), (1, 1, 1, 1), (2, 1), 1),
    "stride 3": ((2, 3, 10, 9), (4, 3, 3, 3), (3, 2), (1, 1, 1, 1), (1, 1), 1),
    "1-d": ((4, 3, 11), (5, 3, 4), (1,), (2, 1), (2,), 1),
    "3-d": ((2, 2, 5, 4, 6), (3, 2, 2, 3, 2), (1, 2, 1), (1, 0, 1, 0, 1, 1), (1, 1, 2), 1),
    "1x1": ((3, 8, 4, 5), (6, 4, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2),
}


def _torch(x, w, g, stride, pad, dilation, groups):
    """torch's conv of x padded (asymmetric padding by F.pad), and the gradients of
    <conv, g> in x and w, float64."""
    d = w.ndim - 2
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (x, w))
    # F.pad takes the last axis' (low, high) first
    pairs = [v for i in reversed(range(d)) for v in (pad[i], pad[d + i])]
    conv = {1: TF.conv1d, 2: TF.conv2d, 3: TF.conv3d}[d]
    y = conv(TF.pad(tx, pairs), tw, stride=stride, dilation=dilation, groups=groups)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


def _ours(x, w, g, stride, pad, dilation, groups):
    d = w.ndim - 2
    shape, p = _conv._conv_rule(_conv.ConvParams(stride=stride, padding=pad,
                                                 dilation=dilation, groups=groups),
                                x.shape, w.shape)
    assert g is None or g.shape == shape
    y = _conv._conv_numpy(p, x, w)
    if g is None:
        return y, None, None
    dx = _conv._transpose_numpy(dataclasses.replace(p, size=x.shape[-d:]), g, w)
    dw = _conv._weight_numpy(dataclasses.replace(p, size=w.shape[2:]), x, g)
    return y, dx, dw


def _shape(x, w, stride, pad, dilation, groups):
    return _conv._conv_rule(_conv.ConvParams(stride=stride, padding=pad, dilation=dilation,
                                             groups=groups), x.shape, w.shape)[0]


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 1000], ids=["one chunk", "chunks"])
@pytest.mark.parametrize("name", list(CASES))
def test_float64_matches_torch(name, chunk_bytes, monkeypatch):
    monkeypatch.setattr(_conv_cpu, "CHUNK_BYTES", chunk_bytes)
    xs, ws, *geometry = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x, w = rng.normal(size=xs), rng.normal(size=ws)
    g = rng.normal(size=_shape(x, w, *geometry))
    ours, theirs = _ours(x, w, g, *geometry), _torch(x, w, g, *geometry)
    for what, a, b in zip(("result", "input's gradient", "weight's gradient"), ours, theirs):
        assert a.shape == b.shape and a.dtype == np.float64 and a.flags.c_contiguous
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=f"{name}: {what}")


def test_the_two_transpose_routes_and_the_object_form_agree():
    # 2 -> 7 channels: col2im; 7 -> 2: the flipped kernel's convolution; object arrays
    # (the scalar engines' form) take _conv's whole-batch im2col: all one function
    rng = np.random.default_rng(3)
    for ws in ((7, 2, 3, 3), (2, 7, 3, 3)):
        x, w = rng.normal(size=(2, ws[1], 6, 5)), rng.normal(size=ws)
        geometry = ((1, 1), (2, 1, 0, 1), (1, 2), 1)
        g = rng.normal(size=_shape(x, w, *geometry))
        fast = _ours(x, w, g, *geometry)
        slow = _ours(x.astype(object), w.astype(object), g.astype(object), *geometry)
        for a, b in zip(fast, slow):
            np.testing.assert_allclose(a, b.astype(float), rtol=1e-12, atol=1e-12)


def test_float32_leading_axes_and_strided_inputs():
    rng = np.random.default_rng(4)
    x64 = rng.normal(size=(2, 3, 4, 9, 8))             # two leading axes
    w64 = rng.normal(size=(5, 4, 3, 3))
    geometry = ((1, 2), (1, 1, 1, 1), (1, 1), 1)
    g64 = rng.normal(size=_shape(x64, w64, *geometry))
    flat = [a.reshape((-1,) + a.shape[2:]) for a in (x64, g64)]
    want = _torch(flat[0], w64, flat[1], *geometry)
    # a transposed (non-contiguous) input and weight in float32
    x32 = np.ascontiguousarray(x64.swapaxes(-1, -2)).astype(np.float32).swapaxes(-1, -2)
    w32 = np.ascontiguousarray(w64.swapaxes(0, 1)).astype(np.float32).swapaxes(0, 1)
    y, dx, dw = _ours(x32, w32, g64.astype(np.float32), *geometry)
    assert (y.dtype, dx.dtype, dw.dtype) == (np.float32,) * 3
    assert y.shape == g64.shape and dx.shape == x64.shape and dw.shape == w64.shape
    for a, b in zip((y.reshape(-1, *y.shape[2:]), dx.reshape(-1, *dx.shape[2:]), dw), want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_the_kept_buffer_grows_and_is_never_returned():
    rng = np.random.default_rng(5)
    geometry = ((1, 1), (2, 2, 2, 2), (1, 1), 1)
    small = rng.normal(size=(1, 2, 3, 3)), rng.normal(size=(2, 2, 3, 3))
    big = rng.normal(size=(3, 2, 9, 8)).astype(np.float32), \
        rng.normal(size=(2, 2, 3, 3)).astype(np.float32)
    _ours(rng.normal(size=(3, 2, 9, 8)), small[1], None, *geometry)  # data where the
    y_small = _ours(*small, None, *geometry)[0]     # next call's borders lie: re-zeroed
    kept = y_small.copy()
    y_big = _ours(*big, None, *geometry)[0]             # another dtype, a bigger buffer
    _ours(small[0] * 2.0, small[1], None, *geometry)    # reuses the float64 buffer
    np.testing.assert_array_equal(y_small, kept)         # (the result is its own array)
    for (x, w), y in ((small, y_small), (big, y_big)):
        np.testing.assert_allclose(y, _torch(x.astype(float), w.astype(float),
                                             np.zeros(y.shape), *geometry)[0],
                                   rtol=1e-5, atol=1e-5)


def test_threads_each_use_their_own_buffers():
    rng = np.random.default_rng(6)
    geometry = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    pairs = [(rng.normal(size=(4, 3, 12 + i, 10)), rng.normal(size=(4, 3, 3, 3)))
             for i in range(4)]
    want = [_ours(x, w, None, *geometry)[0] for x, w in pairs]
    got: dict[int, list[np.ndarray]] = {}

    def run(i):
        got[i] = [_ours(*pairs[i], None, *geometry)[0] for _ in range(20)]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        for y in got[i]:
            np.testing.assert_array_equal(y, want[i])
