"""Hessian sparsity of a recorded tape, and a colouring that compresses it.

A Hessian entry H[p, q] can be non-zero only if some operation has a non-zero second
derivative in two operands that depend on inputs p and q. Which second derivatives of a
rule are non-zero is read off the tangents of its partials (``_expr``, the same
expressions the second-order sweeps run): a tangent of partial k that contains ``dx``
couples operand k with operand 0, ``dy`` with operand 1, ``dz`` with both. Dependencies
are propagated forward once per Function. Columns that share no row may share one
forward-over-reverse sweep (direct recovery), so a tridiagonal Hessian needs 3 sweeps
whatever n is.
"""
from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad import _expr, _rules
from easyad._tapeview import (COMPARE, CONSTANT, CUSTOM, GUARD, KINDS, NODE, SELECT,
                              VARIABLE, TapeView, select_condition)

# a pattern denser than this share of n*n is computed densely (colouring would not pay)
_DENSE_SHARE = 0.5


@functools.lru_cache(maxsize=1)
def _couplings() -> dict[int, tuple[frozenset[str], ...]]:
    """opcode -> per partial k, the tangent names (dx, dy, dz) its tangent contains."""
    out = {}
    for rule in _rules.RULES:
        out[_rules.OPCODES[rule.name]] = tuple(
            _expr.variables(_expr.partial_tangent(rule, k)) & {"dx", "dy", "dz"}
            for k in range(rule.arity))
    return out


def _ancestors(view: TapeView, output: int) -> bytearray:
    """live[i] = 1 for the entries ``output`` reads, directly or not (itself included):
    TapeView.ancestors in one backward pass over plain lists (operands come before)."""
    live = bytearray(output + 1)
    live[output] = 1
    arg0, arg1 = view.arg0[:output + 1].tolist(), view.arg1[:output + 1].tolist()
    for i in range(output, -1, -1):
        if live[i]:
            for j in (arg0[i], arg1[i]):
                if j >= 0:
                    live[j] = 1
            if view.kind(i) == SELECT:
                live[select_condition(i)] = 1
    return live


def hessian_pattern(arrays: dict[str, NDArray[Any]], inputs: tuple[int, ...], output: int
                    ) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """(rows, cols) of the structurally non-zero Hessian entries, or None when dense."""
    n = len(inputs)
    view = TapeView.of_arrays(arrays)
    position = {entry: k for k, entry in enumerate(inputs)}
    couplings = _couplings()
    empty: frozenset[int] = frozenset()
    deps: list[frozenset[int]] = []
    pairs: set[tuple[int, int]] = set()
    limit = _DENSE_SHARE * n * n

    def couple(a: frozenset[int], b: frozenset[int]) -> bool:
        for p in a:
            for q in b:
                pairs.add((p, q))
                pairs.add((q, p))
        return len(pairs) > limit

    # only the output's ancestors: an entry the output does not read (dead code, another
    # output's work) adds no Hessian entry, and a false one costs a colour and a sweep
    live = _ancestors(view, output)
    for i in range(output + 1):
        if not live[i]:
            deps.append(empty)
            continue
        kind = view.kind(i)
        a, b = view.operand(i, 0), view.operand(i, 1)
        da = deps[a] if a >= 0 else empty
        db = deps[b] if b >= 0 else empty
        if kind == VARIABLE:
            deps.append(frozenset((position[i],)) if i in position else empty)
            continue
        if kind in (COMPARE, GUARD, CONSTANT):
            deps.append(empty)   # piecewise constant: no derivative, no coupling
            continue
        both = da | db
        deps.append(both)
        if kind == SELECT:
            continue
        if kind in (CUSTOM, NODE):
            if couple(both, both):
                return None
            continue
        for k, names in enumerate(couplings[int(view.ops[i])]):
            own = (da, db)[k]
            if not own:
                continue
            if ("dx" in names and couple(own, da)) or ("dy" in names and couple(own, db)) \
                    or ("dz" in names and couple(own, both)):
                return None
    if not pairs:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    rows, cols = np.array(sorted(pairs), dtype=np.intp).T
    return rows, cols


def colour_columns(n: int, rows: NDArray[np.intp], cols: NDArray[np.intp]) -> NDArray[np.intp]:
    """A colour per column such that no row has non-zeros in two columns of one colour
    (greedy, columns with most non-zeros first)."""
    in_column: list[list[int]] = [[] for _ in range(n)]
    for r, c in zip(rows.tolist(), cols.tolist()):
        in_column[c].append(r)
    used_in_row: list[set[int]] = [set() for _ in range(n)]
    colour = np.zeros(n, dtype=np.intp)
    for c in sorted(range(n), key=lambda j: -len(in_column[j])):
        taken = set().union(*(used_in_row[r] for r in in_column[c])) if in_column[c] else set()
        k = 0
        while k in taken:
            k += 1
        colour[c] = k
        for r in in_column[c]:
            used_in_row[r].add(k)
    return colour


# ---- Jacobians: the pattern of every output, and partitions of columns or rows ----

@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off: a set (or node) per entry of a long tape would have it
    walk them all again and again (quadratic in the tape's length)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def jacobian_pattern(arrays: dict[str, NDArray[Any]], inputs: tuple[int, ...],
                     outputs: tuple[int, ...]
                     ) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    with no_cyclic_gc():
        return _jacobian_pattern(arrays, inputs, outputs)


def _jacobian_pattern(arrays: dict[str, NDArray[Any]], inputs: tuple[int, ...],
                      outputs: tuple[int, ...]
                      ) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """(rows, cols) of the Jacobian's structurally non-zero entries, row by row, or None
    where the tape holds tensor nodes (their inputs are not operand slots).

    Index sets are propagated forward over the outputs' ancestors: an input is its own
    column, a rule or a user primitive depends on what its operands depend on,
    comparisons and guards on nothing (they are piecewise constant), a select on both its
    operands (the pattern holds on either side of the branch). Guards are not part of
    the pattern: where replay finds another branch, ``on_branch_change`` says what
    happens, as for every other method."""
    if not outputs:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    view = TapeView.of_arrays(arrays)
    last = max(outputs)
    live = bytearray(last + 1)
    for o in outputs:
        live[o] = 1
    ops = view.ops[:last + 1].tolist()
    kind_of = [KINDS[op] for op in ops]
    arg0, arg1 = view.arg0[:last + 1].tolist(), view.arg1[:last + 1].tolist()
    for i in range(last, -1, -1):        # the outputs' ancestors (operands come before)
        if live[i]:
            if kind_of[i] == NODE:
                return None
            for j in (arg0[i], arg1[i]):
                if j >= 0:
                    live[j] = 1
            if kind_of[i] == SELECT:
                live[select_condition(i)] = 1
    position = {entry: k for k, entry in enumerate(inputs)}
    empty: frozenset[int] = frozenset()
    deps: list[frozenset[int]] = [empty] * (last + 1)
    for i in range(last + 1):
        if not live[i]:
            continue
        kind = kind_of[i]
        if kind == VARIABLE:
            if i in position:
                deps[i] = frozenset((position[i],))
            continue
        if kind in (COMPARE, GUARD, CONSTANT):
            continue
        a, b = arg0[i], arg1[i]
        da = deps[a] if a >= 0 else empty
        db = deps[b] if b >= 0 else empty
        deps[i] = db if not da else (da if not db or da is db else da | db)
    rows: list[int] = []
    cols: list[int] = []
    for r, o in enumerate(outputs):
        found = sorted(deps[o])
        rows += [r] * len(found)
        cols += found
    return np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp)

def _members(rows: NDArray[np.intp], cols: NDArray[np.intp], groups: int
             ) -> list[list[int]]:
    """Per group (a column), the rows it has non-zeros in."""
    order = np.argsort(cols, kind="stable")
    bounds = np.searchsorted(cols[order], np.arange(groups + 1))
    r = rows[order].tolist()
    return [r[bounds[g]:bounds[g + 1]] for g in range(groups)]


def colour_partition(rows: NDArray[np.intp], cols: NDArray[np.intp],
                     shape: tuple[int, int], *, limit: int | None = None
                     ) -> NDArray[np.intp] | None:
    """A colour per column of the (m, n) pattern such that no row has non-zeros in two
    columns of one colour (a distance-2 colouring of the bipartite graph, so the
    compressed J @ S gives every non-zero directly): greedy, columns in largest-first
    order (most non-zeros first, ties by index), each the smallest colour its rows leave
    free. None once more than ``limit`` colours would be needed. The colours are at least
    the most non-zeros of a row (a lower bound any partition needs). Rows: call with
    (cols, rows) and the shape reversed."""
    m, n = shape
    in_column = _members(np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp), n)
    order = sorted(range(n), key=lambda j: -len(in_column[j]))
    used: list[list[int]] = [[] for _ in range(m)]
    mark: list[int] = []
    colour = np.zeros(n, dtype=np.intp)
    for c in order:
        for r in in_column[c]:
            for k in used[r]:
                mark[k] = c
        k = 0
        while k < len(mark) and mark[k] == c:
            k += 1
        if limit is not None and k >= limit:
            return None
        if k == len(mark):
            mark.append(-1)
        colour[c] = k
        for r in in_column[c]:
            used[r].append(k)
    return colour


def star_colouring(n: int, rows: NDArray[np.intp], cols: NDArray[np.intp]
                   ) -> NDArray[np.intp]:
    """A star colouring of a symmetric (n, n) pattern's adjacency graph: neighbours have
    other colours, and every path on four vertices has three colours at least (no
    two-coloured path of length 3). Then every H[i, j] is read directly from the
    compressed H @ S: at (i, colour[j]) where j is the only neighbour of i in its colour,
    else at (j, colour[i]) (``star_sources``). Greedy (Gebremedhin, Manne and Pothen's
    simple star colouring), vertices in largest-first order. An arrowhead needs 2 colours
    where a partition of columns needs n."""
    off = rows != cols
    neighbours = _members(np.asarray(cols[off], dtype=np.intp),
                          np.asarray(rows[off], dtype=np.intp), n)
    colour = [-1] * n
    for v in sorted(range(n), key=lambda j: -len(neighbours[j])):
        forbid = set()
        for w in neighbours[v]:
            cw = colour[w]
            if cw >= 0:
                forbid.add(cw)
            for x in neighbours[w]:
                cx = colour[x]
                if x == v or cx < 0:
                    continue
                if cw < 0:
                    forbid.add(cx)     # v, x at distance 2: w may still take any colour
                elif any(colour[y] == cw for y in neighbours[x] if y != w):
                    forbid.add(cx)     # v-w-x-y would be two-coloured
        k = 0
        while k in forbid:
            k += 1
        colour[v] = k
    return np.asarray(colour, dtype=np.intp)


def star_sources(n: int, rows: NDArray[np.intp], cols: NDArray[np.intp],
                 colour: NDArray[np.intp]) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Where each H[rows[t], cols[t]] sits in the compressed (n, K) H @ S of a star
    colouring: (row, colour) per entry. Raises ValueError where the colouring does not
    allow it (a test of the colouring)."""
    K = int(colour.max()) + 1 if n else 0
    count = np.zeros(n * max(K, 1), dtype=np.intp)
    np.add.at(count, rows * K + colour[cols], 1)
    direct = count[rows * K + colour[cols]] == 1
    other = count[cols * K + colour[rows]] == 1
    if not np.all(direct | other):
        raise ValueError("not a star colouring: some entry is in no row alone in its colour")
    src_row = np.where(direct, rows, cols)
    src_colour = np.where(direct, colour[cols], colour[rows])
    return src_row, src_colour
