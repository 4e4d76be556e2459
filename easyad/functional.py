"""Gradients, Jacobians, Hessians and directional derivatives of whole functions (the
functional API), over arrays of any shape and structures of them.

Layer: above the tensors (``easyad/tensor``) and record/replay (``replay.py``), beside
``checks.py`` (finite-difference checks built on it) and ``taylor.py``.

``f`` takes its differentiated argument first: one array (a number, an ndarray of any
shape, a list of numbers) or a structure of them: tuples, lists and dicts, nested
(``_trees.py`` says what is a leaf). Extra positional arguments, or ``args=(...)`` as
scipy spells it, go to ``f`` undifferentiated: ``grad(f)(x0, a, b)`` or
``grad(f)(x0, args=(a, b))`` differentiate ``f(x, a, b)`` with respect to ``x`` only.
``argnums=`` (an int, or a tuple giving a tuple of derivatives) picks other positional
arguments instead, and ``has_aux=True`` lets f return ``(output, aux)``, as JAX's and
torch.func's transforms do (``_argnums.py``).

What ``f`` receives for each array leaf:
- reverse mode (grad, value_and_grad, vjp, jacobian by rows, hessian, hvp): a Tensor on a
  fresh WengertList (numbers: a scalar Record). Tensor code (``ad.softmax``, ``x @ W``,
  nn modules) records one entry per operation; scalar code reads elements ``x[i]``
  (``x[i, j]``...), which are scalar Records, so loops over elements run on the scalar
  engine;
- forward mode (jvp, jacobian by columns, derivative): a TraceTensor (numbers: a Trace),
  whose elements are Traces.
Results have the structure and shapes of the inputs (gradients), or the outputs'
structure around the inputs' (Jacobians: ``J[out][in]`` of shape ``out.shape + in.shape``;
one array in and out: just that array). Floats for numbers.

The transforms compose, in every order of modes:
- reverse over reverse: called on a point already recorded (inside another reverse
  transform) a transform differentiates on the same list with ``create_graph``, so
  ``ad.jacobian(ad.grad(f))`` is the Hessian and ``ad.grad(ad.grad(g))`` the second
  derivative;
- forward over reverse: a reverse transform reached by Traces records f on TraceTensors
  over recorded tensors (Traces of Records) and sweeps both parts of the output, so
  ``ad.jvp(ad.grad(f), x, v)`` is H v and ``ad.jacobian(ad.grad(f), mode="forward")`` H;
- reverse over forward: a forward transform on a recorded point runs TraceTensors over
  it, so ``ad.grad(lambda x: ad.jvp(f, x, v)[1])`` is H v too;
- forward over forward: Traces of Traces for scalars (``ad.derivative(ad.derivative(g))``),
  TraceTensors of TraceTensors for arrays, so ``ad.jacobian(ad.jacobian(f, mode="forward"),
  mode="forward")`` is the Hessian, to any depth.

An inner f may also close over the outer variable (``ad.derivative(lambda x:
ad.derivative(lambda y: x * y)(2.0))`` is 1), in every order and to any depth: each
transform call opens a level (``_levels.py``), so the outer variable is a constant of its
own level inside the inner transform, never the inner perturbation; a reverse transform
inside another records onto the open list; and an inner result is a value of the outer
levels (Traces, Records), so no perturbation leaks. docs/forward-vs-reverse.md, "Nesting
modes".

========================  ====================================  ===========================
call                      result                                mode, cost
========================  ====================================  ===========================
``derivative(f)(x)``      f'(x) for f of one scalar             forward, 1 pass
``grad(f)(x0)``           gradient, x0's structure              reverse, 1 tape, 1 sweep
``value_and_grad(f)(x0)`` (f(x0), gradient)                     reverse, 1 tape, 1 sweep
``jacobian(f)(x0)``       d f / d x0                            forward n passes or
                                                                reverse 1 tape, m sweeps
``jvp(f, x0, v)``         (f(x0), J v)                          forward, 1 pass
``vjp(f, x0, u)``         (f(x0), u^T J)                        reverse, 1 tape, 1 sweep
``hessian(f)(x0)``        second derivatives                    replay, or reverse twice
``hvp(f, x0, v)``         H v without H                         replay, or reverse twice
========================  ====================================  ===========================
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from easyad import _arrays, _trees
from easyad._argnums import ArgNums, Selection, check_argnums, plain
from easyad._core import Record, Trace
from easyad._evaluation import (_arguments, _as_array, _name, _open_level, _output_leaves,
                                _Point, _point_leaves, _scalar_output, _shape, _split_top,
                                _tape_of, _value)
from easyad._forward_mode import (_forward_nested, _forward_point, _forward_run,
                                  _jacobian_forward, _tangent)
from easyad._reverse_mode import _jacobian_reverse, _Reverse, weighted_sweep
from easyad._levels import LIFT, VMAPS
from easyad._levels import opened as _level
from easyad.tensor import Tensor, TraceTensor
from easyad.tensor._base import ObjectArrayOperand

__all__ = ["derivative", "grad", "value_and_grad", "jacobian", "jvp", "vjp", "hessian", "hvp"]

Vector = NDArray[np.float64]
Mode = Literal["auto", "forward", "reverse"]
_MODES = ("auto", "forward", "reverse")


# ---- the API --------------------------------------------------------------------------

def _vmapped(name: str, f: Callable[..., Any], args: tuple[Any, ...], **options: Any) -> Any:
    """Inside ad.vmap: the transform on the whole batch (easyad/transforms/vmap_lift.py),
    or NotImplemented where nothing it differentiates is batched."""
    if VMAPS[0] and LIFT[0] is not None:   # cheap when no vmap runs: one list read
        return LIFT[0](name, f, args, options)
    return NotImplemented


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
    def df(x: float, *extra: Any, args: Any = None) -> float | Vector:
        if isinstance(x, (Trace, Record)):     # inside another transform
            return jvp(f, x, 1.0, *_arguments(extra, args))[1]
        if np.ndim(x) != 0:
            raise ValueError(f"derivative(f)(x) takes a scalar x, got shape {np.shape(x)}; "
                             f"for a function of an array use ad.grad or ad.jacobian")
        tangent = jvp(f, float(_as_array(x, "x")), 1.0, *_arguments(extra, args))[1]
        return tangent  # type: ignore[no-any-return]

    df.__doc__ = f"The derivative of {_name(f)} (made by easyad.derivative)."
    return df


def value_and_grad(f: Callable[..., Any], argnums: ArgNums = 0,
                   has_aux: bool = False) -> Callable[..., tuple[Any, Any]]:
    """The value and gradient of a scalar function, by reverse mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of an array (any shape) or a structure of arrays (tuples, lists,
        dicts), returning a scalar: a number, a scalar Record, or a tensor of one element.
    argnums : int or tuple of ints
        Which positional argument to differentiate (0: the first); a tuple gives a tuple
        of gradients, one per argument named. The others pass through untouched.
    has_aux : bool
        f returns a pair ``(output, aux)``: aux comes back beside the value, not
        differentiated (Records and Traces of this transform read as numbers).

    Returns
    -------
    callable
        ``vg(x0, *args) -> (float, gradient)``: f(x0) and its gradient, with x0's
        structure and shapes, from one recording and one backward sweep. With
        ``has_aux``: ``((value, aux), gradient)``, as JAX's.

    Raises
    ------
    TypeError
        If f returns more than a scalar (use :func:`jacobian` or :func:`vjp`).

    Examples
    --------
    >>> import easyad as ad
    >>> ad.value_and_grad(lambda x: x[0] * x[1])([2.0, 3.0])
    (6.0, array([3., 2.]))
    >>> loss = lambda p: ad.sum(p["w"] ** 2) + p["b"]
    >>> v, g = ad.value_and_grad(loss)({"w": [1.0, 2.0], "b": 3.0})
    >>> v, g["w"], g["b"]
    (8.0, array([2., 4.]), 1.0)
    """
    argnums = check_argnums(argnums, "value_and_grad")
    if not plain(argnums, has_aux):
        return _value_and_grad_selected(f, argnums, has_aux)

    @functools.wraps(f)
    def vg(x0: Any, *extra: Any, args: Any = None) -> tuple[Any, Any]:
        if VMAPS[0]:        # (no call, tuple or keywords made where no vmap runs)
            lifted = _vmapped("value_and_grad", f, (x0, *_arguments(extra, args)),
                              argnums=argnums, has_aux=has_aux)
            if lifted is not NotImplemented:
                return lifted  # type: ignore[no-any-return]
        run = _Reverse(f, x0, extra if args is None else _arguments(extra, args))
        out = _scalar_output(run.result, f, "grad", run.mode)
        return run.value(out), _in_dtype_of(x0, run.gradient(run.sweep(out, last=True)))

    vg.__doc__ = f"The value and gradient of {_name(f)} (made by easyad.value_and_grad)."
    return vg


def _value_and_grad_selected(f: Callable[..., Any], argnums: ArgNums,
                             has_aux: bool) -> Callable[..., tuple[Any, Any]]:
    @functools.wraps(f)
    def vg(x0: Any, *extra: Any, args: Any = None) -> tuple[Any, Any]:
        lifted = _vmapped("value_and_grad", f, (x0, *_arguments(extra, args)),
                          argnums=argnums, has_aux=has_aux)
        if lifted is not NotImplemented:
            return lifted  # type: ignore[no-any-return]
        chosen = Selection(f, argnums, has_aux, (x0, *_arguments(extra, args)), "grad")
        run = _Reverse(chosen.function(), chosen.point, ())
        out = _scalar_output(run.result, f, "grad", run.mode)
        gradient = chosen.result(_in_dtype_of(chosen.point,
                                              run.gradient(run.sweep(out, last=True))))
        value = run.value(out)
        return ((value, chosen.aux()) if has_aux else value), gradient

    vg.__doc__ = (f"The value and gradient of {_name(f)} by argument {argnums!r} (made by "
                  f"easyad.value_and_grad).")
    return vg


def grad(f: Callable[..., Any], argnums: ArgNums = 0, has_aux: bool = False
         ) -> Callable[..., Any]:
    """The gradient of a scalar function, by reverse mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of an array (any shape) or a structure of arrays (tuples, lists,
        dicts, nested), returning a scalar. Its body may be scalar code on elements
        (``x[0] * x[1]``), tensor operations (``ad.softmax(x)``, ``x @ W``) or nn
        modules. A plain number that does not depend on x has gradient 0.
    argnums : int or tuple of ints
        Which positional argument to differentiate (0: the first; negative counts from
        the end); a tuple gives a tuple of gradients. The other arguments pass through
        untouched (numbers, arrays, any object), as JAX's and torch.func's.
    has_aux : bool
        f returns a pair ``(output, aux)``; the result is then ``(gradient, aux)``, aux
        not differentiated.

    Returns
    -------
    callable
        ``g(x0, *args)``: the gradient with x0's structure and shapes (floats for numbers),
        from one recording and one backward sweep. It fits
        ``scipy.optimize.minimize(f, x0, jac=ad.grad(f))``. Called inside another reverse
        transform, it is recorded: ``ad.jacobian(ad.grad(f))`` is the Hessian.

    Raises
    ------
    TypeError
        If f returns more than a scalar (use :func:`jacobian`) or anything but numbers.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> ad.grad(lambda x: x[0] ** 2 + 3 * x[1])([1.0, 5.0])
    array([2., 3.])
    >>> ad.grad(lambda W: ad.sum(W * W))(np.ones((2, 2)))
    array([[2., 2.],
           [2., 2.]])
    >>> ad.grad(ad.grad(lambda x: x ** 3))(2.0)          # d2/dx2 x^3 = 6x
    12.0
    >>> ad.grad(lambda x, y: x * y ** 2, argnums=(0, 1))(3.0, 2.0)
    (4.0, 12.0)
    >>> ad.grad(lambda x: (x ** 2, "note"), has_aux=True)(3.0)
    (6.0, 'note')
    """
    vg = value_and_grad(f, argnums, has_aux)

    @functools.wraps(f)
    def g(x0: Any, *extra: Any, args: Any = None) -> Any:
        if VMAPS[0]:        # (no call, tuple or keywords made where no vmap runs)
            lifted = _vmapped("grad", f, (x0, *_arguments(extra, args)), argnums=argnums,
                              has_aux=has_aux)
            if lifted is not NotImplemented:
                return lifted
        value, gradient = vg(x0, *extra, args=args)
        return (gradient, value[1]) if has_aux else gradient

    g.__doc__ = f"The gradient of {_name(f)} (made by easyad.grad)."
    return g


def jacobian(f: Callable[..., Any], mode: Mode = "auto", argnums: ArgNums = 0,
             has_aux: bool = False, *, sparse: bool = False,
             format: str | None = None) -> Callable[..., Any]:
    """The Jacobian of a function of arrays, by forward or reverse mode.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of an array or a structure of arrays, returning a number, an array
        (a Tensor, an array of Records, a list of numbers) or a structure of them.
    mode : {"auto", "forward", "reverse"}
        ``"forward"``: n passes of Traces, one per input element (column by column).
        ``"reverse"``: one recording and m backward sweeps (row by row).
        ``"auto"``: one forward pass first, which tells m; then forward if n < m, else
        reverse (so the first pass is spent only when reverse mode is cheaper). Inside
        another reverse transform: reverse.
    argnums, has_aux
        As for :func:`grad`: the arguments differentiated (a tuple of them is a
        structure: each output's block is a tuple, one per argument), and
        ``(jacobian, aux)`` for f returning ``(output, aux)``.
    sparse, format
        ``sparse=True``: f (of one array, returning numbers) is recorded once, at the
        first call, and the Jacobian of its flattened output in its flattened input comes
        from the recording's sparse Jacobian (``Function.jacobian(x, sparse=True)``:
        pattern, colouring, compressed evaluation), as ``format`` says: "csr" (default),
        "csc", "coo", "triplets" or "values". Extra arguments are constants of that
        recording: pass them and f is recorded again at every call. docs/sparse.md.

    Returns
    -------
    callable
        ``jac(x0, *args)``: ``d f / d x``: for one array in and one out, an ndarray of
        shape ``out.shape + in.shape`` (so (m, n) for vectors, (n,) for a scalar f, as
        :func:`grad`); for structures, the output's structure holding x0's structure of
        such blocks.

    Examples
    --------
    >>> import easyad as ad
    >>> polar = lambda p: [p[0] * ad.cos(p[1]), p[0] * ad.sin(p[1])]
    >>> ad.jacobian(polar)([2.0, 0.0])
    array([[1., 0.],
           [0., 2.]])
    >>> ad.jacobian(lambda x: x[0] * x[1], mode="forward")([2.0, 3.0])
    array([3., 2.])
    >>> ad.jacobian(ad.grad(lambda x: x[0] ** 2 * x[1]))([1.0, 2.0])   # the Hessian
    array([[4., 2.],
           [2., 0.]])
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}")
    argnums = check_argnums(argnums, "jacobian")
    if sparse or format is not None:
        from easyad.transforms.sparse import sparse_derivative
        return sparse_derivative(f, "jacobian", sparse, argnums, has_aux, format)

    @functools.wraps(f)
    def jac(x0: Any, *extra: Any, args: Any = None) -> Any:
        lifted = _vmapped("jacobian", f, (x0, *_arguments(extra, args)), mode=mode,
                          argnums=argnums, has_aux=has_aux)
        if lifted is not NotImplemented:
            return lifted
        if plain(argnums, has_aux):
            return _in_dtype_of(x0, _jacobian(f, x0, _arguments(extra, args)))
        chosen = Selection(f, argnums, has_aux, (x0, *_arguments(extra, args)), "jacobian")
        J = chosen.result(_in_dtype_of(chosen.point,
                                       _jacobian(chosen.function(), chosen.point, ())))
        return (J, chosen.aux()) if has_aux else J

    def _jacobian(f: Callable[..., Any], x0: Any, arguments: tuple[Any, ...]) -> Any:
        leaves, _ = _point_leaves(x0)
        if mode == "reverse" or any(_trees.is_recorded(v) for v in leaves):
            return _jacobian_reverse(f, x0, arguments)
        point = _forward_point(x0, "jacobian")
        if mode == "forward" or point.size == 0:
            return _jacobian_forward(f, point, arguments)
        tangents = [np.zeros(a.shape) for a in point.arrays]
        next(t for t in tangents if t.size).reshape(-1)[0] = 1.0
        first = _forward_run(f, point, tangents, arguments)
        out, _ = _output_leaves(first, f, "any" if _forward_nested(point) else "forward")
        m = sum(int(np.prod(_shape(v), dtype=int)) for v in out)
        if point.size < m:
            return _jacobian_forward(f, point, arguments, first)
        return _jacobian_reverse(f, x0, arguments)

    jac.__doc__ = f"The Jacobian of {_name(f)} (made by easyad.jacobian, mode {mode!r})."
    return jac


def jvp(f: Callable[..., Any], x0: Any, v: Any, *extra: Any, args: Any = None,
        argnums: ArgNums = 0, has_aux: bool = False) -> tuple[Any, ...]:
    """Jacobian-vector product: f(x0) and the directional derivative J v, in one forward pass.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of an array or structure of arrays.
    x0, v : arrays or structures
        The point and the direction (v with x0's structure and shapes).
    argnums : int or tuple of ints
        Which of f's positional arguments ``(x0, *args)`` the direction moves (the others
        pass through untouched); for a tuple, v is a tuple of directions, one per argument.
    has_aux : bool
        f returns ``(output, aux)``; the result is then ``(value, tangent, aux)``.

    Returns
    -------
    (value, tangent)
        With the structure of f's output: floats for scalars, ndarrays for arrays.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.jvp(lambda x: [x[0] * x[1], x[0]], [2.0, 3.0], [1.0, 1.0])
    (array([6., 2.]), array([5., 1.]))
    """
    arguments = _arguments(extra, args)
    lifted = _vmapped("jvp", f, (x0, *arguments), v=v, argnums=argnums, has_aux=has_aux)
    if lifted is not NotImplemented:
        return lifted  # type: ignore[no-any-return]
    if not plain(check_argnums(argnums, "jvp"), has_aux):
        chosen = Selection(f, argnums, has_aux, (x0, *arguments), "jvp")
        value, tangent = chosen.result(jvp(chosen.function(), chosen.point,
                                           chosen.direction(v, "v")))
        return (value, tangent, chosen.aux()) if has_aux else (value, tangent)
    point = _forward_point(x0, "jvp")
    direction = point.like(v, "v")
    result = _forward_run(f, point, direction, arguments)
    if _forward_nested(point):     # inside other transforms: values of their levels
        leaves, tree = _output_leaves(result, f, "any")
        parts = [_split_top(e, point.level[0]) for e in leaves]
        return (_trees.unflatten(tree, [p[0] for p in parts]),
                _trees.unflatten(tree, [p[1] for p in parts]))
    leaves, tree = _output_leaves(result, f, "forward")
    return _in_dtype_of(x0, (_trees.unflatten(tree, [_value(e) for e in leaves]),
                             _trees.unflatten(tree, [_tangent(e) for e in leaves])))


def vjp(f: Callable[..., Any], x0: Any, u: Any, *extra: Any, args: Any = None,
        argnums: ArgNums = 0, has_aux: bool = False) -> tuple[Any, ...]:
    """Vector-Jacobian product: f(x0) and u^T J, in one recording and one backward sweep.

    Parameters
    ----------
    f : callable
        ``f(x, *args)`` of an array or structure of arrays.
    x0 : array or structure
        The point.
    u : like f's output (structure and shapes; a scalar for a scalar f)
        The weights of the outputs: the result is the gradient of ``sum u * f``. Outputs
        weighted 0 contribute exactly nothing (even where their derivative is inf or NaN).
    argnums, has_aux
        As for :func:`jvp`: the cotangent has the structure of the arguments named (a
        tuple for a tuple), and has_aux gives ``(value, cotangent, aux)``.

    Returns
    -------
    (value, cotangent)
        f(x0) (floats and ndarrays in its structure) and u^T J (x0's structure).

    Examples
    --------
    >>> import easyad as ad
    >>> ad.vjp(lambda x: [x[0] * x[1], x[0]], [2.0, 3.0], [1.0, 10.0])
    (array([6., 2.]), array([13.,  2.]))
    """
    arguments = _arguments(extra, args)
    lifted = _vmapped("vjp", f, (x0, *arguments), u=u, argnums=argnums, has_aux=has_aux)
    if lifted is not NotImplemented:
        return lifted  # type: ignore[no-any-return]
    if not plain(check_argnums(argnums, "vjp"), has_aux):
        chosen = Selection(f, argnums, has_aux, (x0, *arguments), "vjp")
        value, cotangent = chosen.result(vjp(chosen.function(), chosen.point, u))
        return (value, cotangent, chosen.aux()) if has_aux else (value, cotangent)
    run = _Reverse(f, x0, arguments)
    return _in_dtype_of(x0, weighted_sweep(run, f, u))


# ---- second order ---------------------------------------------------------------------

def _replayable(x0: Any, args: tuple[Any, ...]) -> NDArray[np.float64] | None:
    """The point as one array when record/replay can take f (one plain array leaf)."""
    leaves, tree = _trees.flatten(x0)
    if not tree.is_leaf or _trees.is_recorded(leaves[0]) or _trees.is_traced(leaves[0]):
        return None
    if _open_level() != (0, None):
        # inside another transform f may close over its Traces or Records, which a
        # recording for replay would freeze as constants
        return None
    return _as_array(leaves[0], "x0")


def _by_replay(f: Callable[..., Any], x: NDArray[np.float64], args: tuple[Any, ...],
               run: Callable[[Any, NDArray[np.float64]], Any]) -> Any:
    """``run(F, x)`` on f recorded for replay (scalar code, sparse Hessians), or None
    when f uses tensor operations (it cannot run on an array of Records)."""
    from easyad.replay import record
    shape = x.shape

    def flat(z: Any) -> Any:
        # f runs in a reverse level on the recording's list: a transform inside f that
        # closes over z records there too (and its result replays)
        with _level(0, _tape_of(z)):
            return f(z[0] if shape == () else z.reshape(shape), *args)
    try:
        F = record(flat, x.reshape(-1), tensor=False)
    except ObjectArrayOperand:
        return None
    except TypeError as e:      # an array primitive recorded a tensor node
        if str(e).startswith("a tape with tensor operations cannot be replayed"):
            return None
        raise
    if not F.scalar:
        raise TypeError(f"hessian needs {_name(f)} to return a scalar")
    return run(F, x.reshape(-1))


def hessian(f: Callable[..., Any], argnums: ArgNums = 0,
            has_aux: bool = False, *, sparse: bool = False,
            format: str | None = None) -> Callable[..., Any]:
    """``hessian(f)(x0, *args)``: the second derivatives of a scalar ``f``.

    For one array of scalar code, ``f`` is recorded once and the Hessian comes from
    forward-over-reverse sweeps of the replay engine, with its sparsity found and
    columns coloured. Otherwise (tensor code, nn modules, structures of arrays) it is
    the Jacobian of the recorded gradient: reverse over reverse. The result has shape
    ``x.shape + x.shape`` for one array, ``H[a][b]`` of shape ``a.shape + b.shape`` for
    structures. ``argnums`` and ``has_aux`` are :func:`grad`'s: ``argnums=(0, 1)`` gives
    the blocks ``H[i][j]`` between the arguments; ``has_aux`` gives ``(H, aux)``.
    ``sparse=True``: recorded once (as :func:`jacobian`'s ``sparse``), the structurally
    non-zero entries in ``format`` ("csr" by default, "csc", "coo", "triplets",
    "values"), in the flattened input.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.hessian(lambda x: x[0] ** 3 * x[1])([2.0, 5.0])
    array([[60., 12.],
           [12.,  0.]])
    >>> ad.hessian(lambda x: ad.logsumexp(x))([0.0, 0.0])
    array([[ 0.25, -0.25],
           [-0.25,  0.25]])
    """
    argnums = check_argnums(argnums, "hessian")
    if sparse or format is not None:
        from easyad.transforms.sparse import sparse_derivative
        return sparse_derivative(f, "hessian", sparse, argnums, has_aux, format)

    @functools.wraps(f)
    def evaluate(x0: Any, *extra: Any, args: Any = None) -> Any:
        lifted = _vmapped("hessian", f, (x0, *_arguments(extra, args)),
                          argnums=argnums, has_aux=has_aux)
        if lifted is not NotImplemented:
            return lifted
        if plain(argnums, has_aux):
            return _hessian(f, x0, _arguments(extra, args))
        chosen = Selection(f, argnums, has_aux, (x0, *_arguments(extra, args)), "hessian")
        H = chosen.result(_hessian(chosen.function(), chosen.point, ()))
        return (H, chosen.aux()) if has_aux else H

    evaluate.__doc__ = f"Hessian of {_name(f)} (easyad.hessian)."
    return evaluate


def _hessian(f: Callable[..., Any], x0: Any, arguments: tuple[Any, ...]) -> Any:
    x = _replayable(x0, arguments)
    if x is not None:
        shape = x.shape
        H = _by_replay(f, x, arguments, lambda F, z: F.hessian(z))
        if H is not None:
            H = np.asarray(H)     # one number: H is (1, 1)
            return float(H.reshape(())) if shape == () else _in_dtype_of(
                x0, H.reshape(shape + shape))
    return jacobian(_graph_gradient(f), mode="reverse")(x0, *arguments)


def _graph_gradient(f: Callable[..., Any]) -> Callable[..., Any]:
    g = grad(f)

    def recorded_gradient(x: Any, *args: Any) -> Any:
        return g(x, *args)
    recorded_gradient.__name__ = f"grad({_name(f)})"
    return recorded_gradient


def hvp(f: Callable[..., Any], x0: Any, v: Any, *extra: Any, args: Any = None) -> Any:
    """The Hessian-vector product H(x0) v of scalar ``f``, without forming H.

    Scalar code on one array replays its recording (forward over reverse); otherwise the
    gradient is recorded and differentiated once more (reverse over reverse). ``v`` and
    the result have x0's structure.

    Examples
    --------
    >>> import easyad as ad
    >>> ad.hvp(lambda x: x[0] ** 3 * x[1], [2.0, 5.0], [1.0, 0.0])
    array([60., 12.])
    """
    arguments = _arguments(extra, args)
    lifted = _vmapped("hvp", f, (x0, *arguments), v=v)
    if lifted is not NotImplemented:
        return lifted  # type: ignore[no-any-return]
    x = _replayable(x0, arguments)
    if x is not None:
        direction = _Point(x0).like(v, "v")[0]
        result = _by_replay(f, x, arguments, lambda F, z: F.hvp(z, direction.reshape(-1)))
        if result is not None:
            result = np.asarray(result)       # one number: (1,)
            return float(result.reshape(())) if x.shape == () else _in_dtype_of(
                x0, result.reshape(x.shape))
    g = _graph_gradient(f)
    point = _Point(x0)
    directions = point.like(v, "v")

    def directional(z: Any, *a: Any) -> Any:
        parts, _ = _trees.flatten(g(z, *a))
        total: Any = 0.0
        for part, d in zip(parts, directions):
            total = total + (_total(part * d) if d.ndim else part * float(d))
        return total
    return grad(directional)(x0, *arguments)


def _in_dtype_of(x0: Any, result: Any) -> Any:
    """``result``'s arrays in x0's floating dtype: derivatives follow the input's dtype
    (float32 in, float32 out, as torch and JAX do), ints and bools give float64
    (docs/conventions.md). The engines compute in float64 and round once at the end."""
    if type(x0) is np.ndarray:      # the common case, without walking a structure
        dtype = x0.dtype
    else:
        dtype = _arrays.result_dtype(_trees.flatten(x0)[0])
    if dtype.kind != "f" or dtype.itemsize >= 8:     # float64 (or ints, longdouble): as is
        return result
    # numpy's own float32 (or float16) object, not a newbyteorder copy: the core's fast
    # paths test dtypes by identity
    return _arrays.as_result_dtype(result, np.dtype(dtype.type))


def _total(t: Any) -> Any:
    return t.sum() if isinstance(t, (Tensor, TraceTensor)) else t
