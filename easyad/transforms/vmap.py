"""``ad.vmap(f, in_axes=0, out_axes=0)``: f mapped over a batch axis, by the batching
rules of the rule table and the op table (``vmap_batched.py``), not a Python loop.

vmap moves each mapped argument's batch axis first, wraps it as a ``Batched`` of a new
level (levels grow inward, so nested vmaps and closures over an outer vmap's values are
told apart), runs f once, and moves the batch axis of each output to its ``out_axes``.
The derivative transforms called inside (``ad.grad``, ``jacobian``, ``hessian``, ``jvp``,
``vjp``, ``hvp``) see batched arguments and run on the whole batch (``vmap_lift.py``).
"""
from __future__ import annotations

import contextvars
import functools
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from easyad import _levels, _trees
from easyad.transforms import vmap_lift
from easyad.transforms.vmap_batched import Batched, _shape, expanded

# the vmaps running, innermost last: (level, batch size)
OPEN: contextvars.ContextVar[tuple[tuple[int, int], ...]] = contextvars.ContextVar(
    "easyad_vmaps", default=())
_LEVELS = itertools.count(1)


def vmap(f: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0) -> Callable[..., Any]:
    """``f`` mapped over an axis of its arguments: ``vmap(f)(xs)[i] == f(xs[i])``, computed
    once on the whole batch.

    Parameters
    ----------
    f : callable
        A function easyad can trace: the rule table's functions, operators, tensor methods
        (sum, reshape, indexing, @...), the op table's ops, and easyad's transforms (so
        ``ad.vmap(ad.grad(loss))`` gives per-example gradients).
    in_axes : int, None or tuple
        The batch axis of each positional argument (None: not mapped, the same for every
        example); one int or None for all of them, or a tuple with one entry per argument
        (an argument that is a structure of arrays has the axis for all its arrays).
    out_axes : int, None or tuple
        Where the batch axis goes in each output (a tuple: one per item of a tuple
        output); None only for an output that does not depend on the batch.

    Returns
    -------
    callable
        The batched function, taking f's arguments with their batch axes.

    Raises
    ------
    ValueError
        If the mapped arguments' batch sizes differ, an axis is out of range, in_axes
        does not match the arguments, or nothing is mapped.
    NotImplementedError
        If f calls an op without a batching rule (named), or branches on a batched value.

    Examples
    --------
    >>> import numpy as np, easyad as ad
    >>> ad.vmap(lambda x: ad.sum(x * x))(np.array([[1.0, 2.0], [3.0, 4.0]]))
    array([ 5., 25.])
    >>> ad.vmap(lambda x, w: x @ w, in_axes=(0, None))(np.ones((3, 2)), np.eye(2)).shape
    (3, 2)
    """
    _check_axes(in_axes, "in_axes")
    _check_axes(out_axes, "out_axes")

    @functools.wraps(f)
    def mapped(*args: Any) -> Any:
        if not args:
            raise TypeError("ad.vmap: the mapped function got no arguments to map over")
        axes = in_axes if isinstance(in_axes, (tuple, list)) else (in_axes,) * len(args)
        if len(axes) != len(args):
            raise ValueError(f"ad.vmap: in_axes has {len(axes)} entries for {len(args)} "
                             f"positional arguments: give one per argument (None: not "
                             f"mapped)")
        size = _size(args, axes)
        level = next(_LEVELS)
        given = [_trees.unflatten(tree, [_wrap(v, a, level, size) for v in leaves])
                 if a is not None else arg
                 for arg, a, (leaves, tree) in zip(args, axes, map(_trees.flatten, args))]
        token = OPEN.set(OPEN.get() + ((level, size),))
        _levels.VMAPS[0] += 1
        try:
            out = f(*given)
        finally:
            _levels.VMAPS[0] -= 1
            OPEN.reset(token)
        return _outputs(out, out_axes, level, size)

    mapped.__doc__ = f"{getattr(f, '__name__', 'f')} mapped over a batch axis (ad.vmap)."
    return mapped


def _check_axes(axes: Any, name: str) -> None:
    items = axes if isinstance(axes, (tuple, list)) else (axes,)
    for a in items:
        if a is not None and (not isinstance(a, (int, np.integer)) or isinstance(a, bool)):
            raise TypeError(f"ad.vmap: {name} takes ints, None, or a tuple of them (one "
                            f"per argument); got {axes!r}")


def _size(args: tuple[Any, ...], axes: Any) -> int:
    sizes: dict[int, list[str]] = {}
    for k, (arg, a) in enumerate(zip(args, axes)):
        if a is None:
            continue
        leaves, _ = _trees.flatten(arg)
        for v in leaves:
            shape = _shape(v) if not isinstance(v, (list, tuple)) else np.shape(v)
            if not -len(shape) <= a < len(shape):
                raise ValueError(f"ad.vmap: in_axes {a} for argument {k}, of shape "
                                 f"{tuple(shape)}, which has no axis {a}")
            sizes.setdefault(int(shape[a]), []).append(f"argument {k} {tuple(shape)}")
    if not sizes:
        raise ValueError("ad.vmap: in_axes maps no argument (every entry None): map one")
    if len(sizes) > 1:
        told = "; ".join(f"size {n}: {', '.join(w)}" for n, w in sizes.items())
        raise ValueError(f"ad.vmap: the mapped axes have different sizes ({told}); they "
                         f"must all be the batch size")
    return next(iter(sizes))


def _wrap(v: Any, axis: int, level: int, size: int) -> Batched:
    if isinstance(v, (list, tuple, int, float)):
        v = np.asarray(v, dtype=np.float64)
    rank = len(_shape(v))
    axis = axis + rank if axis < 0 else axis
    return Batched(_moved(v, axis, 0), level, size)


def _moved(v: Any, source: int, destination: int) -> Any:
    if source == destination:
        return v
    if isinstance(v, np.ndarray):
        return np.moveaxis(v, source, destination)
    order = [k for k in range(len(_shape(v))) if k != source]
    order.insert(destination, source)
    return v.transpose(*order)


def _outputs(out: Any, out_axes: Any, level: int, size: int) -> Any:
    if isinstance(out_axes, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(out_axes):
            raise ValueError(f"ad.vmap: out_axes {out_axes!r} has one entry per output, but "
                             f"f returned {type(out).__name__}"
                             + (f" of {len(out)}" if isinstance(out, (tuple, list)) else ""))
        return type(out)(_outputs(o, a, level, size) for o, a in zip(out, out_axes))
    leaves, tree = _trees.flatten(out)
    return _trees.unflatten(tree, [_output(v, out_axes, level, size) for v in leaves])


def _output(v: Any, axis: Any, level: int, size: int) -> Any:
    batched = isinstance(v, Batched) and v._level == level
    if axis is None:
        if batched:
            raise ValueError("ad.vmap: out_axes None for an output that depends on the "
                             "mapped arguments (it differs between examples): give an axis")
        return v
    value = v._value if batched else expanded(v, size)
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        value = np.ascontiguousarray(value)
    rank = len(_shape(value))
    if not -rank <= axis < rank:
        raise ValueError(f"ad.vmap: out_axes {axis} for an output of {rank - 1} axes "
                         f"(with the batch axis: {rank})")
    return _moved(value, 0, axis + rank if axis < 0 else axis)


_levels.LIFT[0] = functools.partial(vmap_lift.lift, OPEN, vmap)
