"""The table of generic functions on docs/generic.md, rendered from the rule table when the
docs are built (so a new row of easyad/_rules.py needs no edit here)."""
from __future__ import annotations

import pathlib

from easyad import _rules


def render() -> str:
    """Markdown: one line per generic row, with its aliases, its meaning, its value and its
    partial derivatives as the table writes them (x, y: the inputs; z: the value)."""
    lines = ["<!-- generated from easyad/_rules.py by docs/_functions.py, do not edit -->",
             "",
             "| function | also | meaning | value | derivatives (d/dx, d/dy) |",
             "|---|---|---|---|---|"]
    for rule in _rules.RULES:
        if not rule.generic:
            continue
        args = "x" if rule.arity == 1 else "x, y"
        also = " ".join(f"`{a}`" for a in rule.aliases)
        partials = "; ".join(f"`{p}`" for p in rule.partials)
        lines.append(f"| `{rule.name}({args})` | {also} | {rule.doc} | `{rule.value}` | "
                     f"{partials} |")
    lines.append("| `where(condition, a, b)` |  | `a` where the condition holds, else `b` "
                 "(a select: only the chosen side carries a derivative) |  |  |")
    return "\n".join(lines) + "\n"


def write(out: pathlib.Path) -> pathlib.Path:
    out.mkdir(exist_ok=True)
    target = out / "functions.md"
    text = render()
    if not target.exists() or target.read_text() != text:  # keep Sphinx's cache valid
        target.write_text(text)
    return target
