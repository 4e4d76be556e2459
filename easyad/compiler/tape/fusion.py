"""Consecutive loops of one trip count rendered as one loop (``Piece``, ``fuse``): the values'
affine runs (a run two or more times as long cut into pieces of that count), and the
reverse sweep's (from ``REVERSE_FROM`` iterations). gcc's loop passes (vectorising,
peeling, the epilogue) run once per loop, whatever its body, and a fused loop reads each
value where it was just written: Rosenbrock's bound gradient runs 10% (n = 100) to 24%
(n = 10^4) faster; at n = 10 gcc's compile is ~1-2 ms shorter (~4 ms with the reverse
loops fused too, which then run ~5 ns slower per call: ``REVERSE_FROM`` says from which
trip count).

Fusing changes the order in which the statements of different loops meet, never the
order of the accesses to one element: every element two pieces both touch (one of them
writing it) is reached by the earlier piece at an iteration that runs no later than the
later piece's, checked per pair (``_legal``). Each piece's own statements are what its
loop held, so every value and every sum rounds as before, bit for bit."""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

MOST = 8        # pieces per fused loop: a longer body gains nothing and costs gcc more
# the reverse sweep's loops fuse from this trip count on. Below 16 gcc peels a short loop
# completely into straight vector code, ~5 ns (7%) faster per call at n = 10 than a fused
# loop but ~4 ms more to compile; the issue asks for both at most CasADi's, and only the
# fused form meets both (compile 0.98x, call 0.81x its JIT), so every reverse loop fuses
REVERSE_FROM = 0


@dataclass(frozen=True)
class Access:
    """Elements ``array[base + j]`` (stride 1) or ``array[base]`` (stride 0, every
    iteration) that a piece reads or writes (adds to counts as a write)."""
    array: str
    base: int
    stride: int
    write: bool


@dataclass
class Piece:
    """One loop's body over ``j`` in [0, count) (``down``: from the top); ``checked``: its
    statements set ``bad`` (the values' non-finite test); ``tag``: only pieces of one tag
    join (the values' runs inside ``if (all)`` and outside); ``split``: the same statements
    cut into pieces of a shorter count dividing this one, in execution order (or None)."""
    count: int
    body: str
    accesses: tuple[Access, ...]
    down: bool = False
    checked: bool = False
    tag: str = ""
    split: Callable[[int], list[Piece]] | None = None


def _legal(earlier: Piece, later: Piece) -> bool:
    """Whether ``later``'s body may run in the same iteration as ``earlier``'s, after it:
    for every element both touch, one of them writing, the earlier piece's access runs
    first, as it did when its loop ran whole before."""
    m = earlier.count
    for a in earlier.accesses:
        for b in later.accesses:
            if a.array != b.array or not (a.write or b.write):
                continue
            a_end = a.base + (m if a.stride else 1)
            b_end = b.base + (m if b.stride else 1)
            if a_end <= b.base or b_end <= a.base:
                continue                     # no element in common
            if m == 1:
                continue
            if not (a.stride and b.stride):
                return False                 # an element touched at every iteration
            # element e: iteration e - a.base in the earlier, e - b.base in the later
            if (b.base < a.base) if later.down else (b.base > a.base):
                return False
    return True


def _fits(group: list[Piece], pieces: list[Piece]) -> bool:
    if len(group) + len(pieces) > MOST:
        return False
    head = group[0]
    if head.down and head.count < REVERSE_FROM:
        return False
    for k, piece in enumerate(pieces):
        if (piece.count, piece.down, piece.tag) != (head.count, head.down, head.tag):
            return False
        if not all(_legal(q, piece) for q in group + pieces[:k]):
            return False
    return True


def fuse(items: list[str | Piece], loop: Callable[[int, bool], str], single: Callable[
        [Piece], str], wrap: Callable[[str, str], str]) -> list[str]:
    """The statements with runs of consecutive pieces fused where legal. ``loop(count,
    down)``: a loop's head; ``single(piece)``: a piece alone, as it was rendered before
    fusing; ``wrap(tag, text)``: a fused loop inside what its tag asks for."""
    out: list[str] = []
    group: list[Piece] = []

    def flush() -> None:
        if len(group) == 1:
            out.append(single(group[0]))
        elif group:
            head = group[0]
            body = " ".join(p.body for p in group)
            text = f"{loop(head.count, head.down)} {{ {body} }}"
            if any(p.checked for p in group):
                text = f"double bad = 0.0; {text} if (bad != 0.0) flags |= 2;"
            out.append(wrap(head.tag, f"    {{ {text} }}\n"))
        group.clear()

    for item in items:
        if isinstance(item, str):
            flush()
            out.append(item)
            continue
        if group and _fits(group, [item]):
            group.append(item)
            continue
        if group and item.split is not None and item.count % group[0].count == 0 \
                and item.count > group[0].count:
            parts = item.split(group[0].count)
            if _fits(group, parts):
                group.extend(parts)
                continue
        flush()
        group.append(item)
    flush()
    return out
