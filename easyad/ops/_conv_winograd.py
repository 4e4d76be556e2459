"""Winograd F(2x2, 3x3) for the 3x3, stride-1, undilated 2-D convolutions of float32 and
float64 arrays (``_conv_cpu`` sends them here): each 2x2 block of outputs costs 16
products per pair of channels instead of 36, so the three GEMMs of a convolution's
forward and backward shrink 2.25x (at 32 -> 32 channels their K is the channels, 32, and
OpenBLAS still runs them in the cache at ~130 GFLOP/s: one chunk's tiles are ~1 MB).

For one 4x4 tile d of the padded input, a 3x3 kernel w and 1-D matrices
``B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]]``, ``G = [[1,0,0],[.5,.5,.5],
[.5,-.5,.5],[0,0,1]]``, ``A^T = [[1,1,1,0],[0,1,-1,-1]]`` (Lavin and Gray, 2015)::

    y (2x2) = A^T [ (G w G^T) * (B^T d B) ] A      (* entrywise, 16 entries)

summed over the input channels: per entry (k, l) of the 4x4 that sum is a GEMM of the
kernels' transforms U (Co x Ci) with the tiles' V (Ci x tiles). The weight's gradient
uses the same algebra read the other way (the trilinear form ``sum g[a] d[a+r] w[r]``
is symmetric in the roles of g and w): ``dw[r, s] = sum_(k,l) G[k, r] G[l, s]
sum_tiles (A gg A^T)[k, l] (B^T d B)[k, l]`` for each 2x2 tile gg of the cotangent, i.e.
the input's V again and a GEMM over tiles. The input's gradient at stride 1 is a
convolution with the flipped kernel (``_conv_cpu.conv_transpose``), so it comes here too.

Exact zeros: where every input a direct sum reads is zero (an all-zero window, the
padding) the direct form gives exactly 0, Winograd the rounding residue of the tile's
other entries (~1e-7 of their size in float32): the same size as any other rounding, but
a ReLU or Adam downstream can turn it into a visible difference between two runs whose
inputs differ by rounding (eager against replayed training of the digits CNN moved a
weight by 0.035 after 4 Adam steps with its 4x4 second layer here; MIN_SIZE keeps such
small images on im2col).

The transforms (sums and differences: ``easyad/_winograd.h``) run a chunk of images at
a time so that V stays in the cache for its GEMM; a convolution of one group, and the
weight gradient of one with channels in eights, run image by image in C
(``_core._wino_conv``, ``_core._wino_wgrad``: OpenBLAS's cblas gemm called from there,
no Python between the images; the weight's products accumulate by the gemm's beta).
The result differs from the direct sums by rounding only: in float32, 3.0e-7 of the
result's largest entry from the float64 sums at 32 -> 32 channels 28x28 (torch's
float32: 3.3e-7; the weight's gradient 5.5e-7, torch's 1.2e-6: its GEMM on the tile-
major V sums in another order than the 2.4e-7 of the transposed one;
tests/test_conv_winograd.py bounds both at 2e-6), in float64 ~1e-16.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from easyad import _core
from easyad.tensor import _blas

# bytes of one chunk's transformed tiles (V), about one image's at 32 channels 28x28: one
# image a chunk ran faster than 2, 4, 8 or 16 (7.9, 8.5, 9.1, 11.2, 17.0 ms the convolution
# of 64 images on this loaded machine: the GEMM's operands stay in L2, which two threads share)
CHUNK_BYTES = 1 << 19
# below this many channels a group the GEMMs are too thin to pay for the transforms
# (depthwise convolutions keep the direct form). Measured against _conv_cpu's im2col (64
# images, C -> C channels, one thread, ms conv / weight gradient): C=4 28x28 0.92/1.01 ->
# 0.67/0.65, C=16 28x28 5.96/6.50 -> 3.67/4.01, C=64 14x14 13.1/14.6 -> 8.3/12.9, C=128
# 7x7 14.5/17.0 -> 11.5/17.6 (small odd images waste the most on spare tiles)
MIN_CHANNELS = 4
# nor below this many outputs a side: a spare tile a row and an odd side's half-used tiles
# weigh most there (at 7x7 the weight's gradient ran slower than im2col, above), and
# im2col keeps the exact zeros of small, sparse images (see the docstring)
MIN_SIZE = 8

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def takes(p: Any, w_shape: tuple[int, ...], o: tuple[int, ...]) -> bool:
    """Whether the convolution of a weight ``w_shape`` with parameters p, whose result's
    spatial shape is o, comes here."""
    return len(w_shape) == 4 and tuple(w_shape[2:]) == (3, 3) and \
        tuple(p.stride) == (1, 1) and tuple(p.dilation) == (1, 1) and \
        w_shape[1] >= MIN_CHANNELS and w_shape[0] // p.groups >= MIN_CHANNELS and \
        min(o) >= MIN_SIZE


@functools.lru_cache(maxsize=None)
def _gemm_address(dtype: np.dtype) -> tuple[int, bool] | None:
    """The address of numpy's OpenBLAS cblas gemm for dtype and whether its integers are
    64-bit, for _core._wino_conv (None where numpy's BLAS is not an OpenBLAS found)."""
    gemm = _blas.cblas_gemm(dtype)
    if gemm is None:
        return None
    address = ctypes.cast(gemm, ctypes.c_void_p).value
    return None if not address else (address, gemm.argtypes[3] is ctypes.c_int64)


def _tiles(o: tuple[int, ...]) -> tuple[int, int]:
    return (o[0] + 1) // 2, (o[1] + 1) // 2


def _per_image(th: int, tw: int) -> int:
    """An image's tiles: th rows of tw + 1 (``_winograd.h``: one spare a row)."""
    return th * (tw + 1)


def _geometry(p: Any, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The input's rows and columns read (a negative high padding cuts the rest) and its
    low padding, as _wino_in takes them."""
    h, w = shape[2:]
    return h + min(p.padding[2], 0), w + min(p.padding[3], 0), p.padding[0], p.padding[1]


def _chunk(n: int, channels: int, tiles: int, itemsize: int) -> int:
    return max(1, min(n, CHUNK_BYTES // max(16 * channels * tiles * itemsize, 1)))


def convolve(y: np.ndarray, x: np.ndarray, w: np.ndarray, p: Any) -> bool:
    """y ``(N, Co_all, Oh, Ow)`` (C-contiguous, written) = conv of x ``(N, C, H, W)``;
    False where some entry came out inf or NaN (the output transform checks as it
    writes: no pass of its own over y)."""
    groups = p.groups
    x = np.ascontiguousarray(x)
    n, c = x.shape[:2]
    cout, ci = w.shape[:2]
    co = cout // groups
    th, tw = _tiles(y.shape[2:])
    geometry = _geometry(p, x.shape)
    g = _G.astype(w.dtype)
    # (two matmuls: einsum's one loop over all four indices took ~1 ms here)
    u = np.ascontiguousarray((g @ w @ g.T).transpose(2, 3, 0, 1)).reshape(16, groups, co, ci)
    gemm = _gemm_address(x.dtype)
    if groups == 1 and gemm is not None:     # image by image in C (see _winograd.h)
        return bool(_core._wino_conv(x, u.reshape(16, cout, ci), y, *geometry, th, tw,
                                     *gemm))
    per_image = _per_image(th, tw)
    chunk = _chunk(n, max(c, cout), per_image, x.itemsize)
    wino_in, wino_out, matmul = _core._wino_in, _core._wino_out, np.matmul
    finite = True
    for n0 in range(0, n, chunk):
        m = min(chunk, n - n0)
        if n0 == 0 or m < chunk:        # (the last, smaller chunk gets its own)
            t = m * per_image
            v = np.empty((16, c, t), dtype=x.dtype)
            r = np.empty((16, cout, t), dtype=x.dtype)
            vg, rg = v.reshape(16, groups, ci, t), r.reshape(16, groups, co, t)
        wino_in(x[n0:n0 + m], v, *geometry, th, tw)
        matmul(u, vg, out=rg)
        finite &= wino_out(r, y[n0:n0 + m], th, tw)
    return finite


def weight(p: Any, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """conv_weight: the gradient ``(Co_all, Ci, 3, 3)`` of ``<conv(x, w), g>`` in w, for
    x ``(N, C, H, W)`` and g ``(N, Co_all, Oh, Ow)``."""
    groups = p.groups
    x, g = np.ascontiguousarray(x), np.ascontiguousarray(g)
    n, c = x.shape[:2]
    cout = g.shape[1]
    ci, co = c // groups, cout // groups
    th, tw = _tiles(g.shape[2:])
    geometry = _geometry(p, x.shape)
    per_image = _per_image(th, tw)
    chunk = _chunk(n, max(c, cout), per_image, x.itemsize)
    total = np.zeros((16, groups, co, ci), dtype=x.dtype)
    gemm = _gemm_address(x.dtype)
    if groups == 1 and c % 8 == 0 and gemm is not None:    # image by image in C
        _core._wino_wgrad(x, g, total.reshape(16, cout, c), *geometry, th, tw, *gemm)
        return _weight_from(total, cout, ci)
    part = np.empty_like(total)
    # one group of channels in eights: V tile-major, (16, T, C), so the product is Q (Co,
    # T) by V (T, C) with both operands laid out as OpenBLAS packs fastest (~170 against
    # ~110 GFLOP/s for Q by a transposed (C, T) V; 7.1 -> ~6.1 ms the case's gradient)
    major = groups == 1 and c % 8 == 0
    wino_in = _core._wino_in_t if major else _core._wino_in
    wino_grad, matmul = _core._wino_grad, np.matmul
    for n0 in range(0, n, chunk):
        m = min(chunk, n - n0)
        if n0 == 0 or m < chunk:
            t = m * per_image
            v = np.empty((16, t, c) if major else (16, c, t), dtype=x.dtype)
            q = np.empty((16, cout, t), dtype=x.dtype)
            qg = q.reshape(16, groups, co, t)
            vg = v.reshape(16, 1, t, c) if major else \
                v.reshape(16, groups, ci, t).swapaxes(2, 3)
        wino_in(x[n0:n0 + m], v, *geometry, th, tw)
        wino_grad(g[n0:n0 + m], q, th, tw)
        matmul(qg, vg, out=part)
        total += part
    return _weight_from(total, cout, ci)


def _weight_from(total: np.ndarray, cout: int, ci: int) -> np.ndarray:
    """The weight's gradient (Co_all, Ci, 3, 3) from the summed products (16, ...)."""
    gm = _G.astype(total.dtype)
    dw = gm.T @ total.reshape(4, 4, cout * ci).transpose(2, 0, 1) @ gm      # (Co*Ci, 3, 3)
    return dw.reshape(cout, ci, 3, 3)

