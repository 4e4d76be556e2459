"""numpy's products on tensors: outer, inner, kron, tensordot, einsum.

Each is a composition of easyad operations (reshape, transpose, sums, elementwise products
and matmul, batched where it helps), so every engine differentiates it, to any order,
and recorded programs run the products as matmul steps. ``einsum`` contracts its operands
two at a time: indices of one operand only are summed first, then each pair becomes one
batched matmul (batch indices, the first operand's own, the contracted, the second's
own) and the result is transposed to the output's order. Not supported (a clear error):
``...`` and an index repeated within one operand (a diagonal: ``ad.diagonal`` first).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from easyad.ops._npfunctions import _array, traced
from easyad.tensor import _generic
from easyad.tensor._generic import NUMPY_FUNCTIONS


def _shaped(r: Any, shape: tuple[int, ...]) -> Any:
    # one number comes back as the engines' scalar (a Record, a Trace), as ad.sum's does
    return r.reshape(-1)[0] if shape == () else r.reshape(shape)


def _transposed(x: Any, order: list[int]) -> Any:
    return x if order == list(range(x.ndim)) else x.transpose(*order)


def outer(a: Any, b: Any, out: Any = None) -> Any:
    """``numpy.outer``: ``a.ravel()[i] * b.ravel()[j]`` as a matrix.

    >>> import numpy as np, easyad as ad
    >>> ad.outer(ad.Tensor.constant(np.array([1.0, 2.0])), np.array([3.0, 4.0])).value.tolist()
    [[3.0, 4.0], [6.0, 8.0]]
    """
    if out is not None:
        raise TypeError("outer: out= is not supported on easyad tensors")
    if not traced(a, b):
        return np.outer(a, b)
    return _array(a).reshape(-1, 1) * _array(b).reshape(1, -1)


def inner(a: Any, b: Any) -> Any:
    """``numpy.inner``: sums of products over the last axes of ``a`` and ``b``.

    >>> import numpy as np, easyad as ad
    >>> ad.inner(ad.Tensor.constant(np.array([1.0, 2.0])), np.array([3.0, 4.0]))
    11.0
    """
    if not traced(a, b):
        return np.inner(a, b)
    a, b = _array(a), _array(b)
    if a.ndim == 0 or b.ndim == 0:
        return a * b
    return tensordot(a, b, ([-1], [-1]))


def kron(a: Any, b: Any) -> Any:
    """``numpy.kron``: the Kronecker product (blocks ``a[i, j] * b``).

    >>> import numpy as np, easyad as ad
    >>> ad.kron(ad.Tensor.constant(np.array([1.0, 2.0])), np.array([1.0, 10.0])).value.tolist()
    [1.0, 10.0, 2.0, 20.0]
    """
    if not traced(a, b):
        return np.kron(a, b)
    a, b = _array(a), _array(b)
    nd = max(a.ndim, b.ndim)
    sa = (1,) * (nd - a.ndim) + tuple(a.shape)
    sb = (1,) * (nd - b.ndim) + tuple(b.shape)
    # a's axes interleaved with b's: (a0, 1, a1, 1...) * (1, b0, 1, b1...)
    wide_a = a.reshape(tuple(n for k in sa for n in (k, 1)))
    wide_b = b.reshape(tuple(n for k in sb for n in (1, k)))
    return _shaped(wide_a * wide_b, tuple(x * y for x, y in zip(sa, sb)))


def _contracted_axes(axes: Any, nda: int, ndb: int) -> tuple[list[int], list[int]]:
    if isinstance(axes, (int, np.integer)):
        if not 0 <= axes <= min(nda, ndb):
            raise ValueError(f"tensordot: axes={axes} must be between 0 and the operands' "
                             f"smaller number of axes")
        return list(range(nda - axes, nda)), list(range(axes))
    try:
        first, second = axes
    except (TypeError, ValueError):
        raise ValueError(f"tensordot: axes must be an int or a pair of axis lists, got "
                         f"{axes!r}") from None
    first = [first] if isinstance(first, (int, np.integer)) else list(first)
    second = [second] if isinstance(second, (int, np.integer)) else list(second)
    if len(first) != len(second):
        raise ValueError(f"tensordot: {len(first)} axes of a against {len(second)} of b")
    for name, items, nd in (("a", first, nda), ("b", second, ndb)):
        for ax in items:
            if not -nd <= ax < nd:
                raise np.exceptions.AxisError(f"tensordot: axis {ax} is out of bounds for "
                                              f"{name}, of {nd} dimension(s)")
    return [int(x) % nda for x in first], [int(x) % ndb for x in second]


def tensordot(a: Any, b: Any, axes: Any = 2) -> Any:
    """``numpy.tensordot``: sums of products over ``axes`` (an int: the last of ``a``
    with the first of ``b``; or a pair of axis lists), as one matmul.

    >>> import numpy as np, easyad as ad
    >>> a = ad.Tensor.constant(np.arange(6.0).reshape(2, 3))
    >>> ad.tensordot(a, np.ones((3, 2)), axes=1).value.tolist()
    [[3.0, 3.0], [12.0, 12.0]]
    """
    if not traced(a, b):
        return np.tensordot(a, b, axes)
    a, b = _array(a), _array(b)
    ax_a, ax_b = _contracted_axes(axes, a.ndim, b.ndim)
    for i, j in zip(ax_a, ax_b):
        if a.shape[i] != b.shape[j]:
            raise ValueError(f"tensordot: axis {i} of a has length {a.shape[i]}, axis {j} "
                             f"of b {b.shape[j]} (contracted axes must match)")
    free_a = [k for k in range(a.ndim) if k not in ax_a]
    free_b = [k for k in range(b.ndim) if k not in ax_b]
    k = math.prod(a.shape[i] for i in ax_a)
    m = math.prod(a.shape[i] for i in free_a)
    n = math.prod(b.shape[j] for j in free_b)
    left = _transposed(a, free_a + ax_a).reshape(m, k)
    right = _transposed(b, ax_b + free_b).reshape(k, n)
    shape = tuple(a.shape[i] for i in free_a) + tuple(b.shape[j] for j in free_b)
    return _shaped(left @ right, shape)


# ---- einsum ----

def _expand_ellipsis(text: str, ndims: list[int]) -> str:
    """``text`` with each ``...`` replaced by letters of its own (unused capitals), as
    numpy aligns them: from the right, an operand with fewer broadcast axes taking the
    last ones; the implicit output puts them first."""
    lhs, arrow, out = text.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(ndims):
        raise ValueError(f"einsum: {text!r} names {len(inputs)} operand(s), "
                         f"{len(ndims)} given")
    ranks = []
    for term, ndim in zip(inputs, ndims):
        if term.count("...") > 1 or term.replace("...", "").count(".") \
                or (term.count(".") and "..." not in term):
            raise ValueError(f"einsum: '...' at most once per operand, got {term!r}")
        rank = ndim - len(term.replace("...", "")) if "..." in term else 0
        if rank < 0:
            raise ValueError(f"einsum: operand of {ndim} axes named {term!r}")
        ranks.append(rank)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in text]
    width = max(ranks, default=0)
    if width > len(free):
        raise ValueError(f"einsum: '...' covers {width} axes, more than easyad names")
    letters = "".join(free[:width])
    inputs = [t.replace("...", letters[width - r:]) for t, r in zip(inputs, ranks)]
    if not arrow:        # numpy's implicit output: the broadcast axes, then the rest
        seen = "".join(inputs)
        rest = "".join(sorted(c for c in set(seen) if seen.count(c) == 1 and c not in letters))
        return ",".join(inputs) + "->" + letters + rest
    if out.count("...") > 1:
        raise ValueError(f"einsum: '...' at most once in the output, got {out!r}")
    return ",".join(inputs) + "->" + out.replace("...", letters)


def _parse(subscripts: str, count: int) -> tuple[list[str], str]:
    text = subscripts.replace(" ", "")
    lhs, arrow, out = text.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != count:
        raise ValueError(f"einsum: {subscripts!r} names {len(inputs)} operand(s), "
                         f"{count} given")
    for term in inputs + [out]:
        if not all(c.isalpha() for c in term):
            raise ValueError(f"einsum: subscripts are letters, got {term!r}")
    for term in inputs:
        if len(set(term)) != len(term):
            raise ValueError(f"einsum: an index repeated within one operand ({term!r}: a "
                             f"diagonal) is not supported on easyad tensors; take "
                             f"ad.diagonal(x, 0, i, j) first")
    if not arrow:           # numpy's implicit output: the letters seen once, sorted
        seen = "".join(inputs)
        out = "".join(sorted(c for c in set(seen) if seen.count(c) == 1))
    if len(set(out)) != len(out):
        raise ValueError(f"einsum: output index repeated in {out!r}")
    missing = set(out) - set("".join(inputs))
    if missing:
        raise ValueError(f"einsum: output index {sorted(missing)} is in no operand")
    return inputs, out


def _sum_out(x: Any, term: str, keep: set[str]) -> tuple[Any, str]:
    """``x`` with its indices not in ``keep`` summed away."""
    drop = tuple(k for k, c in enumerate(term) if c not in keep)
    if not drop:
        return x, term
    return _generic.sum(x, axis=drop), "".join(c for c in term if c in keep)


def _pair(a: Any, ta: str, b: Any, tb: str, needed: set[str],
          sizes: dict[str, int]) -> tuple[Any, str]:
    """The product of two terms summed over their shared indices not ``needed``: one
    batched matmul (B, M, K) @ (B, K, N)."""
    batch = [c for c in ta if c in tb and c in needed]
    summed = [c for c in ta if c in tb and c not in needed]
    own_a = [c for c in ta if c not in tb]
    own_b = [c for c in tb if c not in ta]

    def size(letters: list[str]) -> int:
        return math.prod(sizes[c] for c in letters)
    left = _transposed(a, [ta.index(c) for c in batch + own_a + summed]).reshape(
        size(batch), size(own_a), size(summed))
    right = _transposed(b, [tb.index(c) for c in batch + summed + own_b]).reshape(
        size(batch), size(summed), size(own_b))
    letters = batch + own_a + own_b
    product = left @ right
    return product.reshape(tuple(sizes[c] for c in letters)), "".join(letters)


def einsum(subscripts: str, *operands: Any, out: Any = None, optimize: Any = False) -> Any:
    """``numpy.einsum`` with explicit or implicit output: sums of products named by index
    letters, as batched matmuls (any number of operands, contracted two at a time, left to
    right); ``...`` as numpy aligns it (broadcast axes of equal lengths). Not supported: an
    index repeated within one operand.

    >>> import numpy as np, easyad as ad
    >>> a = ad.Tensor.constant(np.arange(6.0).reshape(2, 3))
    >>> ad.einsum("ij,kj->ik", a, np.ones((2, 3))).value.tolist()
    [[3.0, 3.0], [12.0, 12.0]]
    """
    if out is not None:
        raise TypeError("einsum: out= is not supported on easyad tensors")
    if not isinstance(subscripts, str):
        raise TypeError("einsum: the subscripts come first, as a string ('ij,jk->ik'); "
                        "the interleaved form einsum(a, [0, 1], ...) is not supported")
    if not traced(*operands):
        return np.einsum(subscripts, *operands, optimize=optimize)
    xs = [_array(x) for x in operands]
    if "." in subscripts:
        subscripts = _expand_ellipsis(subscripts.replace(" ", ""), [x.ndim for x in xs])
    terms, output = _parse(subscripts, len(operands))
    sizes: dict[str, int] = {}
    for x, term in zip(xs, terms):
        if x.ndim != len(term):
            raise ValueError(f"einsum: operand of {x.ndim} axes named {term!r}")
        for c, n in zip(term, x.shape):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"einsum: index {c!r} has lengths {sizes[c]} and {n} "
                                 f"(broadcasting a length 1 is not supported)")
    current, term = None, ""
    for k, (x, t) in enumerate(zip(xs, terms)):
        later = set(output).union(*terms[k + 1:])
        x, t = _sum_out(x, t, later | set(term))
        if current is None:
            current, term = x, t
            continue
        if not term or not t:            # one side is one number: a plain product
            current, term = _outer_terms(current, term, x, t)
        else:
            current, term = _pair(current, term, x, t, later, sizes)
        current, term = _sum_out(current, term, later)
    current, term = _sum_out(current, term, set(output))
    if not output:       # one number: already the engines' scalar (ad.sum's)
        return current
    return _transposed(current, [term.index(c) for c in output])


def _outer_terms(a: Any, ta: str, b: Any, tb: str) -> tuple[Any, str]:
    return a * b, ta + tb


NUMPY_FUNCTIONS.update({np.outer: outer, np.inner: inner, np.kron: kron,
                        np.tensordot: tensordot, np.einsum: einsum})
