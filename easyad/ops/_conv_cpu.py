"""The convolutions' numpy lowering for float32 and float64 arrays: im2col a few images at
a time (``_conv`` keeps the whole-batch form for object arrays, the scalar engines').

Why chunks: the columns of the whole batch (``(C*prod(K), N*prod(O))``, 58 MB at batch
64, 32 channels, 28x28, 3x3 in float32) are written once and read back by the GEMM from
memory, and the GEMM's result comes out channels first, ``(C_out, N*O)``, needing one
more copy to NCHW. Taken a few images at a time, the columns (about ``CHUNK_BYTES``) are
still in the cache when the GEMM reads them, and a batched matmul of the weight
``(G, Co, Ci*K)`` against the chunk's columns ``(n, G, Ci*K, O)`` writes ``(n, G, Co, O)``:
the result's own NCHW memory, no transposing copy.

- ``conv``: the above; 3x3 kernels at stride 1 (2-D, undilated, >= 4 channels a group,
  results of at least 8x8)
  take Winograd F(2x2, 3x3) instead (``_conv_winograd``: 2.25x fewer products), as do
  the stride-1 ``conv_transpose`` (a convolution here) and ``conv_weight`` of that shape.
- ``conv_transpose`` (the input's gradient): with stride 1 (and no more than twice as
  many out channels as in channels a group) it is a convolution of the
  adjoint padded by ``r (K - 1) - pad`` per side (cut where negative) with the kernel
  flipped and its in and out channels swapped per group, so the same im2col and GEMM
  serve, with no scatter-add. Otherwise the GEMM makes a chunk's columns and they are
  added back into a zeroed padded chunk window offset by window offset (col2im), written
  into the result's NCHW memory.
- ``conv_weight``: per image the GEMM ``(G, Ci*K, O) @ (G, O, Co)`` (the columns as for
  ``conv``), the images' products summed into the weight's gradient, then transposed.

Measured (CPU time, one thread, batch 64, 32 -> 32 channels, 28x28, 3x3, float32, on
this loaded 2-core machine): conv 36 -> 21 ms, conv_transpose 44 -> 21, conv_weight 30 ->
21 against the whole-batch form; torch's oneDNN kernels take about 10 each. What is left
is OpenBLAS's GEMM (about 14 ms of each: 50-60 GFLOP/s on these shapes against 110 on
large squares) and the columns' copy (about 6 ms); for 3x3 kernels ``_conv_winograd``
took the next step (about 8, 8 and 10 ms for the three, same machine, load ~8).

The sums run in another order than the whole-batch GEMM's (a float32 result may differ
from ``_conv``'s object form by a few ulps of its size; float64 likewise at 1e-16).
"""
from __future__ import annotations

import itertools
import math
import threading
from typing import Any

import numpy as np

from easyad.ops import _conv_winograd
from easyad.tensor import _blas

# bytes of columns per chunk of images: about one core's L2, where the GEMM finds them
CHUNK_BYTES = 1 << 20


def takes(*arrays: np.ndarray) -> bool:
    """Whether this module lowers these operands: float32 or float64, one dtype, native
    byte order, and numpy's BLAS an OpenBLAS running one thread (everything else takes
    ``_conv``'s whole-batch form). A many-threaded BLAS on one small GEMM per image keeps
    its threads waiting on each other: on this 2-core machine, loaded, 2 threads ran the
    three convolutions of the case above 5.5x slower than the whole batch's few GEMMs."""
    dtype = arrays[0].dtype
    return dtype in (np.dtype(np.float32), np.dtype(np.float64)) and \
        all(a.dtype == dtype for a in arrays) and _blas.blas_threads() == 1


def _chunk(images: int, per_image: int) -> int:
    return max(1, min(images, CHUNK_BYTES // max(per_image, 1)))


_KEPT = threading.local()


def _kept(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's padded-input buffer for dtype, made once and grown as needed: a
    fresh one of several MB costs its page faults again at every call (about as much as
    filling it). The caller is done with it before its next call in the same thread."""
    kept = getattr(_KEPT, "buffers", None)
    if kept is None:
        kept = _KEPT.buffers = {}
    size = math.prod(shape)
    buf = kept.get(dtype)
    if buf is None or buf.size < size:
        buf = kept[dtype] = np.empty(size, dtype=dtype)
    return buf[:size].reshape(shape)


def _padded(x: np.ndarray, lo: tuple[int, ...], hi: tuple[int, ...]) -> np.ndarray:
    """x (N, C, *S) padded with zeros by lo/hi per spatial axis (a negative entry cuts
    that many off), C-contiguous; where it pads, in this thread's kept buffer."""
    d = len(lo)
    cut = tuple(slice(max(-a, 0), s - max(-b, 0)) for a, b, s in zip(lo, hi, x.shape[2:]))
    x = x[(slice(None),) * 2 + cut]
    lo, hi = tuple(max(a, 0) for a in lo), tuple(max(b, 0) for b in hi)
    if not any(lo) and not any(hi):
        return np.ascontiguousarray(x)
    shape = x.shape[:2] + tuple(s + a + b for s, a, b in zip(x.shape[2:], lo, hi))
    out = _kept(shape, x.dtype)
    out[(slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(lo, x.shape[2:]))] = x
    for i in range(d):          # the borders only: the inside was just written
        at = (slice(None),) * (2 + i)
        out[at + (slice(0, lo[i]),)] = 0
        out[at + (slice(lo[i] + x.shape[2 + i], None),)] = 0
    assert out.ndim == d + 2
    return out


def _windows(xp: np.ndarray, p: Any, kernel: tuple[int, ...], o: tuple[int, ...]
             ) -> np.ndarray:
    """The windows of the padded images xp ``(n, C, *Sp)`` as a view ``(n, C, *K, *O)``."""
    st = xp.strides
    d = len(kernel)
    return np.lib.stride_tricks.as_strided(
        xp, xp.shape[:2] + kernel + o,
        st[:2] + tuple(st[2 + i] * p.dilation[i] for i in range(d))
        + tuple(st[2 + i] * p.stride[i] for i in range(d)), writeable=False)


def _convolve(y: np.ndarray, xf: np.ndarray, w: np.ndarray, p: Any,
              o: tuple[int, ...]) -> None:
    """y ``(N, Co_all, *O)`` (C-contiguous, written) = conv of xf ``(N, C, *S)`` with w."""
    if _conv_winograd.takes(p, w.shape, o):
        # anything not finite takes the sums below, which give it again with their own
        # warnings: a NaN read, an inf (Winograd's differences make inf - inf = NaN where
        # the sums say inf) or an overflow in the transforms (the output transform checks
        # as it writes: a pass over y cost ~0.33 ms of the case's 6)
        with np.errstate(over="ignore", invalid="ignore"):
            if _conv_winograd.convolve(y, xf, w, p):
                return
    d = w.ndim - 2
    kernel = tuple(w.shape[2:])
    groups = p.groups
    n, c = xf.shape[:2]
    depth = w.shape[1] * math.prod(kernel)
    length = math.prod(o)
    xp = _padded(xf, p.padding[:d], p.padding[d:])
    wm = np.ascontiguousarray(w).reshape(groups, w.shape[0] // groups, depth)
    chunk = _chunk(n, c * math.prod(kernel) * length * xf.itemsize)
    cols = np.empty((chunk, groups, depth, length), dtype=xf.dtype)
    ym = y.reshape(n, groups, w.shape[0] // groups, length)
    windows = _windows(xp, p, kernel, o)     # (one view: as_strided costs ~10 us a call)
    for n0 in range(0, n, chunk):
        m = min(chunk, n - n0)
        np.copyto(cols[:m].reshape((m, c) + kernel + o), windows[n0:n0 + m])
        np.matmul(wm, cols[:m], out=ym[n0:n0 + m])


def conv(p: Any, x: np.ndarray, w: np.ndarray, o: tuple[int, ...]) -> np.ndarray:
    """conv of x ``(..., C, *S)`` and w, whose result's spatial shape is o."""
    d = w.ndim - 2
    xf = x.reshape((-1,) + x.shape[-d - 1:])
    y = np.empty(x.shape[:-d - 1] + (w.shape[0],) + o, dtype=x.dtype)
    _convolve(y.reshape((xf.shape[0], w.shape[0]) + o), xf, w, p, o)
    return y


def _flipped(w: np.ndarray, groups: int) -> np.ndarray:
    """w ``(G*Co, Ci, *K)`` as ``(G*Ci, Co, *K)``, each kernel flipped: the weight whose
    convolution is w's transposed one (stride 1)."""
    d = w.ndim - 2
    co, ci = w.shape[0] // groups, w.shape[1]
    v = w.reshape((groups, co, ci) + w.shape[2:]).swapaxes(1, 2)
    v = v[(slice(None),) * 3 + (slice(None, None, -1),) * d]
    return np.ascontiguousarray(v).reshape((groups * ci, co) + w.shape[2:])


def conv_transpose(p: Any, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    d = w.ndim - 2
    kernel, size = tuple(w.shape[2:]), tuple(p.size)
    gf = g.reshape((-1,) + g.shape[-d - 1:])
    n, cin = gf.shape[0], w.shape[1] * p.groups
    x = np.empty(g.shape[:-d - 1] + (cin,) + size, dtype=g.dtype)
    xf = x.reshape((n, cin) + size)
    # (the convolution's columns hold the adjoint's channels, col2im's GEMM makes the
    # input's: the first costs more where the adjoint has many more channels, the second
    # adds K strided slices back; measured: 32 -> 32 channels 3x3 4x faster as a
    # convolution, 3 -> 16 channels 5x5 2.6x slower)
    if all(s == 1 for s in p.stride) and w.shape[0] // p.groups <= 2 * w.shape[1]:
        reach = tuple(p.dilation[i] * (kernel[i] - 1) for i in range(d))
        q = type(p)(stride=p.stride, dilation=p.dilation, groups=p.groups,
                    padding=tuple(reach[i] - p.padding[i] for i in range(d))
                    + tuple(reach[i] - p.padding[d + i] for i in range(d)))
        lo, hi = q.padding[:d], q.padding[d:]
        # (negative padding cuts the adjoint; _convolve then pads by nothing there)
        gc = _padded(gf, tuple(min(a, 0) for a in lo), tuple(min(b, 0) for b in hi))
        q = type(p)(stride=q.stride, dilation=q.dilation, groups=q.groups,
                    padding=tuple(max(a, 0) for a in lo) + tuple(max(b, 0) for b in hi))
        _convolve(xf, gc, _flipped(w, p.groups), q, size)
    else:
        _add_back(xf, gf, w, p, size)
    return x


def _add_back(xf: np.ndarray, gf: np.ndarray, w: np.ndarray, p: Any,
              size: tuple[int, ...]) -> None:
    """xf ``(N, Ci_all, *S)`` = the transposed convolution of gf, chunk by chunk: the
    GEMM makes the chunk's columns, added back window offset by window offset."""
    d = w.ndim - 2
    kernel, o = tuple(w.shape[2:]), tuple(gf.shape[2:])
    groups = p.groups
    n, cin = xf.shape[:2]
    depth = w.shape[1] * math.prod(kernel)
    lo = p.padding[:d]
    full = tuple(s + a + b for s, a, b in zip(size, lo, p.padding[d:]))
    wt = np.ascontiguousarray(w).reshape(groups, w.shape[0] // groups, depth).swapaxes(1, 2)
    gm = np.ascontiguousarray(gf).reshape(n, groups, w.shape[0] // groups, math.prod(o))
    chunk = _chunk(n, cin * math.prod(kernel) * math.prod(o) * gf.itemsize)
    cols = np.empty((chunk, groups, depth, math.prod(o)), dtype=gf.dtype)
    xp = np.empty((chunk, cin) + full, dtype=gf.dtype)
    inside = (slice(None),) * 2 + tuple(slice(a, a + s) for a, s in zip(lo, size))
    for n0 in range(0, n, chunk):
        m = min(chunk, n - n0)
        np.matmul(wt, gm[n0:n0 + m], out=cols[:m])
        cv = cols[:m].reshape((m, cin) + kernel + o)
        xm = xp[:m]
        xm.fill(0)
        for k in itertools.product(*(range(k) for k in kernel)):
            at = tuple(slice(k[i] * p.dilation[i],
                             k[i] * p.dilation[i] + (o[i] - 1) * p.stride[i] + 1, p.stride[i])
                       for i in range(d))
            xm[(slice(None),) * 2 + at] += cv[(slice(None),) * 2 + k]
        xf[n0:n0 + m] = xm[inside]


def conv_weight(p: Any, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    d = len(p.size)
    kernel = tuple(p.size)
    xf = x.reshape((-1,) + x.shape[-d - 1:])
    gf = np.ascontiguousarray(g.reshape((-1,) + g.shape[-d - 1:]))
    o = tuple(gf.shape[2:])
    if _conv_winograd.takes(p, (gf.shape[1], xf.shape[1] // p.groups) + kernel, o):
        with np.errstate(over="ignore", invalid="ignore"):
            dw = _conv_winograd.weight(p, xf, gf)
            if np.isfinite(dw.sum()):       # (else the sums below: see _convolve)
                return dw
    groups = p.groups
    (n, c), cout = xf.shape[:2], gf.shape[1]
    depth = c // groups * math.prod(kernel)
    length = math.prod(o)
    xp = _padded(xf, p.padding[:d], p.padding[d:])
    gm = gf.reshape(n, groups, cout // groups, length)
    chunk = _chunk(n, c * math.prod(kernel) * length * xf.itemsize)
    cols = np.empty((chunk, groups, depth, length), dtype=xf.dtype)
    # (G, Ci*K, O) @ (G, O, Co): OpenBLAS ran this orientation faster than (Co, O) @
    # (O, Ci*K) (CPU time, 64 images of 32 channels 28x28: 18 vs 23 ms)
    part = np.empty((chunk, groups, depth, cout // groups), dtype=xf.dtype)
    total = np.zeros((groups, depth, cout // groups), dtype=xf.dtype)
    windows = _windows(xp, p, kernel, o)
    for n0 in range(0, n, chunk):
        m = min(chunk, n - n0)
        np.copyto(cols[:m].reshape((m, c) + kernel + o), windows[n0:n0 + m])
        np.matmul(cols[:m], gm[n0:n0 + m].swapaxes(2, 3), out=part[:m])
        total += part[:m].sum(axis=0) if m > 1 else part[0]
    return np.ascontiguousarray(total.swapaxes(1, 2)).reshape((cout, c // groups) + kernel)
