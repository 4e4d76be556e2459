"""Graphviz DOT pictures of a WengertList: one node per entry, edges from operands.

``lst.to_dot()`` and ``Function.to_dot()`` call ``to_dot`` here; render the text with
``dot -Tsvg``. Reads the tape through ``WengertList._arrays()``; no easyad logic.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from easyad._rules import COMPARISON_SYMBOLS, OPCODE_NAMES, RULES_BY_NAME

_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "neg": "-"}


def _label(op: str) -> str:
    if op.startswith(("compare_", "guard_")):
        kind, cmp = op.split("_", 1)
        return f"{COMPARISON_SYMBOLS[cmp]}{' (guard)' if kind == 'guard' else ''}"
    if op in _SYMBOLS:
        return _SYMBOLS[op]
    return op


def _arity(tape: Any, op: str, index: int) -> int:
    if op in RULES_BY_NAME:
        return RULES_BY_NAME[op].arity
    if op == "custom":
        return int(tape._custom(index).arity)
    if op == "select" or op.startswith(("compare_", "guard_")):
        return 2
    return 0


def to_dot(tape: Any, derivatives: Any = None, inputs: Sequence[int] = (),
           outputs: Sequence[int] = (), max_entries: int = 500) -> str:
    """The tape as DOT text: operation, value and (given Derivatives) adjoint per entry.

    Examples
    --------
    >>> import easyad as ad
    >>> lst = ad.WengertList()
    >>> x = lst.variable(2.0, name="x")
    >>> y = x * ad.sin(x)
    >>> print(lst.to_dot(y.derivatives()).splitlines()[0])
    digraph WengertList {
    """
    arrays = tape._arrays()
    names = tape._names_dict()
    n = len(arrays["ops"])
    if n > max_entries:
        raise ValueError(f"the tape has {n} entries; a picture of more than {max_entries} "
                         f"is unreadable (pass max_entries= to draw it anyway)")
    adjoints = derivatives._adjoint_array() if derivatives is not None else None
    marked_in, marked_out = set(inputs), set(outputs)
    lines = ["digraph WengertList {", "  rankdir=LR;",
             '  node [shape=box, fontname="Helvetica", fontsize=10];']
    constants = 0
    for i in range(n):
        op = OPCODE_NAMES[arrays["ops"][i]]
        title = names.get(i, f"x{i}") if op == "variable" else _label(op)
        text = f"{i}: {title}\\nvalue {arrays['values'][i]:.6g}"
        if adjoints is not None and i < len(adjoints):
            text += f"\\nadjoint {adjoints[i]:.6g}"
        style = ""
        if op == "variable" or i in marked_in:
            style = ', style=filled, fillcolor="#dbe9f6"'
        if i in marked_out:
            style = ', style=filled, fillcolor="#f6e3c8"'
        lines.append(f'  e{i} [label="{text}"{style}];')
        if op == "variable":
            continue
        for k in range(_arity(tape, op, i)):
            j = int(arrays[f"arg{k}"][i])
            if j >= 0:
                lines.append(f"  e{j} -> e{i};")
            else:  # a constant operand: its value sits in the partial slot
                constants += 1
                lines.append(f'  c{constants} [label="{arrays[f"partial{k}"][i]:.6g}", '
                             f'shape=plaintext];')
                lines.append(f"  c{constants} -> e{i};")
        if op == "select":
            lines.append(f'  e{i - 1} -> e{i} [style=dashed, label="condition"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


__all__ = ["to_dot"]
