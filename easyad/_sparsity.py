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

import functools
from typing import Any

import numpy as np
from numpy.typing import NDArray

from easyad import _expr, _rules
from easyad._tapeview import (COMPARE, CONSTANT, CUSTOM, GUARD, NODE, SELECT, VARIABLE,
                              TapeView, select_condition)

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
