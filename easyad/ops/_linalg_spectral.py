"""Spectral factorisations in the op table: eigh, eigvalsh, svd, svdvals, qr (see
``_linalg`` for what they share: stacks, host lowerings, packed outputs).

Packed layouts (the public functions in ``easyad.linalg`` slice them):

- ``eigh``: ``(..., n + 1, n)``, row 0 the eigenvalues (ascending), rows 1.. the
  eigenvectors (columns);
- ``svd`` (reduced, k = min(m, n)): ``(..., k, m + 1 + n)``, ``[U^T | s | Vh]``;
- ``qr`` (reduced, m >= n): ``(..., n, m + n)``, ``[Q^T | R]``.

Where eigenvalues (singular values) repeat, eigenvectors (singular vectors) are not
unique and have no derivative: the formulas divide by the differences
``w_j - w_i`` (``s_j^2 - s_i^2``), so derivatives through ``eigh``'s vectors (``svd``'s
U and V) come out inf or nan there. Only what the vectors contribute is divided
(``_coupled``: a zero coupling stays zero, not 0 * inf), so a function of the eigenvalues
alone keeps a finite gradient through ``eigh`` too. eigvalsh and svdvals are ops of their
own whose derivatives use no such division (``V diag(g) V^T``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from easyad.errors import ShapeError
from easyad.ops._apply import apply
from easyad.ops._linalg import (NoParams, TriangularParams, SOLVE_TRIANGULAR, diag_embed,
                                diagonal, lapack, leading, lower_read, mT, matrices, square,
                                symmetric_from_lower, tril, triu)
from easyad.ops._table import Op, register
from easyad.tensor._generic import concatenate
from easyad.tensor._structural import where


def _differences(v: Any) -> Any:
    """``D[i, j] = v_j - v_i`` for each stacked vector ``v``."""
    batch, n = tuple(v.shape[:-1]), v.shape[-1]
    return v.reshape(batch + (1, n)) - v.reshape(batch + (n, 1))


def _reciprocal_off_diagonal(d: Any) -> Any:
    """``1 / d`` off the diagonal, 0 on it (inf where d is 0 off it: a repeat)."""
    n = d.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        return (1.0 - np.eye(n)) / (d + np.eye(n))


def _coupled(f: Any, m: Any) -> Any:
    """``f * m`` with the entries where ``m`` is exactly 0 kept 0 (``f`` is inf where values
    repeat: a function of the values alone has ``m = 0`` and its gradient stays finite)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return where(m == 0.0, 0.0, f * m)


# ---- eigh (numpy's: lower triangle read) ----

def _eigh_rule(p: NoParams, a: tuple[int, ...]) -> tuple[tuple[int, ...], NoParams]:
    n = square("eigh", a)
    return a[:-2] + (n + 1, n), p


def _eigh_numpy(p: NoParams, a: np.ndarray) -> np.ndarray:
    w, v = np.linalg.eigh(a)
    return np.concatenate([w[..., None, :], v], axis=-2)


def _eigh_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    w, v = out[..., 0, :], out[..., 1:, :]
    gw, gv = g[..., 0, :], g[..., 1:, :]
    f = _reciprocal_off_diagonal(_differences(w))
    inner = diag_embed(gw) + _coupled(f, mT(v) @ gv)
    return (lower_read(v @ inner @ mT(v)),)


def _eigh_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    w, v = out[..., 0, :], out[..., 1:, :]
    m = mT(v) @ symmetric_from_lower(tangents[0]) @ v
    dw = diagonal(m)
    dv = v @ _coupled(_reciprocal_off_diagonal(_differences(w)), m)
    return concatenate([dw.reshape(tuple(dw.shape[:-1]) + (1, dw.shape[-1])), dv], axis=-2)


EIGH: Op = register(Op(
    name="eigh", params=NoParams, rule=_eigh_rule,
    numpy=lapack("eigh", _eigh_numpy), vjp=_eigh_vjp, jvp=_eigh_jvp, batch=leading,
    doc="eigenvalues and eigenvectors of symmetric matrices, packed (n + 1, n)"))


def _eigvalsh_rule(p: NoParams, a: tuple[int, ...]) -> tuple[tuple[int, ...], NoParams]:
    square("eigvalsh", a)
    return a[:-1], p


def _eigenvectors(a: Any) -> Any:
    return apply(EIGH, NoParams(), (a,))[..., 1:, :]


EIGVALSH: Op = register(Op(
    name="eigvalsh", params=NoParams, rule=_eigvalsh_rule,
    numpy=lapack("eigvalsh", lambda p, a: np.linalg.eigvalsh(a)),
    vjp=lambda p, g, a, out: (lower_read(
        _eigenvectors(a) @ diag_embed(g) @ mT(_eigenvectors(a))),),
    jvp=lambda p, tangents, a, out: diagonal(
        mT(_eigenvectors(a)) @ symmetric_from_lower(tangents[0]) @ _eigenvectors(a)),
    batch=leading, doc="eigenvalues of symmetric matrices (ascending)"))


# ---- svd (reduced) and svdvals ----

def _svd_rule(p: NoParams, a: tuple[int, ...]) -> tuple[tuple[int, ...], NoParams]:
    matrices("svd", a)
    m, n = a[-2], a[-1]
    return a[:-2] + (min(m, n), m + 1 + n), p


def _svd_numpy(p: NoParams, a: np.ndarray) -> np.ndarray:
    u, s, vh = np.linalg.svd(a, full_matrices=False)
    return np.concatenate([np.swapaxes(u, -1, -2), s[..., None], vh], axis=-1)


def _svd_parts(out: Any, m: int) -> tuple[Any, Any, Any]:
    """U, s, V from the packed output (m: A's number of rows)."""
    return mT(out[..., :m]), out[..., m], mT(out[..., m + 1:])


def _columns(t: Any, s: Any) -> Any:
    """``t @ diag(s)``: each column scaled."""
    return t * s.reshape(tuple(s.shape[:-1]) + (1, s.shape[-1]))


def _rows(s: Any, t: Any) -> Any:
    """``diag(s) @ t``: each row scaled."""
    return t * s.reshape(tuple(s.shape) + (1,))


def _svd_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    # Townsend (2016), "Differentiating the singular value decomposition"
    m, n = a.shape[-2], a.shape[-1]
    u, s, v = _svd_parts(out, m)
    gu, gs, gv = _svd_parts(g, m)
    f = _reciprocal_off_diagonal(_differences(s * s))
    j = _coupled(f, mT(u) @ gu - mT(gu) @ u)
    k = _coupled(f, mT(v) @ gv - mT(gv) @ v)
    core = _columns(j, s) + diag_embed(gs) + _rows(s, k)
    with np.errstate(divide="ignore"):
        inverse = 1.0 / s
    ga = u @ core @ mT(v)
    # the parts of gU (gV) outside U's (V's) columns: none for a square matrix
    if m > n:
        ga = ga + _columns((np.eye(m) - u @ mT(u)) @ gu, inverse) @ mT(v)
    if n > m:
        ga = ga + _columns(u, inverse) @ mT(gv) @ (np.eye(n) - v @ mT(v))
    return (ga,)


def _svd_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    m, n = a.shape[-2], a.shape[-1]
    da = tangents[0]
    u, s, v = _svd_parts(out, m)
    dp = mT(u) @ da @ v
    f = _reciprocal_off_diagonal(_differences(s * s))
    with np.errstate(divide="ignore"):
        inverse = 1.0 / s
    du = u @ _coupled(f, _columns(dp, s) + _rows(s, mT(dp)))
    dv = v @ _coupled(f, _rows(s, dp) + _columns(mT(dp), s))
    if m > n:                  # dA's part outside U's columns (none for a square matrix)
        du = du + _columns((np.eye(m) - u @ mT(u)) @ da @ v, inverse)
    if n > m:
        dv = dv + _columns((np.eye(n) - v @ mT(v)) @ mT(da) @ u, inverse)
    ds = diagonal(dp)
    return concatenate([mT(du), ds.reshape(tuple(ds.shape) + (1,)), mT(dv)], axis=-1)


SVD: Op = register(Op(
    name="svd", params=NoParams, rule=_svd_rule,
    numpy=lapack("svd", _svd_numpy), vjp=_svd_vjp, jvp=_svd_jvp, batch=leading,
    doc="reduced singular value decomposition, packed (k, m + 1 + n): [U^T | s | Vh]"))


def _svdvals_rule(p: NoParams, a: tuple[int, ...]) -> tuple[tuple[int, ...], NoParams]:
    matrices("svdvals", a)
    return a[:-2] + (min(a[-2], a[-1]),), p


def _singular_vectors(a: Any) -> tuple[Any, Any]:
    u, _, v = _svd_parts(apply(SVD, NoParams(), (a,)), a.shape[-2])
    return u, v


def _svdvals_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    u, v = _singular_vectors(a)
    return (_columns(u, g) @ mT(v),)


def _svdvals_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    u, v = _singular_vectors(a)
    return diagonal(mT(u) @ tangents[0] @ v)


SVDVALS: Op = register(Op(
    name="svdvals", params=NoParams, rule=_svdvals_rule,
    numpy=lapack("svdvals", lambda p, a: np.linalg.svd(a, compute_uv=False)),
    vjp=_svdvals_vjp, jvp=_svdvals_jvp, batch=leading,
    doc="singular values (descending)"))


# ---- qr (reduced, m >= n) ----

def _qr_rule(p: NoParams, a: tuple[int, ...]) -> tuple[tuple[int, ...], NoParams]:
    matrices("qr", a)
    m, n = a[-2], a[-1]
    if m < n:
        raise ShapeError(f"linalg.qr: differentiable for tall or square matrices (m >= n), "
                         f"got shape {a}: factor the transpose, or split off the first m "
                         f"columns")
    return a[:-2] + (n, m + n), p


def _qr_numpy(p: NoParams, a: np.ndarray) -> np.ndarray:
    q, r = np.linalg.qr(a)
    return np.concatenate([np.swapaxes(q, -1, -2), r], axis=-1)


def _right_solve_upper(y: Any, r: Any, trans: bool) -> Any:
    """``y R^-1`` (trans: ``y R^-T``) for upper triangular R."""
    return mT(apply(SOLVE_TRIANGULAR, TriangularParams(lower=False, trans=not trans),
                    (r, mT(y))))


def _qr_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    # M = R gR^T - gQ^T Q; gA = (gQ + Q copyltu(M)) R^-T (Walter & Lehmann; Liao et al.)
    m = a.shape[-2]
    q, r = mT(out[..., :m]), out[..., m:]
    gq, gr = mT(g[..., :m]), g[..., m:]
    k = r @ mT(gr) - mT(gq) @ q
    copied = tril(k) + mT(tril(k, -1))
    return (_right_solve_upper(gq + q @ copied, r, trans=True),)


def _qr_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    # Q^T dA R^-1 = (Q^T dQ, antisymmetric) + (dR R^-1, upper triangular)
    m = a.shape[-2]
    q, r = mT(out[..., :m]), out[..., m:]
    da_r = _right_solve_upper(tangents[0], r, trans=False)
    c = mT(q) @ da_r
    omega = tril(c, -1) - mT(tril(c, -1))
    upper = triu(c - omega)
    return concatenate([mT(da_r - q @ upper), upper @ r], axis=-1)


QR: Op = register(Op(
    name="qr", params=NoParams, rule=_qr_rule,
    numpy=lapack("qr", _qr_numpy), vjp=_qr_vjp, jvp=_qr_jvp, batch=leading,
    doc="reduced QR of tall or square matrices, packed (n, m + n): [Q^T | R]"))
