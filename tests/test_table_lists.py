"""Hand-written lists of the rule table's functions, checked against the table, so a row
added or renamed without them fails here: the README's "Generic functions:" paragraph and
the table of docs/generic.md. (The typing stub is checked by stubtest in test_api.py, the
API contract and ``easyad.__all__`` by test_api.py's CONTRACT, built from the table.)"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from easyad import _rules

ROOT = Path(__file__).resolve().parent.parent
# every generic function the table defines, under its name and its aliases
NAMES = {n for r in _rules.RULES if r.generic for n in (r.name, *r.aliases)}
NOT_RULES = {"where"}   # generic, but structural (a select), not a row


def _listed(text: str, start: str, end: str) -> set[str]:
    section = text[text.index(start):]
    section = section[:section.index(end)]
    words = set()
    for quoted in re.findall(r"`([^`]*)`", section):
        words |= set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", quoted.split("(")[0]))
    return words


@pytest.mark.parametrize("path, start, end", [
    ("README.md", "Generic functions:", "On floats"),
    ("docs/generic.md", "## The functions", "On floats"),
])
def test_function_lists_follow_the_table(path, start, end):
    listed = _listed((ROOT / path).read_text(encoding="utf-8"), start, end)
    assert listed - NOT_RULES == NAMES, (
        f"{path}: missing {sorted(NAMES - listed)}, unknown {sorted(listed - NAMES - NOT_RULES)}")
