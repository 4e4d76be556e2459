"""Differentiable linear algebra: numpy's ``np.linalg`` and scipy's triangular, Cholesky,
LU and exponential functions, with numpy's and scipy's semantics, on numpy arrays,
Tensors of every device and TraceTensors, in every mode (reverse, forward, create_graph
to any order, ``ad.record(tensor=True)``).

Each factorisation or solve is one op of the op table (``easyad/ops/_linalg.py``,
``_linalg_spectral.py``); the rest are compositions of them and of tensor operations
(``matrix_power``, ``norm``, ``lstsq``, ``cho_factor``/``cho_solve``, ``lu_solve``).
``np.linalg.<name>(tensor)`` calls these. The derivative formulas, their sources and what
happens at repeated eigenvalues: docs/linalg.md.

>>> import numpy as np, easyad as ad
>>> a = np.array([[4.0, 1.0], [1.0, 3.0]])
>>> ad.grad(lambda m: ad.linalg.det(m))(a)          # d det / dA = det(A) A^-T
array([[ 3., -1.],
       [-1.,  4.]])
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import scipy.linalg

from easyad._generated.functions import sqrt as _sqrt
from easyad.ops import _linalg as _ops
from easyad.ops import _linalg_spectral as _spectral
from easyad.ops._apply import apply
from easyad.tensor import _generic
from easyad.tensor._base import TensorBase, read_keyed
from easyad.tensor._generic import NUMPY_FUNCTIONS
from easyad.tensor._trace import TraceTensor

__all__ = ["EighResult", "QRResult", "SVDResult", "SlogdetResult", "cho_factor", "cho_solve",
           "cholesky", "det", "eigh", "eigvalsh", "expm", "inv", "lstsq", "lu_factor",
           "lu_solve", "matrix_power", "norm", "pinv", "qr", "slogdet", "solve",
           "solve_triangular", "svd", "svdvals"]
__all__ += ["cg", "gmres"]   # matrix-free solves (registered by the transforms layer)

_NONE = _ops.NoParams()


class EighResult(NamedTuple):
    eigenvalues: Any
    eigenvectors: Any


class SVDResult(NamedTuple):
    U: Any
    S: Any
    Vh: Any


class SlogdetResult(NamedTuple):
    sign: Any
    logabsdet: Any


class QRResult(NamedTuple):
    Q: Any
    R: Any


def _operand(x: Any) -> Any:
    if isinstance(x, (TensorBase, TraceTensor, np.ndarray)):
        return x
    return np.asarray(x, dtype=np.float64)


def _host(x: Any) -> np.ndarray:
    """The numbers of ``x`` (for what is not differentiated: pivots, ranks)."""
    return np.asarray(x.value if isinstance(x, (TensorBase, TraceTensor)) else x)


def _rank(a: np.ndarray) -> np.ndarray:
    return np.asarray(np.linalg.matrix_rank(a))


def _pivots(a: np.ndarray) -> np.ndarray:
    return np.asarray(scipy.linalg.lu_factor(a, check_finite=False)[1])


def _keyed(x: Any, key: Any) -> Any:
    """``key`` of x's numbers (pivots, a rank: not differentiated). In a tensor recording
    the guard is on key's result, so replay at a point with the same pivots runs and one
    where partial pivoting would choose others raises BranchChangedError (or records
    again, ``on_branch_change="retape"``): never the stale pivots."""
    if isinstance(x, TensorBase):
        return read_keyed(x, key)
    return key(_host(x))


def _call(op: Any, *args: Any, params: Any = _NONE) -> Any:
    return apply(op, params, tuple(_operand(a) for a in args))


def _as_columns(b: Any) -> tuple[Any, bool]:
    """A vector right-hand side as one column (numpy 2's rule: b is a vector iff 1-d)."""
    b = _operand(b)
    return (b.reshape((b.shape[0], 1)), True) if len(b.shape) == 1 else (b, False)


def _vector_back(x: Any, vector: bool) -> Any:
    return x.reshape(tuple(x.shape[:-1])) if vector else x


# ---- solves and inverses ----

def solve(a: Any, b: Any) -> Any:
    """``x`` with ``a @ x = b``, as ``numpy.linalg.solve`` (stacks broadcast; b is a vector
    when 1-d). Singular ``a``: numpy's LinAlgError."""
    b, vector = _as_columns(b)
    return _vector_back(_call(_ops.SOLVE, a, b), vector)


def inv(a: Any) -> Any:
    """The inverse of each matrix of ``a``, as ``numpy.linalg.inv``."""
    return _call(_ops.INV, a)


def det(a: Any) -> Any:
    """The determinant of each matrix, as ``numpy.linalg.det`` (the gradient
    ``det(A) A^-T`` needs A invertible: LinAlgError otherwise)."""
    return _call(_ops.DET, a)


def slogdet(a: Any) -> SlogdetResult:
    """``(sign, logabsdet)`` as ``numpy.linalg.slogdet``; the sign has derivative zero."""
    packed = _call(_ops.SLOGDET, a)
    return SlogdetResult(packed[..., 0], packed[..., 1])


def solve_triangular(a: Any, b: Any, trans: Any = 0, lower: bool = False,
                     unit_diagonal: bool = False, overwrite_b: bool = False,
                     check_finite: bool = True) -> Any:
    """``scipy.linalg.solve_triangular``: only the ``lower`` (or upper) triangle of ``a``
    is read (its other triangle gets zero gradient); ``trans`` 0/'N' or 1/'T'."""
    if trans not in (0, 1, "N", "T"):
        raise ValueError(f"solve_triangular: trans must be 0, 1, 'N' or 'T' (real "
                         f"matrices), got {trans!r}")
    params = _ops.TriangularParams(lower=bool(lower), trans=trans in (1, "T"),
                                   unit_diagonal=bool(unit_diagonal))
    b, vector = _as_columns(b)
    return _vector_back(_call(_ops.SOLVE_TRIANGULAR, a, b, params=params), vector)


def pinv(a: Any, rcond: Any = None, hermitian: bool = False, *, rtol: Any = None) -> Any:
    """The pseudo-inverse, as ``numpy.linalg.pinv`` with its default cut-off. Derivatives
    hold where the rank is constant: matrices of full rank (Golub & Pereyra)."""
    if rcond is not None or rtol is not None:
        raise ValueError("linalg.pinv: only the default cut-off is supported (the "
                         "derivative assumes full rank): leave rcond and rtol out")
    return _call(_ops.PINV, a)


def lstsq(a: Any, b: Any, rcond: Any = None) -> tuple[Any, Any, int, Any]:
    """``(x, residuals, rank, s)`` as ``numpy.linalg.lstsq``; ``x = pinv(a) @ b``, so its
    derivatives are those of a matrix of full rank."""
    a, b = _operand(a), _operand(b)
    x = pinv(a) @ b
    s = svdvals(a)
    rank = int(_keyed(a, _rank))
    m, n = a.shape[-2], a.shape[-1]
    if rank == n and m > n:
        r = a @ x - b
        residuals = _generic.sum(r * r, axis=0)
        if len(residuals.shape) == 0:
            residuals = residuals.reshape((1,))
    else:
        residuals = np.empty((0,))
    return x, residuals, rank, s


def matrix_power(a: Any, n: int) -> Any:
    """``a`` to the integer power ``n`` by repeated squaring (``numpy.linalg.matrix_power``;
    negative ``n``: of the inverse)."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise TypeError(f"matrix_power: the exponent must be an integer, got {n!r}")
    a = _operand(a)
    _ops.square("matrix_power", tuple(a.shape))
    if n == 0:
        return a * 0.0 + np.eye(a.shape[-1])
    if n < 0:
        a, n = inv(a), -n
    result, base = None, a
    while n:
        if n & 1:
            result = base if result is None else result @ base
        n >>= 1
        if n:
            base = base @ base
    return result


# ---- factorisations ----

def cholesky(a: Any, upper: bool = False) -> Any:
    """The Cholesky factor, as ``numpy.linalg.cholesky`` (lower: only ``a``'s lower
    triangle is read). Not positive definite: LinAlgError."""
    factor = _call(_ops.CHOLESKY, a)
    return _ops.mT(factor) if upper else factor


def cho_factor(a: Any, lower: bool = False, overwrite_a: bool = False,
               check_finite: bool = True) -> tuple[Any, bool]:
    """``(c, lower)`` as ``scipy.linalg.cho_factor``, except that ``c``'s other triangle
    is zero (scipy leaves arbitrary numbers there; cho_solve reads neither)."""
    factor = _call(_ops.CHOLESKY, a)
    return (factor if lower else _ops.mT(factor)), bool(lower)


def cho_solve(c_and_lower: tuple[Any, bool], b: Any, overwrite_b: bool = False,
              check_finite: bool = True) -> Any:
    """``x`` with ``A x = b`` from ``cho_factor(A)``, as ``scipy.linalg.cho_solve``."""
    c, lower = c_and_lower
    y = solve_triangular(c, b, lower=lower, trans=0 if lower else 1)
    return solve_triangular(c, y, lower=lower, trans=1 if lower else 0)


def lu_factor(a: Any, overwrite_a: bool = False, check_finite: bool = True
              ) -> tuple[Any, np.ndarray]:
    """``(lu, piv)`` as ``scipy.linalg.lu_factor``. ``lu`` is differentiable; the pivots
    are integers read from ``a``'s numbers (constants where the pivoting does not change;
    in ``ad.record(tensor=True)`` replay is guarded on them: a point where partial
    pivoting chooses others raises BranchChangedError, or records again)."""
    lu = _call(_ops.LU_FACTOR, a)
    piv = _keyed(a, _pivots)
    return lu, piv


def _row_permutation(piv: np.ndarray) -> np.ndarray:
    """LAPACK's row interchanges (``piv``, stacked or not) as constant matrices ``P^T``:
    ``P^T @ b`` puts b's rows in the order the factors have them."""
    piv = np.asarray(piv)
    n = piv.shape[-1]
    out = np.zeros(piv.shape + (n,))
    for index in np.ndindex(piv.shape[:-1]):
        order = np.arange(n)
        for i, p in enumerate(piv[index]):
            order[i], order[p] = order[p], order[i]
        out[index + (np.arange(n), order)] = 1.0
    return out


def lu_solve(lu_and_piv: tuple[Any, np.ndarray], b: Any, trans: int = 0,
             overwrite_b: bool = False, check_finite: bool = True) -> Any:
    """``x`` with ``A x = b`` (trans 1: ``A^T x = b``) from ``lu_factor(A)``, as
    ``scipy.linalg.lu_solve`` (stacks too: the row interchanges are constant matrices)."""
    lu, piv = lu_and_piv
    b, vector = _as_columns(b)
    swap = _row_permutation(piv)                  # P^T
    if trans in (0, "N"):
        y = solve_triangular(lu, swap @ b, lower=True, unit_diagonal=True)
        return _vector_back(solve_triangular(lu, y, lower=False), vector)
    if trans in (1, "T"):
        z = solve_triangular(lu, b, lower=False, trans=1)
        w = solve_triangular(lu, z, lower=True, trans=1, unit_diagonal=True)
        return _vector_back(_ops.mT(swap) @ w, vector)
    raise ValueError(f"lu_solve: trans must be 0 or 1 (real matrices), got {trans!r}")


def _lower_of(a: Any, uplo: str) -> Any:
    """The matrix whose lower triangle holds the triangle ``UPLO`` names."""
    if uplo not in ("L", "U"):
        raise ValueError(f"UPLO must be 'L' or 'U', got {uplo!r}")
    a = _operand(a)
    return a if uplo == "L" else _ops.mT(a)


def eigh(a: Any, UPLO: str = "L") -> EighResult:  # noqa: N803  (numpy's name)
    """``(eigenvalues, eigenvectors)`` of symmetric matrices, as ``numpy.linalg.eigh``.
    Where eigenvalues repeat, derivatives through the eigenvectors are inf/nan."""
    packed = _call(_spectral.EIGH, _lower_of(a, UPLO))
    return EighResult(packed[..., 0, :], packed[..., 1:, :])


def eigvalsh(a: Any, UPLO: str = "L") -> Any:  # noqa: N803
    """Eigenvalues of symmetric matrices (ascending), as ``numpy.linalg.eigvalsh``; the
    derivative ``V diag(g) V^T`` stays finite at repeated eigenvalues."""
    return _call(_spectral.EIGVALSH, _lower_of(a, UPLO))


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True,
        hermitian: bool = False) -> Any:
    """``(U, S, Vh)`` as ``numpy.linalg.svd`` (``compute_uv=False``: ``S``). A full U or V
    of a non-square matrix has columns that are not unique (no derivative): pass
    ``full_matrices=False``. ``hermitian`` computes the general SVD."""
    a = _operand(a)
    if not compute_uv:
        return svdvals(a)
    m, n = a.shape[-2], a.shape[-1]
    if full_matrices and m != n:
        raise ValueError(f"linalg.svd: full_matrices=True of a {m}x{n} matrix adds singular "
                         f"vectors that are not unique, so not differentiable: pass "
                         f"full_matrices=False")
    packed = _call(_spectral.SVD, a)
    return SVDResult(_ops.mT(packed[..., :m]), packed[..., m], packed[..., m + 1:])


def svdvals(x: Any) -> Any:
    """Singular values (descending), as ``numpy.linalg.svdvals``; the derivative
    ``U diag(g) V^T`` stays finite at repeated singular values."""
    return _call(_spectral.SVDVALS, x)


def qr(a: Any, mode: str = "reduced") -> Any:
    """``(Q, R)`` as ``numpy.linalg.qr`` for tall or square matrices; ``mode`` 'reduced'
    (and 'complete' when square) or 'r' (R only)."""
    a = _operand(a)
    m, n = a.shape[-2], a.shape[-1]
    if mode not in ("reduced", "r", "complete") or (mode == "complete" and m != n):
        raise ValueError(f"linalg.qr: mode must be 'reduced', 'r' or (square matrices) "
                         f"'complete', got {mode!r} for shape {tuple(a.shape)}")
    packed = _call(_spectral.QR, a)
    r = packed[..., m:]
    return r if mode == "r" else QRResult(_ops.mT(packed[..., :m]), r)


def expm(a: Any) -> Any:
    """The matrix exponential, as ``scipy.linalg.expm``."""
    return _call(_ops.EXPM, a)


# ---- norms (compositions of tensor operations) ----

def _vector_norm(x: Any, order: Any, axis: Any, keepdims: bool) -> Any:
    s = _generic.sum
    if order is None or order == 2:
        return _sqrt(s(x * x, axis=axis, keepdims=keepdims))
    if order == np.inf:
        return _generic.amax(abs(x), axis=axis, keepdims=keepdims)
    if order == -np.inf:
        return _generic.amin(abs(x), axis=axis, keepdims=keepdims)
    if order == 0:      # a count: derivative zero
        return s((abs(x) > 0) * 1.0, axis=axis, keepdims=keepdims)
    if order == 1:
        return s(abs(x), axis=axis, keepdims=keepdims)
    if isinstance(order, str):
        raise ValueError(f"linalg.norm: ord {order!r} is a matrix norm: give a 2-tuple axis")
    return s(abs(x) ** float(order), axis=axis, keepdims=keepdims) ** (1.0 / float(order))


def _matrix_norm(x: Any, order: Any, axes: tuple[int, int], keepdims: bool) -> Any:
    nd = len(x.shape)
    rows, cols = (a % nd for a in axes)
    if rows == cols:
        raise ValueError("linalg.norm: the two axes of a matrix norm must differ")
    last = x.transpose(*[k for k in range(nd) if k not in (rows, cols)], rows, cols)
    if order in (None, "fro"):
        out = _sqrt(_generic.sum(last * last, axis=(-2, -1)))
    elif order == "nuc":
        out = _generic.sum(svdvals(last), axis=-1)
    elif order in (2, -2):
        out = svdvals(last)[..., 0 if order == 2 else -1]
    elif order in (1, -1, np.inf, -np.inf):
        sums = _generic.sum(abs(last), axis=-2 if order in (1, -1) else -1)
        extreme = _generic.amax if order in (1, np.inf) else _generic.amin
        out = extreme(sums, axis=-1)
    else:
        raise ValueError(f"linalg.norm: invalid norm order {order!r} for matrices")
    if keepdims:
        shape = list(x.shape)
        shape[rows] = shape[cols] = 1
        out = out.reshape(tuple(shape))
    return out


def norm(x: Any, ord: Any = None, axis: Any = None,  # noqa: A002  (numpy's name)
         keepdims: bool = False) -> Any:
    """Vector and matrix norms, as ``numpy.linalg.norm`` (2-norms, 1/inf norms,
    Frobenius, nuclear, spectral), written with tensor operations and ``svdvals``."""
    x = _operand(x)
    nd = len(x.shape)
    if axis is None:
        if ord is None:
            flat = x.reshape((-1,))
            out = _vector_norm(flat, None, 0, False)
            return out.reshape((1,) * nd) if keepdims else out
        if nd == 1:
            return _vector_norm(x, ord, 0, keepdims)
        if nd == 2:
            return _matrix_norm(x, ord, (0, 1), keepdims)
        raise ValueError("linalg.norm: an ord needs a 1-d or 2-d x, or an axis")
    if isinstance(axis, (int, np.integer)):
        return _vector_norm(x, ord, int(axis), keepdims)
    axis = tuple(axis)
    if len(axis) == 1:
        return _vector_norm(x, ord, axis[0], keepdims)
    if len(axis) == 2:
        return _matrix_norm(x, ord, axis, keepdims)
    raise ValueError(f"linalg.norm: axis takes one or two axes, got {axis}")


# numpy's linalg functions on Tensors and TraceTensors (their __array_function__ reads this)
for _name in ("solve", "inv", "det", "slogdet", "cholesky", "eigh", "eigvalsh", "svd",
              "svdvals", "qr", "lstsq", "pinv", "matrix_power", "norm"):
    NUMPY_FUNCTIONS[getattr(np.linalg, _name)] = globals()[_name]


# ---- matrix-free solves: ad.linalg.cg, ad.linalg.gmres ----
# They differentiate the user's matvec with the functional API, a layer above this one:
# easyad/transforms/implicit_linear.py defines them and puts them here at import (as the
# tensor layer registers array primitives with easyad/primitives.py), so the imports run
# one way. The placeholders below are replaced before `import easyad` returns.

def cg(matvec: Any, b: Any, args: Any = (), **options: Any) -> Any:
    """Conjugate gradients on a linear operator (see easyad.transforms.implicit_linear)."""
    raise RuntimeError("ad.linalg.cg is put here by easyad.transforms.implicit_linear: "
                       "import easyad")


def gmres(matvec: Any, b: Any, args: Any = (), **options: Any) -> Any:
    """GMRES on a linear operator (see easyad.transforms.implicit_linear)."""
    raise RuntimeError("ad.linalg.gmres is put here by easyad.transforms.implicit_linear: "
                       "import easyad")


def _register_matrix_free(**solvers: Any) -> None:
    globals().update(solvers)
