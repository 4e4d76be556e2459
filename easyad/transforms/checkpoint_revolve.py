"""Binomial checkpointing: Griewank and Walther's optimal reversal schedule (revolve).

Reversing ``l`` steps of a loop (each step maps a state to the next) needs every state in
reverse order. Keeping them all costs ``l`` states; keeping ``c`` snapshots and recomputing
the rest costs forward steps. With the first state held in one of the ``c`` snapshots,
the fewest un-recorded step evaluations are (Griewank 1992; Griewank & Walther, ACM TOMS
26, 2000)

    t(l, c) = r l - beta(c + 1, r - 1),   beta(c, r) = C(c + r, c),

with ``r`` the smallest integer with ``beta(c, r) >= l`` (each step is then run at most
``r`` times before it is recorded once). ``t`` satisfies the recursion
``t(l, c) = min_m [m + t(l - m, c - 1) + t(m, c)]`` (advance m steps, keep that state,
reverse the right part with one snapshot fewer, then the left part), ``t(l, 1) =
l (l - 1) / 2``; both terms are convex in ``m``, so the best split is found by bisection
on the difference (no table of size l).

This module is arithmetic and one driver, ``reverse``, with the work passed in as
callbacks, so the tests count steps and live snapshots exactly; it imports nothing of
easyad.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any


def beta(c: int, r: int) -> int:
    """The most steps ``c`` snapshots reverse with each step run at most ``r`` times."""
    return math.comb(c + r, c) if r >= 0 else 0


def repetitions(steps: int, snapshots: int) -> int:
    """The smallest ``r`` with ``beta(snapshots, r) >= steps``."""
    r = 0
    while beta(snapshots, r) < steps:
        r += 1
    return r


def forward_steps(steps: int, snapshots: int) -> int:
    """The fewest un-recorded step evaluations reversing ``steps`` steps with
    ``snapshots`` snapshots (the first state's included) needs: Griewank's formula."""
    if steps <= 1:
        return 0
    if snapshots < 1:
        raise ValueError("reversing a loop needs at least one snapshot (its first state)")
    r = repetitions(steps, snapshots)
    return r * steps - beta(snapshots + 1, r - 1)


def _cost(m: int, steps: int, snapshots: int) -> int:
    return m + forward_steps(steps - m, snapshots - 1) + forward_steps(m, snapshots)


@functools.lru_cache(maxsize=65536)
def split(steps: int, snapshots: int) -> int:
    """Where to keep the next snapshot (steps from the held state) reversing ``steps``
    steps with ``snapshots >= 2``: an optimal m, the smallest one (cost convex in m)."""
    lo, hi = 1, steps - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _cost(mid + 1, steps, snapshots) - _cost(mid, steps, snapshots) >= 0:
            hi = mid
        else:
            lo = mid + 1
    return lo


def spine(steps: int, snapshots: int) -> list[int]:
    """The snapshots the schedule takes first, in increasing step order: the primal
    forward run keeps them as it passes (revolve's first sweep), so the backward sweep
    does not run those steps again."""
    out: list[int] = []
    a, c = 0, snapshots
    while steps - a > 1 and c >= 2:
        a += split(steps - a, c)
        out.append(a)
        c -= 1
    return out


def reverse(steps: int, snapshots: int, first: Any, stored: dict[int, Any],
            advance: Callable[[Any, int, int], Any],
            reverse_step: Callable[[Any, int, Any], Any], adjoint: Any) -> Any:
    """Run the optimal schedule: ``advance(state, i, j)`` gives the state after step
    ``j - 1`` from the state before step ``i`` (un-recorded), ``reverse_step(state, i,
    adjoint)`` records step ``i`` from its state and returns the adjoint of that state
    from the adjoint of the next; ``first`` is the state before step 0, ``stored`` the
    snapshots the forward run kept (``spine``; consumed). Returns the first state's
    adjoint. At most ``snapshots`` states are held at once (the stack below), plus the
    one being advanced."""
    if steps < 1:
        return adjoint
    stack: list[tuple[int, Any, int]] = [(0, first, snapshots)]
    b = steps
    while stack:
        a, state, c = stack[-1]
        if b - a > 1 and c >= 2:
            m = a + split(b - a, c)
            later = stored.pop(m) if m in stored else advance(state, a, m)
            stack.append((m, later, c - 1))
            continue
        # one snapshot left (or one step): each step from the held state, last first
        for i in range(b - 1, a, -1):
            adjoint = reverse_step(advance(state, a, i), i, adjoint)
        adjoint = reverse_step(state, a, adjoint)
        stack.pop()
        b = a
    return adjoint


__all__ = ["beta", "forward_steps", "repetitions", "reverse", "spine", "split"]
