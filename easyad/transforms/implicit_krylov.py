"""The numbers of implicit differentiation: linear solves on flat numpy vectors.

CG and GMRES are SciPy's (``scipy.sparse.linalg``) on a ``LinearOperator`` of the user's
matrix-vector product; what this module adds is the guarantee the derivatives need: a
solve that did not reach its tolerance raises ``ConvergenceError`` (SciPy only returns an
``info`` code), and the answer's TRUE residual ``|A x - b|`` is measured once more with
the user's product (a Krylov method's recurrence residual can drift from it). The dense
solve builds A column by column from the product (n products: for small systems).
Nothing here knows about easyad's modes: the callers hand in plain functions.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse.linalg as _sparse

from easyad.errors import ConvergenceError

Matvec = Callable[[np.ndarray], np.ndarray]

METHODS = ("gmres", "cg", "dense")

# the true residual may exceed the tolerance the recurrence met by this factor before the
# answer is refused (rounding in the product; a preconditioned GMRES's own residual norm)
_SLACK = 100.0


def _product(matvec: Matvec, n: int, what: str) -> Matvec:
    def checked(v: np.ndarray) -> np.ndarray:
        w = np.asarray(matvec(v), dtype=np.float64).reshape(-1)
        if w.shape != (n,):
            raise ValueError(f"{what}: the linear operator returned {w.shape[0]} numbers "
                             f"for a vector of {n}; it must map x's shape to x's shape")
        return w
    return checked


def _checked_answer(x: np.ndarray, product: Matvec, b: np.ndarray, rtol: float,
                    atol: float, what: str, method: str, info: int) -> np.ndarray:
    bound = max(rtol * float(np.linalg.norm(b)), atol)
    if not np.all(np.isfinite(x)):
        raise ConvergenceError(f"{what}: {method} produced non-finite numbers (the operator "
                               f"is singular or not {_needs(method)})")
    residual = float(np.linalg.norm(product(x) - b))
    if info != 0 or residual > _SLACK * bound:
        why = f"stopped after its {info} iterations" if info > 0 else "broke down"
        if info == 0:
            why = "met its own residual estimate but not the true residual"
        raise ConvergenceError(
            f"{what}: {method} {why}: |A x - b| = {residual:.3g} > {bound:.3g} "
            f"(rtol={rtol:g}, atol={atol:g}); raise maxiter, loosen rtol/atol, or use "
            f"method='dense' for a small system (the operator must be {_needs(method)})")
    return x


def _needs(method: str) -> str:
    return "symmetric positive definite" if method == "cg" else "invertible"


def solve(matvec: Matvec, b: np.ndarray, method: str = "gmres", *, x0: np.ndarray | None = None,
          rtol: float = 1e-10, atol: float = 0.0, maxiter: int | None = None,
          restart: int | None = None, what: str = "linear solve") -> np.ndarray:
    """``x`` with ``matvec(x) = b`` (flat float64 vectors), by ``method``; raises
    ``ConvergenceError`` when the answer is not within ``max(rtol |b|, atol)``."""
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    n = b.shape[0]
    product = _product(matvec, n, what)
    if method not in METHODS:
        raise ValueError(f"{what}: method must be one of {', '.join(map(repr, METHODS))} "
                         f"or a callable, got {method!r}")
    if not np.all(np.isfinite(b)):
        raise ConvergenceError(f"{what}: the right-hand side has non-finite numbers")
    if n == 0 or not np.any(b):
        return np.zeros(n)
    if method == "dense":
        return solve_matrix(dense(product, n), b, what, product, rtol, atol)
    operator = _sparse.LinearOperator((n, n), matvec=product, dtype=np.float64)
    start = None if x0 is None else np.asarray(x0, dtype=np.float64).reshape(-1)
    if method == "cg":
        x, info = _sparse.cg(operator, b, x0=start, rtol=rtol, atol=atol,
                             maxiter=maxiter if maxiter is not None else 10 * n + 10)
    else:
        inner = restart if restart is not None else min(n, 50)
        outer = maxiter if maxiter is not None else max(10, (10 * n) // inner + 1)
        x, info = _sparse.gmres(operator, b, x0=start, rtol=rtol, atol=atol, restart=inner,
                                maxiter=outer)
    return _checked_answer(np.asarray(x, dtype=np.float64), product, b, rtol, atol, what,
                           method, int(info))


def solve_matrix(a: np.ndarray, b: np.ndarray, what: str, product: Matvec | None = None,
                 rtol: float = 1e-10, atol: float = 0.0) -> np.ndarray:
    """``x`` with ``a x = b`` by LU; singular: ConvergenceError. The residual is checked
    with ``product`` (default: ``a`` itself), loosely (LU's error grows with a's
    condition number)."""
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    try:
        x = np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        raise ConvergenceError(f"{what}: the operator's matrix ({a.shape[0]}x{a.shape[1]}) "
                               f"is singular") from None
    return _checked_answer(x, product if product is not None else a.__matmul__, b,
                           max(rtol, 1e-8), atol, what, "dense", 0)


def dense(product: Matvec, n: int) -> np.ndarray:
    """The matrix of a linear map of R^n, one column per unit vector."""
    a = np.empty((n, n))
    e = np.zeros(n)
    for j in range(n):
        e[j] = 1.0
        a[:, j] = product(e)
        e[j] = 0.0
    return a


__all__ = ["METHODS", "dense", "solve", "solve_matrix"]
