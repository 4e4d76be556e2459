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
from easyad._tapeview import (COMPARE, CONSTANT, CUSTOM, GUARD, KINDS, NODE, RULE, SELECT,
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
    """(rows, cols) of the structurally non-zero Hessian entries, or None when dense.

    The index sets come from ``dependencies`` (C); each pair of sets an entry couples
    (below) becomes its cartesian product with numpy. Tapes with tensor nodes take the
    same rules entry by entry in Python (``_hessian_pattern_entries``)."""
    from easyad import _core
    n = len(inputs)
    size = output + 1
    ops = arrays["ops"][:size]
    arg = (np.ascontiguousarray(arrays["arg0"][:size], dtype=np.int32),
           np.ascontiguousarray(arrays["arg1"][:size], dtype=np.int32))
    live = _core._sparse_live(arg[0], arg[1], _SELECT_OPS[ops],
                              np.asarray([output], dtype=np.int64), size)
    if np.any((_DEPENDS[ops] == 3) & (live > 0)):
        return _hessian_pattern_entries(arrays, inputs, output)
    couplings = _couplings()
    first: list[NDArray[np.intp]] = []      # couples: entries whose sets are multiplied
    second: list[NDArray[np.intp]] = []
    computes = np.flatnonzero(live & (_DEPENDS[ops] == 2))
    wide = (arg[0].astype(np.intp), arg[1].astype(np.intp))
    for op in np.flatnonzero(np.bincount(ops[computes], minlength=len(KINDS))):
        at = computes[ops[computes] == op]
        if KINDS[op] == CUSTOM:      # every pair of what it reads
            first.append(at)
            second.append(at)
        if KINDS[op] != RULE:
            continue
        for k, names in enumerate(couplings[int(op)]):
            own = at[wide[k][at] >= 0]
            for name, other in (("dx", wide[0][own]), ("dy", wide[1][own]), ("dz", own)):
                if name in names:
                    keep = other >= 0
                    first.append(wide[k][own][keep])
                    second.append(other[keep])
    if not first:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    a, b = np.concatenate(first), np.concatenate(second)
    # index sets only where a couple reads them (and below): a long sum of squares never
    # builds the sets of its partial sums (quadratic in its length)
    needed = _core._sparse_live(arg[0], arg[1], _SELECT_OPS[ops],
                                np.concatenate([a, b]).astype(np.int64), size)
    _, start, length, pool = dependencies(arrays, inputs, (output,), needed)
    la, lb = length[a].astype(np.intp), length[b].astype(np.intp)
    sizes = la * lb
    limit = _DENSE_SHARE * n * n
    if sizes.sum() > 8 * limit + 10**6:     # the products alone say dense
        return None
    owner = np.repeat(np.arange(len(a)), sizes)
    t = np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    p = pool[start[a][owner] + t // lb[owner]].astype(np.intp)
    q = pool[start[b][owner] + t % lb[owner]].astype(np.intp)
    codes = np.unique(np.concatenate([p * n + q, q * n + p]))
    if len(codes) > limit:
        return None
    return codes // n, codes % n


def _hessian_pattern_entries(arrays: dict[str, NDArray[Any]], inputs: tuple[int, ...],
                             output: int) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """hessian_pattern entry by entry (a tape with tensor nodes)."""
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
    colour = colour_partition(rows, cols, (n, n))
    assert colour is not None
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
                     outputs: tuple[int, ...], found: Any = None
                     ) -> tuple[NDArray[np.intp], NDArray[np.intp]] | None:
    """(rows, cols) of the Jacobian's structurally non-zero entries, row by row, or None
    where the tape holds tensor nodes (their inputs are not operand slots).

    Index sets are propagated forward over the outputs' ancestors (``dependencies``): an
    input is its own column, a rule or a user primitive depends on what its operands
    depend on, comparisons and guards on nothing (they are piecewise constant), a select
    on both its operands (the pattern holds on either side of the branch). Guards are not
    part of the pattern: where replay finds another branch, ``on_branch_change`` says
    what happens, as for every other method. ``found``: ``dependencies``' result, where
    the caller has it."""
    if not outputs:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    found = found or dependencies(arrays, inputs, outputs)
    if found is None:
        return None
    _, start, length, pool = found
    outs = np.asarray(outputs, dtype=np.intp)
    return runs(start[outs], length[outs], pool)


def runs(start: NDArray[np.int64], length: NDArray[np.int32], pool: NDArray[np.int32]
         ) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(run number, member) of the runs pool[start[r]:start[r] + length[r]], in order."""
    counts = length.astype(np.intp)
    rows = np.repeat(np.arange(len(counts), dtype=np.intp), counts)
    first = np.cumsum(counts) - counts
    at = np.repeat(start.astype(np.intp) - first, counts) + np.arange(len(rows), dtype=np.intp)
    return rows, pool[at].astype(np.intp)


# per opcode: 0 nothing passes (comparisons, guards, constants), 1 a variable (an input's
# own column where it is one), 2 the union of its operands, 3 a tensor node
_DEPENDS = np.array([{VARIABLE: 1, COMPARE: 0, GUARD: 0, CONSTANT: 0, NODE: 3}.get(k, 2)
                     for k in KINDS], dtype=np.uint8)
_SELECT_OPS = np.array([k == SELECT for k in KINDS], dtype=np.uint8)


def dependencies(arrays: dict[str, NDArray[Any]], inputs: tuple[int, ...],
                 outputs: tuple[int, ...], within: NDArray[np.uint8] | None = None
                 ) -> tuple[NDArray[np.uint8], NDArray[np.int64], NDArray[np.int32],
                            NDArray[np.int32]] | None:
    """(live, start, length, pool) over entries 0..max(outputs): live marks the outputs'
    ancestors; the input columns entry i depends on are pool[start[i]:][:length[i]],
    sorted (none for dead entries). None where a live entry is a tensor node.
    ``within``: the entries to find sets for, in place of the outputs' ancestors. The
    loops run in C (``_core._sparse_live``, ``_sparse_deps``)."""
    from easyad import _core
    size = max(outputs) + 1
    ops = arrays["ops"][:size]
    arg0 = np.ascontiguousarray(arrays["arg0"][:size], dtype=np.int32)
    arg1 = np.ascontiguousarray(arrays["arg1"][:size], dtype=np.int32)
    live = _core._sparse_live(arg0, arg1, _SELECT_OPS[ops],
                              np.asarray(outputs, dtype=np.int64), size) \
        if within is None else within
    kind = _DEPENDS[ops] * live
    if np.any(kind == 3):
        return None
    column = np.full(size, -1, dtype=np.int32)
    ins = np.asarray(inputs, dtype=np.intp)
    inside = ins < size
    column[ins[inside]] = np.arange(len(ins), dtype=np.int32)[inside]
    kind[(kind == 1) & (column < 0)] = 0
    start, length, pool = _core._sparse_deps(kind, arg0, arg1, column)
    return live, start, length, pool


def _csr(groups: NDArray[np.intp], members: NDArray[np.intp], count: int
         ) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
    """Members of each group 0..count-1 as (ptr, members), each group's in given order."""
    order = np.argsort(groups, kind="stable")
    ptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(groups, minlength=count), out=ptr[1:])
    return ptr, np.ascontiguousarray(members[order], dtype=np.int32)


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
    from easyad import _core
    m, n = shape
    rows = np.asarray(rows, dtype=np.intp)
    cols = np.asarray(cols, dtype=np.intp)
    col_ptr, col_rows = _csr(cols, rows, n)
    row_ptr, row_cols = _csr(rows, cols, m)
    order = np.argsort(-np.diff(col_ptr), kind="stable").astype(np.int64)
    return _core._sparse_partition(col_ptr, col_rows, row_ptr, row_cols, order,
                                   -1 if limit is None else limit)


def star_colouring(n: int, rows: NDArray[np.intp], cols: NDArray[np.intp]
                   ) -> NDArray[np.intp]:
    """A star colouring of a symmetric (n, n) pattern's adjacency graph: neighbours have
    other colours, and every path on four vertices has three colours at least (no
    two-coloured path of length 3). Then every H[i, j] is read directly from the
    compressed H @ S: at (i, colour[j]) where j is the only neighbour of i in its colour,
    else at (j, colour[i]) (``star_sources``). Greedy (Gebremedhin, Manne and Pothen's
    simple star colouring), vertices in largest-first order, in C. An arrowhead needs 2 colours
    where a partition of columns needs n."""
    from easyad import _core
    rows = np.asarray(rows, dtype=np.intp)
    cols = np.asarray(cols, dtype=np.intp)
    off = rows != cols
    ptr, adj = _csr(rows[off], cols[off], n)
    order = np.argsort(-np.diff(ptr), kind="stable").astype(np.int64)
    return _core._star_colour(ptr, adj, order)


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


def symmetric_sources(n: int, rows: NDArray[np.intp], cols: NDArray[np.intp],
                      colour: NDArray[np.intp]) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Like ``star_sources``, but H[r, c] and H[c, r] read one place, so the recovered
    matrix is exactly symmetric: the pair (low, high) = (min, max) is read at (low,
    colour[high]) where low is alone in its row with that colour, else at (high,
    colour[low]). For a partition of columns (a distance-2 colouring) every entry is the
    first kind: the upper triangle, as the sweeps have always read it. Raises ValueError
    where ``colour`` is not a star colouring of the pattern."""
    rows = np.asarray(rows, dtype=np.intp)
    cols = np.asarray(cols, dtype=np.intp)
    K = int(colour.max()) + 1 if n else 1
    count = np.bincount(rows * K + colour[cols], minlength=n * K)
    low, high = np.minimum(rows, cols), np.maximum(rows, cols)
    direct = count[low * K + colour[high]] == 1
    other = count[high * K + colour[low]] == 1
    if not np.all(direct | other):
        raise ValueError("not a star colouring: some entry is in no row alone in its colour")
    return np.where(direct, low, high), np.where(direct, colour[high], colour[low])
