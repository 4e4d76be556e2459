"""The lists of the rule table's functions that people read: the table of docs/generic.md
is rendered from the rule table when the docs are built (docs/_functions.py), so a new row
needs no edit there; the README names a few functions by way of example, and each must be
a real one. (The typing stub is checked by stubtest in test_api.py, the API contract and
``easyad.__all__`` by test_api.py's CONTRACT, built from the table.)"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import easyad as ad
from easyad import _rules

ROOT = Path(__file__).resolve().parent.parent
# every generic function the table defines, under its name and its aliases
NAMES = {n for r in _rules.RULES if r.generic for n in (r.name, *r.aliases)}


def _rendered_docs_table() -> str:
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import _functions
    finally:
        sys.path.pop(0)
    return _functions.render()


def test_the_docs_table_lists_every_row_with_its_derivatives():
    table = _rendered_docs_table()
    listed = set(re.findall(r"^\| `(\w+)\(", table, re.M))
    aliases = set(re.findall(r"`(\w+)`", " ".join(
        line.split("|")[2] for line in table.splitlines() if line.startswith("| `"))))
    assert listed | aliases == NAMES | {"where"}
    for rule in _rules.RULES:
        if rule.generic:
            assert all(f"`{p}`" in table for p in rule.partials), rule.name
    page = (ROOT / "docs" / "generic.md").read_text(encoding="utf-8")
    assert "_generated/functions.md" in page      # the page includes the rendered table


def test_the_readme_names_real_functions():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("Generic functions:"):text.index("On floats")]
    named = set(re.findall(r"`(\w+)`", section))
    assert named and named <= NAMES | {"where"}, sorted(named - NAMES)
    assert all(callable(getattr(ad, n)) for n in named)
