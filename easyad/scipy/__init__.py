"""easyad's derivatives handed to SciPy: ``ad.scipy.minimize``, ``ad.scipy.least_squares``,
``ad.scipy.ode_jacobian`` (``solve_ivp``'s ``jac``), and ``ad.scipy.special``.

Each records the user's function once with ``ad.record`` (a scalar tape: the function
sees a 1-D object array of Records, so plain numpy code and ``ad.<function>`` run on it)
and replays the recording at every point SciPy asks for: values and gradients in one
sweep, Hessians or Hessian-vector products by the second-order sweeps, Jacobians by rows.
A function that branches on its input is recorded again where a branch changes
(``on_branch_change="retape"``). A layer above the functional API and record/replay;
SciPy itself is imported when first used. The guide: docs/scientific.md.

>>> import numpy as np, easyad as ad
>>> rosen = lambda x: (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
>>> res = ad.scipy.minimize(rosen, [-1.2, 1.0], method="trust-exact")
>>> np.round(res.x, 8).tolist(), bool(res.success)
([1.0, 1.0], True)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from easyad.functional import jacobian as _jacobian
from easyad.replay import record as _record
from easyad.scipy import special

__all__ = ["least_squares", "minimize", "ode_jacobian", "special"]

# scipy.optimize.minimize's methods that use a Hessian: by product where they take one
# (cheaper: one sweep over the sweep), as a matrix where they need it
_HESSP_METHODS = frozenset({"newton-cg", "trust-ncg", "trust-krylov", "trust-constr"})
_HESS_METHODS = frozenset({"dogleg", "trust-exact"})
# least_squares: dense Jacobians from this many entries are handed over sparse (by default)
_SPARSE_SIZE = 1_000_000


def _refuse(kw: dict[str, Any], names: tuple[str, ...], what: str) -> None:
    given = [n for n in names if kw.get(n) is not None]
    if given:
        raise TypeError(f"{what} computes {', '.join(given)} itself with easyad; call "
                        f"scipy.optimize.{what.split('.')[-1]} directly to pass your own")


class _Recorded:
    """f recorded once at x0 (flattened), replayed at SciPy's points in x0's shape."""

    def __init__(self, f: Callable[..., Any], x0: Any, args: tuple[Any, ...]) -> None:
        x0 = np.asarray(x0, dtype=np.float64)
        if x0.ndim == 0 or x0.size == 0:
            x0 = x0.reshape(-1)
        if x0.size == 0:
            raise ValueError("x0 is empty: there is nothing to differentiate")
        self.shape, self.x0 = x0.shape, x0.ravel()
        shape = self.shape
        self.F = _record(lambda x: f(x.reshape(shape), *args), self.x0,
                         on_branch_change="retape")


def minimize(fun: Callable[..., Any], x0: Any, args: tuple[Any, ...] = (),
             method: str | None = None, **kwargs: Any) -> Any:
    """``scipy.optimize.minimize(fun, x0, args, method, ...)`` with ``jac`` and, for the
    methods that use one, ``hessp`` (Newton-CG, trust-ncg, trust-krylov, trust-constr) or
    ``hess`` (dogleg, trust-exact) from one recording of ``fun``, replayed. ``fun(x,
    *args)`` returns a number; ``x`` has ``x0``'s shape. Dict constraints without a
    ``jac`` get theirs the same way. Every other keyword goes to SciPy unchanged; the
    result is SciPy's ``OptimizeResult``.

    >>> import numpy as np, easyad as ad
    >>> res = ad.scipy.minimize(lambda x: np.sum((x - 3.0) ** 2), np.zeros(3),
    ...                         method="BFGS")
    >>> np.round(res.x, 6).tolist()
    [3.0, 3.0, 3.0]
    """
    import scipy.optimize

    _refuse(kwargs, ("jac", "hess", "hessp"), "ad.scipy.minimize")
    rec = _Recorded(fun, x0, tuple(args))
    F, shape = rec.F, rec.shape

    def value_and_gradient(x: np.ndarray) -> tuple[float, np.ndarray]:
        value, gradient = F.value_and_gradient(x)   # raises for a function of many outputs
        return float(np.asarray(value).reshape(())), \
            np.asarray(gradient, dtype=np.float64).ravel()

    name = method.lower() if isinstance(method, str) else ""   # (or a callable)
    if name in _HESSP_METHODS:
        kwargs["hessp"] = lambda x, v: np.asarray(F.hvp(x, v), dtype=np.float64).ravel()
    elif name in _HESS_METHODS:
        kwargs["hess"] = lambda x: np.asarray(F.hessian(x), dtype=np.float64).reshape(
            x.size, x.size)
    if "constraints" in kwargs:
        kwargs["constraints"] = _with_jacobians(kwargs["constraints"], shape)
    result = scipy.optimize.minimize(value_and_gradient, rec.x0, method=method, jac=True,
                                     **kwargs)
    result.x = np.asarray(result.x).reshape(shape)
    return result


def _with_jacobians(constraints: Any, shape: tuple[int, ...]) -> Any:
    """Dict constraints ({"type", "fun", "args"}) given a recorded ``jac`` where they
    have none; other constraint objects unchanged."""
    single = isinstance(constraints, dict)
    out = []
    for c in [constraints] if single else list(constraints):
        if isinstance(c, dict) and c.get("jac") is None and callable(c.get("fun")):
            fun, cargs = c["fun"], tuple(c.get("args", ()))

            def vector(x: Any, fun: Any = fun, cargs: Any = cargs) -> Any:
                v = fun(x.reshape(shape), *cargs)
                return np.array(v, dtype=object).reshape(-1) \
                    if not hasattr(v, "shape") or np.ndim(v) != 1 else v
            G = _record(vector, np.zeros(int(np.prod(shape))), on_branch_change="retape")
            c = {**c, "jac": lambda x, *_, G=G: np.asarray(G.jacobian(np.ravel(x)),
                                                           dtype=np.float64)}
        out.append(c)
    return out[0] if single else out


def least_squares(fun: Callable[..., Any], x0: Any, args: tuple[Any, ...] = (),
                  sparse: bool | None = None, **kwargs: Any) -> Any:
    """``scipy.optimize.least_squares(fun, x0, jac=..., args=args, ...)`` with the
    Jacobian of the residuals ``fun(x, *args)`` (a 1-D array) from one recording,
    replayed at each point (one reverse sweep per residual). Other keywords go to SciPy.

    ``sparse``: the Jacobian as a scipy.sparse csr matrix from the recording's sparse
    Jacobian (its exact pattern, compressed: ``Function.jacobian(x, sparse=True)``), and
    that pattern passed as ``jac_sparsity``; SciPy then solves its trust-region
    subproblems with LSMR (iterative: on ill-conditioned problems it may need more
    iterations than the dense exact solver). None (the default): sparse where a dense
    Jacobian would hold a million entries or more, its pattern fills at most a quarter
    of them, and the method allows it (not "lm", not ``tr_solver="exact"``).

    >>> import numpy as np, easyad as ad
    >>> t = np.linspace(0.0, 1.0, 20)
    >>> y = 2.0 * np.exp(-3.0 * t)
    >>> res = ad.scipy.least_squares(lambda p: p[0] * ad.exp(-p[1] * t) - y, [1.0, 1.0])
    >>> np.round(res.x, 6).tolist()
    [2.0, 3.0]
    """
    import scipy.optimize

    _refuse(kwargs, ("jac", "jac_sparsity"), "ad.scipy.least_squares")
    rec = _Recorded(fun, x0, tuple(args))
    F, shape = rec.F, rec.shape

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.asarray(F(x), dtype=np.float64).ravel()

    def jac(x: np.ndarray) -> np.ndarray:
        return np.asarray(F.jacobian(x), dtype=np.float64).reshape(-1, x.size)

    dense_only = kwargs.get("method") == "lm" or kwargs.get("tr_solver") == "exact"
    if sparse and dense_only:
        raise ValueError("sparse=True needs a method and tr_solver that take a sparse "
                         "Jacobian: method 'trf' or 'dogbox', tr_solver 'lsmr' or None")
    if sparse is None and not dense_only:
        # the pattern is found once and kept by F (the sparse Jacobian uses it too)
        size = F.n_outputs * F.n_inputs
        sparse = size >= _SPARSE_SIZE and 4 * len(F.jacobian_pattern()[0]) <= size
    if sparse:
        kwargs["jac_sparsity"] = F.jacobian_pattern("csr")

        def jac(x: np.ndarray) -> Any:      # noqa: F811  (the sparse one replaces it)
            return F.jacobian(x, sparse=True, format="csr")

    result = scipy.optimize.least_squares(residuals, rec.x0, jac=jac, **kwargs)
    result.x = np.asarray(result.x).reshape(shape)
    return result


def ode_jacobian(fun: Callable[..., Any]) -> Callable[[float, Any], np.ndarray]:
    """``jac(t, y)`` for ``scipy.integrate.solve_ivp(fun, ..., jac=...)`` (Radau, BDF,
    LSODA): the Jacobian of ``fun(t, y)`` in ``y``, by ``ad.jacobian(fun, argnums=1)``
    (forward mode: one sweep per column), as a float array (n, n).

    >>> import numpy as np, easyad as ad
    >>> jac = ad.scipy.ode_jacobian(lambda t, y: np.array([y[1], -t * y[0]]))
    >>> jac(2.0, np.array([1.0, 0.0])).tolist()
    [[0.0, 1.0], [-2.0, 0.0]]
    """
    J = _jacobian(fun, argnums=1)

    def jac(t: float, y: Any) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        return np.asarray(J(float(t), y), dtype=np.float64).reshape(y.size, y.size)
    return jac
