"""Linear algebra in the op table (issue 26): the factorisations and solves ``ad.linalg``
is built from, each one registration (see ``_table``).

Every op works on stacks of matrices (``(..., m, n)``, the last two axes the matrix). The
numpy lowering is numpy's or scipy's LAPACK call; no OpenCL kernel or composite exists, so
an OpenCL tensor runs it on host copies (``Op.lower``) and the result goes back to the
device. vjps and jvps are Giles' "An extended collection of matrix derivative results for
forward and reverse mode algorithmic differentiation" (2008) written with easyad operations
(matmul, transposes, these ops themselves), so create_graph and forward-over-anything work
to any order. ``_linalg_spectral`` holds eigh, svd and qr.

Ops whose LAPACK routine reads one triangle (cholesky, eigh) are differentiated as the
function numpy computes: the other triangle is not read, so its gradient is zero and the
read triangle collects both halves of the symmetric gradient (``_lower_read``).
Multi-output factorisations (slogdet here; eigh, svd, qr) return ONE packed array the
public function slices (slicing is differentiable), so one op call, one LAPACK call and
one tape node serve every output, and recorded programs replay them together.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import scipy.linalg

from easyad.errors import ShapeError
from easyad.ops._apply import apply
from easyad.ops._table import Op, register
from easyad.tensor._generic import sum as _sum
from easyad.tensor._generic import concatenate


@dataclasses.dataclass(frozen=True)
class NoParams:
    """For ops without static parameters."""


# ---- helpers on (stacks of) matrices, for numpy arrays and every tensor kind ----

def mT(t: Any) -> Any:
    """The last two axes swapped (each matrix transposed)."""
    nd = len(t.shape)
    return t.transpose(*range(nd - 2), nd - 1, nd - 2)


def diagonal(t: Any) -> Any:
    """``(..., n, n) -> (..., n)``: each matrix's diagonal."""
    return _sum(t * np.eye(t.shape[-1]), axis=-1)


def diag_embed(v: Any) -> Any:
    """``(..., n) -> (..., n, n)``: diagonal matrices."""
    n = v.shape[-1]
    return v.reshape(tuple(v.shape) + (1,)) * np.eye(n)


def trace(t: Any) -> Any:
    return _sum(t * np.eye(t.shape[-1]), axis=(-2, -1))


def as_matrices(v: Any) -> Any:
    """``(...) -> (..., 1, 1)``: one number per matrix, to broadcast against the matrices."""
    return v.reshape(tuple(v.shape) + (1, 1))


def tril(t: Any, k: int = 0) -> Any:
    n, m = t.shape[-2], t.shape[-1]
    return t * np.tril(np.ones((n, m)), k)


def triu(t: Any, k: int = 0) -> Any:
    n, m = t.shape[-2], t.shape[-1]
    return t * np.triu(np.ones((n, m)), k)


def lower_read(g: Any) -> Any:
    """The gradient of ``f(sym(tril(A)))`` from ``g``, the gradient of ``f`` at a symmetric
    argument: a routine that reads the lower triangle sees ``A_ij`` (i > j) in two places."""
    return tril(g + mT(g)) - diag_embed(diagonal(g))


def symmetric_from_lower(t: Any) -> Any:
    """The symmetric matrix whose lower triangle is ``t``'s (what LAPACK's 'L' routines see)."""
    return tril(t) + mT(tril(t, -1))


def sum_to(t: Any, shape: tuple[int, ...]) -> Any:
    """``t`` summed over the axes broadcasting added to ``shape`` (a cotangent's shape)."""
    shape = tuple(shape)
    lead = len(t.shape) - len(shape)
    if lead:
        t = _sum(t, axis=tuple(range(lead)))
    kept = tuple(k for k, (a, b) in enumerate(zip(t.shape, shape)) if a != b and b == 1)
    return _sum(t, axis=kept, keepdims=True) if kept else t


def square(name: str, shape: tuple[int, ...]) -> int:
    """``n`` of an operand of shape ``(..., n, n)``, or a ShapeError saying what is wrong."""
    if len(shape) < 2 or shape[-1] != shape[-2]:
        raise ShapeError(f"linalg.{name}: takes square matrices (shape (..., n, n)), got "
                         f"shape {shape}")
    return shape[-1]


def matrices(name: str, shape: tuple[int, ...]) -> None:
    if len(shape) < 2:
        raise ShapeError(f"linalg.{name}: takes matrices (shape (..., m, n)), got shape "
                         f"{shape}")


def lapack(name: str, f: Any) -> Any:
    """A numpy lowering whose LinAlgError names the linalg operation that raised it."""
    def lowering(p: Any, *arrays: Any) -> Any:
        try:
            return f(p, *arrays)
        except np.linalg.LinAlgError as error:
            raise np.linalg.LinAlgError(f"linalg.{name}: {error}") from None
    return lowering


class _Leading:
    """The batching rule of every op here: a batch axis before the matrix axes is one more
    stacking axis, left where it is: ``leading(params, axis) -> (params, axis)``. A batch
    axis among the last ``core_axes`` axes (the matrices') cannot be: the caller moves it
    to the front first and the result's back after (``ops.batched`` does, reading
    ``core_axes`` from the rule; so must any caller of a rule that has it)."""

    core_axes = 2

    def __call__(self, p: Any, axis: int) -> tuple[Any, int]:
        return p, axis

    def __repr__(self) -> str:
        return "leading"


leading = _Leading()


def _solve_batch(name: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(a[:-2], b[:-2]))
    except ValueError:
        raise ShapeError(f"linalg.{name}: the stacks of shapes {a[:-2]} and {b[:-2]} do not "
                         f"broadcast") from None


# ---- solve: X = A^-1 B ----

def _solve_rule(p: NoParams, a: tuple[int, ...], b: tuple[int, ...]
                ) -> tuple[tuple[int, ...], NoParams]:
    n = square("solve", a)
    if len(b) < 2 or b[-2] != n:
        raise ShapeError(f"linalg.solve: b must have shape (..., {n}, k) for a of shape {a}, "
                         f"got {b} (a vector b is made a column by ad.linalg.solve)")
    return _solve_batch("solve", a, b) + (n, b[-1]), p


def _solve_vjp(p: NoParams, g: Any, a: Any, b: Any, out: Any) -> tuple[Any, Any]:
    gb = apply(SOLVE, p, (mT(a), g))
    return sum_to(-(gb @ mT(out)), a.shape), sum_to(gb, b.shape)


def _solve_jvp(p: NoParams, tangents: Any, a: Any, b: Any, out: Any) -> Any:
    da, db = tangents
    return apply(SOLVE, p, (a, db - da @ out))


SOLVE: Op = register(Op(
    name="solve", params=NoParams, rule=_solve_rule,
    numpy=lapack("solve", lambda p, a, b: np.linalg.solve(a, b)),
    vjp=_solve_vjp, jvp=_solve_jvp, batch=leading,
    doc="X with A X = B (stacks of square A, B of shape (..., n, k))"))


# ---- inv ----

def _square_rule(name: str) -> Any:
    def rule(p: Any, a: tuple[int, ...]) -> tuple[tuple[int, ...], Any]:
        square(name, a)
        return a, p
    return rule


INV: Op = register(Op(
    name="inv", params=NoParams, rule=_square_rule("inv"),
    numpy=lapack("inv", lambda p, a: np.linalg.inv(a)),
    vjp=lambda p, g, a, out: (-(mT(out) @ g @ mT(out)),),
    jvp=lambda p, tangents, a, out: -(out @ tangents[0] @ out), batch=leading,
    doc="the inverse of each square matrix"))


# ---- det, slogdet (packed: [..., 0] the sign, [..., 1] log|det|) ----

def _stack_rule(name: str, extra: tuple[int, ...]) -> Any:
    def rule(p: Any, a: tuple[int, ...]) -> tuple[tuple[int, ...], Any]:
        square(name, a)
        return a[:-2] + extra, p
    return rule


def _det_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    return out * trace(apply(SOLVE, NoParams(), (a, tangents[0])))


DET: Op = register(Op(
    name="det", params=NoParams, rule=_stack_rule("det", ()),
    numpy=lambda p, a: np.asarray(np.linalg.det(a)),
    vjp=lambda p, g, a, out: (as_matrices(g * out) * mT(apply(INV, p, (a,))),),
    jvp=_det_jvp, batch=leading,
    doc="the determinant of each square matrix (its gradient needs A invertible)"))


def _slogdet_numpy(p: NoParams, a: np.ndarray) -> np.ndarray:
    sign, logabs = np.linalg.slogdet(a)
    return np.stack([sign, logabs], axis=-1)


def _slogdet_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    # g[..., 1] as (..., 1, 1) by a product (indexing one matrix's pair gives a number)
    scale = g.reshape(tuple(g.shape[:-1]) + (1, 2)) @ np.array([[0.0], [1.0]])
    return (scale * mT(apply(INV, p, (a,))),)


def _slogdet_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    # the trace kept as (..., 1) (a full sum of one matrix would be a number); the sign's
    # tangent is zero
    d = _sum(diagonal(apply(SOLVE, p, (a, tangents[0]))), axis=-1, keepdims=True)
    return d * np.array([0.0, 1.0])


SLOGDET: Op = register(Op(
    name="slogdet", params=NoParams, rule=_stack_rule("slogdet", (2,)),
    numpy=_slogdet_numpy, vjp=_slogdet_vjp, jvp=_slogdet_jvp, batch=leading,
    doc="sign and log|det| of each square matrix, packed on a last axis of 2"))


# ---- solve_triangular (scipy's semantics: only one triangle of A is read) ----

@dataclasses.dataclass(frozen=True)
class TriangularParams:
    lower: bool = False
    trans: bool = False             # solve A^T X = B
    unit_diagonal: bool = False     # A's diagonal taken as ones (not read)


def _triangle(p: TriangularParams, t: Any) -> Any:
    """The part of ``t`` the solve reads, as the matrix it solves with (transposed if
    ``trans``): the gradient with respect to A lives there only."""
    part = tril(t, -1 if p.unit_diagonal else 0) if p.lower else \
        triu(t, 1 if p.unit_diagonal else 0)
    return mT(part) if p.trans else part


def _triangular_rule(p: TriangularParams, a: tuple[int, ...], b: tuple[int, ...]
                     ) -> tuple[tuple[int, ...], TriangularParams]:
    n = square("solve_triangular", a)
    if len(b) < 2 or b[-2] != n:
        raise ShapeError(f"linalg.solve_triangular: b must have shape (..., {n}, k) for a "
                         f"of shape {a}, got {b}")
    return _solve_batch("solve_triangular", a, b) + (n, b[-1]), p


def _triangular_numpy(p: TriangularParams, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    batch = _solve_batch("solve_triangular", a.shape, b.shape)
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    return scipy.linalg.solve_triangular(a, b, lower=p.lower, trans=int(p.trans),
                                         unit_diagonal=p.unit_diagonal)


def _triangular_vjp(p: TriangularParams, g: Any, a: Any, b: Any, out: Any
                    ) -> tuple[Any, Any]:
    gb = apply(SOLVE_TRIANGULAR, dataclasses.replace(p, trans=not p.trans), (a, g))
    gm = -(gb @ mT(out))                       # the gradient of the matrix solved with
    ga = _triangle(p, gm) if not p.trans else _triangle(
        dataclasses.replace(p, trans=False), mT(gm))
    return sum_to(ga, a.shape), sum_to(gb, b.shape)


def _triangular_jvp(p: TriangularParams, tangents: Any, a: Any, b: Any, out: Any) -> Any:
    da, db = tangents
    return apply(SOLVE_TRIANGULAR, p, (a, db - _triangle(p, da) @ out))


SOLVE_TRIANGULAR: Op = register(Op(
    name="solve_triangular", params=TriangularParams, rule=_triangular_rule,
    numpy=lapack("solve_triangular", _triangular_numpy),
    vjp=_triangular_vjp, jvp=_triangular_jvp, batch=leading,
    doc="X with T X = B for the triangle T of A (scipy.linalg.solve_triangular)"))


# ---- cholesky (numpy's: lower, reads A's lower triangle) ----

def _phi(t: Any) -> Any:
    """The lower triangle with half the diagonal."""
    return tril(t) - 0.5 * diag_embed(diagonal(t))


def _cholesky_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    # Murray (2016): S = L^-T Phi(L^T G) L^-1 is the gradient at a symmetric argument
    upper = TriangularParams(lower=True, trans=True)
    x = apply(SOLVE_TRIANGULAR, upper, (out, _phi(mT(out) @ g)))       # L^-T Phi
    s = mT(apply(SOLVE_TRIANGULAR, upper, (out, mT(x))))                # ... L^-1
    return (lower_read(0.5 * (s + mT(s))),)


def _cholesky_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    lower = TriangularParams(lower=True)
    da = symmetric_from_lower(tangents[0])
    x = apply(SOLVE_TRIANGULAR, lower, (out, da))                       # L^-1 dA
    inner = mT(apply(SOLVE_TRIANGULAR, lower, (out, mT(x))))            # ... L^-T
    return out @ _phi(inner)


CHOLESKY: Op = register(Op(
    name="cholesky", params=NoParams, rule=_square_rule("cholesky"),
    numpy=lapack("cholesky", lambda p, a: np.linalg.cholesky(a)),
    vjp=_cholesky_vjp, jvp=_cholesky_jvp, batch=leading,
    doc="the lower Cholesky factor of each positive-definite matrix (lower triangle read)"))


# ---- pinv (of matrices of full rank: the rank is constant near them) ----

def _pinv_rule(p: NoParams, a: tuple[int, ...]) -> tuple[tuple[int, ...], NoParams]:
    matrices("pinv", a)
    return a[:-2] + (a[-1], a[-2]), p


def _pinv_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    # the adjoint of Golub & Pereyra's dP = -P dA P + P P^T dA^T (I - A P)
    #                                        + (I - P A) dA^T P^T P
    m, n = a.shape[-2], a.shape[-1]
    left = np.eye(m) - a @ out
    right = np.eye(n) - out @ a
    return (-(mT(out) @ g @ mT(out)) + left @ mT(g) @ out @ mT(out)
            + mT(out) @ out @ mT(g) @ right,)


def _pinv_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    da = tangents[0]
    m, n = a.shape[-2], a.shape[-1]
    return (-(out @ da @ out) + out @ mT(out) @ mT(da) @ (np.eye(m) - a @ out)
            + (np.eye(n) - out @ a) @ mT(da) @ mT(out) @ out)


PINV: Op = register(Op(
    name="pinv", params=NoParams, rule=_pinv_rule,
    numpy=lapack("pinv", lambda p, a: np.linalg.pinv(a)),
    vjp=_pinv_vjp, jvp=_pinv_jvp, batch=leading,
    doc="the Moore-Penrose pseudo-inverse (derivatives for matrices of full rank)"))


# ---- expm ----

def _block_expm(a: Any, e: Any) -> Any:
    """The upper right block of expm([[a, e], [0, a]]): the derivative of expm at ``a``
    along ``e`` (Najfeld & Havel 1995); with ``a`` transposed, the vjp."""
    zero = a * 0.0
    big = concatenate([concatenate([a, e], axis=-1), concatenate([zero, a], axis=-1)],
                      axis=-2)
    n = a.shape[-1]
    return apply(EXPM, NoParams(), (big,))[..., :n, n:]


EXPM: Op = register(Op(
    name="expm", params=NoParams, rule=_square_rule("expm"),
    numpy=lambda p, a: scipy.linalg.expm(a),
    vjp=lambda p, g, a, out: (_block_expm(mT(a), g),),
    jvp=lambda p, tangents, a, out: _block_expm(a, tangents[0]), batch=leading,
    doc="the matrix exponential (scipy.linalg.expm)"))


# ---- lu_factor (scipy's packed LU: L's strict lower triangle, unit diagonal, and U) ----

def _lu_numpy(p: NoParams, a: np.ndarray) -> np.ndarray:
    return scipy.linalg.lu_factor(a, check_finite=False)[0]


def _lu_parts(lu: Any) -> tuple[Any, Any]:
    return tril(lu, -1) + np.eye(lu.shape[-1]), triu(lu)


def _permutation(a: Any, l: Any, u: Any) -> Any:  # noqa: E741
    """P with A = P L U, as ``A U^-1 L^-1``: constant wherever the pivots are (so its
    derivatives vanish), and needing no pivot indices in the vjp."""
    upper, lower = TriangularParams(lower=False, trans=True), \
        TriangularParams(lower=True, trans=True, unit_diagonal=True)
    x = mT(apply(SOLVE_TRIANGULAR, upper, (u, mT(a))))                  # A U^-1
    return mT(apply(SOLVE_TRIANGULAR, lower, (l, mT(x))))               # ... L^-1


def _lu_vjp(p: NoParams, g: Any, a: Any, out: Any) -> tuple[Any]:
    # A = P L U; with F = L^-1 P^T dA U^-1: dL = L tril(F, -1), dU = triu(F) U
    l, u = _lu_parts(out)  # noqa: E741
    perm = _permutation(a, l, u)
    inner = tril(mT(l) @ tril(g, -1), -1) + triu(triu(g) @ mT(u))
    x = apply(SOLVE_TRIANGULAR, TriangularParams(lower=True, trans=True,
                                                 unit_diagonal=True), (l, inner))
    y = mT(apply(SOLVE_TRIANGULAR, TriangularParams(lower=False), (u, mT(x))))
    return (perm @ y,)


def _lu_jvp(p: NoParams, tangents: Any, a: Any, out: Any) -> Any:
    l, u = _lu_parts(out)  # noqa: E741
    perm = _permutation(a, l, u)
    x = apply(SOLVE_TRIANGULAR, TriangularParams(lower=True, unit_diagonal=True),
              (l, mT(perm) @ tangents[0]))
    f = mT(apply(SOLVE_TRIANGULAR, TriangularParams(lower=False, trans=True), (u, mT(x))))
    return l @ tril(f, -1) + triu(f) @ u       # dL (strictly lower) + dU, packed


LU_FACTOR: Op = register(Op(
    name="lu_factor", params=NoParams, rule=_square_rule("lu_factor"),
    numpy=lapack("lu_factor", _lu_numpy), vjp=_lu_vjp, jvp=_lu_jvp, batch=leading,
    doc="the packed LU factors of each square matrix (scipy.linalg.lu_factor's lu)"))
