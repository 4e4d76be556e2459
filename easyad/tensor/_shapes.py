"""Shape arithmetic of the tensor layer: broadcasting, axes, matmul, indexing, reshape.

Pure Python on tuples, no data: every tensor operation asks here for its output shape
before any buffer is touched, so a mismatch raises ``ShapeError`` (naming the operation and
both shapes) before a kernel runs, and ``eval_shape`` needs nothing else.
"""
from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from easyad.errors import ShapeError

Shape = tuple[int, ...]


def broadcast(op: str, *shapes: Shape) -> Shape:
    """numpy's broadcasting of ``shapes``; ShapeError names ``op`` and the shapes."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        size = 1
        for s in shapes:
            k = d - (ndim - len(s))
            if k < 0 or s[k] == 1:
                continue
            if size != 1 and s[k] != size:
                listed = " and ".join(str(tuple(s)) for s in shapes)
                raise ShapeError(f"{op}: shapes {listed} do not broadcast "
                                 f"(axis {d - ndim}: {size} vs {s[k]})")
            size = s[k]
        out.append(size)
    return tuple(out)


def reduced_axes(shape: Shape, target: Shape) -> tuple[int, ...]:
    """The axes of ``shape`` to sum over so a broadcast result folds back to ``target``."""
    lead = len(shape) - len(target)
    return tuple(range(lead)) + tuple(lead + i for i, n in enumerate(target)
                                      if n == 1 and shape[lead + i] != 1)


def normalize_axes(op: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        a = operator.index(a)
        if not -ndim <= a < ndim:
            raise ShapeError(f"{op}: axis {a} is out of range for {ndim} dimensions")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis!r}")
    return tuple(sorted(out))


def reduce(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def matmul(a: Shape, b: Shape) -> Shape:
    """numpy's matmul shape; ShapeError for scalars or inner dimensions that differ."""
    if not a or not b:
        raise ShapeError(f"matmul: shapes {a} and {b}: operands must have at least one axis")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"matmul: shapes {a} and {b}: inner dimensions {a2[-1]} and "
                         f"{b2[-2]} differ")
    batch = broadcast("matmul", a2[:-2], b2[:-2])
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def reshape(shape: Shape, new: Any) -> Shape:
    if isinstance(new, (int, np.integer)):
        new = (new,)
    new = tuple(operator.index(n) for n in new)
    size = math.prod(shape)
    unknown = [i for i, n in enumerate(new) if n == -1]
    if len(unknown) > 1 or any(n < -1 for n in new):
        raise ShapeError(f"reshape: invalid target shape {new}")
    if unknown:
        known = math.prod(n for n in new if n != -1)
        if known == 0 or size % known:
            raise ShapeError(f"reshape: cannot reshape {shape} (size {size}) to {new}")
        new = tuple(size // known if n == -1 else n for n in new)
    if math.prod(new) != size:
        raise ShapeError(f"reshape: cannot reshape {shape} (size {size}) to {new}")
    return tuple(int(n) for n in new)


def contiguous_strides(shape: Shape) -> Shape:
    """Strides, in elements, of a C-contiguous array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def transpose(shape: Shape, axes: Any) -> tuple[int, ...]:
    ndim = len(shape)
    if axes is None or axes == ():
        return tuple(reversed(range(ndim)))
    if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
        axes = tuple(axes[0])
    perm = tuple(operator.index(a) % ndim if ndim else operator.index(a) for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise ShapeError(f"transpose: axes {tuple(axes)} are not a permutation of the "
                         f"{ndim} axes of shape {shape}")
    return perm


def concatenate(op: str, shapes: list[Shape], axis: int) -> tuple[Shape, int]:
    """Output shape and the normalized axis of joining ``shapes`` along ``axis``."""
    if not shapes:
        raise ShapeError(f"{op}: needs at least one tensor")
    first = shapes[0]
    if not first:
        raise ShapeError(f"{op}: zero-dimensional tensors cannot be joined")
    (ax,) = normalize_axes(op, axis, len(first))
    for s in shapes[1:]:
        if len(s) != len(first) or any(a != b for d, (a, b) in enumerate(zip(first, s))
                                       if d != ax):
            raise ShapeError(f"{op}: shapes {first} and {s} differ off axis {ax}")
    return first[:ax] + (sum(s[ax] for s in shapes),) + first[ax + 1:], ax


def stack(shapes: list[Shape], axis: int) -> int:
    if not shapes:
        raise ShapeError("stack: needs at least one tensor")
    for s in shapes[1:]:
        if s != shapes[0]:
            raise ShapeError(f"stack: shapes {shapes[0]} and {s} differ")
    (ax,) = normalize_axes("stack", axis, len(shapes[0]) + 1)
    return ax


# ---- indexing ----

def basic_index(shape: Shape, key: Any) -> tuple[int, Shape, Shape] | None:
    """``(offset, shape, strides)`` in elements of ``x[key]`` for basic indexing (ints,
    slices, None, Ellipsis) of a C-contiguous ``x``; None for advanced indexing."""
    if type(key) is slice and len(shape) == 1:     # x[a:b:c] of a vector, the common case
        start, stop, step = key.indices(shape[0])
        length = len(range(start, stop, step))
        return (start if length else 0), (length,), (step,)
    items = key if isinstance(key, tuple) else (key,)
    for item in items:
        if item is None or item is Ellipsis or isinstance(item, slice):
            continue
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            return None
    consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
    if consumed > len(shape):
        raise IndexError(f"too many indices for a tensor of shape {shape}: {consumed}")
    if sum(1 for item in items if item is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded: list[Any] = []
    for item in items:
        if item is Ellipsis:
            expanded += [slice(None)] * (len(shape) - consumed)
        else:
            expanded.append(item)
    expanded += [slice(None)] * (len(shape) - sum(1 for item in expanded if item is not None))
    strides = contiguous_strides(shape)
    offset, out_shape, out_strides, d = 0, [], [], 0
    for item in expanded:
        if item is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        n = shape[d]
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            length = len(range(start, stop, step))
            if length:
                offset += start * strides[d]
            out_shape.append(length)
            out_strides.append(step * strides[d])
        else:
            i = operator.index(item)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {n}")
            offset += (i % n) * strides[d]
        d += 1
    return offset, tuple(out_shape), tuple(out_strides)


def advanced_index(shape: Shape, key: Any) -> np.ndarray:
    """The flat source positions of ``x[key]`` (any numpy index), as an int64 array."""
    index: np.ndarray = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)[key]
    return index


def is_element(key: Any, ndim: int) -> bool:
    """Whether the index ``key`` picks one element of an array of ``ndim`` axes (an int
    per axis)."""
    if type(key) is int or isinstance(key, np.integer):
        return ndim == 1
    return (type(key) is tuple and len(key) == ndim
            and all(type(k) is int or isinstance(k, np.integer) for k in key))
