"""The attention op's numpy kernels for float32 and float64 arrays: forward and backward
taken a few heads at a time, so that a block's scores stay in the cache between the
products and the softmax (the composite writes each ``(..., L, S)`` array to memory and
reads it back several times).

Shapes: ``q (N, L, E)``, ``k (N, S, E)``, ``v (N, S, Ev)``, the leading axes flattened to
N; ``bias`` broadcasts to ``(N, L, S)`` (the additive mask, -inf where a position may not
attend). Forward, per block of heads::

    s = q kᵀ scale + bias          (row i of a causal call: columns 0..i only)
    p = exp(s - c), l = rowsum(p)  kept for the backward (c: 0, or the rows' maxima)
    o = (p v) / l

Backward (``g`` = dL/do, ``g' = g / l``, so the weights ``p / l`` are never formed)::

    dv = pᵀ g'
    ds = p * (g' vᵀ - rowsum(g' * o))
    dq = ds k scale,  dk = dsᵀ q scale,  dbias = ds summed over its broadcast axes

- Causal calls skip the upper triangle: the rows are cut into ``parts`` bands, band
  ``r0:r1`` reading only columns ``0:r1`` (torch's ``is_causal`` is ``tril(ones(L, S))``:
  row i sees columns 0..i), so the products do about (1 + 1/bands) / 2 of the full
  work; the diagonal block of each band is masked by an additive -inf triangle. dk and
  dv are the bands' products summed (the widest writes them, the others add theirs).
- The shift: a block is first exponentiated unshifted (no pass for the rows' maxima);
  if a row sum comes out infinite or below ``_SMALLEST`` (overflow, or a row all
  underflowed or masked) the block is done again shifted by the maxima. A row whose
  every score is -inf then gives nan, as the composite does, in the value and in every
  cotangent it reaches.
- kᵀ and vᵀ are copied contiguous per block (OpenBLAS runs the bands' products far
  faster on them than on transposed views); row sums are products with a column of
  ones (BLAS, not a ufunc reduction: 0.3 against 1.2 ms for 256 heads of 128 x 128).

p is kept packed band by band (``layout``: each band's rows C-contiguous, so its
elementwise passes run over contiguous memory; a causal call keeps only its bands, about
(1 + 1/bands) / 2 of ``N L S``; the composite keeps more). With p and l kept the sweep
computes no score again: recomputing them (the forward kernel run again in the
sweep) cost about 20 ms more of the 256-head case's ~70 (one thread, float32).
"""
from __future__ import annotations

import math

import numpy as np

# about a quarter of one core's L2: a block's scores, and the products' operands beside
BLOCK_BYTES = 1 << 19


def parts(causal: bool, length: int) -> list[tuple[int, int]]:
    """The row bands ``(r0, r1)``: one unless causal (then up to 4, of 32 rows at least:
    smaller products lose more to BLAS's per-call cost than the triangle saves)."""
    bands = 1 if not causal else max(1, min(4, length // 32))
    edges = [round(length * b / bands) for b in range(bands + 1)]
    return [(edges[b], edges[b + 1]) for b in range(bands) if edges[b + 1] > edges[b]]


def _heads(n: int, length: int, source: int, itemsize: int) -> int:
    return max(1, min(n, BLOCK_BYTES // max(1, length * source * itemsize)))


def _triangle(length: int, source: int, dtype: np.dtype) -> np.ndarray:
    """The causal mask as an additive (L, S) array: 0 on and below the diagonal, -inf
    above."""
    upper = np.triu(np.ones((length, source), dtype=bool), 1)
    return np.where(upper, -np.inf, 0.0).astype(dtype)


def layout(causal: bool, length: int, source: int) -> list[tuple[int, int, int, int]]:
    """The bands ``(r0, r1, c1, offset)``: rows r0:r1 read columns 0:c1, and their
    weights sit at ``offset`` of a head's row of the packed p, ``(r1 - r0) * c1`` of them
    in C order (so each band's elementwise passes run over contiguous memory)."""
    found, offset = [], 0
    for r0, r1 in parts(causal, length):
        c1 = source if not causal else min(source, r1)
        found.append((r0, r1, c1, offset))
        offset += (r1 - r0) * c1
    return found


def _band(p: np.ndarray, h0: int, h1: int, band: tuple[int, int, int, int]) -> np.ndarray:
    r0, r1, c1, offset = band
    return p[h0:h1, offset:offset + (r1 - r0) * c1].reshape(h1 - h0, r1 - r0, c1)


def forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None,
            scale: float, causal: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(o, p, l)`` for q (N, L, E), k (N, S, E), v (N, S, Ev), bias None or broadcasting
    to (N, L, S) (of q's dtype): p (N, T) the softmax's numerators ``exp(s - c)`` packed
    band by band (``layout``; T = L S without causal), l (N, L, 1) their row sums, so the
    weights are ``p / l``. The shift c is 0 where that is safe: a block is first taken
    unshifted, and taken again with c the rows' maxima when a row sum came out infinite
    or too small to trust (exp overflowed, or every entry of a row underflowed or was
    masked: such a row then gives nan, as the composite's)."""
    n, length, _ = q.shape
    source, ev = k.shape[1], v.shape[2]
    dtype = q.dtype
    bands = layout(causal, length, source)
    o = np.empty((n, length, ev), dtype=dtype)
    p = np.empty((n, bands[-1][3] + (bands[-1][1] - bands[-1][0]) * bands[-1][2]),
                 dtype=dtype)
    lsum = np.empty((n, length, 1), dtype=dtype)
    tri = _triangle(length, source, dtype) if causal else None
    exact = math.frexp(scale)[0] == 0.5     # a power of two: scaling k is exact
    hb = _heads(n, length, source, dtype.itemsize)
    kt = np.empty((hb, k.shape[2], source), dtype=dtype)
    ones = np.ones((source, 1), dtype=dtype)
    smallest = _SMALLEST[dtype.type]
    for h0 in range(0, n, hb):
        h1 = min(n, h0 + hb)
        m = h1 - h0
        qb = q[h0:h1]
        # kᵀ copied contiguous (BLAS runs the bands' products far faster on it than on
        # the transposed view), scaled on the way when that is exact
        if exact:
            np.multiply(k[h0:h1].transpose(0, 2, 1), scale, out=kt[:m])
        else:
            np.copyto(kt[:m], k[h0:h1].transpose(0, 2, 1))
        for shifted in (False, True):
            for band in bands:
                r0, r1, c1, _ = band
                s = _band(p, h0, h1, band)
                np.matmul(qb[:, r0:r1], kt[:m, :, :c1], out=s)
                if not exact and scale != 1.0:
                    s *= scale
                if tri is not None and r0 < c1:
                    s[:, :, r0:c1] += tri[r0:r1, r0:c1]
                if bias is not None:
                    s += _bias_block(bias, h0, h1, r0, r1, c1)
                if shifted:
                    s -= s.max(axis=-1, keepdims=True)
                np.exp(s, out=s)
                # the row sums as a product with ones (BLAS: faster than a reduction)
                np.matmul(s, ones[:c1], out=lsum[h0:h1, r0:r1])
            total = lsum[h0:h1]
            least = total.min()
            if shifted or least >= smallest and np.isfinite(total).all():
                break
        for band in bands:
            r0, r1, c1, _ = band
            np.matmul(_band(p, h0, h1, band), v[h0:h1, :c1], out=o[h0:h1, r0:r1])
        o[h0:h1] *= np.reciprocal(total)
    return o, p, lsum


# the least row sum of unshifted numerators trusted: its row's largest score is then
# above log(_SMALLEST / S), where exp and the sum keep their relative precision
_SMALLEST = {np.float32: 1e-30, np.float64: 1e-290}


def _bias_block(bias: np.ndarray, h0: int, h1: int, r0: int, r1: int, c1: int
                ) -> np.ndarray:
    """The part of bias (N or 1, L or 1, S or 1) that heads h0:h1, rows r0:r1 and
    columns 0:c1 of the scores see (broadcasting)."""
    return bias[(slice(h0, h1) if bias.shape[0] > 1 else slice(0, 1)),
                (slice(r0, r1) if bias.shape[1] > 1 else slice(0, 1)),
                (slice(0, c1) if bias.shape[2] > 1 else slice(0, 1))]


def backward(g: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
             p: np.ndarray, lsum: np.ndarray, scale: float, causal: bool,
             needs: tuple[bool, ...], bias_shape: tuple[int, ...] | None
             ) -> list[np.ndarray | None]:
    """The cotangents ``[dq, dk, dv, dbias]`` from forward's o, p (packed) and l (None
    where ``needs`` says not wanted; dbias (N or 1, L or 1, S or 1) as the bias was given
    to forward, or None without one), band by band: the widest band writes dk and dv's
    columns, the narrower ones add theirs (causal zeros are never multiplied)."""
    n, length, _ = q.shape
    source, e, ev = k.shape[1], k.shape[2], v.shape[2]
    dtype = q.dtype
    want_q, want_k, want_v = needs[:3]
    want_b = bias_shape is not None and len(needs) > 3 and needs[3]
    dq = np.empty_like(q) if want_q else None
    dk = np.empty_like(k) if want_k else None
    dv = np.empty_like(v) if want_v else None
    db = np.zeros(bias_shape, dtype=dtype) if want_b and bias_shape is not None else None
    if not (want_q or want_k or want_b or want_v):
        return [dq, dk, dv, db]
    bands = layout(causal, length, source)[::-1]          # the widest first
    widest = bands[0][2]
    hb = _heads(n, length, source, dtype.itemsize)
    ds = np.empty(hb * max((r1 - r0) * c1 for r0, r1, c1, _ in bands), dtype=dtype)
    tmp = np.empty((hb, source, max(e, ev)), dtype=dtype)
    gs = np.empty((hb, length, ev), dtype=dtype)
    vt = np.empty((hb, ev, source), dtype=dtype)
    ones = np.ones((ev, 1), dtype=dtype)
    if widest < source:                 # causal, S > L: no row sees these columns
        for d in (dk, dv):
            if d is not None:
                d[:, widest:] = 0.0
    for h0 in range(0, n, hb):
        h1 = min(n, h0 + hb)
        m = h1 - h0
        gb = np.multiply(g[h0:h1], np.reciprocal(lsum[h0:h1]), out=gs[:m])
        if want_v:
            for i, band in enumerate(bands):
                r0, r1, c1, _ = band
                pt = _band(p, h0, h1, band).transpose(0, 2, 1)
                _into(dv[h0:h1, :c1], pt, gb[:, r0:r1], tmp[:m, :c1, :ev], i == 0)
        if not (want_q or want_k or want_b):
            continue
        if db is None:      # ds scaled from here on: dq, dk need no pass of their own
            gb *= scale
        np.copyto(vt[:m], v[h0:h1].transpose(0, 2, 1))
        # rowsum(g' * o) as a product with ones (a BLAS pass, not a ufunc reduction)
        delta = np.matmul(np.multiply(gb, o[h0:h1]), ones)
        for i, band in enumerate(bands):
            r0, r1, c1, _ = band
            d = ds[:m * (r1 - r0) * c1].reshape(m, r1 - r0, c1)
            np.matmul(gb[:, r0:r1], vt[:m, :, :c1], out=d)
            d -= delta[:, r0:r1]
            d *= _band(p, h0, h1, band)
            if db is not None:
                _add_broadcast(db, d, h0, h1, r0, r1, c1)
            if want_q:
                np.matmul(d, k[h0:h1, :c1], out=dq[h0:h1, r0:r1])
            if want_k:
                _into(dk[h0:h1, :c1], d.transpose(0, 2, 1), q[h0:h1, r0:r1],
                      tmp[:m, :c1, :e], i == 0)
        if db is not None:
            for d in (dq, dk):
                if d is not None:
                    d[h0:h1] *= scale
    return [dq, dk, dv, db]


def _into(out: np.ndarray, a: np.ndarray, b: np.ndarray, scratch: np.ndarray,
          first: bool) -> None:
    """``out = a @ b`` (first) or ``out += a @ b``."""
    if first:
        np.matmul(a, b, out=out)
    else:
        np.matmul(a, b, out=scratch)
        out += scratch


def _add_broadcast(db: np.ndarray, d: np.ndarray, h0: int, h1: int, r0: int, r1: int,
                   c1: int) -> None:
    """Add a band's ds (heads h0:h1, rows r0:r1, columns 0:c1) into db, the bias's
    cotangent (N', L', S'), each axis of size 1 where the bias broadcast over it."""
    part = d
    rows, cols = slice(r0, r1), slice(0, c1)
    if db.shape[1] == 1:
        part, rows = part.sum(axis=1, keepdims=True), slice(0, 1)
    if db.shape[2] == 1:
        part, cols = part.sum(axis=2, keepdims=True), slice(0, 1)
    if db.shape[0] == 1:
        db[0, rows, cols] += part.sum(axis=0)
    else:
        db[h0:h1, rows, cols] += part
