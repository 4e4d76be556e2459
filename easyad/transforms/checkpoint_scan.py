"""``ad.scan`` and ``ad.fori_loop``: loops whose backward sweep runs binomial checkpointing.

``checkpoints=None`` (or ``"all"``) records every step on the caller's list, as a Python
loop would: the reference. ``checkpoints=c`` (an int >= 1, or ``"sqrt"`` for
ceil(sqrt(steps))) records the whole loop as ONE node (``checkpoint.attach``): the
forward run evaluates the steps on constants and keeps only the snapshots revolve's
first sweep takes (``checkpoint_revolve.spine``); the backward sweep runs the optimal
schedule (``checkpoint_revolve.reverse``), recording each step again on a small list of
its own, sweeping it and dropping it. At most ``c`` carries are held at once (plus the
one being advanced) and each step runs at most ``r + 1`` times un-recorded, r the
smallest integer with C(c + r, c) >= steps: 10^5 steps with c = 100 take r = 3.

The carry is a structure (tuples, lists, dicts) of Records, float Tensors (one device),
floats and anything else (ints, strings: passed along, no derivative); its structure
must not change between steps. Parameters that the body reads and that need a
derivative go in the carry: a closure over a recorded value raises (see ``checkpoint``).
Forward mode, ``ad.eval_shape`` and ``ad.record`` of tensor code run the plain loop;
``create_graph=True`` through a checkpointed loop records the plain loop on the list in
the backward sweep (exact second derivatives, no memory saved).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from easyad._core import Record, WengertList
from easyad.tensor import Tensor
from easyad.tensor._base import wrap
from easyad.transforms import checkpoint_revolve as revolve
from easyad.transforms.checkpoint import (active, attach, backend_of, bypassed,
                                          closure_error, compiled, constant, cotangent,
                                          flatten, floats, number, one_tape, own_lists,
                                          pairing, recorded, unflatten, variable)

_Step = Callable[[Any, Any, int], tuple[Any, Any]]
_NO_XS = ("no xs",)      # the structure of xs when there is none (a single leaf's: None)


def scan(body: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any = None,
         length: int | None = None, checkpoints: int | str | None = None) -> tuple[Any, Any]:
    """``carry, y_i = body(carry, x_i)`` for each row ``x_i`` of ``xs``; returns the final
    carry and the ``y_i`` stacked (Tensors; None when body gives None).

    ``xs``: a structure of arrays or Tensors sharing their first axis (the steps), or
    None with ``length``. ``checkpoints``: None/"all" records every step; an int c >= 1
    or "sqrt" runs Griewank's binomial checkpointing in the backward sweep with at most
    c carries held (docs/checkpointing.md).

    Examples
    --------
    >>> import easyad as ad
    >>> def body(c, x):
    ...     u, k = c
    ...     return (u + 0.01 * ad.sin(k * u), k), None
    >>> lst = ad.WengertList()
    >>> u0, k = lst.variable(1.0), lst.variable(2.0)
    >>> (u, _), _ = ad.scan(body, (u0, k), length=1000, checkpoints=10)
    >>> plain = ad.scan(body, (u0, k), length=1000)[0][0]
    >>> d, e = u.derivatives(), plain.derivatives()
    >>> abs(d[u0] - e[u0]) < 1e-12 and abs(d[k] - e[k]) < 1e-12
    True
    """
    xl, xt = _xs_leaves(xs)
    n = _length(xl, length)

    def step(c: Any, row: Any, i: int) -> tuple[Any, Any]:
        out = body(c, row)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f"ad.scan: body must return (carry, y), got "
                            f"{type(out).__name__}")
        return out
    return _loop("ad.scan", step, carry, n, xl, xt, checkpoints)


def fori_loop(lower: int, upper: int, body: Callable[[int, Any], Any], init: Any,
              checkpoints: int | str | None = None) -> Any:
    """``carry = body(i, carry)`` for i in range(lower, upper); returns the final carry
    (``checkpoints`` as in ``ad.scan``).

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(0.5)
    >>> y = ad.fori_loop(0, 100, lambda i, c: c - 0.1 * c * c, x, checkpoints=4)
    >>> y2 = ad.fori_loop(0, 100, lambda i, c: c - 0.1 * c * c, x)
    >>> abs(y.derivatives()[x] - y2.derivatives()[x]) < 1e-12
    True
    """
    if not all(isinstance(v, (int, np.integer)) for v in (lower, upper)):
        raise TypeError(f"ad.fori_loop: lower and upper must be ints, got "
                        f"{type(lower).__name__} and {type(upper).__name__}")
    lower, upper = int(lower), int(upper)

    def step(c: Any, row: Any, i: int) -> tuple[Any, Any]:
        return body(lower + i, c), None
    return _loop("ad.fori_loop", step, init, max(upper - lower, 0), [], _NO_XS,
                 checkpoints)[0]


# ---- the steps' rows ----

def _xs_leaves(xs: Any) -> tuple[list[Any], Any]:
    if xs is None:
        return [], _NO_XS
    leaves, tree = flatten(xs)
    if _has_objects(tree):
        raise TypeError("ad.scan: xs holds an object array (of Records); pass a Tensor "
                        "(ad.Tensor.variable, or ad.stack of the Records' tensors)")
    out = []
    for v in leaves:
        if isinstance(v, (Tensor, np.ndarray)):
            out.append(v)
        elif isinstance(v, (list, tuple, float, int)):
            out.append(np.asarray(v, dtype=np.float64))
        else:
            raise TypeError(f"ad.scan: xs leaves must be arrays or Tensors, got "
                            f"{type(v).__name__}")
    return out, tree


def _has_objects(t: Any) -> bool:
    if t is None:
        return False
    return t[0] == "objects" or any(_has_objects(c) for c in t[-1])


def _length(leaves: list[Any], length: int | None) -> int:
    sizes = {int(v.shape[0]) for v in leaves if len(v.shape) > 0}
    if any(len(v.shape) == 0 for v in leaves):
        raise ValueError("ad.scan: every leaf of xs needs a first axis (the steps)")
    if len(sizes) > 1:
        raise ValueError(f"ad.scan: the leaves of xs have different lengths {sorted(sizes)}")
    if length is not None:
        if not isinstance(length, (int, np.integer)) or length < 0:
            raise ValueError(f"ad.scan: length must be an int >= 0, got {length!r}")
        if sizes and sizes != {int(length)}:
            raise ValueError(f"ad.scan: length={length} but xs has {sizes.pop()} rows")
        return int(length)
    if not sizes:
        raise ValueError("ad.scan: give xs or length (the number of steps)")
    return sizes.pop()


def _row(leaf: Any, i: int) -> Any:
    r = leaf[i]
    return float(r) if isinstance(r, np.floating) else r


def _rows(xl: list[Any], xt: Any, i: int) -> Any:
    return None if xt is _NO_XS else xt.build([_row(v, i) for v in xl])


def _snapshots(checkpoints: int | str | None, n: int, what: str) -> int | None:
    if checkpoints is None or checkpoints == "all":
        return None
    if checkpoints == "sqrt":
        return max(1, math.ceil(math.sqrt(n)))
    if isinstance(checkpoints, bool) or not isinstance(checkpoints, (int, np.integer)) \
            or checkpoints < 1:
        raise ValueError(f"{what}: checkpoints must be None, 'all', 'sqrt' or an int >= 1 "
                         f"(the most carries held at once), got {checkpoints!r}")
    return int(checkpoints)


# ---- the loop ----

def _loop(what: str, step: _Step, carry: Any, n: int, xl: list[Any], xt: Any,
          checkpoints: int | str | None) -> tuple[Any, Any]:
    snaps = _snapshots(checkpoints, n, what)
    leaves, tree = flatten(carry)
    shape = _Shape(tree, what)
    if xt is not _NO_XS:
        xt = _Shape(xt, what)
    everything = leaves + xl
    tape = None if any(bypassed(v) for v in everything) else one_tape(everything, what)
    if snaps is None or tape is None or n == 0:
        return _plain(step, carry, shape, n, xl, xt)
    with own_lists():
        return _Checkpointed(what, step, shape, n, xl, xt, snaps).run(tape, leaves, xl)


def _plain(step: _Step, carry: Any, shape: _Shape, n: int, xl: list[Any],
           xt: Any) -> tuple[Any, Any]:
    ys: list[Any] = []
    for i in range(n):
        carry, y = step(carry, _rows(xl, xt, i), i)
        shape.leaves(carry)                     # the structure checked
        ys.append(y)
    if not ys or all(y is None for y in ys):
        return carry, None
    y_tree = flatten(ys[0])[1]
    columns = list(zip(*(flatten(y)[0] for y in ys)))
    return carry, unflatten(y_tree, [_stack(list(c)) for c in columns])


class _Shape:
    """A carry's structure: ``leaves(x)`` (checked: ValueError for another structure)
    and ``build(leaves)``, by generated functions where ``compiled`` makes them."""

    def __init__(self, tree: Any, what: str) -> None:
        self.tree, self.what, self.fast = tree, what, compiled(tree)

    def leaves(self, x: Any) -> list[Any]:
        if self.fast is not None:
            found = self.fast.leaves(x)
            if found is not None:
                return found
        leaves, again = flatten(x)          # a subclass of tuple, or another structure
        if again != self.tree:
            raise ValueError(f"{self.what}: the body returned a carry of another structure "
                             f"than it was given; keep the carry's structure the same at "
                             f"every step")
        return leaves

    def build(self, leaves: list[Any]) -> Any:
        return self.fast.build(leaves) if self.fast is not None else \
            unflatten(self.tree, leaves)


def _stack(column: list[Any]) -> Any:
    """One y leaf over the steps: a Tensor (recorded when a step's was), or an array."""
    if any(isinstance(v, Tensor) for v in column):
        from easyad.tensor._generic import stack
        return stack(column)
    if any(type(v) is Record and v.tape is not None for v in column):
        from easyad.tensor._custom import _pack
        return _pack(np.array(column, dtype=object))
    return np.array([v.number if type(v) is Record else v for v in column])


class _Checkpointed:
    """One checkpointed run: the constants' forward run and the node's vjp. Holds the
    body, the xs' constant values and the snapshots, never the caller's list."""

    def __init__(self, what: str, step: _Step, shape: _Shape, n: int, xl: list[Any],
                 xt: Any, snaps: int) -> None:
        self.what, self.step, self.shape, self.n, self.snaps = what, step, shape, n, snaps
        self.xt = xt
        self.xc = [constant(v) for v in xl]              # the rows' values
        self.x_in = [k for k, v in enumerate(xl) if recorded(v)]
        self.stored: dict[int, Any] = {}
        self.first: Any = None
        self.y_tree: Any = _NO_XS          # no ys (a single leaf's tree is None)
        self.y_kinds: list[str] = []
        self.final_kinds: list[bool] = []
        self.c_in: list[int] = []

    # the states are carries as the body takes them (structures of constants): the
    # un-recorded steps flatten nothing; each step's structure is checked when it is
    # recorded (every step is, once), and the first one at once
    def advance(self, state: Any, i: int, j: int) -> Any:
        step, xc, xt = self.step, self.xc, self.xt
        for k in range(i, j):
            state = step(state, _rows(xc, xt, k), k)[0]
        return state

    def run(self, tape: Any, leaves: list[Any], xl: list[Any]) -> tuple[Any, Any]:
        state = self.first = self.shape.build([constant(v) for v in leaves])
        keep = set(revolve.spine(self.n, self.snaps))
        before = len(tape)
        ys: list[Any] = []
        step, xc, xt = self.step, self.xc, self.xt
        for i in range(self.n):
            state, y = step(state, _rows(xc, xt, i), i)
            if i == 0:
                self.shape.leaves(state)
            if i + 1 in keep:
                self.stored[i + 1] = state
            ys.append(y)
        last = self.shape.leaves(state)
        if len(tape) != before or any(recorded(v) for v in last):
            raise closure_error(self.what)
        self.final_kinds = [active(v) for v in last]
        outs = [v for v in last if active(v)]
        device = backend_of(leaves + xl + last, self.what).device
        stacked = self._ys(ys, device)
        if any(recorded(v) for v in stacked if isinstance(v, Tensor)):
            raise closure_error(self.what)
        y_out = [v for v, kind in zip(stacked, self.y_kinds) if kind != "static"]
        c_in = [k for k, v in enumerate(leaves) if recorded(v)]
        inputs = [leaves[k] for k in c_in] + [xl[k] for k in self.x_in]
        self.c_in = c_in
        done = attach(self.what, tape, inputs, outs + y_out, self.vjp, self.again)
        final, it = list(last), iter(done)
        for k, v in enumerate(last):
            if active(v):
                final[k] = next(it)
        result = [next(it) if kind != "static" else v for v, kind in zip(stacked, self.y_kinds)]
        ys_out = None if self.y_tree is _NO_XS else unflatten(self.y_tree, result)
        return self.shape.build(final), ys_out

    def again(self, handles: list[Any]) -> list[Any]:
        """The plain loop on handles of the node's inputs, recorded (create_graph)."""
        leaves = self.shape.leaves(self.first)
        for k, h in zip(self.c_in, handles):
            leaves[k] = h
        xl = list(self.xc)
        for k, h in zip(self.x_in, handles[len(self.c_in):]):
            xl[k] = h
        carry, ys = _plain(self.step, self.shape.build(leaves), self.shape, self.n, xl,
                           self.xt)
        outs = [v for v, a in zip(self.shape.leaves(carry), self.final_kinds) if a]
        if self.y_kinds:
            outs += [v for v, kind in zip(flatten(ys)[0], self.y_kinds) if kind != "static"]
        return outs

    def _ys(self, ys: list[Any], device: Any) -> list[Any]:
        if not ys or all(y is None for y in ys):
            return []
        leaves0, self.y_tree = flatten(ys[0])
        columns = list(zip(*(flatten(y)[0] for y in ys)))
        out = []
        for column in columns:
            if any(isinstance(v, Tensor) for v in column):
                from easyad.tensor._generic import stack
                out.append(stack(list(column)))
                self.y_kinds.append("tensor")
            elif all(floats(v) for v in column):     # a transform's result, say
                out.append(Tensor.constant(np.stack(column), device=device))
                self.y_kinds.append("tensor")
            elif all(number(v) for v in column):
                out.append(Tensor.constant(np.array([float(v.number) if type(v) is Record
                                                     else float(v) for v in column]),
                                           device=device))
                self.y_kinds.append("numbers")
            else:
                out.append(np.array(column))
                self.y_kinds.append("static")
        return out

    # ---- the backward sweep ----
    def vjp(self, gs: list[Any]) -> list[Any]:
        with own_lists():
            return self._vjp(gs)

    def _vjp(self, gs: list[Any]) -> list[Any]:
        state_count = sum(1 for v in self.final_kinds if v)
        g_state, g_ys = gs[:state_count], gs[state_count:]
        it = iter(g_state)
        adjoint = [next(it) if a else None for a in self.final_kinds]
        rows: dict[int, list[Any]] = {k: [None] * self.n for k in self.x_in}
        y_rows = [g.value if isinstance(g, Tensor) and g.ndim == 1 else g for g in g_ys]

        def reverse_step(state: Any, i: int, adj: list[Any]) -> list[Any]:
            inner = WengertList()
            vs = [variable(v, inner) for v in self.shape.leaves(state)]
            x_leaves = [_row(v, i) for v in self.xc]
            for k in self.x_in:
                x_leaves[k] = variable(x_leaves[k], inner)
            row = None if self.xt is _NO_XS else self.xt.build(x_leaves)
            new, y = self.step(self.shape.build(vs), row, i)
            leaves = self.shape.leaves(new)
            outs, gv = list(leaves), list(adj)
            if y_rows:
                ly = [v for v, kind in zip(flatten(y)[0], self.y_kinds) if kind != "static"]
                outs += ly
                gv += [float(g[i]) if isinstance(g, np.ndarray) else g[i] for g in y_rows]
            total = pairing(outs, gv)
            d = total.derivatives() if type(total) is Record and total.tape is inner \
                else None
            for k in self.x_in:
                rows[k][i] = cotangent(x_leaves[k], d)
            return [cotangent(v, d) for v in vs]
        stored = self.stored
        first = revolve.reverse(self.n, self.snaps, self.first, stored, self.advance,
                                reverse_step, adjoint)
        result = [first[k] for k in self.c_in]
        for k in self.x_in:
            result.append(_stacked_rows(rows[k], self.xc[k]))
        return result


def _stacked_rows(rows: list[Any], like: Any) -> Any:
    """The cotangent of an xs leaf from its rows' (floats, Tensors or None)."""
    if like.ndim == 1:
        values = np.array([0.0 if r is None else float(r) for r in rows])
        return Tensor.constant(values, device=like.device, dtype=like.dtype)
    zero = None
    parts = []
    for r in rows:
        if r is None:
            if zero is None:
                zero = wrap(Tensor, like._backend, like._backend.full(like.shape[1:], 0.0,
                                                                      like.dtype),
                            like.shape[1:], like.dtype)
            r = zero
        parts.append(r)
    from easyad.tensor._generic import stack
    return stack(parts)


__all__ = ["fori_loop", "scan"]
