"""Gradients, Jacobians and directional derivatives of whole functions (the functional API).

Layer: rules (``_rules.py``) -> compiled core (``Trace``, ``Record``, ``WengertList``) ->
functional (this module), beside ``checks.py`` (finite-difference checks built on it) and
``taylor.py`` (higher derivatives by Taylor arithmetic).

Every function here differentiates an ``f`` written like an objective for
``scipy.optimize``: it takes ONE 1-D argument, which easyad fills with a numpy object
array of Traces (forward mode) or Records (reverse mode), and returns a number (or, for
Jacobians, a 1-D sequence of numbers). The point ``x0`` is any 1-D array-like of reals
(ints are promoted to float); results are float64 ndarrays, scalars Python floats.

========================  ====================================  ===========================
call                      result                                mode, cost
========================  ====================================  ===========================
``derivative(f)(x)``      f'(x) for f of one scalar             forward, 1 pass
``grad(f)(x0)``           gradient, shape (n,)                  reverse, 1 tape, 1 sweep
``value_and_grad(f)(x0)`` (f(x0), gradient)                     reverse, 1 tape, 1 sweep
``jacobian(f)(x0)``       (m, n); (n,) if f returns a scalar    forward n passes or
                                                                reverse 1 tape, m sweeps
``jvp(f, x0, v)``         (f(x0), J v)                          forward, 1 pass
``vjp(f, x0, u)``         (f(x0), u^T J)                        reverse, 1 tape, 1 sweep
========================  ====================================  ===========================

Extra positional arguments of the returned callables go to ``f`` (as scipy's ``args`` do):
``grad(f)(x0, a, b)`` differentiates ``f(x, a, b)`` with respect to ``x`` only.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from easyad._core import Record, Trace, WengertList

__all__ = ["derivative", "grad", "value_and_grad", "jacobian", "jvp", "vjp"]

Vector = NDArray[np.float64]
Mode = Literal["auto", "forward", "reverse"]
_MODES = ("auto", "forward", "reverse")
# what f may return as (an element of) its output besides Traces and Records
_PLAIN_REAL = (int, float, np.integer, np.floating, np.bool_)


# ---- inputs ---------------------------------------------------------------------------

def as_vector(x: ArrayLike, what: str = "x0") -> Vector:
    """``x`` as a fresh 1-D float64 array; TypeError/ValueError naming ``what`` otherwise.

    >>> as_vector([1, 2])
    array([1., 2.])
    """
    array = np.asarray(x)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{what} must hold real numbers (floats or ints), "
                        f"got an array of dtype {array.dtype}")
    if array.ndim != 1:
        hint = ("; for a function of one scalar use ad.derivative(f), or pass [x]"
                if array.ndim == 0 else "; flatten it (np.ravel) and reshape inside f")
        raise ValueError(f"{what} must be 1-D (shape (n,)), got shape {array.shape}{hint}")
    return np.array(array, dtype=np.float64)


def _forward_inputs(x: Vector, seed: Vector) -> NDArray[np.object_]:
    inputs = np.empty(x.shape, dtype=object)
    for i in range(x.size):
        inputs[i] = Trace(float(x[i]), float(seed[i]))
    return inputs


def _reverse_inputs(x: Vector, tape: WengertList) -> NDArray[np.object_]:
    inputs = np.empty(x.shape, dtype=object)
    for i in range(x.size):
        inputs[i] = tape.variable(float(x[i]))
    return inputs


def _unit(n: int, j: int) -> Vector:
    e = np.zeros(n)
    e[j] = 1.0
    return e


# ---- outputs --------------------------------------------------------------------------

def _name(f: Callable[..., Any]) -> str:
    return getattr(f, "__name__", type(f).__name__)


def _outputs(result: Any, f: Callable[..., Any]) -> tuple[list[Any], bool]:
    """f's result as a list of its elements, and whether it was a scalar."""
    if isinstance(result, np.ndarray):
        if result.ndim == 0:
            return _outputs(result[()], f)
        if result.ndim != 1:
            raise ValueError(f"{_name(f)} returned an array of shape {result.shape}; it must "
                             f"return a number or a 1-D sequence of numbers (flatten it)")
        elements = list(result)
        scalar = False
    elif isinstance(result, (Trace, Record, *_PLAIN_REAL)):
        elements, scalar = [result], True
    elif isinstance(result, Sequence) and not isinstance(result, (str, bytes)):
        elements, scalar = list(result), False
    else:
        raise TypeError(f"{_name(f)} must return a number (or a 1-D sequence of numbers), "
                        f"got {type(result).__name__}")
    for i, element in enumerate(elements):
        if not isinstance(element, (Trace, Record, *_PLAIN_REAL)):
            where = "" if scalar else f" element {i} of"
            raise TypeError(f"{_name(f)} must return numbers, but{where} its output is a "
                            f"{type(element).__name__}")
    return elements, scalar


def _value(element: Any) -> float:
    if isinstance(element, (Trace, Record)):
        return element.number
    return float(element)


def _values(elements: list[Any], scalar: bool) -> float | Vector:
    if scalar:
        return _value(elements[0])
    return np.array([_value(e) for e in elements], dtype=np.float64)


def _tangent(element: Any, f: Callable[..., Any]) -> float:
    """The derivative a forward pass carries out of f (0 for a plain number)."""
    if isinstance(element, Trace):
        return element.derivative
    if isinstance(element, Record):
        raise TypeError(f"{_name(f)} returned a Record in forward mode: it must compute from "
                        f"its argument only, not from Records made elsewhere")
    return 0.0


def _adjoints(element: Any, inputs: NDArray[np.object_], f: Callable[..., Any]) -> Vector:
    """d element / d inputs by one backward sweep (zeros for a plain number)."""
    if isinstance(element, Trace):
        raise TypeError(f"{_name(f)} returned a Trace in reverse mode: it must compute from "
                        f"its argument only, not from Traces made elsewhere")
    if not isinstance(element, Record) or element.tape is None:
        return np.zeros(inputs.size)  # a constant: it does not depend on the inputs
    d = element.derivatives()
    return np.fromiter((d[x] for x in inputs), dtype=np.float64, count=inputs.size)


def _scalar_output(elements: list[Any], scalar: bool, f: Callable[..., Any],
                   caller: str) -> Any:
    if not scalar:
        raise TypeError(
            f"{caller} needs {_name(f)} to return a scalar, but it returned a sequence of "
            f"length {len(elements)}: use ad.jacobian(f) for all the derivatives, or "
            f"ad.vjp(f, x0, u) for the gradient of one weighted sum u . f")
    return elements[0]


# ---- the API --------------------------------------------------------------------------

def derivative(f: Callable[..., Any]) -> Callable[..., float | Vector]:
    """The derivative of a function of one scalar, by forward mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of a scalar ``x`` (it receives a :class:`Trace`), returning a number,
        or a 1-D sequence of numbers.

    Returns
    -------
    callable
        ``df(x, *args)``: f'(x) as a float (an ndarray of shape (m,) if f returns m values),
        from one pass of Traces.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.derivative(lambda x: x * ad.sin(x))(0.0)
    0.0
    >>> ad.derivative(lambda x: x ** 3)(2)
    12.0
    """
    @functools.wraps(f)
    def df(x: float, *args: Any) -> float | Vector:
        if np.ndim(x) != 0:
            raise ValueError(f"derivative(f)(x) takes a scalar x, got shape {np.shape(x)}; "
                             f"for a function of a 1-D array use ad.grad or ad.jacobian")
        point = as_vector([x], "x")
        elements, scalar = _outputs(f(Trace(float(point[0]), 1.0), *args), f)
        tangents = [_tangent(e, f) for e in elements]
        return tangents[0] if scalar else np.array(tangents, dtype=np.float64)

    df.__doc__ = f"The derivative of {_name(f)} (made by easyad.derivative)."
    return df


def value_and_grad(f: Callable[..., Any]) -> Callable[..., tuple[float, Vector]]:
    """The value and gradient of a scalar function of a 1-D array, by reverse mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` taking a 1-D array (it receives an object array of Records) and
        returning a scalar.

    Returns
    -------
    callable
        ``vg(x0, *args) -> (float, ndarray of shape (n,))``: f(x0) and its gradient, from one
        recording on a fresh WengertList and one backward sweep.

    Raises
    ------
    TypeError
        If f returns a sequence (use :func:`jacobian`) or anything but a number.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.value_and_grad(lambda x: x[0] * x[1])([2.0, 3.0])
    (6.0, array([3., 2.]))
    """
    @functools.wraps(f)
    def vg(x0: ArrayLike, *args: Any) -> tuple[float, Vector]:
        x = as_vector(x0)
        inputs = _reverse_inputs(x, WengertList())
        elements, scalar = _outputs(f(inputs, *args), f)
        out = _scalar_output(elements, scalar, f, "grad")
        return _value(out), _adjoints(out, inputs, f)

    vg.__doc__ = f"The value and gradient of {_name(f)} (made by easyad.value_and_grad)."
    return vg


def grad(f: Callable[..., Any]) -> Callable[..., Vector]:
    """The gradient of a scalar function of a 1-D array, by reverse mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` taking a 1-D array (it receives an object array of Records) and
        returning a scalar. A plain number that does not depend on x has gradient 0.

    Returns
    -------
    callable
        ``g(x0, *args) -> ndarray of shape (n,)``: one recording, one backward sweep. It fits
        ``scipy.optimize.minimize(f, x0, jac=ad.grad(f))``.

    Raises
    ------
    TypeError
        If f returns a sequence (use :func:`jacobian`) or anything but a number.
    ValueError
        If x0 is not 1-D.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.grad(lambda x: x[0] ** 2 + 3 * x[1])([1.0, 5.0])
    array([2., 3.])
    """
    vg = value_and_grad(f)

    @functools.wraps(f)
    def g(x0: ArrayLike, *args: Any) -> Vector:
        return vg(x0, *args)[1]

    g.__doc__ = f"The gradient of {_name(f)} (made by easyad.grad)."
    return g


def _jacobian_forward(f: Callable[..., Any], x: Vector, args: tuple[Any, ...],
                      first: tuple[list[Any], bool] | None = None) -> NDArray[np.float64]:
    n = x.size
    columns: list[list[float]] = []
    shape: tuple[int, bool] | None = None
    for j in range(n):
        if j == 0 and first is not None:
            elements, scalar = first
        else:
            elements, scalar = _outputs(f(_forward_inputs(x, _unit(n, j)), *args), f)
        if shape is None:
            shape = (len(elements), scalar)
        elif shape != (len(elements), scalar):
            raise ValueError(f"{_name(f)} returned {len(elements)} values on one pass and "
                             f"{shape[0]} on another: its output must not change size")
        columns.append([_tangent(e, f) for e in elements])
    if shape is None:  # no inputs: one evaluation tells the output's size
        elements, scalar = _outputs(f(_forward_inputs(x, x), *args), f)
        shape = (len(elements), scalar)
    m, scalar = shape
    jac: NDArray[np.float64] = np.array(columns, dtype=np.float64).reshape(n, m).T
    return jac.reshape(n) if scalar else jac


def _jacobian_reverse(f: Callable[..., Any], x: Vector,
                      args: tuple[Any, ...]) -> NDArray[np.float64]:
    inputs = _reverse_inputs(x, WengertList())
    elements, scalar = _outputs(f(inputs, *args), f)
    rows = [_adjoints(e, inputs, f) for e in elements]
    jac: NDArray[np.float64] = np.array(rows, dtype=np.float64).reshape(len(elements), x.size)
    return jac.reshape(x.size) if scalar else jac


def jacobian(f: Callable[..., Any], mode: Mode = "auto") -> Callable[..., NDArray[np.float64]]:
    """The Jacobian of a function of a 1-D array, by forward or reverse mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` taking a 1-D array and returning m numbers (a list, tuple or 1-D
        array) or a single number.
    mode : {"auto", "forward", "reverse"}
        ``"forward"``: n passes of Traces, one per input (column by column).
        ``"reverse"``: one recording on a WengertList and m backward sweeps (row by row).
        ``"auto"``: one forward pass first, which tells m; then forward if n < m, else
        reverse (so the first pass is spent only when reverse mode is cheaper).

    Returns
    -------
    callable
        ``jac(x0, *args)``: an ndarray of shape (m, n), ``jac[i, j] = d f_i / d x_j``. If f
        returns a scalar (not a sequence of length 1), the shape is (n,), as for
        :func:`grad`.

    Examples
    --------
    >>> import easyad as ad
    >>> polar = lambda p: [p[0] * ad.cos(p[1]), p[0] * ad.sin(p[1])]
    >>> ad.jacobian(polar)([2.0, 0.0])
    array([[1., 0.],
           [0., 2.]])
    >>> ad.jacobian(lambda x: x[0] * x[1], mode="forward")([2.0, 3.0])
    array([3., 2.])
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")

    @functools.wraps(f)
    def jac(x0: ArrayLike, *args: Any) -> NDArray[np.float64]:
        x = as_vector(x0)
        if mode == "reverse":
            return _jacobian_reverse(f, x, args)
        if mode == "forward" or x.size == 0:
            return _jacobian_forward(f, x, args)
        first = _outputs(f(_forward_inputs(x, _unit(x.size, 0)), *args), f)
        if x.size < len(first[0]):
            return _jacobian_forward(f, x, args, first)
        return _jacobian_reverse(f, x, args)

    jac.__doc__ = f"The Jacobian of {_name(f)} (made by easyad.jacobian, mode {mode!r})."
    return jac


def jvp(f: Callable[..., Any], x0: ArrayLike, v: ArrayLike,
        *args: Any) -> tuple[float | Vector, float | Vector]:
    """Jacobian-vector product: f(x0) and the directional derivative J v, in one forward pass.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` taking a 1-D array, returning a number or a 1-D sequence of numbers.
    x0, v : array_like, shape (n,)
        The point and the direction.

    Returns
    -------
    (value, tangent)
        Floats if f returns a scalar, else ndarrays of shape (m,).

    Examples
    --------
    >>> import easyad as ad
    >>> ad.jvp(lambda x: [x[0] * x[1], x[0]], [2.0, 3.0], [1.0, 1.0])
    (array([6., 2.]), array([5., 1.]))
    """
    x = as_vector(x0)
    direction = as_vector(v, "v")
    if direction.shape != x.shape:
        raise ValueError(f"v must have the shape of x0, {x.shape}, got {direction.shape}")
    elements, scalar = _outputs(f(_forward_inputs(x, direction), *args), f)
    tangents = [_tangent(e, f) for e in elements]
    tangent: float | Vector = tangents[0] if scalar else np.array(tangents, dtype=np.float64)
    return _values(elements, scalar), tangent


def vjp(f: Callable[..., Any], x0: ArrayLike, u: ArrayLike,
        *args: Any) -> tuple[float | Vector, Vector]:
    """Vector-Jacobian product: f(x0) and u^T J, in one recording and one backward sweep.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` taking a 1-D array, returning a number or a 1-D sequence of m numbers.
    x0 : array_like, shape (n,)
        The point.
    u : array_like, shape (m,), or a scalar if f returns a scalar
        The weights of the outputs: the result is the gradient of ``sum_i u_i f_i``. Outputs
        weighted 0 contribute exactly nothing (even where their derivative is inf or NaN).

    Returns
    -------
    (value, cotangent)
        f(x0) (a float or an ndarray of shape (m,)) and u^T J (an ndarray of shape (n,)).

    Examples
    --------
    >>> import easyad as ad
    >>> ad.vjp(lambda x: [x[0] * x[1], x[0]], [2.0, 3.0], [1.0, 10.0])
    (array([6., 2.]), array([13.,  2.]))
    """
    x = as_vector(x0)
    inputs = _reverse_inputs(x, WengertList())
    elements, scalar = _outputs(f(inputs, *args), f)
    weights = np.asarray(u)
    if weights.dtype.kind not in "biuf":
        raise TypeError(f"u must hold real numbers, got an array of dtype {weights.dtype}")
    expected = () if scalar else (len(elements),)
    if weights.shape != expected and not (scalar and weights.shape == (1,)):
        what = "a scalar" if scalar else f"shape {expected}"
        raise ValueError(f"u must have one weight per output of {_name(f)}, so {what}; "
                         f"got shape {weights.shape}")
    total: Any = 0.0
    for weight, element in zip(weights.astype(np.float64).reshape(-1), elements):
        if weight != 0.0:
            total = total + float(weight) * element
    return _values(elements, scalar), _adjoints(total, inputs, f)
