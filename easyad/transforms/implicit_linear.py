"""Matrix-free differentiable linear solves: ``ad.linalg.cg`` and ``ad.linalg.gmres``.

``x = cg(matvec, b, args)`` solves ``A(args) x = b`` for a linear operator given only by
its product ``matvec(v, *args)``. It is the root of the affine residual
``matvec(x, *args) - b``, so it is differentiated as ``custom_root`` differentiates
(easyad/transforms/implicit.py), in b and in the operator's parameters:
``bbar = A^-T xbar`` (one transposed solve: CG reuses A, which it needs symmetric;
GMRES solves with the vjp of matvec) and ``argsbar = -(d(A x)/d args)^T bbar`` (one vjp
of matvec); forward mode ``xdot = A^-1 (bdot - (d(A x)/d args) argsdot)``. The residual
being affine, the products with A are matvec itself on plain numbers (no derivative of
matvec is taken for them).

These live in the transforms layer (they call the functional API) and are registered
with ``easyad.linalg`` (the tensor layer) at import, as the array primitives register
with ``easyad.primitives``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import linalg
from easyad.transforms import implicit, implicit_krylov as krylov


def _linear(name: str, method: str, matvec: Callable[..., Any], b: Any, args: Any,
            x0: Any, rtol: float, atol: float, maxiter: int | None,
            restart: int | None) -> Any:
    if not callable(matvec):
        raise TypeError(f"{name}: matvec must be callable matvec(v, *args), got "
                        f"{type(matvec).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    shape = np.shape(implicit._numbers(b))
    start = np.zeros(shape) if x0 is None else implicit._numbers(x0)
    if np.shape(start) != shape:
        raise ValueError(f"{name}: x0 must have b's shape {shape}, got {np.shape(start)}")

    def residual(x: Any, rhs: Any, *a: Any) -> Any:
        return matvec(x, *a) - rhs

    def solve(r: Callable[[Any], Any], guess: Any) -> Any:
        # r(x) = A x - b at plain numbers: A v = r(v) - r(0), b = -r(0)
        zero = np.ravel(r(np.zeros(shape)))
        x = krylov.solve(lambda v: np.ravel(r(v.reshape(shape))) - zero, -zero, method,
                         x0=np.ravel(guess), rtol=rtol, atol=atol, maxiter=maxiter,
                         restart=restart, what=f"{name} (A x = b)")
        return x.reshape(shape)

    derivatives = implicit._Derivatives(name, method, rtol, atol, maxiter, True)
    # the Krylov solve checks |A x - b| itself, against its own tolerances
    return implicit._operation(name, residual, start, solve, derivatives, (b, *args), None)


def cg(matvec: Callable[..., Any], b: Any, args: Any = (), *, x0: Any = None,
       rtol: float = 1e-10, atol: float = 0.0, maxiter: int | None = None) -> Any:
    """``x`` with ``matvec(x, *args) = b`` by conjugate gradients, for a symmetric positive
    definite linear operator given only by its product; differentiable in ``b`` and
    ``args``.

    Parameters
    ----------
    matvec : callable
        ``matvec(v, *args)``: A(args) v, v of b's shape; linear in v, written with easyad
        operations where it depends on ``args`` (its vjp in args is taken for the
        derivative). A must be symmetric: the transposed solve of the derivative reuses
        it.
    b : float, array, Tensor, Record...
        The right-hand side (any shape: v has its shape).
    args : tuple
        The operator's parameters (numbers, arrays, Tensors, Records, Traces or
        structures of them).
    x0 : array, optional
        The starting guess (b's shape).
    rtol, atol, maxiter
        Stop when ``norm(A x - b) <= max(rtol * norm(b), atol)`` (the true residual is
        checked again); ``ConvergenceError`` after ``maxiter`` iterations (default
        10 n + 10).

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> K = np.array([[4.0, 1.0], [1.0, 3.0]])
    >>> x = lambda b: ad.linalg.cg(lambda v: K @ v, b)
    >>> np.allclose(x(np.array([1.0, 2.0])), np.linalg.solve(K, [1.0, 2.0]))
    True
    >>> np.allclose(ad.jacobian(x)(np.array([1.0, 2.0])), np.linalg.inv(K))
    True
    """
    return _linear("ad.linalg.cg", "cg", matvec, b, args, x0, rtol, atol, maxiter, None)


def gmres(matvec: Callable[..., Any], b: Any, args: Any = (), *, x0: Any = None,
          rtol: float = 1e-10, atol: float = 0.0, restart: int | None = None,
          maxiter: int | None = None) -> Any:
    """``x`` with ``matvec(x, *args) = b`` by restarted GMRES, for any invertible linear
    operator given only by its product; differentiable in ``b`` and ``args`` (the
    transposed solve of reverse mode runs GMRES on matvec's vjp).

    As :func:`cg`, with ``restart`` (the Krylov space's size between restarts, default
    min(n, 50)) and ``maxiter`` (restart cycles, default ~10 n / restart).

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> def matvec(v, s):                       # A(s) = [[2, s], [0, 1]]
    ...     return ad.stack([2.0 * v[0] + s * v[1], v[1]])
    >>> x = lambda s: ad.linalg.gmres(matvec, np.array([1.0, 1.0]), (s,))
    >>> x(1.0)
    array([0., 1.])
    >>> np.round(ad.jacobian(x)(1.0), 12)        # dx/ds = -A^-1 (dA/ds) x
    array([-0.5,  0. ])
    """
    return _linear("ad.linalg.gmres", "gmres", matvec, b, args, x0, rtol, atol, maxiter,
                   restart)


linalg._register_matrix_free(cg=cg, gmres=gmres)

__all__ = ["cg", "gmres"]
