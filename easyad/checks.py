"""Checking derivatives against central finite differences.

Layer: rules (``_rules.py``) -> compiled core -> functional (``functional.py``) -> checks
(this module). ``check_gradients`` differentiates a function of one 1-D array in BOTH modes
(forward: Traces, reverse: Records on a WengertList), compares each entry with a central
finite difference of the same function run on plain floats, and raises
:class:`~easyad.errors.GradientCheckError` with a table of the entries that disagree.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad import _trees
from easyad.errors import GradientCheckError
from easyad._evaluation import _output_leaves, _Point, _value
from easyad.functional import jacobian

__all__ = ["check_gradients", "GradientCheck"]

_EPS = float(np.finfo(np.float64).eps)
# the rounding allowance: a central difference of values each off by about eps |f| (a few
# eps for a longer computation) is off by up to ROUNDING * eps max|f| / h
_ROUNDING = 16.0
_MAX_ROWS = 25


@dataclass(frozen=True)
class GradientCheck:
    """What :func:`check_gradients` compared, when everything agreed.

    Arrays have the Jacobian's shape: (n,) for a scalar function, (m, n) otherwise.
    """

    forward: NDArray[np.float64]            # AD, forward mode
    reverse: NDArray[np.float64]            # AD, reverse mode
    finite_difference: NDArray[np.float64]  # central differences
    tolerance: NDArray[np.float64]          # allowed |AD - finite difference| per entry

    @property
    def max_error(self) -> float:
        """The largest |AD - finite difference| over both modes and all entries."""
        if self.forward.size == 0:
            return 0.0
        return float(max(np.max(np.abs(self.forward - self.finite_difference)),
                         np.max(np.abs(self.reverse - self.finite_difference))))


def _flat_values(f: Callable[..., Any], point: _Point, x: NDArray[np.float64],
                 args: tuple[Any, ...]) -> NDArray[np.float64]:
    """f at the flat point ``x`` (split into the point's leaves), its outputs flattened."""
    arrays, start = [], 0
    for a in point.arrays:
        arrays.append(x[start:start + a.size].reshape(a.shape))
        start += a.size
    leaves, _ = _output_leaves(f(point.numbers(arrays), *args), f, "forward")
    return np.concatenate([np.asarray(_value(v), dtype=np.float64).reshape(-1)
                           for v in leaves]) if leaves else np.zeros(0)


def _central_differences(f: Callable[..., Any], point: _Point, eps: float,
                         args: tuple[Any, ...]) -> tuple[NDArray[np.float64],
                                                         NDArray[np.float64]]:
    """Central differences (M, N) and their rounding bounds (M, N) over the flattened
    outputs and inputs."""
    x = np.concatenate([a.reshape(-1) for a in point.arrays]) if point.arrays else np.zeros(0)
    columns, bounds = [], []
    for j in range(x.size):
        step = eps * max(1.0, abs(float(x[j])))
        plus, minus = x.copy(), x.copy()
        plus[j] += step
        minus[j] -= step
        width = float(plus[j] - minus[j])  # the step actually taken, after rounding
        high = _flat_values(f, point, plus, args)
        low = _flat_values(f, point, minus, args)
        columns.append((high - low) / width)
        bounds.append(_ROUNDING * _EPS * np.maximum(np.abs(high), np.abs(low)) / width)
    m = len(columns[0]) if columns else 0
    shape = (x.size, m)
    return (np.array(columns, dtype=np.float64).reshape(shape).T,
            np.array(bounds, dtype=np.float64).reshape(shape).T)


def _matrix(jac: Any, out_sizes: list[int], in_sizes: list[int]) -> NDArray[np.float64]:
    """A Jacobian in the transforms' structure (outputs around inputs) as one (M, N)
    matrix over the flattened outputs and inputs."""
    blocks = iter(_trees.flatten(jac)[0])
    rows = [[np.asarray(next(blocks), dtype=np.float64).reshape(m, n) for n in in_sizes]
            for m in out_sizes]
    if not rows:
        return np.zeros((0, sum(in_sizes)))
    return np.block(rows) if in_sizes else np.zeros((sum(out_sizes), 0))


def _table(rows: list[tuple[str, float, float, float, float]]) -> str:
    header = ("index", "AD forward", "AD reverse", "finite difference", "abs error")
    width = max(len(header[0]), *(len(r[0]) for r in rows))
    lines = [f"  {header[0]:<{width}}  {header[1]:>16}  {header[2]:>16}  {header[3]:>17}  "
             f"{header[4]:>10}"]
    for index, fwd, rev, fd, err in rows:
        lines.append(f"  {index:<{width}}  {fwd:>16.9g}  {rev:>16.9g}  {fd:>17.9g}  {err:>10.3g}")
    return "\n".join(lines)


def check_gradients(f: Callable[..., Any], x0: ArrayLike, eps: float = 1e-6,
                    rtol: float = 1e-5, atol: float = 1e-8,
                    args: tuple[Any, ...] = ()) -> GradientCheck:
    """Check f's AD derivatives, forward and reverse mode, against finite differences.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` taking a 1-D array and returning a number or a 1-D sequence of
        numbers (as for :func:`~easyad.jacobian`). It runs on Traces, on Records and, for the
        finite differences, on plain float64 arrays.
    x0 : array_like, shape (n,)
        The point.
    eps : float
        Relative step: input j moves by ``h_j = eps * max(1, |x0_j|)`` each way.
    rtol, atol : float
        An entry agrees when ``|AD - fd| <= atol + rtol * |fd| + r``, for the forward AND the
        reverse mode, where ``r = 16 eps_machine max|f(x0 +- h_j)| / (2 h_j)`` bounds the
        rounding error of the difference quotient itself.
    args : tuple
        Extra arguments for f (as scipy's ``args``), not differentiated.

    Returns
    -------
    GradientCheck
        The three derivative arrays and the tolerances (shape (n,) for a scalar f, (m, n)
        otherwise), when every entry agrees.

    Raises
    ------
    GradientCheckError
        An ``AssertionError`` whose message is a table (index, AD forward, AD reverse, finite
        difference, abs error) of the entries that disagree. NaN never agrees.

    Examples
    --------
    >>> import easyad as ad
    >>> report = ad.check_gradients(lambda x: ad.exp(x[0]) * x[1], [0.5, 2.0])
    >>> report.max_error < 1e-8
    True
    >>> def wrong(x):  # floats see 2x, AD sees 3x
    ...     return 3 * x[0] if isinstance(x[0], (ad.Trace, ad.Record)) else 2 * x[0]
    >>> ad.check_gradients(wrong, [1.0])
    Traceback (most recent call last):
    ...
    easyad.errors.GradientCheckError: check_gradients(wrong): 1 of 1 derivatives disagree ...
    """
    if not (eps > 0 and rtol >= 0 and atol >= 0):
        raise ValueError(f"need eps > 0, rtol >= 0 and atol >= 0, got eps={eps}, "
                         f"rtol={rtol}, atol={atol}")
    point = _Point(x0)
    out_leaves, out_tree = _output_leaves(f(point.numbers(point.arrays), *args), f, "forward")
    out_shapes = [np.shape(_value(v)) for v in out_leaves]
    in_sizes = [a.size for a in point.arrays]
    out_sizes = [int(np.prod(s, dtype=int)) for s in out_shapes]
    forward = _matrix(jacobian(f, mode="forward")(x0, *args), out_sizes, in_sizes)
    reverse = _matrix(jacobian(f, mode="reverse")(x0, *args), out_sizes, in_sizes)
    fd, rounding = _central_differences(f, point, eps, args)
    if out_tree.is_leaf and point.tree.is_leaf:   # one array in and out: its own shape
        shape = out_shapes[0] + point.arrays[0].shape
        forward, reverse, fd, rounding = (a.reshape(shape)
                                          for a in (forward, reverse, fd, rounding))
    tolerance = atol + rtol * np.abs(fd) + rounding
    with np.errstate(invalid="ignore"):
        error = np.maximum(np.abs(forward - fd), np.abs(reverse - fd))
        bad = ~(error <= tolerance)  # NaN anywhere never agrees
    if not bad.any():
        return GradientCheck(forward, reverse, fd, tolerance)
    name = getattr(f, "__name__", type(f).__name__)
    indices = list(zip(*np.nonzero(bad)))
    rows = [(f"[{', '.join(str(int(i)) for i in index)}]", float(forward[index]),
             float(reverse[index]), float(fd[index]), float(error[index]))
            for index in indices[:_MAX_ROWS]]
    more = f"\n  ... and {len(indices) - _MAX_ROWS} more" if len(indices) > _MAX_ROWS else ""
    kind = "d f / d x_j at [j]" if forward.ndim == 1 else "d f_i / d x_j at [i, j]"
    raise GradientCheckError(
        f"check_gradients({name}): {len(indices)} of {forward.size} derivatives disagree with "
        f"central finite differences ({kind}; step {eps:g} * max(1, |x_j|), "
        f"rtol={rtol:g}, atol={atol:g})\n{_table(rows)}{more}")
