"""Graphviz DOT pictures of a WengertList: one node per entry, edges from operands.

``lst.to_dot()`` and ``Function.to_dot()`` call ``to_dot`` here; render the text with
``dot -Tsvg``. Reads the tape through ``_tapeview.TapeView``; no easyad logic.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from easyad import _core
from easyad._tapeview import COMPARE, GUARD, SELECT, VARIABLE, TapeView

_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**", "neg": "-"}


def _escape(text: str) -> str:
    """``text`` safe inside a double-quoted DOT string, shown as it is: names come from
    users and from loaded files, and an unescaped quote would end the string and add
    attributes (``x", image="/etc/passwd``). Backslashes are doubled (Graphviz reads
    ``\\N``, ``\\G``, ``\\l``... as escapes), quotes escaped, line breaks become ``\\n``
    and other control characters their ``\\xNN`` code."""
    out = []
    for ch in str(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _label(view: TapeView, e: int) -> str:
    kind = view.kind(e)
    if kind in (COMPARE, GUARD):
        return f"{view.symbol(e)}{' (guard)' if kind == GUARD else ''}"
    return _SYMBOLS.get(view.name(e), view.name(e))


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
    view = TapeView(tape)
    names = tape._names_dict()
    n = len(view)
    if n > max_entries:
        raise ValueError(f"the tape has {n} entries; a picture of more than {max_entries} "
                         f"is unreadable (pass max_entries= to draw it anyway)")
    adjoints = derivatives._adjoint_array() if derivatives is not None else None
    marked_in, marked_out = set(inputs), set(outputs)
    lines = ["digraph WengertList {", "  rankdir=LR;",
             '  node [shape=box, fontname="Helvetica", fontsize=10];']
    constants = 0
    for i in range(n):
        kind = view.kind(i)
        title = names.get(i, f"x{i}") if kind == VARIABLE else _label(view, i)
        text = f"{i}: {_escape(title)}\\nvalue {view.values[i]:.6g}"
        if adjoints is not None and i < len(adjoints):
            text += f"\\nadjoint {adjoints[i]:.6g}"
        style = ""
        if kind == VARIABLE or i in marked_in:
            style = ', style=filled, fillcolor="#dbe9f6"'
        if i in marked_out:
            style = ', style=filled, fillcolor="#f6e3c8"'
        lines.append(f'  e{i} [label="{text}"{style}];')
        if kind == VARIABLE:
            continue
        for k in range(view.arity(i)):
            j = view.operand(i, k)
            if j >= 0:
                lines.append(f"  e{j} -> e{i};")
            else:
                constants += 1
                lines.append(f'  c{constants} [label="{view.constant(i, k):.6g}", '
                             f'shape=plaintext];')
                lines.append(f"  c{constants} -> e{i};")
        if kind == SELECT:
            lines.append(f'  e{view.condition(i)} -> e{i} [style=dashed, label="condition"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


_core._register_service("dot.to_dot", to_dot)   # lst.to_dot() in the core draws with it

__all__ = ["to_dot"]
