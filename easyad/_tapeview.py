"""The one reading of a tape for every interpreter written in Python.

A WengertList is six parallel arrays (``ops``, ``arg0``, ``arg1``, ``values``,
``partial0``, ``partial1``). What an entry *means* depends on its opcode, and those
conventions are stated here, once (the compiled core states the same ones in
``_engine/conventions.pxi`` for its C loops):

- ``variable``: an input. Its value is set, not computed; it reads nothing.
- ``constant``: reserved (never recorded): a value only.
- ``compare_*``: a comparison whose outcome (1.0 or 0.0) is the entry's value. It reads
  operands but passes no derivative (the outcome is piecewise constant).
- ``guard_*``: a comparison Python branched on (``bool()``); replay checks that its
  outcome at a new point is the recorded one.
- ``select``: ``where(condition, a, b)``; its **condition is the entry just before it**
  (a comparison), and the operand it takes gets the whole adjoint.
- ``custom``: a user primitive (``ad.primitive``); its payload is ``tape._custom(e)``.
- ``node``: a tensor operation; its payload is ``tape._node(e)`` (inputs and vjp).
- a rule of the table: ``rule(e)``; its partials at recording are ``partial0/1``.

An operand index of -1 means "none or a constant"; a constant operand's value sits in the
entry's partial slot of that operand (``constant(e, k)``).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from easyad import _rules

VARIABLE, CONSTANT, COMPARE, GUARD, SELECT, CUSTOM, NODE, RULE = (
    "variable", "constant", "compare", "guard", "select", "custom", "node", "rule")


def _kind_of(name: str) -> str:
    if name.startswith("compare_"):
        return COMPARE
    if name.startswith("guard_"):
        return GUARD
    if name in _rules.RULES_BY_NAME:
        return RULE
    return name


# per opcode: its kind, and for comparisons the operator's symbol
KINDS: tuple[str, ...] = tuple(_kind_of(name) for name in _rules.OPCODE_NAMES)
SYMBOLS: dict[int, str] = {code: _rules.COMPARISON_SYMBOLS[name.split("_", 1)[1]]
                           for code, name in enumerate(_rules.OPCODE_NAMES)
                           if KINDS[code] in (COMPARE, GUARD)}


def select_condition(e: int) -> int:
    """The entry a select at ``e`` reads its condition from (the comparison before it)."""
    return e - 1


class Entry(NamedTuple):
    """One entry, read without copying the tape (``entry(tape, e)``)."""

    e: int
    op: int
    arg0: int
    arg1: int
    value: float
    partial0: float
    partial1: float

    @property
    def name(self) -> str:
        return _rules.OPCODE_NAMES[self.op]

    @property
    def kind(self) -> str:
        return KINDS[self.op]

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.op]

    def operand(self, k: int) -> int:
        return (self.arg0, self.arg1)[k]

    def constant(self, k: int) -> float:
        return (self.partial0, self.partial1)[k]


def entry(tape: Any, e: int) -> Entry:
    return Entry(e, *tape._entry(e))


class TapeView:
    """A typed, read-only view of a tape's entries (a snapshot: later entries are not seen).

    Build it from a WengertList (``TapeView(lst)``) or from its arrays
    (``TapeView.of_arrays(lst._arrays())``, for code that renders a tape it does not hold).
    """

    def __init__(self, tape: Any = None, arrays: dict[str, np.ndarray] | None = None) -> None:
        self.tape = tape
        a = arrays if arrays is not None else tape._arrays()
        self.ops: np.ndarray = a["ops"]
        self.arg0: np.ndarray = a["arg0"]
        self.arg1: np.ndarray = a["arg1"]
        self.values: np.ndarray = a["values"]
        self.partial0: np.ndarray = a["partial0"]
        self.partial1: np.ndarray = a["partial1"]

    @classmethod
    def of_arrays(cls, arrays: dict[str, np.ndarray]) -> TapeView:
        return cls(None, arrays)

    def __len__(self) -> int:
        return len(self.ops)

    # ---- what an entry is ----
    def name(self, e: int) -> str:
        """The opcode's name (``"sin"``, ``"select"``, ``"guard_gt"``...)."""
        return _rules.OPCODE_NAMES[int(self.ops[e])]

    def kind(self, e: int) -> str:
        """One of VARIABLE, CONSTANT, COMPARE, GUARD, SELECT, CUSTOM, NODE, RULE."""
        return KINDS[int(self.ops[e])]

    def rule(self, e: int) -> _rules.Rule:
        return _rules.RULES_BY_NAME[self.name(e)]

    def symbol(self, e: int) -> str:
        """A comparison's or guard's operator (``"<"``, ``">="``...)."""
        return SYMBOLS[int(self.ops[e])]

    def computes(self, e: int) -> bool:
        """Whether the entry's value is computed from operands (not set)."""
        return self.kind(e) not in (VARIABLE, CONSTANT)

    def passes_derivative(self, e: int) -> bool:
        """Whether adjoints flow through the entry to its operands."""
        return self.kind(e) not in (VARIABLE, CONSTANT, COMPARE, GUARD)

    # ---- what it reads ----
    def arity(self, e: int) -> int:
        """How many operand slots the entry uses (0 for inputs and tensor nodes, whose
        inputs are their payload's)."""
        kind = self.kind(e)
        if kind == RULE:
            return self.rule(e).arity
        if kind == CUSTOM:
            return int(self.tape._custom(e).arity) if self.tape is not None else 2
        if kind in (SELECT, COMPARE, GUARD):
            return 2
        return 0

    def operand(self, e: int, k: int) -> int:
        """Operand slot ``k`` (0 or 1): an entry index, or -1 for none or a constant."""
        return int((self.arg0, self.arg1)[k][e])

    def constant(self, e: int, k: int) -> float:
        """The value of constant operand ``k`` (its partial slot holds it)."""
        return float((self.partial0, self.partial1)[k][e])

    def partial(self, e: int, k: int) -> float:
        """The recorded partial of operand ``k`` (for an operand that is an entry)."""
        return float((self.partial0, self.partial1)[k][e])

    def operands(self, e: int) -> tuple[int, ...]:
        """The entries ``e`` reads, its select condition included."""
        reads = tuple(j for j in (int(self.arg0[e]), int(self.arg1[e])) if j >= 0)
        if self.kind(e) == SELECT:
            return (*reads, select_condition(e))
        return reads

    def condition(self, e: int) -> int:
        """The comparison entry a select reads."""
        return select_condition(e)

    def taken(self, e: int) -> int:
        """The operand slot a select took when it was recorded (0: a, 1: b)."""
        return 0 if self.values[select_condition(e)] != 0.0 else 1

    # ---- whole-tape questions ----
    def guards(self) -> list[int]:
        """Every guard of the tape, also those recorded after an output."""
        guard = [code for code, kind in enumerate(KINDS) if kind == GUARD]
        return [int(e) for e in np.flatnonzero(np.isin(self.ops, guard))]

    def ancestors(self, roots: Iterable[int]) -> set[int]:
        """The entries ``roots`` depend on (themselves included), through every operand
        and select condition."""
        seen: set[int] = set()
        stack = [int(r) for r in roots]
        while stack:
            e = stack.pop()
            if e < 0 or e in seen:
                continue
            seen.add(e)
            stack += self.operands(e)
        return seen


__all__ = ["TapeView", "Entry", "entry", "select_condition", "KINDS", "SYMBOLS", "VARIABLE",
           "CONSTANT",
           "COMPARE", "GUARD", "SELECT", "CUSTOM", "NODE", "RULE"]
